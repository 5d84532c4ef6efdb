// The plan: every decision the compiler made for one model on one rig, as a directory holding plan.toml
// (decisions, memory, placement, the kernel choices and why: human-readable) and graph.ir (the annotated IR:
// per op its layer, device, formats, kernel variants per range of rows and arena offsets). The runtime reads
// it and decides nothing the plan already decided. Plan::read validates every field as carefully as a GGUF.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace qrig::ir {

// One stage of the pipeline: a device and the contiguous layers it runs (the first stage also runs the token
// embedding, the last the output norm and lm_head). Stages run in order; the residual stream crosses between them.
struct Placement {
  std::string device;      // "cpu", "cpu:N" (a stage of a multi-stage CPU plan) or "cuda:N" (N: the stage index)
  int64_t ordinal = -1;    // cuda: the CUDA device the stage runs on (several stages may share one for tests); cpu: -1
  int64_t first_layer = 0;
  int64_t last_layer = 0;  // inclusive
  // The placement pass's cost model for this stage (why it got these layers): prefill matmul time per token at
  // the device's dp4a rate, decode bytes per token at its bandwidth.
  double prefill_us_per_token = 0;
  double decode_us_per_token = 0;
};

// What one device holds, in bytes, as the runtime allocates it (the memory pass lays it out; the CUDA
// executor allocates exactly these, and a test checks the two agree).
struct DeviceMemory {
  std::string device;
  int64_t weights = 0;      // uploaded weights (Q8_0 repacked, f32 vectors, RoPE tables)
  int64_t arena = 0;        // activations and op scratch of one step (offsets in graph.ir)
  int64_t io = 0;           // per-step inputs and outputs (tokens, positions, rows, argmax)
  int64_t sampling = 0;     // top-k candidate selection buffers
  int64_t states = 0;       // every slot's recurrent states (conv + GDN) and KV caches
  int64_t snapshots = 0;    // prefix-cache snapshots of recurrent state at most (the engine's budget)
  int64_t total = 0;        // the sum of the above
  int64_t budget = 0;       // what the plan may use of the device
};

// The KV-format pass's trade table: per key/value format pair, the cache bytes per token (one sequence, every
// device) and the longest context that fits at the plan's sequence slots, on every device and on each.
struct KvFit {
  std::string kv;                       // "k16v16", "k8v3", ...
  int64_t bytes_per_token = 0;
  int64_t context = 0;                  // the smallest of device_contexts
  std::vector<int64_t> device_contexts;  // per device of MemoryPlan::devices, in order
};

struct MemoryPlan {
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;        // per sequence, keys and values of every attention layer
  int64_t state_bytes_per_sequence = 0;  // GDN recurrent + conv states
  int64_t activation_bytes = 0;          // arena of one step at max_batch_tokens
  int64_t budget_bytes = 0;              // what the smallest device offers the plan
  int64_t snapshot_bytes = 0;            // one snapshot (a sequence's recurrent state)
  int64_t snapshots_per_slot = 0;        // prefix-cache snapshots the engine may hold per slot
  int64_t bridge_host_bytes = 0;         // pipelines: pinned host buffers between stages (two per boundary)
  // Speculative decoding (Plan::draft_tokens > 0), per sequence and included in the devices' states: the MTP
  // head's own key and value cache per token, and the recurrent states a verify step keeps for a rollback; on CUDA
  // also the main model's hidden rows waiting for the head. Included in the last device's weights and arena: the
  // head's own weights (the embedding and lm_head are the main model's), and on CUDA its activations (laid out in
  // the same arena as the main graph's: the two never run at once, so the arena is the larger of the two).
  int64_t draft_kv_bytes_per_token = 0;
  int64_t draft_rollback_bytes = 0;
  int64_t draft_pending_bytes = 0;
  int64_t draft_weight_bytes = 0;
  int64_t draft_arena_bytes = 0;
  std::vector<DeviceMemory> devices;     // per device of the placement
  std::vector<KvFit> kv_fits;            // the KV-format pass's candidates (and the formats it could not use)
};

// One decision of the kernel pass, for `qrig inspect`: ops of one kind and shape, a range of rows, the
// variants that run and the cost model's reason.
struct KernelChoice {
  std::string op;       // op kind
  std::string shape;    // e.g. "4096->12288", "dims 16/32/128/128"
  int64_t ops = 0;      // ops of the graph sharing this choice
  int64_t first_rows = 0, last_rows = 0;
  std::string variants;  // as in the kernel attribute: parts ',' separated, launches '+' joined
  std::string reason;
};

// The shared prefix cache (runtime/prefix_cache.h, docs/prefix-cache.md): its byte budget and where prompts are cut
// and snapshotted. Prefill pieces end at every cut point of a prompt whether or not anything is cached, so a state
// restored at a cut point equals, bit for bit on the CPU, what prefilling the prompt from scratch computes there.
// Cut points: each message start (the position of a turn_start token), each header end (after the first
// header_end token within header_max tokens of a turn_start), each multiple of `chunk`, and the prompt's last
// token. Snapshots (GDN states, with the KV entries up to them) are kept at: the end of the first message (the
// system prompt or tool definitions) and its next header, the start of the last turn (the generation prompt's
// header: "<|im_start|>assistant\n"), each multiple of `chunk`, and the position before the last token.
struct PrefixCachePolicy {
  // "shared": the index shared by all slots (CPU, one stage), a slot's own state where the index has nothing;
  // "per-slot": only a slot's own state (its prompt-end snapshots, its last output); "off": no reuse at all.
  std::string mode = "per-slot";
  int64_t budget_bytes = 0;   // cached KV spans + snapshots the engine may hold (all devices); 0: no shared cache
  int64_t chunk = 0;          // regular cut and snapshot interval (a multiple of gdn_chunk); 0: none
  int64_t turn_start = -1;    // token id opening a message ("<|im_start|>"); -1: no message markers
  int64_t header_end = -1;    // token id ending a message header (the newline after the role)
  int64_t header_max = 0;     // tokens after turn_start within which header_end must come
  std::string markers;        // where the markers come from, for people ("chat template: <|im_start|>ROLE\n")
};

