// GGUF reader: maps a file (or takes bytes), parses header, metadata and tensor infos with every length,
// count and offset checked against the file size, so corrupt or hostile files fail with a clear Error; a
// split model's other shards are found by llama.cpp's naming and checked against the split.* keys.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_set>

#include <fmt/format.h>

namespace qrig::gguf {

namespace {

constexpr uint64_t kMaxStringBytes = 1ull << 30;   // one metadata string
constexpr uint64_t kMaxNesting = 8;                 // arrays of arrays
constexpr uint64_t kMaxDims = 4;                    // ggml tensors have at most 4 dims
constexpr uint64_t kMaxTensorNameBytes = 4096;
// Counts a real file never comes near (Qwen3.5: ~35 keys, ~850 tensors, ~750k array elements in all), so a
// corrupt count in a multi-GB file fails here instead of driving allocations sized by the count.
constexpr uint64_t kMaxKv = 1ull << 20;
constexpr uint64_t kMaxTensors = 1ull << 20;
constexpr uint64_t kMaxArrayElements = 1ull << 24;  // all metadata arrays together, nested ones included
// Containers are reserved for at most this many elements up front; beyond it they grow as elements parse
// (each of which consumed file bytes), so memory stays proportional to what the file really holds.
constexpr uint64_t kMaxReserve = 4096;

// Cursor over the untrusted bytes; every read checks the remaining length.
struct Cursor {
  const uint8_t* p;
  uint64_t size;
  uint64_t pos = 0;
  std::string where;  // what is being read, for messages
  uint64_t elements_left = kMaxArrayElements;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("corrupt GGUF at byte {}: {}{}", pos, what, where.empty() ? "" : " (" + where + ")"));
  }
  void need(uint64_t n, const char* what) const {
    if (n > size - pos) fail(fmt::format("truncated: {} needs {} bytes, {} left", what, n, size - pos));
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string read_string(const char* what, uint64_t limit = kMaxStringBytes) {
    uint64_t n = read<uint64_t>(what);
    if (n > limit) fail(fmt::format("{} length {} is larger than allowed ({})", what, n, limit));
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p + pos), n);
    pos += n;
    return s;
  }
};

uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool valid_value_type(uint32_t t) { return t <= 12; }

void read_scalar(Cursor& c, ValueType t, Value& v) {
  switch (t) {
    case ValueType::UINT8: v.u = c.read<uint8_t>("u8"); v.i = (int64_t)v.u; break;
    case ValueType::INT8: v.i = c.read<int8_t>("i8"); v.u = (uint64_t)v.i; break;
    case ValueType::UINT16: v.u = c.read<uint16_t>("u16"); v.i = (int64_t)v.u; break;
    case ValueType::INT16: v.i = c.read<int16_t>("i16"); v.u = (uint64_t)v.i; break;
    case ValueType::UINT32: v.u = c.read<uint32_t>("u32"); v.i = (int64_t)v.u; break;
    case ValueType::INT32: v.i = c.read<int32_t>("i32"); v.u = (uint64_t)v.i; break;
    case ValueType::UINT64: v.u = c.read<uint64_t>("u64"); v.i = (int64_t)v.u; break;
    case ValueType::INT64: v.i = c.read<int64_t>("i64"); v.u = (uint64_t)v.i; break;
    case ValueType::FLOAT32: v.f = c.read<float>("f32"); break;
    case ValueType::FLOAT64: v.f = c.read<double>("f64"); break;
    case ValueType::BOOL: {
      uint8_t b = c.read<uint8_t>("bool");
      if (b > 1) c.fail(fmt::format("bool value {} is neither 0 nor 1", b));
      v.b = b != 0; v.i = b; v.u = b;
      break;
    }
    case ValueType::STRING: v.s = c.read_string("string"); break;
    default: c.fail("unexpected value type");
  }
}

Value read_value(Cursor& c, ValueType t, uint64_t depth);

