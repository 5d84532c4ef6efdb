// `qrig probe`: what each GPU of this machine and each link between them can do, measured. Per device: its
// name, compute capability, SMs, memory and clocks; the peak rate of each arithmetic unit (FP32 FMA, HFMA2,
// DP4A, and the tensor cores through mma.sync: HMMA fp16, IMMA int8) from the micro-benchmarks of
// templates/probe_units.cu, timed with CUDA events (the target cards have no CUPTI); its memory bandwidth
// (device-to-device copy); pinned host<->device bandwidth. Per pair of devices: whether peer-to-peer access
// is possible and, when it is, the peer copy bandwidth.
//
// Each unit's rate is compared with its architectural rate (arch_unit_rate, a table per compute capability)
// and judged: below a quarter of it, the unit is throttled (a CMP 100-210's tensor cores run at ~1/16).
// The compiler only plans tensor-core kernels for rigs whose tensor cores are proven healthy, so anything
// not proven (not measured, an architecture missing from the table) counts as throttled.
//
// Plain structs, no CUDA types: the CLI turns them into a compiler::Rig (the runtime may not include the
// compiler). Throws CudaError when there is no usable GPU; failures of single measurements are recorded in
// the result (DeviceProbe::errors) so one bad step does not hide the others.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/nvrtc.h"

namespace qrig::cuda {

enum class Unit { fp32_fma = 0, hfma2, dp4a, hmma, imma };
inline constexpr int kUnitCount = 5;
inline constexpr std::array<Unit, kUnitCount> kUnits = {Unit::fp32_fma, Unit::hfma2, Unit::dp4a, Unit::hmma,
                                                       Unit::imma};
const char* unit_name(Unit u);  // "FP32 FMA", "HFMA2", "DP4A", "HMMA", "IMMA"
inline bool is_tensor_unit(Unit u) { return u == Unit::hmma || u == Unit::imma; }

// The architectural rate of a unit in operations per clock per SM (a multiply-add counts 2; one DP4A is 4
// multiply-adds), for the compute capabilities 70, 75, 80, 86, 89, 90 (sources in probe_rates.cpp).
// 0: the architecture has no such unit (IMMA on sm_70). nullopt: the architecture is not in the table.
std::optional<double> arch_unit_rate(int sm, Unit u);
std::vector<int> arch_rate_table_archs();  // the compute capabilities of the table

// The micro-benchmark of a unit for a feature-set architecture: its kernel in templates/probe_units.cu, the
// PTX opcode it measures and the operations one warp does per step of one chain. nullopt when the
// architecture lacks the instruction (HMMA before sm_70, IMMA before sm_75).
struct UnitKernel {
  std::string entry;   // "probe_hmma"
  std::string opcode;  // "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"
  double ops_per_warp_step = 0;
};
std::optional<UnitKernel> unit_kernel(Unit u, int feature_sm);

// Launch shape of every micro-benchmark (the values templates/probe_units.cu is written for).
inline constexpr int kProbeThreads = 256;       // QRIG_THREADS
inline constexpr int kProbeBlocksPerSm = 4;     // QRIG_PROBE_MIN_BLOCKS: one full wave
inline constexpr int kProbeChains = 8;          // QRIG_PROBE_CHAINS
inline constexpr int kProbeUnroll = 16;         // QRIG_PROBE_UNROLL

enum class Verdict {
  ok,            // at least kThrottledBelow of the architectural rate
  throttled,     // measured below kThrottledBelow of the architectural rate
  absent,        // the architecture has no such unit
  unknown_arch,  // measured, but the architecture is not in the rate table
  not_measured,  // the benchmark could not run (see the device's notes or errors)
};
const char* verdict_name(Verdict v);  // "ok", "THROTTLED", "absent", "unknown arch", "not measured"
inline constexpr double kThrottledBelow = 0.25;

struct UnitRate {
  Unit unit = Unit::fp32_fma;
  std::string opcode;                    // what was measured (empty when the unit has no benchmark here)
  bool measured = false;
  double tops = 0;                       // tera-operations per second
  double clock_mhz = 0;                  // SM clock during the benchmark (clock64 / globaltimer); 0 unknown
  double ops_per_clk_per_sm = 0;         // measured, per clock of clock_mhz (of the peak clock when unknown)
  double expected_ops_per_clk_per_sm = 0;  // architectural; 0 when absent or unknown
  double ratio = 0;                      // measured / expected; 0 when either is missing
  Verdict verdict = Verdict::not_measured;
};

struct DeviceProbe {
  int index = 0;
  std::string name;
  int sm = 0;                         // compute capability as 70, 90, ...
  int sms = 0;
  long long total_bytes = 0;
  double sm_clock_mhz = 0;            // peak (boost) SM clock the driver reports
  double sm_clock_load_mhz = 0;       // measured during the FP32 benchmark (clock64 / globaltimer); 0 unknown
  double mem_clock_mhz = 0;           // peak memory clock the driver reports
  int mem_bus_bits = 0;
  std::array<UnitRate, kUnitCount> units;  // indexed by Unit
  double copy_gbps = 0;               // device-to-device copy, bytes read + written per second
  double h2d_gbps = 0, d2h_gbps = 0;  // pinned host memory <-> device
  bool tensor_cores_throttled = true; // HMMA or IMMA not proven healthy (see apply_verdicts)
  ArchKernels kernels;                // which NVRTC builds this GPU's kernels (arch_kernels)
  std::vector<std::string> notes;     // why something was not measured, derived facts
  std::vector<std::string> errors;    // measurements that failed