struct Plan {
  static constexpr int64_t kFormat = 2;
  int64_t format = kFormat;
  std::string compiler_version;
  std::string model_path;      // absolute path of the GGUF
  int64_t model_size = 0;      // bytes, checked at load
  std::string arch;
  std::string model_name;
  std::string rig_name;
  std::string backend;         // "cpu" | "cuda"
  std::string arch_target;     // e.g. "sm_90" for cuda; empty for cpu
  int64_t device_sms = 0;      // SMs of the target GPU (kernel tilings and splits are chosen for it); 0 for cpu
  std::string kernel_family;   // "reference" (cpu), "dp4a", "dp4a-emulated" (the dp4a family's numerics on the cpu)
  // cuda: which NVRTC compiles the kernels ("11.8"; empty: chosen where the plan runs) and for which code target
  // ("sm_70"; differs from arch_target only in NVRTC's degraded mode); how they are loaded: "cubin" (on a GPU
  // of the code target) or "ptx" (through the driver's JIT on any GPU at least as new: how a plan for an older
  // architecture is checked on a newer GPU; its speed there is not the older GPU's).
  std::string kernel_nvrtc;
  std::string kernel_target;
  std::string kernel_code;
  std::string tuning_source;   // where the kernel pass's measured numbers came from
  int64_t context_length = 0;  // tokens per sequence the plan allows
  int64_t max_sequences = 1;   // sequence slots
  int64_t max_batch_tokens = 0;  // tokens per forward call (prefill chunk)
  int64_t max_logit_rows = 0;  // output rows (logits) per step
  // Several stages: a step's tokens cross the pipeline in micro-batches of at most this many rows (a multiple of
  // gdn_chunk), so with S stages up to S micro-batches are in flight; each stage's activations, kernels and
  // buffers are planned for this many rows. 0: one stage (a call runs up to max_batch_tokens rows).
  int64_t pipeline_micro_batch = 0;
  // Several stages: a step of single-token pieces (decode) is cut into groups of at least this many sequences, at
  // most one per stage, so that stages work on different groups at once; the placement pass sets it where a
  // group's compute time reaches the time to read the stage's weights (below that, a group costs what the whole
  // batch does). 0: one stage.
  int64_t pipeline_decode_group_rows = 0;
  int64_t rows_per_call() const { return pipeline_micro_batch > 0 ? pipeline_micro_batch : max_batch_tokens; }
  int64_t gdn_chunk = 64;      // chunk length of chunked GDN
  int64_t gdn_recurrent_below = 16;  // steps with fewer tokens per sequence run the recurrent GDN
  // GPU matmuls over at most this many activation rows quantize them to two int8 planes (~15 bits: decode is
  // bound by the weight bytes, so it costs little); larger ones (prefill) to one plane, llama.cpp's numerics.
  int64_t precise_rows = 0;
  std::string k_dtype;         // keys in the KV cache: "f32" | "f16" | "q8" | "t4" | "t3" (kernels/kv_format.h)
  std::string v_dtype;         // values
  bool decode_graphs = false;  // decode steps run as CUDA graphs (captured once per shape, then replayed)
  // CUDA plans for sm_90+: kernels are launched with programmatic stream serialization, so each one's launch
  // overlaps the kernel before it, whose end it waits for on the GPU (docs/gpu.md "launch overlap").
  bool programmatic_launch = false;
  int64_t threads = 0;         // cpu threads (0 = all cores)
  int64_t vocab_real = 0;      // tokens that may be sampled
  // Speculative decoding with the model's MTP head (docs/speculative.md): draft tokens per step (0: off), and the
  // head's graph (draft.ir; empty when off): inputs %tokens (the token after each row's position), %pos (the
  // head's own cache positions), %rows, %hidden (the main model's value tapped as its `hidden_from` attribute
  // names); output %logits. One-stage plans on the CPU (reference family) and CUDA backends.
  int64_t draft_tokens = 0;
  Graph draft;
  std::vector<Placement> placement;
  MemoryPlan memory;
  PrefixCachePolicy prefix_cache;
  std::vector<KernelChoice> kernels;
  std::vector<std::string> notes;  // what the passes decided and why, in order
  Graph graph;

  void write(const std::string& dir) const;   // plan.toml + graph.ir (atomic per file)
  static Plan read(const std::string& dir);   // throws Error with the file and what is wrong
  std::string to_toml() const;
};

// The smallest micro-batch the pipeline's cutting rule allows (runtime/pipeline.h pipeline_units): a last piece
// shorter than max(gdn_recurrent_below, precise_rows + 1) takes whole 64-token chunks of the piece before it, which
// must keep that length itself.
int64_t pipeline_min_micro_batch(const Plan& p);

}  // namespace qrig::ir