void read_array(Cursor& c, Value& v, uint64_t depth) {
  if (depth > kMaxNesting) c.fail("arrays nested too deeply");
  uint32_t et = c.read<uint32_t>("array element type");
  if (!valid_value_type(et)) c.fail(fmt::format("unknown array element type {}", et));
  v.elem = static_cast<ValueType>(et);
  uint64_t n = c.read<uint64_t>("array length");
  // Each element takes at least one byte (strings: 8), so n is bounded by the remaining bytes: this stops
  // absurd counts before any allocation.
  uint64_t min_elem = v.elem == ValueType::STRING ? 8 : v.elem == ValueType::ARRAY ? 12 : scalar_size(v.elem);
  if (n > (c.size - c.pos) / min_elem)
    c.fail(fmt::format("truncated or corrupt: array length {} does not fit in the {} bytes left", n, c.size - c.pos));
  if (n > c.elements_left)
    c.fail(fmt::format("array length {} exceeds the limit of {} array elements per file", n, kMaxArrayElements));
  c.elements_left -= n;
  const uint64_t reserve = std::min(n, kMaxReserve);
  switch (v.elem) {
    case ValueType::STRING:
      v.strs.reserve(reserve);
      for (uint64_t k = 0; k < n; ++k) v.strs.push_back(c.read_string("array string"));
      break;
    case ValueType::ARRAY:
      v.arr.reserve(reserve);
      for (uint64_t k = 0; k < n; ++k) v.arr.push_back(read_value(c, ValueType::ARRAY, depth + 1));
      break;
    case ValueType::FLOAT32: case ValueType::FLOAT64:
      v.floats.reserve(reserve);
      for (uint64_t k = 0; k < n; ++k) { Value e; read_scalar(c, v.elem, e); v.floats.push_back(e.f); }
      break;
    default:
      v.ints.reserve(reserve);
      v.uints.reserve(reserve);
      for (uint64_t k = 0; k < n; ++k) {
        Value e;
        read_scalar(c, v.elem, e);
        v.ints.push_back(e.i);
        v.uints.push_back(e.u);
      }
  }
}

Value read_value(Cursor& c, ValueType t, uint64_t depth) {
  Value v;
  v.type = t;
  if (t == ValueType::ARRAY) read_array(c, v, depth);
  else read_scalar(c, t, v);
  return v;
}

const TypeTraits kTraits[] = {
    /*0*/ {"F32", 1, 4}, /*1*/ {"F16", 1, 2}, /*2*/ {"Q4_0", 32, 18}, /*3*/ {"Q4_1", 32, 20},
    /*4*/ {nullptr, 0, 0}, /*5*/ {nullptr, 0, 0}, /*6*/ {"Q5_0", 32, 22}, /*7*/ {"Q5_1", 32, 24},
    /*8*/ {"Q8_0", 32, 34}, /*9*/ {"Q8_1", 32, 36}, /*10*/ {"Q2_K", 256, 84}, /*11*/ {"Q3_K", 256, 110},
    /*12*/ {"Q4_K", 256, 144}, /*13*/ {"Q5_K", 256, 176}, /*14*/ {"Q6_K", 256, 210}, /*15*/ {"Q8_K", 256, 292},
    /*16*/ {"IQ2_XXS", 256, 66}, /*17*/ {"IQ2_XS", 256, 74}, /*18*/ {"IQ3_XXS", 256, 98}, /*19*/ {"IQ1_S", 256, 50},
    /*20*/ {"IQ4_NL", 32, 18}, /*21*/ {"IQ3_S", 256, 110}, /*22*/ {"IQ2_S", 256, 82}, /*23*/ {"IQ4_XS", 256, 136},
    /*24*/ {"I8", 1, 1}, /*25*/ {"I16", 1, 2}, /*26*/ {"I32", 1, 4}, /*27*/ {"I64", 1, 8}, /*28*/ {"F64", 1, 8},
    /*29*/ {"IQ1_M", 256, 56}, /*30*/ {"BF16", 1, 2}, /*31*/ {nullptr, 0, 0}, /*32*/ {nullptr, 0, 0},
    /*33*/ {nullptr, 0, 0}, /*34*/ {"TQ1_0", 256, 54}, /*35*/ {"TQ2_0", 256, 66}, /*36*/ {nullptr, 0, 0},
    /*37*/ {nullptr, 0, 0}, /*38*/ {nullptr, 0, 0}, /*39*/ {"MXFP4", 32, 17},
};

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "unknown";
}

const TypeTraits* type_traits(uint32_t id) {
  if (id >= sizeof(kTraits) / sizeof(kTraits[0]) || kTraits[id].name == nullptr) return nullptr;
  return &kTraits[id];
}

const char* tensor_type_name(TensorType t) {
  const TypeTraits* tr = type_traits(static_cast<uint32_t>(t));
  return tr ? tr->name : "unknown";
}

