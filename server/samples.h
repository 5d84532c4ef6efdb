// Internal to server/: starting a request's samples in the engine. The endpoints (chat completions,
// completions, and the Messages / Responses APIs built on chat) all turn GenParams plus a tokenized prompt
// into engine requests the same way: the stop tokens (the model's end-of-generation ids unless ignore_eos,
// plus stop_token_ids), min_tokens, logprobs, one constraint per sample, and n samples sharing one prefill.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/constraint.h"
#include "server/generation.h"
#include "server/request_parse.h"

namespace qrig::server {

// The engine request of one sample (its constraint made by `make`, when not null).
runtime::Request sample_request(const ServedModel& model, const std::vector<int32_t>& prompt, const GenParams& g,
                                const ConstraintMaker& make);

// Submits g.n samples of `prompt`: one Generation for n = 1, a group (one prefill) otherwise. Throws like
// Generation's constructor. prompt_param: the field blamed when the prompt does not fit.
std::vector<std::unique_ptr<Generation>> start_samples(const std::shared_ptr<const ServedModel>& model,
                                                       const std::vector<int32_t>& prompt, const GenParams& g,
                                                       const ConstraintMaker& make, const std::string& prompt_param);

// The usage of several samples of one prompt: the prompt counted once, the completions summed (and the
// reasoning tokens, when reasoning_tokens is given, one entry per sample).
nlohmann::json samples_usage(const std::vector<std::unique_ptr<Generation>>& gens,
                             const std::vector<int64_t>& reasoning_tokens = {});

}  // namespace qrig::server
