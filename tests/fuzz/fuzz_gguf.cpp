// libFuzzer target for the GGUF reader (build with -DQRIG_FUZZ=ON, run scripts/fuzz-gguf.sh): any input must
// either parse or throw gguf::Error; after a parse, every tensor's bytes and every metadata value must be
// readable (ASan catches reads outside the image) and the supported types must dequantize (and pass or fail
// check_blocks with an Error).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gguf/gguf.h"

namespace {

volatile uint64_t g_sink;  // keeps the reads below from being optimised away

void touch_value(const qrig::gguf::Value& v) {
  uint64_t h = v.u ^ (uint64_t)v.i ^ v.s.size() ^ v.size();
  for (int64_t x : v.ints) h += (uint64_t)x;
  for (uint64_t x : v.uints) h += x;
  for (double x : v.floats) h += (uint64_t)(x == x);
  for (const auto& s : v.strs) h += s.size() ? (uint8_t)s.back() : 0;
  for (const auto& a : v.arr) touch_value(a);
  g_sink = g_sink + h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qrig::gguf;
  try {
    File f = File::from_bytes(data, size, "fuzz");
    for (const auto& [key, value] : f.metadata()) touch_value(value);
    // The typed getters must answer with a value or an Error, whatever the stored type.
    for (const char* key : {"general.architecture", "general.alignment", "tokenizer.ggml.tokens"}) {
      try { (void)f.get_string(key); } catch (const Error&) {}
      try { (void)f.get_uint(key); } catch (const Error&) {}
      try { (void)f.get_int_array(key); } catch (const Error&) {}
      try { (void)f.get_float(key); } catch (const Error&) {}
    }
    std::vector<float> out;
    for (const TensorInfo& t : f.tensors()) {
      const uint8_t* p = f.tensor_data(t);
      uint64_t h = 0;
      for (uint64_t k = 0; k < t.n_bytes; ++k) h += p[k];
      g_sink = g_sink + h;
      if (can_dequantize(t.type)) {
        try { check_blocks(t.type, p, t.n_elements, t.name); } catch (const Error&) {}  // NaN/inf scales: an Error
        out.resize(t.n_elements);
        dequantize(t.type, p, out.data(), t.n_elements);
        g_sink = g_sink + (uint64_t)(out.back() == out.back());
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