size_t Value::size() const {
  switch (elem) {
    case ValueType::STRING: return strs.size();
    case ValueType::ARRAY: return arr.size();
    case ValueType::FLOAT32: case ValueType::FLOAT64: return floats.size();
    default: return ints.size();
  }
}

Value Value::of_u16(uint16_t x) { Value v; v.type = ValueType::UINT16; v.u = x; v.i = x; return v; }
Value Value::of_u32(uint32_t x) { Value v; v.type = ValueType::UINT32; v.u = x; v.i = x; return v; }
Value Value::of_u64(uint64_t x) { Value v; v.type = ValueType::UINT64; v.u = x; v.i = (int64_t)x; return v; }
Value Value::of_i32(int32_t x) { Value v; v.type = ValueType::INT32; v.i = x; v.u = (uint64_t)x; return v; }
Value Value::of_f32(float x) { Value v; v.type = ValueType::FLOAT32; v.f = x; return v; }
Value Value::of_bool(bool x) { Value v; v.type = ValueType::BOOL; v.b = x; v.i = x; v.u = x; return v; }
Value Value::of_str(std::string x) { Value v; v.type = ValueType::STRING; v.s = std::move(x); return v; }
Value Value::of_i32s(std::vector<int32_t> x) {
  Value v; v.type = ValueType::ARRAY; v.elem = ValueType::INT32;
  for (int32_t e : x) { v.ints.push_back(e); v.uints.push_back((uint64_t)(int64_t)e); }
  return v;
}
Value Value::of_f32s(std::vector<float> x) {
  Value v; v.type = ValueType::ARRAY; v.elem = ValueType::FLOAT32;
  v.floats.assign(x.begin(), x.end());
  return v;
}
Value Value::of_strs(std::vector<std::string> x) {
  Value v; v.type = ValueType::ARRAY; v.elem = ValueType::STRING; v.strs = std::move(x); return v;
}
Value Value::of_bools(std::vector<bool> x) {
  Value v; v.type = ValueType::ARRAY; v.elem = ValueType::BOOL;
  for (bool e : x) { v.ints.push_back(e); v.uints.push_back(e); }
  return v;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t k = 0; k < ne.size(); ++k) s += (k ? ", " : "") + std::to_string(ne[k]);
  return s + "]";
}

