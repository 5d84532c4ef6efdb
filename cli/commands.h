// The qrig subcommands, one function each (argv as given to main, argv[1] is the subcommand).
#pragma once

#include <memory>
#include <string>

#include "ir/plan.h"

namespace qrig::cli {

int cmd_compile(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_verify(int argc, char** argv);
int cmd_serve(int argc, char** argv);  // cli/cmd_serve.cpp: the OpenAI-compatible server
int cmd_run(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_template(int argc, char** argv);
int cmd_probe(int argc, char** argv);  // cli/cmd_probe.cpp: measure the GPUs and links, write a rig
int cmd_bench(int argc, char** argv);  // cli/cmd_bench.cpp: llama-bench-style pp/tg table

// `qrig CMD --help`: the usage text of a subcommand ("" for an unknown one); `qrig --version`.
std::string command_usage(const std::string& command);
std::string serve_usage();  // cli/cmd_serve.cpp: generated from its option table
std::string version_text();

// The built-in default model (a `qrig synth --preset tiny` model written once to the user's cache
// directory), used when run/serve get no model.
std::string builtin_model_path();

// A model ready to execute: from a plan directory, or a .gguf compiled on the spot for a rig (default: this
// machine's CPU). `path` may also be a directory holding one model (cli/model_source.h). The plan's notes that
// start with "warning:" are printed to stderr.
struct LoadOptions {
  std::string rig_path;      // empty: default rig
  std::string backend;       // "", "cpu", "cuda"
  int64_t context_length = 0;
  int64_t max_sequences = 4;
  int64_t precise_rows = -1;  // CompileOptions::precise_rows
  int64_t max_logit_rows = 0;  // CompileOptions::max_logit_rows
  std::string family;          // CompileOptions::family ("dp4a-emulated")
  bool ptx_jit = false;        // CompileOptions::ptx_jit (--ptx: an older architecture's plan on a newer GPU)
  double gpu_memory_utilization = 0;  // CompileOptions::gpu_memory_utilization; 0: its default
  std::string model_override;  // --model: a plan directory's model file at a new place
  std::string kv;              // CompileOptions::kv (--kv k8v3); "" lets the compiler choose
  int64_t draft_tokens = -1;   // CompileOptions::draft_tokens (--draft N); -1 lets the draft pass choose
  int64_t prefix_cache_mib = -1;  // CompileOptions::prefix_cache_mib (--prefix-cache-mib); -1: the default
};
ir::Plan load_or_compile_plan(const std::string& path, const LoadOptions& opt);

class Args;
// llama.cpp's -ngl N (parsed as --n-gpu-layers): 0 keeps every layer on the CPU, which is qrig's --backend cpu;
// another count asks for a split offload that qrig's plans do not make: a UsageError naming qrig's flags.
// Returns the backend to compile for.
std::string backend_for_ngl(const Args& a, const std::string& backend);

}  // namespace qrig::cli
