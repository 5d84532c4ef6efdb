// Random sampler parameters over the space the GPU top-k path takes (tests/runtime/test_sampler.cpp checks
// the host side, tests/gpu/test_gpu_sampling.cpp the kernels): a seed, greedy or a temperature in [0.2, 2),
// top_k 1..64, top_p and min_p on or off, presence / frequency penalties of either sign or off, repetition
// off, below or above 1. Biases, history and the penalty window are the callers' (they differ per test).
#pragma once

#include <cstdint>
#include <random>

#include "runtime/sampler.h"

namespace qrig::runtime::test {

inline void random_top_params(std::mt19937_64& g, SamplingParams& p) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto pick = [&](int lo, int hi) { return lo + (int)(g() % (uint64_t)(hi - lo + 1)); };
  p.seed = g();
  p.temperature = pick(0, 3) == 0 ? 0.0f : 0.2f + 1.8f * u(g);
  p.top_k = pick(1, 64);
  p.top_p = pick(0, 1) ? 1.0f : 0.05f + 0.95f * u(g);
  p.min_p = pick(0, 1) ? 0.0f : 0.5f * u(g);
  p.presence_penalty = pick(0, 1) ? 0.0f : -2.0f + 4.0f * u(g);
  p.frequency_penalty = pick(0, 1) ? 0.0f : -1.0f + 2.0f * u(g);
  const int rep = pick(0, 2);
  p.repetition_penalty = rep == 0 ? 1.0f : rep == 1 ? 0.5f + 0.5f * u(g) : 1.0f + u(g);
}

}  // namespace qrig::runtime::test