namespace {

// What one file's header says: its metadata and tensor infos, every offset checked against its size.
struct Parsed {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;
  std::vector<std::pair<std::string, Value>> kv;
  std::vector<TensorInfo> tensors;
};

const Value* find_in(const std::vector<std::pair<std::string, Value>>& kv, std::string_view key) {
  for (const auto& [k, v] : kv)
    if (k == key) return &v;
  return nullptr;
}

Parsed parse_image(const uint8_t* base, uint64_t size) {
  Parsed r;
  Cursor c{base, size, 0, {}};
  if (size < 4 || std::memcmp(base, "GGUF", 4) != 0) throw Error("not a GGUF file (bad magic)");
  c.pos = 4;
  r.version = c.read<uint32_t>("version");
  if (r.version != 2 && r.version != 3)
    throw Error(fmt::format("unsupported GGUF version {} (supported: 2, 3)", r.version));
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Every metadata entry needs >= 13 bytes and every tensor info >= 32: bound counts by the file size.
  if (n_kv > (size - c.pos) / 13)
    c.fail(fmt::format("truncated or corrupt: metadata count {} does not fit in the {} bytes left", n_kv, size - c.pos));
  if (n_tensors > (size - c.pos) / 32)
    c.fail(fmt::format("truncated or corrupt: tensor count {} does not fit in the {} bytes left", n_tensors, size - c.pos));
  if (n_kv > kMaxKv) c.fail(fmt::format("metadata count {} exceeds the limit {}", n_kv, kMaxKv));
  if (n_tensors > kMaxTensors) c.fail(fmt::format("tensor count {} exceeds the limit {}", n_tensors, kMaxTensors));

  std::unordered_set<std::string> keys;
  r.kv.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t k = 0; k < n_kv; ++k) {
    c.where = fmt::format("metadata entry {}", k);
    std::string key = c.read_string("key", 1 << 16);
    c.where = "metadata '" + key + "'";
    uint32_t t = c.read<uint32_t>("value type");
    if (!valid_value_type(t)) c.fail(fmt::format("unknown value type {}", t));
    if (!keys.insert(key).second) c.fail("duplicate key");
    r.kv.emplace_back(key, read_value(c, static_cast<ValueType>(t), 0));
  }
  if (const Value* a = find_in(r.kv, "general.alignment")) {
    if (a->type != ValueType::UINT32 && a->type != ValueType::UINT64)
      throw Error("general.alignment must be an unsigned integer");
    if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20))
      throw Error(fmt::format("general.alignment {} is not a power of two up to 1 MiB", a->u));
    r.alignment = a->u;
  }

  std::unordered_set<std::string> names;
  r.tensors.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    c.where = fmt::format("tensor info {}", k);
    TensorInfo ti;
    ti.name = c.read_string("tensor name", kMaxTensorNameBytes);
    c.where = "tensor '" + ti.name + "'";
    if (!names.insert(ti.name).second) c.fail("duplicate tensor name");
    uint32_t nd = c.read<uint32_t>("dimension count");
    if (nd == 0 || nd > kMaxDims) c.fail(fmt::format("dimension count {} (must be 1..4)", nd));
    ti.n_elements = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      uint64_t e = c.read<uint64_t>("dimension");
      if (e == 0 || e > (1ull << 40)) c.fail(fmt::format("dimension {} = {} is out of range", d, e));
      if (ti.n_elements > std::numeric_limits<uint64_t>::max() / e) c.fail("element count overflows");
      ti.n_elements *= e;
      ti.ne.push_back(e);
    }
    if (ti.n_elements > (1ull << 42)) c.fail("element count is absurd");
    uint32_t type = c.read<uint32_t>("tensor type");
    const TypeTraits* tr = type_traits(type);
    if (!tr) c.fail(fmt::format("unknown tensor type id {}", type));
    ti.type = static_cast<TensorType>(type);
    if (ti.ne[0] % tr->block_elems != 0)
      c.fail(fmt::format("first dimension {} is not a multiple of the {} block size {}", ti.ne[0], tr->name,
                         tr->block_elems));
    ti.n_bytes = ti.n_elements / tr->block_elems * tr->block_bytes;
    ti.offset = c.read<uint64_t>("tensor data offset");
    if (ti.offset % r.alignment != 0) c.fail(fmt::format("data offset {} is not aligned to {}", ti.offset, r.alignment));
    r.tensors.push_back(std::move(ti));
  }
  c.where.clear();
  r.data_offset = (c.pos + r.alignment - 1) / r.alignment * r.alignment;
  if (r.tensors.empty()) {
    if (r.data_offset > size) r.data_offset = size;
    return r;
  }
  if (r.data_offset > size) throw Error(fmt::format("truncated: data section starts at {} past end of file ({} bytes)", r.data_offset, size));
  uint64_t avail = size - r.data_offset;
  for (const TensorInfo& t : r.tensors) {
    if (t.offset > avail || t.n_bytes > avail - t.offset)
      throw Error(fmt::format("truncated or corrupt: tensor '{}' ({} {}, {} bytes at data offset {}) extends past the end of the file",
                              t.name, tensor_type_name(t.type), t.shape_string(), t.n_bytes, t.offset));
  }
  // Tensors must not share bytes (a writer never produces that; a corrupt offset does).
  std::vector<size_t> order(r.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.tensors[a].offset < r.tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = r.tensors[order[k - 1]];
    const TensorInfo& cur = r.tensors[order[k]];
    if (prev.offset + prev.n_bytes > cur.offset)
      throw Error(fmt::format("corrupt GGUF: data of tensors '{}' (bytes {}..{}) and '{}' (from byte {}) overlap", prev.name,
                              prev.offset, prev.offset + prev.n_bytes, cur.name, cur.offset));
  }
  return r;
}

// A split key's value: any non-negative integer up to `max`; nullopt when the key is absent.
std::optional<uint64_t> split_key(const std::vector<std::pair<std::string, Value>>& kv, const char* key,
                                  const std::string& path, uint64_t max) {
  const Value* v = find_in(kv, key);
  if (!v) return std::nullopt;
  const bool integer = v->type != ValueType::FLOAT32 && v->type != ValueType::FLOAT64 && v->type != ValueType::STRING &&
                       v->type != ValueType::ARRAY && v->type != ValueType::BOOL;
  const bool negative = (v->type == ValueType::INT8 || v->type == ValueType::INT16 || v->type == ValueType::INT32 ||
                         v->type == ValueType::INT64) && v->i < 0;
  if (!integer || negative || v->u > max)
    throw Error(fmt::format("{}: metadata key '{}' must be an integer in [0, {}]", path, key, max));
  return v->u;
}

}  // namespace

