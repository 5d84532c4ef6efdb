// GGUF file format: reading (mmap, untrusted input, every length bounds-checked; a model split into shards
// by llama.cpp's gguf-split read as one file) and the value and tensor-type vocabulary shared by the reader,
// the writer and dequantization. Includes nothing of qrig.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qrig::gguf {

// Everything wrong with a file (truncated, corrupt, hostile, unsupported) is reported as this.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// ggml tensor types. The reader knows every type's block layout (so files with any of them can be
// listed and bounds-checked); dequantize() supports the types dequantizable_types() lists.
enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10,
  Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18,
  IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26,
  I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};
struct TypeTraits {
  const char* name;
  uint32_t block_elems;  // values per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
};
// nullptr for a type id this reader does not know.
const TypeTraits* type_traits(uint32_t type_id);
const char* tensor_type_name(TensorType t);

// A metadata value. Scalars live in u/i/f/b/s by kind; arrays keep their element type and a
// typed vector (nested arrays in `arr`).
struct Value {
  ValueType type = ValueType::UINT8;
  uint64_t u = 0;   // UINT8..UINT64
  int64_t i = 0;    // INT8..INT64 (also mirrors unsigned values that fit)
  double f = 0;     // FLOAT32/FLOAT64
  bool b = false;   // BOOL
  std::string s;    // STRING
  ValueType elem = ValueType::UINT8;  // ARRAY element type
  std::vector<int64_t> ints;          // integer/bool arrays
  std::vector<uint64_t> uints;        // unsigned arrays (exact, including UINT64 > INT64_MAX)
  std::vector<double> floats;         // float arrays
  std::vector<std::string> strs;      // string arrays
  std::vector<Value> arr;             // arrays of arrays
  size_t size() const;                // element count of an array

  static Value of_u16(uint16_t v);
  static Value of_u32(uint32_t v);
  static Value of_u64(uint64_t v);
  static Value of_i32(int32_t v);
  static Value of_f32(float v);
  static Value of_bool(bool v);
  static Value of_str(std::string v);
  static Value of_i32s(std::vector<int32_t> v);
  static Value of_f32s(std::vector<float> v);
  static Value of_strs(std::vector<std::string> v);
  static Value of_bools(std::vector<bool> v);
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the fastest (innermost, "in") dimension
  TensorType type = TensorType::F32;
  uint64_t offset = 0;       // relative to the start of the data section of its shard
  uint32_t shard = 0;        // which file of a split model holds the data (0: the first, or the only one)
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  std::string shape_string() const;  // e.g. "[256, 1024]"
};

// The keys llama.cpp's gguf-split writes into every shard of a split model (`NAME-00001-of-00003.gguf` ...):
// the shard's number (from 0), how many shards there are and the tensors of all shards together. The first
// shard holds every other metadata key; each shard holds its own tensors and their data.
constexpr const char* kSplitNo = "split.no";
constexpr const char* kSplitCount = "split.count";
constexpr const char* kSplitTensorsCount = "split.tensors.count";
// The file name of shard `no` (from 0) of `count` for a prefix: PREFIX-00002-of-00003.gguf (llama.cpp's naming).
std::string split_path(const std::string& prefix, uint32_t no, uint32_t count);
// The prefix of a shard's path when its name follows that naming with these numbers; nullopt otherwise.
std::optional<std::string> split_prefix(const std::string& path, uint32_t no, uint32_t count);

// A read-only GGUF model. Construction parses and validates the header, metadata and tensor infos; tensor
// data stays in the mapping. A split model (split.count > 1) opened by its first shard maps every shard:
// metadata comes from the first, tensors from all of them, each tensor_data() pointing into its own file; a
// missing, extra or mismatched shard is an Error naming it.
class File {
 public:
  static File open(const std::string& path);
  // Parse an in-memory image (tests, fuzzing). The bytes are copied. Other shards are not looked for.
  static File from_bytes(const uint8_t* data, size_t size, std::string name = "<memory>");

  struct Shard {
    std::string path;
    uint64_t size = 0;         // bytes of this file
    uint64_t data_offset = 0;  // where its data section starts
    uint64_t tensors = 0;      // tensors whose data it holds
  };

  const std::string& path() const { return shards_[0].path; }  // the first (or only) file
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return shards_[0].data_offset; }  // of the first file
  uint64_t file_size() const;  // bytes of every file of the model together (one file: its size)
  const std::vector<Shard>& shards() const { return shards_; }  // one entry unless the model is split

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Typed getters: throw Error naming the key when missing or of the wrong kind.
  uint64_t get_uint(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  std::optional<uint64_t> opt_uint(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // throws Error naming the tensor
  const uint8_t* tensor_data(const TensorInfo& t) const;  // into the file that holds t (t.shard)
  const uint8_t* bytes() const { return maps_[0].base; }  // the first file's bytes

  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;
  ~File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

 private:
  // One file's bytes: an mmap (unmapped on destruction) or an owned copy.
  struct Mapping {
    const uint8_t* base = nullptr;
    uint64_t size = 0;
    void* map = nullptr;
    std::unique_ptr<std::vector<uint8_t>> owned;
    Mapping() = default;
    Mapping(Mapping&& o) noexcept;
    Mapping& operator=(Mapping&& o) noexcept;
    ~Mapping();
  };
  File() = default;
  static Mapping map_file(const std::string& path);
  void open_other_shards();
  std::vector<Mapping> maps_;   // per shard
  std::vector<Shard> shards_;   // per shard
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorInfo> tensors_;
};

// Convert n values of a tensor (starting at a block boundary; n a multiple of the type's block) to float,
// bit for bit as llama.cpp's reference dequantize_row_* (ggml-quants.c). Throws Error for a type
// can_dequantize() refuses, naming it. Scales are not checked here (a NaN scale gives NaN values):
// check_blocks() is the load-time check.
void dequantize(TensorType type, const uint8_t* src, float* dst, size_t n);
bool can_dequantize(TensorType type);
// "F32, F16, BF16, Q8_0, Q4_0, ...": the types can_dequantize() accepts, for messages.
const char* dequantizable_types();
// The load-time check of a block-quantized tensor's n values at src: throws Error naming `what`, the block
// and the byte when one of its fp16 scales is NaN or infinite (such a block would turn every value it
// holds into NaN). Plain types (F32, F16, BF16) pass unchecked.
void check_blocks(TensorType type, const uint8_t* src, size_t n, const std::string& what);
float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);
float bf16_to_float(uint16_t h);
// Q8_0: 32 values per block, fp16 scale then 32 int8; quantize n (multiple of 32) floats.
void quantize_q8_0(const float* src, uint8_t* dst, size_t n);
constexpr size_t kQ8_0Block = 32;
constexpr size_t kQ8_0Bytes = 34;
// Quantize n floats (a multiple of the type's block) into `type` by ggml's reference algorithms (quantize.cpp):
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Throws Error for other types, naming them.
void quantize(TensorType type, const float* src, uint8_t* dst, size_t n);
bool can_quantize(TensorType type);

}  // namespace qrig::gguf
