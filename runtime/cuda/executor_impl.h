// Internals of the CUDA executor shared by its binding half (executor_bind.cpp: weights, kernels, the
// activation arena, slot states) and its running half (executor.cpp: steps, snapshots).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/attention.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executor.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/graph.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/pointwise.h"

namespace qrig::runtime {

enum class OpKind { embed, rmsnorm, matmul, add, swiglu, conv1d_silu, gdn, gated_rmsnorm, head_rmsnorm, rope,
                    kv_write, attention, gather_rows };

// One bound op. Value ids index Impl::values; inputs are ids 0 (tokens), 1 (pos), 2 (rows).
struct CudaStep {
  const ir::Op* op = nullptr;
  OpKind kind{};
  int result = -1;
  std::vector<int> args;
  int64_t width = 0;            // result row length
  bool rows_result = false;     // R rows instead of T
  const cuda::LoadedKernel* kernel = nullptr;  // the op's kernel (pointwise, norms, embed)
  // rmsnorm feeding a matmul: the kernels that also quantize the row, by planes (1, 2; null if unused)
  const cuda::LoadedKernel* norm_quant[3] = {nullptr, nullptr, nullptr};
  cuda::Q8Matrix w{};           // matmul / embed weights
  const cuda::MatmulQ8* mm = nullptr;     // one int8 plane (steps of more than plan.precise_rows rows)
  const cuda::MatmulQ8* mm_precise = nullptr;  // two planes (at most plan.precise_rows rows); null if 0
  const cuda::GdnKernels* gdn = nullptr;
  const cuda::AttentionKernels* att = nullptr;
  const float* vec = nullptr;   // norm weight, conv weight, gdn ssm_a
  const float* vec2 = nullptr;  // gdn dt_bias
  const double* inv_freq = nullptr;  // rope
  int state = -1;               // index into Impl::state_layout
  float eps = 0.0f;
  int64_t heads = 0, head_dim = 0, row_stride = 0, head_stride = 0, head_offset = 0;
  int64_t in_width = 0;         // matmul input length
  bool recurrent_below_all = false;
  int64_t recurrent_below = 1;
  float scale = 0.0f;           // attention
  int64_t gate_offset = 0, gate_row_stride = 0, gate_head_stride = 0;
  std::string tap;
  int group = -1;               // matmul: its group of matmuls reading the same input (MatmulGroup)
  bool group_head = false;      // the first member launches the group's single-row GEMV
};

// Consecutive matmuls that read the same input (q|k|v, gate|up, the GDN input projections): their weights are
// uploaded stacked in one matrix (each member's Q8Matrix is a slice of it), so a single-row step runs one GEMV
// for all of them, writing each member's rows to its own output.
struct MatmulGroup {
  cuda::Q8Matrix merged{};
  std::vector<int> members;     // step indices
  const cuda::LoadedKernel* gemv = nullptr;  // two planes when plan.precise_rows >= 1
};

// Where a state lives in a slot: non-positional states (conv, GDN) at an offset of the slot's recurrent
// buffer (floats); KV caches as their own fp16 buffer.
struct StateLayout {
  std::string name;
  bool positional = false;
  int64_t offset = 0;    // floats into the recurrent buffer
  int64_t elements = 0;  // values (floats or halves)
  int64_t width = 0;     // kv: Hkv*hd values per position
  int kv_index = -1;     // kv: index into Slot::kv
};

struct Slot {
  cuda::DeviceBuffer<float> rec;                  // conv + GDN states
  std::vector<cuda::DeviceBuffer<uint16_t>> kv;   // [2][context][width] fp16 each
  int64_t n_past = 0;
};

struct CudaSnapshot : Snapshot {
  int device = 0;
  cuda::DeviceBuffer<float> rec;
};

struct CudaExecutor::Impl {
  ir::Plan plan;
  std::shared_ptr<const gguf::File> file;
  CudaOptions opt;
  cuda::DeviceInfo info;
  int feature_sm = 0;
  std::unique_ptr<cuda::KernelCompiler> compiler;
  std::unique_ptr<cuda::Stream> stream;

  // Kernels and kernel sets, owned here; steps point into them.
  std::map<std::string, std::unique_ptr<cuda::LoadedKernel>> kernels;  // by variant name
  std::map<std::string, std::unique_ptr<cuda::MatmulQ8>> matmuls;      // by "k x n"
  std::map<std::string, std::unique_ptr<cuda::GdnKernels>> gdns;
  std::map<std::string, std::unique_ptr<cuda::AttentionKernels>> attentions;
  const cuda::LoadedKernel* quant = nullptr;          // one plane
  const cuda::LoadedKernel* quant_precise = nullptr;  // two planes (null when plan.precise_rows is 0)
  const cuda::LoadedKernel* argmax = nullptr;
  std::unique_ptr<cuda::TopKSelector> top_k;  // sampling candidates of the last step's output rows
  int64_t last_rows = 0;                      // output rows of the last step (their logits are on the device)

  // Weights.
  std::vector<cuda::DeviceBuffer<int8_t>> weight_qs;
  std::vector<cuda::DeviceBuffer<uint16_t>> weight_scales;
  std::vector<cuda::DeviceBuffer<float>> weight_f32;
  std::vector<cuda::DeviceBuffer<double>> weight_f64;
  std::map<std::string, cuda::Q8Matrix> q8_by_name;
  std::map<std::string, const float*> f32_by_name;
  int64_t weight_bytes = 0;

  // Activations: values[id] = device pointer into the arena (nullptr for inputs), width per value.
  std::vector<std::string> value_names;
  std::vector<float*> values;
  std::vector<int64_t> value_width;
  cuda::DeviceBuffer<char> arena;
  int64_t max_t = 0;          // rows per step (plan max_batch_tokens)
  int64_t max_r = 0;          // logit rows per step
  cuda::DeviceBuffer<int32_t> tokens_dev, pos_dev, rows_dev, argmax_dev;
  cuda::DeviceBuffer<int8_t> xq;  // the quantized matmul input
  cuda::DeviceBuffer<float> xd;
  cuda::DeviceBuffer<int8_t> xq2;  // its second plane (matmuls of at most plan.precise_rows rows)
  cuda::DeviceBuffer<char> workspace;  // GDN / attention scratch
  size_t workspace_bytes = 0;

  // Decode-step graphs by shape: the slots of the step, then -1, then its output rows.
  std::map<std::vector<int32_t>, std::unique_ptr<cuda::StepGraph>> graphs;
  bool use_graphs = true;
  int graph_patch_failures = 0;  // replays refused in a row
  GraphStats graph_stats;

  std::vector<CudaStep> steps;
  std::vector<MatmulGroup> groups;
  std::vector<StateLayout> state_layout;
  int64_t rec_floats = 0;
  std::vector<Slot> slots;
  int64_t vocab_rows = 0;
  int64_t state_bytes = 0;

  void bind();  // executor_bind.cpp
  // executor_weights.cpp: uploads (each tensor once) and matmul groups.
  struct GroupMap {
    std::map<std::string, std::string> head_of;  // member weight -> its group's first weight
    std::map<std::string, int> index;            // first weight -> groups index
  };
  cuda::Q8Matrix upload_q8(const std::string& name, const ir::Op& op);
  const float* upload_f32(const std::string& name, const ir::Op& op, int64_t n);
  GroupMap upload_weight_groups();
  const cuda::LoadedKernel* load(const cuda::Variant& v);
  cuda::KernelLoader loader();
  Slot& slot(int s);
};

}  // namespace qrig::runtime
