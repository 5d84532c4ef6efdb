// `qrig synth --type`: every type's tiny model loads and runs on the CPU backend, its matrices dequantize back
// to the floats synth drew within the type's quantization error (and much closer than a wrong decoding
// would), the per-tensor mix equals what llama-quantize chose for the kquant fixtures' 4-layer model, and
// gguf::quantize round-trips random data within the same bounds.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli/args.h"
#include "cli/synth.h"
#include "compiler/compile.h"
#include "gguf/gguf.h"
#include "runtime/cpu/executor.h"
#include "runtime/model_file.h"
#include "tests/fixtures.h"

using namespace qrig;
using gguf::TensorType;

namespace {

std::string tmp(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("qrig-synth-types-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// Relative RMS error of a type's reference quantization on Gaussian data: a bound a correct quantizer stays under
// (measured on 65536 values: Q8_0 0.0054, Q4_0 0.086, Q4_1 0.079, Q5_0 0.043, Q5_1 0.038, Q2_K 0.30, Q3_K 0.15,
// Q4_K 0.072, Q5_K 0.036, Q6_K 0.018) and a wrong one (wrong scale, wrong order: error ~1) cannot meet.
double error_bound(TensorType t) {
  switch (t) {
    case TensorType::Q2_K: return 0.45;
    case TensorType::Q3_K: return 0.22;
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q4_K: return 0.12;
    case TensorType::Q5_0: case TensorType::Q5_1: case TensorType::Q5_K: return 0.06;
    case TensorType::Q6_K: return 0.03;
    case TensorType::Q8_0: return 0.008;
    default: return 0;
  }
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double)(a[i] - b[i]) * (a[i] - b[i]);
    n += (double)a[i] * a[i];
  }
  return std::sqrt(e / n);
}

const cli::SynthPreset kKq = {"kq", 256, 4, 256, 2, 1, 256, 2, 4, 128, 4, 1088, 8192};  // fixtures/kquant's shape

}  // namespace

TEST_CASE("gguf::quantize round-trips Gaussian data within each type's error", "[cli]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> x(4096);
  for (auto& v : x) v = nd(rng);
  for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
                       TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    const gguf::TypeTraits& tr = *gguf::type_traits((uint32_t)t);
    INFO(tr.name);
    REQUIRE(gguf::can_quantize(t));
    std::vector<uint8_t> q(x.size() / tr.block_elems * tr.block_bytes, 0xee);
    gguf::quantize(t, x.data(), q.data(), x.size());
    REQUIRE_NOTHROW(gguf::check_blocks(t, q.data(), x.size(), "q"));
    std::vector<float> y(x.size(), NAN);
    gguf::dequantize(t, q.data(), y.data(), y.size());
    const double e = rel_rms(x, y);
    CHECK(e < error_bound(t));
    CHECK(e > error_bound(t) / 20);  // it is a quantization, not a copy
    // All-zero blocks quantize to zeros.
    std::vector<float> z(tr.block_elems, 0.0f), back(tr.block_elems, NAN);
    std::vector<uint8_t> qz(tr.block_bytes);
    gguf::quantize(t, z.data(), qz.data(), z.size());
    gguf::dequantize(t, qz.data(), back.data(), back.size());
    for (float v : back) CHECK(v == 0.0f);
    CHECK_THROWS_WITH(gguf::quantize(t, x.data(), q.data(), tr.block_elems + 16), Catch::Contains("multiple"));
  }
  CHECK_FALSE(gguf::can_quantize(TensorType::IQ4_XS));
  std::vector<uint8_t> q(136);
  CHECK_THROWS_WITH(gguf::quantize(TensorType::IQ4_XS, x.data(), q.data(), 256), Catch::Contains("IQ4_XS"));
}

