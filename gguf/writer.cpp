// GGUF writer implementation: serialises metadata values (including nested arrays) and aligned tensor data,
// streaming it to a sink (a file or a byte vector) so callback-produced tensors never sit in memory whole.
#include "gguf/writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include <fmt/format.h>

namespace qrig::gguf {

namespace {
constexpr uint64_t kFillChunkBytes = 16ull << 20;  // rows produced per RowFill call, about this many bytes

struct Out {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
};

void put_scalar(Out& o, ValueType t, uint64_t u, int64_t i, double f, bool bo, const std::string& s) {
  switch (t) {
    case ValueType::UINT8: o.put<uint8_t>((uint8_t)u); break;
    case ValueType::INT8: o.put<int8_t>((int8_t)i); break;
    case ValueType::UINT16: o.put<uint16_t>((uint16_t)u); break;
    case ValueType::INT16: o.put<int16_t>((int16_t)i); break;
    case ValueType::UINT32: o.put<uint32_t>((uint32_t)u); break;
    case ValueType::INT32: o.put<int32_t>((int32_t)i); break;
    case ValueType::UINT64: o.put<uint64_t>(u); break;
    case ValueType::INT64: o.put<int64_t>(i); break;
    case ValueType::FLOAT32: o.put<float>((float)f); break;
    case ValueType::FLOAT64: o.put<double>(f); break;
    case ValueType::BOOL: o.put<uint8_t>(bo ? 1 : 0); break;
    case ValueType::STRING: o.str(s); break;
    default: throw Error("writer: bad scalar type");
  }
}

void put_value(Out& o, const Value& v) {
  if (v.type != ValueType::ARRAY) {
    put_scalar(o, v.type, v.u, v.i, v.f, v.b, v.s);
    return;
  }
  o.put<uint32_t>((uint32_t)v.elem);
  o.put<uint64_t>(v.size());
  static const std::string empty;
  switch (v.elem) {
    case ValueType::STRING: for (const auto& s : v.strs) o.str(s); break;
    case ValueType::ARRAY: for (const auto& a : v.arr) put_value(o, a); break;
    case ValueType::FLOAT32: case ValueType::FLOAT64:
      for (double f : v.floats) put_scalar(o, v.elem, 0, 0, f, false, empty);
      break;
    default:
      for (size_t k = 0; k < v.ints.size(); ++k) {
        uint64_t u = k < v.uints.size() ? v.uints[k] : (uint64_t)v.ints[k];
        put_scalar(o, v.elem, u, v.ints[k], 0, v.ints[k] != 0, empty);
      }
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
}  // namespace

void Writer::set(const std::string& key, Value v) {
  if (key == "general.alignment") {
    if ((v.type != ValueType::UINT32 && v.type != ValueType::UINT64) || v.u == 0 || (v.u & (v.u - 1)) != 0 ||
        v.u > (1u << 20))
      throw Error("writer: general.alignment must be a UINT32/UINT64 power of two up to 1 MiB");
    alignment_ = v.u;
  }
  for (auto& [k, old] : kv_)
    if (k == key) { old = std::move(v); return; }
  kv_.emplace_back(key, std::move(v));
}

void Writer::check_new_tensor(const std::string& name, TensorType type, const std::vector<uint64_t>& ne,
                              uint64_t& n_bytes, uint64_t& row_bytes) const {
  const TypeTraits* tr = type_traits((uint32_t)type);
  if (!tr) throw Error(fmt::format("writer: tensor '{}' has unknown type id {}", name, (uint32_t)type));
  if (ne.empty() || ne.size() > 4) throw Error(fmt::format("writer: tensor '{}' has {} dimensions", name, ne.size()));
  uint64_t n = 1;
  for (uint64_t e : ne) {
    if (e == 0 || n > std::numeric_limits<uint64_t>::max() / e)
      throw Error(fmt::format("writer: tensor '{}' has a bad dimension", name));
    n *= e;
  }
  if (ne[0] % tr->block_elems)
    throw Error(fmt::format("writer: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", name, ne[0],
                            tr->name, tr->block_elems));
  for (const Tensor& t : tensors_)
    if (t.name == name) throw Error(fmt::format("writer: duplicate tensor name '{}'", name));
  row_bytes = ne[0] / tr->block_elems * tr->block_bytes;
  n_bytes = n / tr->block_elems * tr->block_bytes;
}

void Writer::add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> ne, std::vector<uint8_t> data) {
  uint64_t n_bytes = 0, row_bytes = 0;
  check_new_tensor(name, type, ne, n_bytes, row_bytes);
  if (n_bytes != data.size())
    throw Error(fmt::format("writer: tensor '{}' has {} bytes, shape needs {}", name, data.size(), n_bytes));
  tensors_.push_back({name, type, std::move(ne), n_bytes, row_bytes, std::move(data), nullptr});
}

void Writer::add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> ne, RowFill fill) {
  uint64_t n_bytes = 0, row_bytes = 0;
  check_new_tensor(name, type, ne, n_bytes, row_bytes);
  if (!fill) throw Error(fmt::format("writer: tensor '{}' has no data source", name));
  tensors_.push_back({name, type, std::move(ne), n_bytes, row_bytes, {}, std::move(fill)});
}

std::vector<Writer::Entry> Writer::tensor_table() const {
  std::vector<Entry> out;
  uint64_t off = 0;
  for (const Tensor& t : tensors_) {
    out.push_back({t.name, t.type, t.ne, off, t.n_bytes});
    off += align_up(t.n_bytes, alignment_);
  }
  return out;
}

std::vector<uint8_t> Writer::header() const {
  Out o;
  o.put<uint32_t>(0x46554747);  // "GGUF"
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    o.str(k);
    o.put<uint32_t>((uint32_t)v.type);
    put_value(o, v);
  }
  for (const Entry& e : tensor_table()) {
    o.str(e.name);
    o.put<uint32_t>((uint32_t)e.ne.size());
    for (uint64_t d : e.ne) o.put<uint64_t>(d);
    o.put<uint32_t>((uint32_t)e.type);
    o.put<uint64_t>(e.offset);
  }
  return o.b;
}