  const UnitRate& unit(Unit u) const { return units[(size_t)u]; }
  UnitRate& unit(Unit u) { return units[(size_t)u]; }
};

// An unordered pair of devices a < b.
struct PeerProbe {
  int a = 0, b = 0;
  bool a_to_b = false, b_to_a = false;  // cuDeviceCanAccessPeer each way
  double a_to_b_gbps = 0, b_to_a_gbps = 0;  // peer copy bandwidth with access on (0 when not possible)
  std::vector<std::string> errors;
  bool p2p() const { return a_to_b && b_to_a; }
};

struct ProbeResult {
  std::vector<std::string> toolchain;  // toolchain_report(): the driver and the NVRTC libraries
  std::vector<DeviceProbe> devices;
  std::vector<PeerProbe> peers;
  double seconds = 0;
  bool ok() const;  // no errors anywhere
};

struct ProbeOptions {
  double unit_ms = 40;    // duration of each timed unit benchmark launch
  double copy_ms = 40;    // duration of each timed batch of copies
  int reps = 3;           // timed repetitions; the best one counts
  bool links = true;      // measure host links and peers (false: units and device copy only)
};

// Fills expected_ops_per_clk_per_sm, ratio and verdict of every unit from d.sm and the measured
// ops_per_clk_per_sm, and tensor_cores_throttled: false only when HMMA is ok and IMMA is ok or absent.
// No GPU needed (tests use synthetic measurements).
void apply_verdicts(DeviceProbe& d);

// Every device and link. Throws CudaError when there is no CUDA device or driver.
ProbeResult probe_rig(const ProbeOptions& opt = {});
// One device (its host link too when opt.links).
DeviceProbe probe_device(int device, const ProbeOptions& opt = {});
// One pair of devices.
PeerProbe probe_peers(int a, int b, const ProbeOptions& opt = {});

// templates/probe_units.cu compiled by NVRTC for a feature-set architecture (-DQRIG_SM=feature_sm; the
// code target from choose_arch). Throws KernelError when NVRTC cannot.
struct ProbeBuild {
  ArchChoice arch;
  NvrtcOutput out;
};
ProbeBuild compile_probe_units(int feature_sm);

}  // namespace qrig::cuda
