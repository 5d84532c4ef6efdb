// Catch2 main for every test binary (one per area, see CMakeLists.txt). Before running, it checks the reference
// material that the [fixtures] test cases read (tests/fixtures.h): when it is missing (a fresh clone without
// ../shared), one message says what is missing and how many selected test cases need it; those cases are then
// skipped (QRIG_TESTS_ALLOW_MISSING=1 outside CI, tests/missing_input.h) or the run fails after the others.
// A binary left with nothing to run exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "tests/fixtures.h"
#include "tests/missing_input.h"

namespace {

size_t selected(Catch::Session& session) {
  const Catch::Config& cfg = session.config();
  return Catch::filterTests(Catch::getAllTestCasesSorted(cfg), cfg.testSpec(), cfg).size();
}

}  // namespace

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv)) return rc;
  if (session.configData().listTests || session.configData().listTags || session.configData().listTestNamesOnly ||
      session.configData().showHelp)
    return session.run();
  const std::string missing = qrig::fixtures::missing_fixture();
  if (missing.empty()) return session.run();

  const size_t all = selected(session);
  Catch::ConfigData data = session.configData();
  data.testsOrTags.push_back("~[fixtures]");
  session.useConfigData(data);
  const size_t rest = selected(session);
  if (rest == all) return session.run();  // none of the selected cases reads the fixtures

  const bool allowed = qrig::test::missing_inputs_allowed();
  std::fprintf(stderr,
               "%s: %zu of %zu test cases need the reference fixtures, and %s is missing: set QRIG_SHARED_DIR to the "
               "directory holding fixtures/ and reference/ (../shared beside the checkout by default)%s\n",
               allowed ? "SKIPPED" : "missing test input", all - rest, all, missing.c_str(),
               allowed ? " (QRIG_TESTS_ALLOW_MISSING=1)"
                       : "; they fail (set QRIG_TESTS_ALLOW_MISSING=1 to skip them on purpose outside CI)");
  if (rest == 0) return allowed ? 77 : 1;
  const int rc = session.run();
  return allowed ? rc : (rc ? rc : 1);
}