uint64_t Writer::data_offset() const { return align_up(header().size(), alignment_); }

uint64_t Writer::file_size() const {
  uint64_t n = data_offset();
  for (const Tensor& t : tensors_) n += align_up(t.n_bytes, alignment_);
  return n;
}

void Writer::emit(const Sink& out) const {
  static const uint8_t zeros[256] = {};
  auto pad = [&](uint64_t n) {
    uint64_t fill = align_up(n, alignment_) - n;
    while (fill) {
      size_t k = (size_t)std::min<uint64_t>(fill, sizeof zeros);
      out(zeros, k);
      fill -= k;
    }
  };
  std::vector<uint8_t> h = header();
  out(h.data(), h.size());
  pad(h.size());
  std::vector<uint8_t> buf;
  for (const Tensor& t : tensors_) {
    if (!t.fill) {
      out(t.data.data(), t.data.size());
    } else {
      uint64_t n_rows = t.n_bytes / t.row_bytes;
      uint64_t chunk_rows = std::max<uint64_t>(1, kFillChunkBytes / t.row_bytes);
      buf.resize((size_t)(std::min(chunk_rows, n_rows) * t.row_bytes));
      for (uint64_t r = 0; r < n_rows; r += chunk_rows) {
        uint64_t k = std::min(chunk_rows, n_rows - r);
        t.fill(r, k, buf.data());
        out(buf.data(), (size_t)(k * t.row_bytes));
      }
    }
    pad(t.n_bytes);
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> b;
  b.reserve((size_t)file_size());
  emit([&](const uint8_t* p, size_t n) { b.insert(b.end(), p, p + n); });
  return b;
}

void Writer::write(const std::string& path) const {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(fmt::format("cannot write '{}': {}", tmp, std::strerror(errno)));
  try {
    emit([&](const uint8_t* p, size_t n) {
      if (std::fwrite(p, 1, n, f) != n) throw Error(fmt::format("write to '{}' failed: {}", tmp, std::strerror(errno)));
    });
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("write to '{}' failed: {}", tmp, std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
  }
}

}  // namespace qrig::gguf
