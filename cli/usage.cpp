// The usage text of every subcommand (`qrig CMD --help`, and after a usage error) and `qrig --version`: the
// version, the commit this build was made from (scripts/build_info.cmake) and the CUDA pieces it found.
#include <string>

#ifdef QRIG_HAVE_CUDA
#endif

#include <fmt/format.h>

#include "cli/commands.h"
#include "compiler/compile.h"
#include "qrig_build_info.h"
#ifdef QRIG_HAVE_CUDA
#include "runtime/cuda/driver_api.h"
#include "runtime/cuda/nvrtc_lib.h"
#endif

namespace qrig::cli {

namespace {

struct Usage {
  const char* command;
  const char* text;
};

// serve's usage is generated from its option table (cmd_serve.cpp).
const Usage kUsages[] = {
    {"compile",
     "usage: qrig compile MODEL.gguf|DIR [--rig RIG.toml] -o PLAN_DIR [options]\n"
     "Lowers the model to IR, runs the passes and writes PLAN_DIR/plan.toml + graph.ir; for a GPU rig also compiles\n"
     "every kernel variant the plan names into the cubin cache (NVRTC, no GPU needed).\n"
     "  -o, --out PLAN_DIR            where to write the plan (required)\n"
     "  --rig RIG.toml                the rig (qrig probe -o writes one; default: this machine's CPU)\n"
     "  --ctx N                       tokens per sequence (0: the most that fits, up to the model's trained context)\n"
     "  --parallel N                  sequence slots [4]\n"
     "  --batch N                     tokens per step (prefill chunk) [512]\n"
     "  --backend cpu|cuda            force a backend\n"
     "  --gpus N                      use at most N of the rig's GPUs\n"
     "  --gpu-memory-utilization F    fraction of each GPU's memory the plan may use [0.92]\n"
     "  --kv k8v3                     key and value cache formats k<bits>v<bits>, bits 16 (f16), 8 (q8), 4 (t4),\n"
     "                                3 (t3), 32 (f32) [the most precise pair that fits; CUDA: f16, q8, t4, t3 alike]\n"
     "  --draft N                     draft tokens per step of speculative decoding with the model's MTP head, 0 off\n"
     "                                [the draft pass's cost model; CPU plans of one stage only so far]\n"
     "  --prefix-cache-mib N          the shared prefix cache's budget (0: none) [16 snapshots per slot; CPU only]\n"
     "  --precise | --precise-rows N  two-plane int8 activations in every GPU matmul / in matmuls of at most N rows [4]\n"
     "  --emulate-dp4a                a CPU plan computing the GPU family's numerics\n"
     "  --no-cuda-graphs              decode kernel by kernel\n"
     "  --no-pdl                      plain kernel launches (no programmatic dependent launch on sm_90+)\n"
     "  --no-precompile               do not compile the kernels now\n"},
    {"inspect",
     "usage: qrig inspect PLAN_DIR [--graph]\n"
     "Prints every decision of a plan: kernels per op kind and range of rows with the cost model's reason, the bytes\n"
     "per device the runtime allocates and the headroom left; --graph adds the IR.\n"},
    {"verify",
     "usage: qrig verify MODEL.gguf|DIR|PLAN_DIR REF.gguf [options]\n"
     "Runs every sequence of a reference file and compares the logits (max relative error, top-1 agreement, mean KL\n"
     "divergence of the next-token distribution); exit 0 within tolerance. A draft reference (mtp_logits.<seq>) checks\n"
     "the plan's MTP draft head instead: its logits and intermediates per row, on the engine's hidden and alone.\n"
     "  --rig RIG.toml, --backend cpu|cuda   how to compile a .gguf (default: the CPU)\n"
     "  --model PATH                         a plan directory's model file at a new place\n"
     "  --tol X, --min-top1 F                tolerance (max |error| / max |logit|) and top-1 agreement minimum\n"
     "  --split N                            prefill N tokens, decode the rest one by one\n"
     "  --kv k8v3                            compile the .gguf with these key/value cache formats (and their floor)\n"
     "  --draft N                            compile the .gguf with N draft tokens (a draft reference needs N > 0)\n"
     "  --emulate-dp4a, --precise            the GPU family's numerics on the CPU; two-plane activations everywhere\n"
     "  --dump FILE                          write every position's logits (raw f32)\n"},
    {"run",
     "usage: qrig run [MODEL.gguf|DIR|PLAN_DIR] -p PROMPT [options]   (no model: the built-in tiny random model)\n"
     "Generates once, streaming to the terminal, then prints prompt and generation speed.\n"
     "  -p, --prompt TEXT | -f FILE   the prompt\n"
     "  --chat [--system S]           apply the model's chat template; --no-think turns thinking off\n"
     "  --parse-special               special tokens written in the prompt become their ids\n"
     "  -n, --n-predict N             tokens to generate at most\n"
     "  --temp T, --top-k K, --top-p P, --min-p P, --presence-penalty X, --frequency-penalty X,\n"
     "  --repeat-penalty X, --seed S, --stop STR   sampling\n"
     "  --rig RIG.toml, --backend cpu|cuda, --ctx N (-c, --ctx-size), --gpu-memory-utilization F, --kv k8v3,\n"
     "  --draft N                     compiling a .gguf (--draft: speculative decoding; its acceptance is printed)\n"
     "  -m, --model PATH              the model (or a plan directory's model file at a new place)\n"
     "  --no-cuda-graphs, --quiet\n"},
    {"tokenize",
     "usage: qrig tokenize MODEL.gguf [--parse-special] < text\n"
     "Prints the token ids of stdin, space-separated.\n"},
    {"template",
     "usage: qrig template MODEL.gguf < request.json\n"
     "Prints the exact prompt text of an OpenAI chat request body (messages, tools, chat_template_kwargs).\n"},
    {"bench",
     "usage: qrig bench MODEL.gguf|DIR|PLAN_DIR [options]\n"
     "llama-bench's tests: ppN prefills N random tokens, tgN decodes N tokens; a markdown table of t/s.\n"
     "  -p 512,4096   prompt lengths      -n 128   generation lengths      -d 0,32768   depths      -r 3   repetitions\n"
     "  --json FILE   every sample as JSON\n"
     "  --rig RIG.toml, --backend cpu|cuda, --ctx N, --gpu-memory-utilization F, --kv k8v3, --draft N   compiling a .gguf\n"
     "                (a plan that drafts runs tg speculatively and prints acceptance and tokens per step)\n"
     "  --model PATH  a plan directory's model file at a new place\n"
     "  --seed N, --no-cuda-graphs\n"},
    {"probe",
     "usage: qrig probe [-o RIG.toml] [--name NAME]\n"
     "Measures each GPU (compute units by micro-benchmark, memory, links) and writes the rig file qrig compile reads.\n"},
    {"synth",
     "usage: qrig synth --preset tiny|9b|27b [--type TYPE] [--seed N] -o FILE.gguf [--dry-run]\n"
     "Writes a random-weight model with the real converter's layout (--dry-run: print its metadata and tensors).\n"
     "  --type TYPE   q8_0 (default), q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k:\n"
     "                weights quantized by qrig's reference quantizer with llama-quantize's tensor-type mix\n"},
};


}  // namespace

std::string command_usage(const std::string& command) {
  if (command == "serve") return serve_usage();
  for (const Usage& u : kUsages)
    if (command == u.command) return u.text;
  return "";
}

std::string version_text() {
  std::string s = fmt::format("{} (commit {})\n", compiler::compiler_version(), QRIG_BUILD_COMMIT);
#ifdef QRIG_HAVE_CUDA
  s += "CUDA: the driver API and NVRTC are loaded at run time (nothing of CUDA is linked; docs/gpu.md)\n";
  std::string nvrtc;
  for (const cuda::NvrtcLib& l : cuda::nvrtc_libraries())
    nvrtc += fmt::format("{}{} ({})", nvrtc.empty() ? "" : ", ", l.version(), l.path);
  s += fmt::format("NVRTC: {}\n", nvrtc.empty() ? "not found (" + cuda::nvrtc_search_report().back() + ")" : nvrtc);
  std::string why;
  if (cuda::drv::driver_status(&why)) {
    const int v = cuda::drv::driver_version();
    s += fmt::format("CUDA driver: {}.{} (libcuda.so.1)\n", v / 1000, v % 1000 / 10);
  } else {
    s += fmt::format("CUDA driver: {} ({})\n", why.find("did not load") != std::string::npos ? "not found" : "not usable",
                     why);
  }
#else
  s += "CUDA: not in this build (CPU backend only)\n";
#endif
  return s;
}

}  // namespace qrig::cli
