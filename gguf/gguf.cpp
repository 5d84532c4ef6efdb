// GGUF reader: maps a file (or takes bytes), parses header, metadata and tensor infos with every length,
// count and offset checked against the file size, so corrupt or hostile files fail with a clear Error.
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

File File::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("'{}' is not a regular file", path));
  }
  File f;
  f.path_ = path;
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* m = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw Error(fmt::format("cannot map '{}': {}", path, std::strerror(errno)));
    f.map_ = m;
    f.base_ = static_cast<const uint8_t*>(m);
  } else {
    ::close(fd);
  }
  try {
    f.parse();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  return f;
}

File File::from_bytes(const uint8_t* data, size_t size, std::string name) {
  File f;
  f.path_ = std::move(name);
  f.owned_ = std::make_unique<std::vector<uint8_t>>(data, data + size);
  f.base_ = f.owned_->data();
  f.size_ = size;
  f.parse();
  return f;
}

File::File(File&& o) noexcept { *this = std::move(o); }
File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, size_);
    path_ = std::move(o.path_);
    base_ = o.base_; size_ = o.size_; map_ = o.map_;
    owned_ = std::move(o.owned_);
    version_ = o.version_; alignment_ = o.alignment_; data_offset_ = o.data_offset_;
    kv_ = std::move(o.kv_); tensors_ = std::move(o.tensors_);
    o.map_ = nullptr; o.base_ = nullptr; o.size_ = 0;
  }
  return *this;
}
File::~File() {
  if (map_) munmap(map_, size_);
}

void File::parse() {
  Cursor c{base_, size_, 0, {}};
  if (size_ < 4 || std::memcmp(base_, "GGUF", 4) != 0) throw Error("not a GGUF file (bad magic)");
  c.pos = 4;
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    throw Error(fmt::format("unsupported GGUF version {} (supported: 2, 3)", version_));
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Every metadata entry needs >= 13 bytes and every tensor info >= 32: bound counts by the file size.
  if (n_kv > (size_ - c.pos) / 13)
    c.fail(fmt::format("truncated or corrupt: metadata count {} does not fit in the {} bytes left", n_kv, size_ - c.pos));
  if (n_tensors > (size_ - c.pos) / 32)
    c.fail(fmt::format("truncated or corrupt: tensor count {} does not fit in the {} bytes left", n_tensors, size_ - c.pos));
  if (n_kv > kMaxKv) c.fail(fmt::format("metadata count {} exceeds the limit {}", n_kv, kMaxKv));
  if (n_tensors > kMaxTensors) c.fail(fmt::format("tensor count {} exceeds the limit {}", n_tensors, kMaxTensors));

  std::unordered_set<std::string> keys;
  kv_.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t k = 0; k < n_kv; ++k) {
    c.where = fmt::format("metadata entry {}", k);
    std::string key = c.read_string("key", 1 << 16);
    c.where = "metadata '" + key + "'";
    uint32_t t = c.read<uint32_t>("value type");
    if (!valid_value_type(t)) c.fail(fmt::format("unknown value type {}", t));
    if (!keys.insert(key).second) c.fail("duplicate key");
    kv_.emplace_back(key, read_value(c, static_cast<ValueType>(t), 0));
  }
  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::UINT32 && a->type != ValueType::UINT64)
      throw Error("general.alignment must be an unsigned integer");
    if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20))
      throw Error(fmt::format("general.alignment {} is not a power of two up to 1 MiB", a->u));
    alignment_ = a->u;
  }

  std::unordered_set<std::string> names;
  tensors_.reserve(std::min(n_tensors, kMaxReserve));
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
    if (ti.offset % alignment_ != 0) c.fail(fmt::format("data offset {} is not aligned to {}", ti.offset, alignment_));
    tensors_.push_back(std::move(ti));
  }
  c.where.clear();
  data_offset_ = (c.pos + alignment_ - 1) / alignment_ * alignment_;
  if (tensors_.empty()) {
    if (data_offset_ > size_) data_offset_ = size_;
    return;
  }
  if (data_offset_ > size_) throw Error(fmt::format("truncated: data section starts at {} past end of file ({} bytes)", data_offset_, size_));
  uint64_t avail = size_ - data_offset_;
  for (const TensorInfo& t : tensors_) {
    if (t.offset > avail || t.n_bytes > avail - t.offset)
      throw Error(fmt::format("truncated or corrupt: tensor '{}' ({} {}, {} bytes at data offset {}) extends past the end of the file",
                              t.name, tensor_type_name(t.type), t.shape_string(), t.n_bytes, t.offset));
  }
  // Tensors must not share bytes (a writer never produces that; a corrupt offset does).
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors_[order[k - 1]];
    const TensorInfo& cur = tensors_[order[k]];
    if (prev.offset + prev.n_bytes > cur.offset)
      throw Error(fmt::format("corrupt GGUF: data of tensors '{}' (bytes {}..{}) and '{}' (from byte {}) overlap", prev.name,
                              prev.offset, prev.offset + prev.n_bytes, cur.name, cur.offset));
  }
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
    throw Error(fmt::format("{}: metadata key '{}' is negative ({})", path_, key, v->i));
  return v->u;
}
int64_t File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v || !is_int(v->type)) missing(*this, key, "integer");
  if (!is_signed(v->type) && v->u > (uint64_t)std::numeric_limits<int64_t>::max())
    throw Error(fmt::format("{}: metadata key '{}' is too large", path_, key));
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
  if (!t) throw Error(fmt::format("{}: tensor '{}' is missing", path_, name));
  return *t;
}
const uint8_t* File::tensor_data(const TensorInfo& t) const { return base_ + data_offset_ + t.offset; }

}  // namespace qrig::gguf
