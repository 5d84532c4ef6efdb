// Internals of the CUDA executor shared by its binding half (executor_bind.cpp: device, layout, weights,
// kernels, arena, slots), its op tables (executor_ops.cpp: per op kind, what binding loads and what a step
// launches) and its running half (executor.cpp: steps, graphs, snapshots).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/bound_graph.h"
#include "runtime/cuda/attention.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executor.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/graph.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/layout.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/pointwise.h"

namespace qrig::runtime {

// A q8 value in the arena: int8 values [rows][k], f32 scales [rows][k/32], the second plane [<= precise rows][k].
struct Q8Value {
  int8_t* q = nullptr;
  float* d = nullptr;
  int8_t* q2 = nullptr;
};

// One bound op: its place in the bound graph, weights, kernels per range of rows and arena pointers.
struct CudaStep {
  const BoundGraph* g = nullptr;                // the graph it is an op of (the main one or the draft head's)
  const BoundOp* b = nullptr;
  std::vector<ir::LaunchRange> ranges;          // the plan's kernel attribute
  std::vector<const cuda::LoadedKernel*> kernel_of_range;  // single-kernel ops: one per range
  std::vector<float*> in;                       // f32 arguments (arena; null for step inputs and q8 ones)
  Q8Value q8_in;                                // the quantized argument of a matmul
  std::vector<float*> out;                      // f32 results (arena)
  Q8Value q8_out;                               // the q8 result of a quantizing op (ir::makes_q8)
  char* scratch = nullptr;                      // the op's scratch in the arena (rmsnorm_quant, gdn, attention)
  std::vector<cuda::Q8Matrix> w;                // embed, matmul: one; matmul_stack: per member
  cuda::Q8Matrix stacked{};                     // matmul_stack: all members
  std::vector<const cuda::MatmulKernels*> mm;   // matmul: one; matmul_stack: per member (rows >= 2)
  const cuda::LoadedKernel* stacked_gemv = nullptr;  // matmul_stack: the single-row launch over the stack
  const cuda::GdnKernels* gdn = nullptr;
  const cuda::AttentionKernels* att = nullptr;
  const float* vec = nullptr;                   // norm weight, conv weight
  const float* ssm_a = nullptr;                 // gdn
  const float* dt_bias = nullptr;
  const double* inv_freq = nullptr;             // rope
  int64_t taps = 0;                             // conv
  float eps = 0.0f;
  // Ops on a sequence's state (conv1d_silu, gdn, kv_write, attention): the plan's decode_kernel attribute, per
  // number of sequences of a decode step (one token each): whether that many run as one batched launch, and its
  // kernel (conv, gdn, kv_write) or kernel pair (attention); empty: every sequence runs on its own.
  std::vector<ir::LaunchRange> decode_ranges;
  std::vector<bool> decode_batched;
  std::vector<const cuda::LoadedKernel*> decode_kernel_of_range;          // null for attention
  std::vector<const cuda::BatchedDecodeAttention*> decode_att_of_range;  // attention's batched ranges

  // The single kernel of a range-dependent single-kernel op for n rows (throws RuntimeError outside).
  const cuda::LoadedKernel& kernel_for(int64_t n) const;
  // The index of the decode_kernel range that runs a decode step of n sequences batched, or -1 (per sequence).
  int batched_range_for(int64_t n) const;
};

struct Slot {
  cuda::DeviceBuffer<float> rec;                  // conv + GDN states
  std::vector<cuda::DeviceBuffer<uint16_t>> cache;  // per graph state: its fp16 cache (empty for recurrent ones)
  int64_t n_past = 0;
  // Speculative decoding (plans with draft_tokens > 0, docs/speculative.md): a verify step's recurrent states after
  // each of its first kept_count tokens, each a whole image of rec (layout.rec_floats apart), for rollback().
  cuda::DeviceBuffer<float> kept;
  int64_t kept_from = -1;  // n_past before the step that kept them (-1: nothing kept)
  int64_t kept_count = 0;
  // The MTP draft head (plans that draft): per draft-graph state its cache (like `cache`), and the main model's
  // hidden rows waiting for the head (runtime/cuda/draft_head.h keeps their count).
  std::vector<cuda::DeviceBuffer<uint16_t>> draft_cache;
  cuda::DeviceBuffer<float> draft_pending;
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
  cuda::ArchChoice arch;    // the plan's NVRTC and code target
  bool ptx_jit = false;     // kernels loaded as PTX through the driver's JIT (plan kernel_code = "ptx")
  std::string kernel_load;  // how, in words (CudaExecutor::kernel_load)
  std::unique_ptr<cuda::KernelCompiler> compiler;
  std::unique_ptr<cuda::Stream> stream;
  std::unique_ptr<BoundGraph> graph;
  cuda::DeviceLayout layout;

