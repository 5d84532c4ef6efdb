// Tests that run the qrig binary as a user does: a shell command line, its exit status and its output.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include <sys/wait.h>

namespace qrig::test {

struct CommandOutput {
  int rc;            // exit status (-1 when it did not exit normally)
  std::string text;  // stdout, with stderr appended when asked
};

// Runs `cmd` through the shell; stderr goes into text (both = true) or is dropped.
inline CommandOutput run_command(const std::string& cmd, bool both) {
  std::FILE* p = ::popen((cmd + (both ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  REQUIRE(p);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, s};
}

}  // namespace qrig::test
