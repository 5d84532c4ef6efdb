// qrig: one binary for every command (compile, inspect, verify, run, serve, bench, probe, synth...).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/synth.h"

namespace {

const char* kUsage =
    "usage: qrig COMMAND [ARGS]\n"
    "  compile MODEL.gguf [--rig RIG.toml] -o PLAN_DIR   compile a plan for a rig\n"
    "  inspect PLAN_DIR [--graph]                         print a plan's decisions\n"
    "  verify MODEL|PLAN REF.gguf [--tol X] [--split N]   compare with a reference file\n"
    "  run [MODEL|PLAN] -p PROMPT [--chat] [--no-think]    generate, streaming to the terminal\n"
    "  serve [MODEL|PLAN] [--port N] [--parallel N]       OpenAI-compatible HTTP server\n"
    "  tokenize MODEL.gguf [--parse-special] < text       print token ids\n"
    "  template MODEL.gguf < request.json                 print the chat prompt of a request\n"
    "  bench MODEL|PLAN [-p 512,4096] [-n 128] [-d D]     llama-bench-style speed table\n"
    "  probe [-o RIG.toml] [--name NAME]                  measure the GPUs and links, write a rig\n"
    "  synth --preset tiny|9b|27b [--seed N] -o FILE      write a random-weight model\n"
    "`qrig COMMAND --help` prints a command's options; `qrig --version` the version, commit and CUDA pieces.\n";

bool wants_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version")) {
    std::fputs(qrig::cli::version_text().c_str(), stdout);
    return 0;
  }
  const std::string cmd = argv[1];
  const std::string usage = qrig::cli::command_usage(cmd);
  if (!usage.empty() && wants_help(argc, argv)) {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  try {
    if (cmd == "compile") return qrig::cli::cmd_compile(argc, argv);
    if (cmd == "inspect") return qrig::cli::cmd_inspect(argc, argv);
    if (cmd == "verify") return qrig::cli::cmd_verify(argc, argv);
    if (cmd == "run") return qrig::cli::cmd_run(argc, argv);
    if (cmd == "serve") return qrig::cli::cmd_serve(argc, argv);
    if (cmd == "tokenize") return qrig::cli::cmd_tokenize(argc, argv);
    if (cmd == "template") return qrig::cli::cmd_template(argc, argv);
    if (cmd == "probe") return qrig::cli::cmd_probe(argc, argv);
    if (cmd == "synth") return qrig::cli::cmd_synth(argc, argv);
    if (cmd == "bench") return qrig::cli::cmd_bench(argc, argv);
    fmt::print(stderr, "qrig: unknown command '{}'\n{}", cmd, kUsage);
    return 2;
  } catch (const qrig::cli::UsageError& e) {
    fmt::print(stderr, "qrig {}: {}\n(qrig {} --help lists the options)\n", cmd, e.what(), cmd);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "qrig {}: error: {}\n", cmd, e.what());
    return 1;
  }
}