TEST_CASE("synth --type: every type's tiny model runs on the CPU and holds the drawn weights", "[cli]") {
  for (const std::string& type : cli::synth_type_names()) {
    INFO(type);
    const std::string path = tmp("tiny-" + type + ".gguf");
    cli::synth_model("tiny", 4, type).write(path);
    const gguf::File f = gguf::File::open(path);
    const cli::SynthMix mix = cli::synth_mix(type, cli::synth_preset("tiny"));
    CHECK(f.get_uint("general.file_type") == mix.file_type);
    // Matrices: the drawn floats, dequantized back within the type's error (a few rows of each).
    size_t matrices = 0;
    for (const auto& t : f.tensors()) {
      if (t.ne.size() != 2 || t.name.find("conv1d") != std::string::npos) continue;
      ++matrices;
      INFO(t.name << " " << gguf::tensor_type_name(t.type));
      if (type == "q8_0") {
        CHECK(t.type == TensorType::Q8_0);
        continue;  // drawn as int8 directly (test_synth.cpp)
      }
      const double sigma = t.name == "token_embd.weight" ? 1.0 : 1.0 / std::sqrt((double)t.ne[0]);
      const gguf::TypeTraits& tr = *gguf::type_traits((uint32_t)t.type);
      const size_t row_bytes = t.ne[0] / tr.block_elems * tr.block_bytes;
      std::vector<float> want, got;
      for (uint64_t r : {(uint64_t)0, t.ne[1] / 2, t.ne[1] - 1}) {
        auto x = cli::synth_float_row(4, t.name, r, t.ne[0], sigma);
        want.insert(want.end(), x.begin(), x.end());
        std::vector<float> y(t.ne[0]);
        gguf::dequantize(t.type, f.tensor_data(t) + r * row_bytes, y.data(), y.size());
        got.insert(got.end(), y.begin(), y.end());
      }
      CHECK(rel_rms(want, got) < error_bound(t.type));
    }
    CHECK(matrices == 64);
    // It runs: the CPU plan loads (every scale checked) and gives finite, non-trivial logits.
    auto plan = compiler::compile(f, compiler::Rig::default_cpu(), {});
    runtime::CpuExecutor ex(plan, runtime::open_plan_model(plan));
    auto seq = ex.new_sequence();
    auto logits = ex.forward(seq, {1, 2, 3, 500, 1001}, {0, 4});
    double amax = 0;
    for (float v : logits) {
      REQUIRE(std::isfinite(v));
      amax = std::max(amax, (double)std::fabs(v));
    }
    CHECK(amax > 0.1);
    CHECK(amax < 1e3);
    std::filesystem::remove(path);
  }
  CHECK_THROWS_AS(cli::synth_mix("iq2_xxs", cli::synth_preset("tiny")), cli::UsageError);
}

TEST_CASE("synth --type mixes equal llama-quantize's for the kquant fixtures' model", "[cli][fixtures]") {
  for (const char* type : {"q2_k", "q3_k_m", "q4_0", "q4_1", "q4_k_m", "q5_0", "q5_1", "q5_k_m", "q6_k"}) {
    INFO(type);
    const gguf::File ref = gguf::File::open(qrig::fixtures::shared_path(std::string("fixtures/kquant/kq-") + type + ".gguf"));
    const gguf::Writer w = cli::synth_model(kKq, 1, type);
    std::map<std::string, TensorType> ours;
    for (const auto& e : w.tensor_table()) ours[e.name] = e.type;
    size_t compared = 0;
    for (const auto& t : ref.tensors()) {
      INFO(t.name);
      REQUIRE(ours.count(t.name) == 1);
      if (t.name.find("conv1d") != std::string::npos) continue;  // F32 in both (our synth: a vector)
      CHECK(gguf::tensor_type_name(ours.at(t.name)) == std::string(gguf::tensor_type_name(t.type)));
      ++compared;
    }
    CHECK(compared == ref.tensors().size() - 3);  // three GDN layers' conv1d
    CHECK(ref.get_uint("general.file_type") == cli::synth_mix(type, kKq).file_type);
  }
}