  // Kernels and kernel sets, owned here; steps point into them.
  std::map<std::string, std::unique_ptr<cuda::LoadedKernel>> kernels;  // by variant name
  std::vector<std::unique_ptr<cuda::MatmulKernels>> matmuls;
  std::vector<std::unique_ptr<cuda::GdnKernels>> gdns;
  std::vector<std::unique_ptr<cuda::AttentionKernels>> attentions;
  std::vector<std::unique_ptr<cuda::BatchedDecodeAttention>> batched_attentions;
  const cuda::LoadedKernel* argmax = nullptr;
  std::unique_ptr<cuda::TopKSelector> top_k;  // sampling candidates of the last step's output rows
  int64_t last_rows = 0;                      // output rows of the last step (their logits are on the device)

  // Weights, by tensor name (a stack's members are slices of its upload).
  std::vector<cuda::DeviceBuffer<int8_t>> weight_qs;
  std::vector<cuda::DeviceBuffer<uint16_t>> weight_scales;
  std::vector<cuda::DeviceBuffer<float>> weight_f32;
  std::vector<cuda::DeviceBuffer<double>> weight_f64;
  std::map<std::string, cuda::Q8Matrix> q8_by_name;
  std::map<std::string, cuda::Q8Matrix> stack_by_head;  // a stack's first tensor -> the whole stacked matrix
  std::map<std::string, const float*> f32_by_name;
  std::map<const ir::Op*, const double*> rope_by_op;  // by the rope op (of either graph)
  int64_t allocated = 0;  // device bytes allocated at bind (checked against the layout)

  cuda::DeviceBuffer<char> arena;
  std::vector<float*> f32_of;   // per value id: its f32 place in the arena (bind)
  std::vector<Q8Value> q8_of;   // per value id: its q8 place
  cuda::DeviceBuffer<int32_t> tokens_dev, pos_dev, rows_dev, argmax_dev;
  // The batched decode kernels' tables (fixed buffers, so a replayed graph reads each step's contents):
  // decode_tables [slots] each slot's recurrent-state image, then per graph state [slots] its caches (device
  // pointers, null where a state has none on this stage), written at bind; decode_seq the step's slots [slots], then
  // their positions [slots], written before a decode step of several sequences runs.
  cuda::DeviceBuffer<uint64_t> decode_tables;
  cuda::DeviceBuffer<int32_t> decode_seq;
  float* const* rec_table() const { return reinterpret_cast<float* const*>(decode_tables.data()); }
  void* const* cache_table(int state) const {
    return reinterpret_cast<void* const*>(decode_tables.data() + (size_t)(1 + state) * slots.size());
  }
  const int32_t* seq_slots() const { return decode_seq.data(); }
  const int32_t* seq_positions() const { return decode_seq.data() + slots.size(); }
  int64_t vocab_rows = 0;

  // Decode-step graphs by shape: the slots of the step (a batched step: -2 and their number), then -1, then its
  // output rows.
  std::map<std::vector<int32_t>, std::unique_ptr<cuda::StepGraph>> graphs;
  bool use_graphs = true;
  int graph_patch_failures = 0;  // replays refused in a row
  GraphStats graph_stats;

  std::vector<CudaStep> steps;
  std::vector<Slot> slots;

  // Profiling (set_profiling): the sums per key, keys in order of first appearance, and events reused per step.
  bool profiling = false;
  std::map<std::string, OpProfile> profile_sums;
  std::vector<std::string> profile_order;
  std::vector<std::unique_ptr<cuda::Event>> profile_events;

