// Where the tests find the reference material (../shared: fixtures/, reference/; see its fixtures/README.md):
// $QRIG_SHARED_DIR when set, else ../shared beside the checkout.
#pragma once

#include <cstdlib>
#include <string>

namespace qrig::fixtures {

inline std::string shared_dir() {
  const char* env = std::getenv("QRIG_SHARED_DIR");
  return env && *env ? std::string(env) : std::string(QRIG_SHARED_DIR_DEFAULT);
}

// shared_dir() + "/" + rel, e.g. shared_path("fixtures/tiny.gguf").
inline std::string shared_path(const std::string& rel) { return shared_dir() + "/" + rel; }

}  // namespace qrig::fixtures
