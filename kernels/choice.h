// What a choice function of this library returns for an op: per range of rows (the rows one launch covers:
// a step's tokens, its output rows, or one sequence's tokens for per-sequence ops), the variants launched for
// it and why. The compiler's kernel pass writes them into the plan (ir/kernel_attr.h gives their text form).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/variant.h"

namespace qrig::kernels {

struct KernelRange {
  int64_t first = 0, last = 0;  // rows, inclusive
  // What runs, per part of the op: one list for ops with one result (e.g. gdn_chunk_prep then
  // gdn_chunk_scan), one per result for a stacked matmul whose members run separately, or one list for a
  // stacked matmul launching one kernel over all its members.
  std::vector<std::vector<Variant>> parts;
  std::string reason;
};

}  // namespace qrig::kernels
