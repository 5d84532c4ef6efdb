// Records the largest single heap request made through operator new while armed, so tests can check that a
// corrupt count never drives an allocation larger than the input (see alloc_probe.cpp).
#pragma once

#include <cstddef>

namespace qrig::gguf_test {

void alloc_probe_arm();       // start recording (resets the maximum)
size_t alloc_probe_disarm();  // stop; returns the largest request seen while armed

}  // namespace qrig::gguf_test
