// A rig description: the devices (with measured unit rates) and links the compiler plans for. Written by
// `qrig probe` or by hand; presets live in rigs/.
#pragma once

#include <string>
#include <vector>

#include "kernels/tuning.h"

namespace qrig::compiler {

struct RigDevice {
  std::string kind;        // "cpu" | "cuda"
  std::string name;
  std::string arch;        // "sm_70" ... (cuda)
  int sms = 0;             // cuda SMs, or cpu cores
  double memory_gib = 0;   // usable device memory (cpu: RAM the plan may use)
  double clock_mhz = 0;
  double mem_bw_gbps = 0;  // measured copy bandwidth
  // Measured unit rates (tera-ops/s); 0 = not measured or not present.
  double dp4a_tops = 0, fp32_tflops = 0, hfma2_tflops = 0, hmma_tflops = 0, imma_tops = 0;
  bool tensor_cores_throttled = false;  // probe verdict: HMMA/IMMA far below the architectural rate
  // cuda: the CUDA device index this entry is (-1: its position among the rig's cuda devices). Two entries with the
  // same ordinal put two pipeline stages on one GPU (how a pipeline is tested on a one-GPU machine).
  int ordinal = -1;
};

struct RigLink {
  std::string from, to;    // "host" or a device index as a string
  double h2d_gbps = 0, d2h_gbps = 0;
  bool p2p = false;
  double p2p_gbps = 0;
};

// Measured numbers that replace the kernel library's defaults (kernels/tuning.h) for this rig's GPUs: a
// [tuning] table in the rig file (written by hand or by a measuring tool). Absent entries keep the defaults.
struct RigTuning {
  bool present = false;
  std::string source;                               // what measured them
  std::vector<kernels::GemmTiling> gemm_tilings[2];  // by planes - 1; non-empty replaces the default list
  std::vector<std::pair<std::string, int64_t>> attention_resident;  // added to / replacing the defaults
  int64_t gdn_recurrent_below = 0;                  // 0: the default
};

struct Rig {
  std::string name;
  std::vector<RigDevice> devices;
  std::vector<RigLink> links;
  RigTuning tuning;

  // The tuning data a plan for feature set sm_<sm> uses: the library's defaults with this rig's entries.
  kernels::Tuning tuning_for(int sm) const;

  static Rig load(const std::string& path);  // throws CompileError naming the file and field
  static Rig parse(const std::string& toml_text, const std::string& source);
  static Rig default_cpu();                   // this machine's CPU (cores, RAM)
  std::string to_toml() const;
  bool has_cuda() const;
};

}  // namespace qrig::compiler
