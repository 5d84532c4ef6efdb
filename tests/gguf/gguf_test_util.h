// Helpers for the GGUF tests: fixture bytes, an independent little walker that finds where each field of a
// (trusted) GGUF file lies so tests can check the reader against raw bytes and patch fields precisely, and a
// byte builder for hand-made files.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>
#include "tests/fixtures.h"

namespace qrig::gguf_test {

inline std::string tiny_path() { return qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf"; }

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

inline const std::vector<uint8_t>& tiny_bytes() {
  static const std::vector<uint8_t> b = read_file(tiny_path());
  return b;
}

template <class T>
T get_le(const std::vector<uint8_t>& b, size_t pos) {
  T v;
  std::memcpy(&v, b.data() + pos, sizeof(T));
  return v;
}
template <class T>
void put_le(std::vector<uint8_t>& b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
}

// Byte positions of the fields of each metadata entry and tensor info.
struct KvPos {
  size_t key_len = 0, type = 0, value = 0, end = 0;
};
struct TensorPos {
  std::string name;
  size_t name_len = 0, n_dims = 0, dims = 0, type = 0, offset = 0, end = 0;
};
struct Layout {
  std::map<std::string, KvPos> kv;
  std::vector<TensorPos> tensors;
  size_t kv_start = 24, infos_start = 0, infos_end = 0;
  const TensorPos& tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
};

// Walks a well-formed GGUF v2/v3 file without the reader (no checks: fixtures only).
inline Layout walk(const std::vector<uint8_t>& b) {
  Layout l;
  size_t p = 8;
  uint64_t n_tensors = get_le<uint64_t>(b, p), n_kv = get_le<uint64_t>(b, p + 8);
  p = 24;
  auto str = [&](size_t& q) {
    uint64_t n = get_le<uint64_t>(b, q);
    std::string s(reinterpret_cast<const char*>(b.data() + q + 8), n);
    q += 8 + n;
    return s;
  };
  auto skip = [&](auto& self, uint32_t type, size_t& q) -> void {
    static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      str(q);
    } else if (type == 9) {
      uint32_t et = get_le<uint32_t>(b, q);
      uint64_t n = get_le<uint64_t>(b, q + 4);
      q += 12;
      for (uint64_t k = 0; k < n; ++k) self(self, et, q);
    } else {
      q += sizes[type];
    }
  };
  for (uint64_t k = 0; k < n_kv; ++k) {
    KvPos kp;
    kp.key_len = p;
    std::string key = str(p);
    kp.type = p;
    uint32_t type = get_le<uint32_t>(b, p);
    p += 4;
    kp.value = p;
    skip(skip, type, p);
    kp.end = p;
    l.kv[key] = kp;
  }
  l.infos_start = p;
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorPos t;
    t.name_len = p;
    t.name = str(p);
    t.n_dims = p;
    uint32_t nd = get_le<uint32_t>(b, p);
    t.dims = p + 4;
    p += 4 + 8 * nd;
    t.type = p;
    t.offset = p + 4;
    p += 12;
    t.end = p;
    l.tensors.push_back(t);
  }
  l.infos_end = p;
  return l;
}

// Little-endian builder for hand-made (possibly malformed) files.
struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  Bytes& put(T v) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);  // "GGUF"
  }
  Bytes& pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

}  // namespace qrig::gguf_test