std::string split_path(const std::string& prefix, uint32_t no, uint32_t count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, no + 1, count);
}

std::optional<std::string> split_prefix(const std::string& path, uint32_t no, uint32_t count) {
  const std::string tail = fmt::format("-{:05d}-of-{:05d}.gguf", no + 1, count);
  if (path.size() <= tail.size() || path.compare(path.size() - tail.size(), tail.size(), tail) != 0) return std::nullopt;
  return path.substr(0, path.size() - tail.size());
}

File::Mapping::Mapping(Mapping&& o) noexcept { *this = std::move(o); }
File::Mapping& File::Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (map) munmap(map, size);
    base = o.base; size = o.size; map = o.map;
    owned = std::move(o.owned);
    o.map = nullptr; o.base = nullptr; o.size = 0;
  }
  return *this;
}
File::Mapping::~Mapping() {
  if (map) munmap(map, size);
}

File::Mapping File::map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("'{}' is not a regular file", path));
  }
  Mapping m;
  m.size = static_cast<uint64_t>(st.st_size);
  if (m.size > 0) {
    void* p = mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw Error(fmt::format("cannot map '{}': {}", path, std::strerror(errno)));
    m.map = p;
    m.base = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return m;
}

File File::open(const std::string& path) {
  File f;
  f.maps_.push_back(map_file(path));
  Parsed r;
  try {
    r = parse_image(f.maps_[0].base, f.maps_[0].size);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  f.version_ = r.version;
  f.alignment_ = r.alignment;
  f.kv_ = std::move(r.kv);
  f.tensors_ = std::move(r.tensors);
  f.shards_.push_back({path, f.maps_[0].size, r.data_offset, (uint64_t)f.tensors_.size()});
  f.open_other_shards();
  return f;
}

// A split model given by its first shard: maps shards 2..N (named as llama.cpp names them) and adds their
// tensors. Every shard must say it is shard k of the same N; the tensors of all of them must add up to
// split.tensors.count and never repeat a name.
void File::open_other_shards() {
  const std::string first = shards_[0].path;  // a copy: shards_ grows below
  const auto count = split_key(kv_, kSplitCount, first, 65535);
  if (!count || *count <= 1) return;
  const auto no = split_key(kv_, kSplitNo, first, 65535).value_or(0);
  const auto n = (uint32_t)*count;
  if (no != 0) {
    const auto prefix = split_prefix(first, (uint32_t)no, n);
    throw Error(fmt::format("{} is shard {} of {} of a split model: give the first shard{}", first, no + 1, n,
                            prefix ? " (" + split_path(*prefix, 0, n) + ")" : std::string()));
  }
  const auto prefix = split_prefix(first, 0, n);
  if (!prefix)
    throw Error(fmt::format("{} is the first of {} shards of a split model, but its name does not end in "
                            "-00001-of-{:05d}.gguf, so the other shards cannot be found (keep gguf-split's names)",
                            first, n, n));
  const auto total = split_key(kv_, kSplitTensorsCount, first, kMaxTensors);
  std::unordered_set<std::string> names;
  for (const TensorInfo& t : tensors_) names.insert(t.name);
  for (uint32_t k = 1; k < n; ++k) {
    const std::string path = split_path(*prefix, k, n);
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0)
      throw Error(fmt::format("split model {}: shard {} of {} is missing: {} ({})", first, k + 1, n, path,
                              std::strerror(errno)));
    maps_.push_back(map_file(path));
    Parsed r;
    try {
      r = parse_image(maps_.back().base, maps_.back().size);
    } catch (const Error& e) {
      throw Error(fmt::format("split model {}: shard {} of {} ({}): {}", first, k + 1, n, path, e.what()));
    }
    const auto their_count = split_key(r.kv, kSplitCount, path, 65535);
    const auto their_no = split_key(r.kv, kSplitNo, path, 65535);
    if (their_count != count || their_no != k)
      throw Error(fmt::format("split model {}: {} is not shard {} of {} of it (its split.no is {}, split.count {})", first,
                              path, k + 1, n, their_no ? std::to_string(*their_no) : "missing",
                              their_count ? std::to_string(*their_count) : "missing"));
    const auto their_total = split_key(r.kv, kSplitTensorsCount, path, kMaxTensors);
    if (their_total && total && *their_total != *total)
      throw Error(fmt::format("split model {}: shard {} says the model has {} tensors, the first shard says {}: the "
                              "shards come from different files", first, path, *their_total, *total));
    for (TensorInfo& t : r.tensors) {
      if (!names.insert(t.name).second)
        throw Error(fmt::format("split model {}: tensor '{}' of {} is also in an earlier shard", first, t.name, path));
      t.shard = k;
      tensors_.push_back(std::move(t));
    }
    shards_.push_back({path, maps_.back().size, r.data_offset, (uint64_t)r.tensors.size()});
  }
  if (total && *total != tensors_.size())
    throw Error(fmt::format("split model {}: split.tensors.count is {} but its {} shards hold {} tensors", first, *total,
                            n, tensors_.size()));
}

