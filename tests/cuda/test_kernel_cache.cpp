// The cubin cache and the kernel compiler, without a GPU: entries written atomically (concurrent readers
// never see a partial file, failures leave nothing behind), a second request served without compiling (from
// memory, then from disk in a new process-like object), cache entries distinct per arch and feature set, the
// no-JIT switch, the sm_70 -> sm_75 substitution under NVRTC 13, and NVRTC errors reported with the log.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/nvrtc.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::kernels;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> dir_listing(const fs::path& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

KernelCache::Entry pattern_entry(char c, size_t n) {
  KernelCache::Entry e;
  e.cubin.assign(n, c);
  for (size_t i = 0; i < n; i += 4096) e.cubin[i] = (char)(c + 1);  // not one repeated byte
  e.ptx = std::string(n / 4, c);
  e.log = std::string("log ") + c;
  return e;
}

}  // namespace

TEST_CASE("kernel cache: store then load, no temporary files left", "[cuda]") {
  test::ScratchDir d("cache");
  KernelCache cache(d.path / "nested" / "kernels");  // created when missing
  CHECK(!cache.load("x.sm_80.0123").has_value());
  const auto e = pattern_entry('a', 100000);
  cache.store("x.sm_80.0123", e);
  auto got = cache.load("x.sm_80.0123");
  REQUIRE(got.has_value());
  CHECK(got->cubin == e.cubin);
  CHECK(got->ptx == e.ptx);
  CHECK(got->log == e.log);
  CHECK(dir_listing(cache.dir()) == std::vector<std::string>{"x.sm_80.0123.cubin", "x.sm_80.0123.log", "x.sm_80.0123.ptx"});

  // An entry missing a file is a miss (the cubin is only renamed into place after the others).
  fs::remove(cache.path("x.sm_80.0123", ".ptx"));
  CHECK(!cache.load("x.sm_80.0123").has_value());
  CHECK_THROWS_AS(cache.store("empty", KernelCache::Entry{}), KernelError);
}

TEST_CASE("kernel cache: concurrent writers and readers never see a partial entry", "[cuda]") {
  test::ScratchDir d("cache-race");
  KernelCache cache(d.path);
  const auto a = pattern_entry('a', 4 << 20), b = pattern_entry('b', 4 << 20);
  std::atomic<bool> stop{false};
  auto writer = [&](const KernelCache::Entry& e) {
    for (int i = 0; i < 8; ++i) cache.store("race", e);
  };
  int loads = 0, torn = 0;
  std::thread reader([&] {
    while (!stop) {
      if (auto got = cache.load("race")) {
        ++loads;
        const bool ok_cubin = got->cubin == a.cubin || got->cubin == b.cubin;
        const bool ok_ptx = got->ptx == a.ptx || got->ptx == b.ptx;
        torn += !(ok_cubin && ok_ptx);
      }
    }
  });
  std::thread wa(writer, std::cref(a)), wb(writer, std::cref(b));
  wa.join();
  wb.join();
  stop = true;
  reader.join();
  CHECK(loads > 0);
  CHECK(torn == 0);
  CHECK(dir_listing(d.path) == std::vector<std::string>{"race.cubin", "race.log", "race.ptx"});
}

TEST_CASE("kernel cache: a failed store says which file and leaves no temporary file", "[cuda]") {
  test::ScratchDir d("cache-fail");
  KernelCache cache(d.path);
  fs::create_directories(cache.path("blocked", ".ptx") / "child");  // rename onto a non-empty directory fails
  CHECK_THROWS_WITH(cache.store("blocked", pattern_entry('c', 1000)), Catch::Contains("blocked.ptx"));
  CHECK(dir_listing(d.path) == std::vector<std::string>{"blocked.ptx"});
  CHECK(!cache.load("blocked").has_value());
}

TEST_CASE("kernel cache: default directory follows XDG_CACHE_HOME, then HOME", "[cuda]") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg ? xdg : "";
  setenv("XDG_CACHE_HOME", "/some/where", 1);
  CHECK(KernelCache::default_dir() == fs::path("/some/where/qrig/kernels"));
  unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME")) CHECK(KernelCache::default_dir() == fs::path(home) / ".cache/qrig/kernels");
  if (xdg) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

