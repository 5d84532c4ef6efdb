// The `kernel` attribute of a CUDA plan's op: which kernel variants run it, per range of rows (the rows of one
// launch: a step's tokens, its output rows, or one sequence's tokens for ops on a sequence's state), written by
// the compiler's kernel pass and read by the runtime, which loads exactly these and chooses nothing:
//   kernel="1-1:gemv_q8_0_dp4a_k4096_p2_r1_u2_t256 2-4:gemm_q8_0_dp4a_skinny_p2_c4_r8_u1_t64 5-512:..."
// An entry is `first-last:` and its parts separated by ','; a part is one or more variant names joined by '+'
// (launched in that order). Ops with one result have one part; a stacked matmul has one part per weight, or
// one part for a single launch over all its weights. Ranges ascend without gaps from 1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qrig::ir {

struct LaunchRange {
  int64_t first = 0, last = 0;
  std::vector<std::vector<std::string>> parts;
  bool operator==(const LaunchRange&) const = default;
};

std::vector<LaunchRange> parse_launch_ranges(std::string_view text);  // throws Error saying what is wrong
std::string print_launch_ranges(const std::vector<LaunchRange>& ranges);
// The entry whose range holds `rows`, or nullptr.
const LaunchRange* launch_range_for(const std::vector<LaunchRange>& ranges, int64_t rows);

}  // namespace qrig::ir
