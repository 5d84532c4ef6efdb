// Engine requests for a request's samples (see samples.h).
#include "server/samples.h"

#include <algorithm>

namespace qrig::server {

runtime::Request sample_request(const ServedModel& model, const std::vector<int32_t>& prompt, const GenParams& g,
                                const ConstraintMaker& make) {
  runtime::Request r;
  r.prompt = prompt;
  r.sampling = g.sampling;
  r.max_tokens = g.max_tokens;
  if (!g.ignore_eos) r.stop_tokens = model.eog;
  for (int32_t id : g.stop_token_ids)
    if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), id) == r.stop_tokens.end()) r.stop_tokens.push_back(id);
  r.min_tokens = g.min_tokens;
  r.draft = g.draft;
  r.top_logprobs = g.top_logprobs;
  if (make) r.constraint = make();
  return r;
}

std::vector<std::unique_ptr<Generation>> start_samples(const std::shared_ptr<const ServedModel>& model,
                                                       const std::vector<int32_t>& prompt, const GenParams& g,
                                                       const ConstraintMaker& make, const std::string& prompt_param) {
  Generation::Options opt{g.stop, prompt_param, g.skip_special_tokens, g.include_stop_str};
  std::vector<std::unique_ptr<Generation>> gens;
  if (g.n <= 1) {
    gens.push_back(std::make_unique<Generation>(model, sample_request(*model, prompt, g, make), opt));
    return gens;
  }
  std::vector<runtime::Request> reqs;
  for (int64_t i = 0; i < g.n; ++i) {
    reqs.push_back(sample_request(*model, prompt, g, make));
    // A seed makes the whole set reproducible, not every sample the same.
    if (g.sampling.seed) reqs.back().sampling.seed = *g.sampling.seed + (uint64_t)i;
  }
  return Generation::group(model, std::move(reqs), opt);
}

nlohmann::json samples_usage(const std::vector<std::unique_ptr<Generation>>& gens,
                             const std::vector<int64_t>& reasoning_tokens) {
  if (gens.empty()) return nullptr;
  nlohmann::json u = gens.front()->usage(reasoning_tokens.empty() ? -1 : reasoning_tokens.front());
  int64_t completion = 0, reasoning = 0;
  for (size_t i = 0; i < gens.size(); ++i) {
    completion += gens[i]->usage()["completion_tokens"].get<int64_t>();
    if (i < reasoning_tokens.size()) reasoning += reasoning_tokens[i];
  }
  u["completion_tokens"] = completion;
  u["total_tokens"] = u["prompt_tokens"].get<int64_t>() + completion;
  if (!reasoning_tokens.empty()) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return u;
}

}  // namespace qrig::server
