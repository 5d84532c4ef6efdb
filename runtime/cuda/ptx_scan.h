// PTX scans: the default kernel family must run on sm_70 (CMP 100-210, V100), so the PTX of an sm_70 plan
// may hold no instruction newer than sm_70 (tensor-core mma/wmma/wgmma, ldmatrix/stmatrix, cp.async and
// the TMA/mbarrier machinery, redux.sync, bf16/fp8 arithmetic and conversions, cluster and grid-dependency
// control). Checked by CI on every kernel of the CMP plan (compiled for sm_70 by NVRTC 11.8 or 12.x; in the
// degraded mode under NVRTC 13 for sm_75, where ptxas itself would accept some of them). Also: every entry
// declares its block size (.maxntid, from __launch_bounds__); the module's .target; the architecture a cubin
// holds code for.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qrig::cuda {

struct PtxFinding {
  int line = 0;             // 1-based
  std::string instruction;  // the opcode as written, e.g. "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
  std::string why;          // which rule it breaks
};

// Instructions newer than sm_70 in PTX text; comments, directives, labels and identifiers are not
// instructions (a kernel named "gemma" is fine).
std::vector<PtxFinding> scan_ptx_newer_than_sm70(std::string_view ptx);

struct PtxEntry {
  std::string name;
  int maxntid = 0;  // 0 when the entry has no .maxntid (no __launch_bounds__)
};
// The .entry functions of a PTX module with their declared maximum block size.
std::vector<PtxEntry> ptx_entries(std::string_view ptx);

// True when the module has entries and every one executes griddepcontrol.wait (the templates'
// qrig_grid_dependency_wait on sm_90+): what a kernel launched with programmatic stream serialization must do
// before it touches memory the kernel before it writes or reads.
bool waits_for_previous_grid(std::string_view ptx);

// The module's ".target" architecture ("sm_70"); empty when there is none.
std::string ptx_target(std::string_view ptx);

// The SM a cubin's code is for (70, 90, ...), from its ELF header (EM_CUDA; the e_flags layout of ELF ABI
// version 7, NVRTC <= 12, and of version 8, NVRTC 13); -1 when it is not a CUDA ELF file.
int cubin_sm(const std::vector<char>& cubin);

}  // namespace qrig::cuda