File File::from_bytes(const uint8_t* data, size_t size, std::string name) {
  File f;
  Mapping m;
  m.owned = std::make_unique<std::vector<uint8_t>>(data, data + size);
  m.base = m.owned->data();
  m.size = size;
  f.maps_.push_back(std::move(m));
  Parsed r = parse_image(f.maps_[0].base, f.maps_[0].size);
  f.version_ = r.version;
  f.alignment_ = r.alignment;
  f.kv_ = std::move(r.kv);
  f.tensors_ = std::move(r.tensors);
  f.shards_.push_back({std::move(name), size, r.data_offset, (uint64_t)f.tensors_.size()});
  return f;
}

uint64_t File::file_size() const {
  uint64_t n = 0;
  for (const Shard& s : shards_) n += s.size;
  return n;
}

const Value* File::find(std::string_view key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

namespace {
[[noreturn]] void missing(const File& f, std::string_view key, const char* want) {
  const Value* v = f.find(key);
  if (!v) throw Error(fmt::format("{}: metadata key '{}' is missing", f.path(), key));
  throw Error(fmt::format("{}: metadata key '{}' has type {}, expected {}", f.path(), key, value_type_name(v->type), want));
}
bool is_int(ValueType t) {
  return t != ValueType::FLOAT32 && t != ValueType::FLOAT64 && t != ValueType::STRING && t != ValueType::ARRAY &&
         t != ValueType::BOOL;
}
bool is_signed(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}
}  // namespace

uint64_t File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v || !is_int(v->type)) missing(*this, key, "unsigned integer");
  if (is_signed(v->type) && v->i < 0)
    throw Error(fmt::format("{}: metadata key '{}' is negative ({})", path(), key, v->i));
  return v->u;
}
int64_t File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v || !is_int(v->type)) missing(*this, key, "integer");
  if (!is_signed(v->type) && v->u > (uint64_t)std::numeric_limits<int64_t>::max())
    throw Error(fmt::format("{}: metadata key '{}' is too large", path(), key));
  return v->i;
}
double File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) missing(*this, key, "number");
  if (v->type == ValueType::FLOAT32 || v->type == ValueType::FLOAT64) return v->f;
  if (is_int(v->type)) return is_signed(v->type) ? (double)v->i : (double)v->u;
  missing(*this, key, "number");
}
bool File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::BOOL) missing(*this, key, "bool");
  return v->b;
}
const std::string& File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::STRING) missing(*this, key, "string");
  return v->s;
}
std::vector<int64_t> File::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::ARRAY || !(is_int(v->elem) || v->elem == ValueType::BOOL))
    missing(*this, key, "integer array");
  return v->ints;
}
const std::vector<std::string>& File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::ARRAY || v->elem != ValueType::STRING) missing(*this, key, "string array");
  return v->strs;
}
std::optional<uint64_t> File::opt_uint(std::string_view key) const {
  if (!find(key)) return std::nullopt;
  return get_uint(key);
}
std::optional<std::string> File::opt_string(std::string_view key) const {
  if (!find(key)) return std::nullopt;
  return get_string(key);
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}
const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) throw Error(fmt::format("{}: tensor '{}' is missing", path(), name));
  return *t;
}
const uint8_t* File::tensor_data(const TensorInfo& t) const {
  return maps_[t.shard].base + shards_[t.shard].data_offset + t.offset;
}

}  // namespace qrig::gguf