TEST_CASE("architecture choice: sm_70 compiles as sm_75 where NVRTC cannot target it, and says so", "[cuda]") {
  const std::vector<int> archs = nvrtc_supported_archs();
  REQUIRE(!archs.empty());
  const ArchChoice h = choose_arch(90);
  CHECK(h.target_sm == 90);
  CHECK(!h.substituted());
  CHECK(h.note.empty());
  const ArchChoice c = choose_arch(parse_sm("sm_70"));
  CHECK(c.feature_sm == 70);
  if (std::find(archs.begin(), archs.end(), 70) != archs.end()) {  // CUDA 12
    CHECK(c.target_sm == 70);
    CHECK(c.note.empty());
  } else {  // CUDA 13
    CHECK(c.target_sm == archs.front());
    CHECK(c.target_sm == 75);
    CHECK_THAT(c.note, Catch::Contains("cannot target sm_70") && Catch::Contains("for sm_75") &&
                           Catch::Contains(nvrtc_version()));
  }
  CHECK_THROWS_WITH(choose_arch(999), Catch::Contains("cannot compile for sm_999"));
  CHECK_THROWS_AS(parse_sm("compute_90"), KernelError);
  CHECK_THROWS_AS(parse_sm("sm_9"), KernelError);
  CHECK(parse_sm("sm_120") == 120);
}

TEST_CASE("kernel compiler: a second request does not compile; a new compiler reads the disk cache", "[cuda]") {
  test::ScratchDir d("compiler");
  const Variant v = rmsnorm_f32_variant(256);
  KernelCompiler c1(d.path);
  const CompiledKernel k1 = c1.get(v, 80);
  CHECK(c1.compiles() == 1);
  CHECK(!k1.from_disk);
  CHECK(!k1.cubin.empty());
  CHECK(k1.ptx.find(".entry rmsnorm_f32") != std::string::npos);
  CHECK(k1.cache_stem.rfind("rmsnorm_f32_d256_q0_t64.sm_80.", 0) == 0);
  const CompiledKernel k1b = c1.get("rmsnorm_f32_d256_q0_t64", 80);
  CHECK(c1.compiles() == 1);
  CHECK(c1.memory_hits() == 1);
  CHECK(k1b.cubin == k1.cubin);

  KernelCompiler c2(d.path);
  const CompiledKernel k2 = c2.get(v, 80);
  CHECK(c2.compiles() == 0);
  CHECK(c2.disk_hits() == 1);
  CHECK(k2.from_disk);
  CHECK(k2.cubin == k1.cubin);
  CHECK(k2.ptx == k1.ptx);
  CHECK(k2.log == k1.log);

  // Other archs and feature sets are other entries (sm_70 and sm_75 both emit sm_75 code under NVRTC 13,
  // but the kernels see a different QRIG_SM).
  c2.get(v, 75);
  c2.get(v, 70);
  CHECK(c2.compiles() == 2);
  const auto s80 = KernelCompiler::cache_stem(v, choose_arch(80)), s75 = KernelCompiler::cache_stem(v, choose_arch(75)),
             s70 = KernelCompiler::cache_stem(v, choose_arch(70));
  CHECK(s80 != s75);
  CHECK(s75 != s70);
  CHECK(KernelCompiler::cache_stem(rmsnorm_f32_variant(512), choose_arch(80)) != s80);
  if (choose_arch(70).substituted()) {
    REQUIRE(c2.notes().size() == 1);
    CHECK_THAT(c2.notes()[0], Catch::Contains("sm_70"));
  }
}

TEST_CASE("kernel compiler: the no-JIT switch makes a compile an error, cached kernels still load", "[cuda]") {
  test::ScratchDir d("nojit");
  {
    KernelCompiler warm(d.path);
    warm.get(quant_act_q8_variant(1), 86);
  }
  KernelCompiler c(d.path);
  c.forbid_jit();
  CHECK(c.jit_forbidden());
  const CompiledKernel k = c.get(quant_act_q8_variant(1), 86);  // warmed: from disk
  CHECK(k.from_disk);
  CHECK_THROWS_AS(c.get(quant_act_q8_variant(1), 89), JitForbidden);
  CHECK_THROWS_WITH(c.get(embed_q8_0_variant(256), 86),
                    Catch::Contains("embed_q8_0_d256_t32") && Catch::Contains("forbidden"));
  CHECK(c.compiles() == 0);
  c.forbid_jit(false);
  c.get(embed_q8_0_variant(256), 86);
  CHECK(c.compiles() == 1);
}

TEST_CASE("NVRTC failures carry the program name and the compiler's log", "[cuda]") {
  const std::string bad = "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_thing; }\n";
  CHECK_THROWS_WITH(nvrtc_compile("broken.cu", bad, {}, {"--gpu-architecture=sm_80"}),
                    Catch::Contains("broken.cu") && Catch::Contains("undefined_thing"));
  // A template compiled without its parameters stops at its own checks.
  CHECK_THROWS_WITH(nvrtc_compile("t.cu", "#include \"qrig_common.cuh\"\n", {{"qrig_common.cuh", "#error no QRIG_SM\n"}},
                                  {"--gpu-architecture=sm_80"}),
                    Catch::Contains("no QRIG_SM"));
  const PtxasReport r = parse_ptxas_report(
      "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
      "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers\n");
  CHECK(r.registers == 40);
  CHECK(r.spill_store_bytes == 12);
  CHECK(r.spill_load_bytes == 16);
  CHECK(r.stack_frame_bytes == 8);
}
