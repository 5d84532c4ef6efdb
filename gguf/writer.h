// GGUF writer: metadata and tensors in the order added, v3, 32-byte alignment unless general.alignment says
// otherwise (used by `qrig synth` and tests). Tensor data is either given as bytes or produced by a callback
// while the file is written, so multi-GB files stream to disk without being held in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"

namespace qrig::gguf {

class Writer {
 public:
  // Fills rows [first_row, first_row + n_rows) of a tensor into dst, which holds n_rows * row_bytes bytes
  // (a row is ne[0] values; 1-D tensors are one row). Must write every byte; called in row order.
  using RowFill = std::function<void(uint64_t first_row, uint64_t n_rows, uint8_t* dst)>;

  // Where each tensor lands: offset relative to the data section, as the reader reports it.
  struct Entry {
    std::string name;
    TensorType type;
    std::vector<uint64_t> ne;
    uint64_t offset;
    uint64_t n_bytes;
  };

  // Replaces an existing key in place. general.alignment must be a UINT32/UINT64 power of two.
  void set(const std::string& key, Value v);
  // data must hold exactly the bytes of `type` for shape `ne` (ggml order, ne[0] fastest, 1..4 dims).
  void add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> ne, std::vector<uint8_t> data);
  // Data produced by `fill` when the file is written (or to_bytes() runs), a few MiB of rows at a time.
  void add_tensor(const std::string& name, TensorType type, std::vector<uint64_t> ne, RowFill fill);

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  std::vector<Entry> tensor_table() const;  // without producing any data
  uint64_t data_offset() const;             // where the data section starts in the file
  uint64_t file_size() const;

  void write(const std::string& path) const;  // streams into a temp file, then renames it into place
  std::vector<uint8_t> to_bytes() const;
  // Everything before the data section, unpadded: with a sparse file of file_size() bytes, a metadata-only
  // GGUF that the compiler can plan from (tests plan 9B/27B shapes without writing their weights).
  std::vector<uint8_t> header() const;

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> ne;
    uint64_t n_bytes;
    uint64_t row_bytes;
    std::vector<uint8_t> data;  // when given as bytes
    RowFill fill;               // otherwise
  };
  using Sink = std::function<void(const uint8_t* p, size_t n)>;
  void check_new_tensor(const std::string& name, TensorType type, const std::vector<uint64_t>& ne,
                        uint64_t& n_bytes, uint64_t& row_bytes) const;
  void emit(const Sink& out) const;  // the whole file, in order
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<Tensor> tensors_;
  uint64_t alignment_ = 32;
};

}  // namespace qrig::gguf
