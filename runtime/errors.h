// What both backends (and everything driving them) share: the error a run reports, and the callback through
// which a run shows its tapped hidden states (verification compares them with a reference, layer by layer).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace qrig::runtime {

struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Called with (tap name, pointer to rows x width floats, rows, width) for every op carrying a `tap` attribute.
using TapFn = std::function<void(const std::string&, const float*, int64_t, int64_t)>;

}  // namespace qrig::runtime
