// Test helper shared by the areas that load split models (gguf, cli): writes a GGUF as the shards llama.cpp's
// gguf-split makes, with qrig's GGUF writer: PREFIX-00001-of-0000N.gguf ..., the first shard holding every
// metadata key, each shard split.no (u16, from 0), split.count (u16) and split.tensors.count (i32, all shards
// together), the tensors in their original order, cut into N runs of about equal count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace qrig::fixtures {

struct SplitOptions {
  int32_t tensors_count = -1;  // split.tensors.count to write; -1: the true total
};

// Returns the shard paths in order.
inline std::vector<std::string> write_split_gguf(const gguf::File& src, const std::string& prefix, uint32_t n,
                                                 SplitOptions opt = {}) {
  const auto& tensors = src.tensors();
  const int32_t total = opt.tensors_count >= 0 ? opt.tensors_count : (int32_t)tensors.size();
  std::vector<std::string> paths;
  for (uint32_t k = 0; k < n; ++k) {
    gguf::Writer w;
    if (k == 0)
      for (const auto& [key, v] : src.metadata()) w.set(key, v);
    w.set(gguf::kSplitNo, gguf::Value::of_u16((uint16_t)k));
    w.set(gguf::kSplitCount, gguf::Value::of_u16((uint16_t)n));
    w.set(gguf::kSplitTensorsCount, gguf::Value::of_i32(total));
    const size_t first = tensors.size() * k / n, last = tensors.size() * (k + 1) / n;
    for (size_t i = first; i < last; ++i) {
      const gguf::TensorInfo& t = tensors[i];
      const uint8_t* d = src.tensor_data(t);
      w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(d, d + t.n_bytes));
    }
    paths.push_back(gguf::split_path(prefix, k, n));
    w.write(paths.back());
  }
  return paths;
}

}  // namespace qrig::fixtures
