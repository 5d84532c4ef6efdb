// Where the tests find the reference material (../shared: fixtures/, reference/; see its fixtures/README.md):
// $QRIG_SHARED_DIR when set, else ../shared beside the checkout. A fresh clone may not have it: every test case
// that reads it carries the tag [fixtures], and tests/main.cpp handles their absence once per binary (one
// message naming what is missing; the tests/missing_input.h rules decide between failing and skipping).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace qrig::fixtures {

inline std::string shared_dir() {
  const char* env = std::getenv("QRIG_SHARED_DIR");
  return env && *env ? std::string(env) : std::string(QRIG_SHARED_DIR_DEFAULT);
}

// shared_dir() + "/" + rel, e.g. fixture_path("fixtures/tiny.gguf").
inline std::string shared_path(const std::string& rel) { return shared_dir() + "/" + rel; }

// The files every [fixtures] test may read; main.cpp checks they exist before any test runs.
inline const char* const kFixtureFiles[] = {"fixtures/tiny.gguf", "fixtures/tiny-ref.gguf", "fixtures/tiny-mtp.gguf",
                                            "fixtures/tiny-chat-cases.json", "reference/qwen3.5-chat-template.jinja",
                                            "fixtures/kquant/kq-q4_k_m.gguf", "fixtures/kquant/kq-q4_k_m-ref.gguf"};

// The first of kFixtureFiles that is missing ("" when all are there).
inline std::string missing_fixture() {
  for (const char* f : kFixtureFiles)
    if (!std::filesystem::exists(shared_path(f))) return shared_path(f);
  return "";
}

}  // namespace qrig::fixtures
