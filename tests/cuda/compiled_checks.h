// The checks every no-GPU compile test makes on an NVRTC result: one entry point named like the template with
// the variant's block size in its PTX (__launch_bounds__), ptxas reports registers and no spills, no tensor-core
// instruction in the default family on any arch, and nothing newer than sm_70 when compiled for the sm_70
// feature set (the CMP rigs). Area tests add their own checks after calling it.
#pragma once

#include <catch2/catch.hpp>

#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/ptx_scan.h"

namespace qrig::cuda::test {

inline void check_compiled_kernel(const CompiledKernel& k, int feature_sm) {
  INFO(k.variant.name << " for feature sm_" << feature_sm << " (code sm_" << k.arch.target_sm << ")\n" << k.log);
  const auto entries = ptx_entries(k.ptx);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].name == k.variant.kernel);
  CHECK(entries[0].maxntid == k.variant.threads());
  const PtxasReport r = parse_ptxas_report(k.log);
  CHECK(r.registers > 0);
  CHECK(r.spill_store_bytes == 0);
  CHECK(r.spill_load_bytes == 0);
  for (const auto& f : scan_ptx_newer_than_sm70(k.ptx)) {
    INFO("PTX line " << f.line << ": " << f.instruction << " (" << f.why << ")");
    CHECK(f.why.find("tensor-core") == std::string::npos);  // never in the default family, on any arch
    CHECK(feature_sm != 70);                                // nothing newer than sm_70 in an sm_70 build
  }
}

}  // namespace qrig::cuda::test