  // The MTP draft head (plan draft_tokens > 0, docs/speculative.md): the draft graph bound like the main one (its
  // steps share the weights, kernels and arena), the main graph's value whose rows feed it (the op tapped as the
  // draft graph's hidden_from: a step copies them to hidden_stage), the draft value whose last row a draft step
  // carries to the next (mtp_hidden_out, copied to draft_carry), and the draft graph's %hidden rows (draft_hidden).
  std::unique_ptr<BoundGraph> draft_graph;
  std::vector<CudaStep> draft_steps;
  std::vector<float*> draft_f32_of;
  std::vector<Q8Value> draft_q8_of;
  int hidden_value = -1;       // main graph value id (-1: the plan does not draft)
  int carry_value = -1;        // draft graph value id
  cuda::DeviceBuffer<float> hidden_stage, draft_hidden, draft_carry;

  // A pipeline stage (CudaOptions::stage): its bridge buffers (two in, two out: double-buffered), the step of its
  // incoming bridge op, and the value its outgoing bridge takes.
  cuda::DeviceBuffer<float> bridge_in[2], bridge_out[2];
  int bridge_in_step = -1;   // index into steps
  int bridge_out_value = -1; // value id

  void bind();        // executor_bind.cpp
  void bind_draft();  // the MTP head's graph (plans that draft)
  void upload_weights();  // executor_weights.cpp
  const cuda::LoadedKernel* load(const cuda::Variant& v);
  const cuda::LoadedKernel* load(const std::string& name) { return load(cuda::parse_variant(name)); }
  cuda::KernelLoader loader();
  Slot& slot(int s);
  // Q8 value pointers of a value at an arena offset.
  Q8Value q8_at(int64_t offset, int64_t rows, int64_t width) const;
};

// Binding an op's kernels needs no device, only a loader: the plan, its bound graph, owners of the kernel sets,
// and the steps bound so far (a matmul checks the planes its input's producer writes).
struct KernelBinder {
  const ir::Plan& plan;
  const BoundGraph& graph;
  std::function<const cuda::LoadedKernel*(const std::string&)> load;  // by variant name, owned by the caller
  cuda::KernelLoader loader;                                           // the same, by value (for kernel sets)
  std::vector<std::unique_ptr<cuda::MatmulKernels>>& matmuls;
  std::vector<std::unique_ptr<cuda::GdnKernels>>& gdns;
  std::vector<std::unique_ptr<cuda::AttentionKernels>>& attentions;
  std::vector<std::unique_ptr<cuda::BatchedDecodeAttention>>& batched_attentions;
  std::vector<CudaStep>& steps;
};

// Per op kind (executor_ops.cpp): its kernels, its weights and arena places, and one step's launches.
struct StepCx {
  CudaExecutor::Impl& m;
  const std::vector<StepInput>& batch;
  const std::vector<int64_t>& offset;  // first row of each input in the step
  const std::vector<int32_t>& out_rows;
  const std::vector<int64_t>& keep;    // per input: recurrent states kept after its first keep tokens (a verify step)
  int64_t T, R;
  cuda::StreamHandle stream;
  bool decode;                         // every input has one token (decode_seq holds their slots and positions)
  // A draft-graph call (one input): its caches are the slot's draft_cache, its rows start at head position draft_pos.
  bool draft = false;
  int64_t draft_pos = 0;
};
void bind_op_kernels(KernelBinder& kb, CudaStep& s);
// The op's weights and arena places (s.g: which graph; the draft graph's values have their own places).
void bind_op_resources(CudaExecutor::Impl& m, CudaStep& s);
// The output rows' kernels the graph names: the argmax (loaded) and the top-k pair (names, for the selector).
void bind_output_kernels(KernelBinder& kb, const cuda::LoadedKernel*& argmax, std::vector<std::string>& top_k);
// Every variant name binding the plan loads, found by running the kernel binding over it with a loader that
// records names (no device). The executor loads exactly these (tests compare them with plan_kernels()).
std::vector<std::string> kernels_loaded_by(const ir::Plan& plan);
void run_op(const StepCx& c, const CudaStep& s);
// The ops whose launches change from one decode step to the next (positions): what a graph replay patches.
bool patchable(ir::OpKind k);
// Whether a decode step of `seqs` one-token sequences runs every op on a sequence's state batched (the plan's
// decode_kernel): then no launch outside the patchable ones names a slot (they read the step's slots and positions
// from decode_seq), so one graph serves every combination of that many slots.
bool slot_free_step(const CudaExecutor::Impl& m, int64_t seqs);
// Whether the CUDA bind and run tables have a row for every op kind (tests).
bool cuda_op_tables_complete();

}  // namespace qrig::runtime
