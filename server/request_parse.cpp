// Request body parsing and the fields chat and text completions share (see request_parse.h for the policy).
#include "server/request_parse.h"

#include <cmath>
#include <limits>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "server/errors.h"

namespace qrig::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::invalid_request, message, param);
}

const Json* field(const Json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string type_name(const Json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

}  // namespace

// Builds the ordered DOM from nlohmann's SAX events. Not Json::parse: ordered_json inserts each key with a
// linear search over the object's keys, so an object with n keys took O(n^2) (100,000 keys: 15 s). Here a
// key goes to the end of its object unless it is already there (a duplicate key: the last value wins, in
// the first one's place, as Json::parse does), found by a linear look among the first keys and a hash index
// past kIndexFrom keys. Also bounds the nesting and turns every parse failure (number overflow included:
// 1e400) into a 400.
namespace {

class DomBuilder {
 public:
  explicit DomBuilder(Json& root) : root_(root) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(Json::number_integer_t v) { return put(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(v); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return put(v); }
  bool string(Json::string_t& v) { return put(std::move(v)); }
  bool binary(Json::binary_t& v) { return put(Json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(Json::string_t& k) {
    Frame& f = stack_.back();
    auto& items = static_cast<ObjectItems&>(*f.value->get_ptr<Json::object_t*>());
    size_t at = items.size();
    if (items.size() < kIndexFrom) {
      for (size_t i = 0; i < items.size(); ++i)
        if (items[i].first == k) at = i;
    } else {
      if (f.index.empty())
        for (size_t i = 0; i < items.size(); ++i) f.index.emplace(items[i].first, i);
      auto [it, fresh] = f.index.emplace(k, items.size());
      at = it->second;
    }
    if (at == items.size()) {
      items.emplace_back(std::move(k), nullptr);
      if (!f.index.empty() && f.index.size() < items.size()) f.index.emplace(items.back().first, at);
    }
    target_ = &items[at].second;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    bad("", std::string("the request body is not valid JSON: ") + e.what());
  }

 private:
  using ObjectItems = std::vector<std::pair<const std::string, Json>>;
  static constexpr size_t kIndexFrom = 16;
  struct Frame {
    Json* value;
    std::unordered_map<std::string, size_t> index;  // key -> position, for objects past kIndexFrom keys
  };

  // Where the next value goes: the root, the next array element, or the value of the last key.
  Json* slot() {
    if (stack_.empty()) return &root_;
    Json* top = stack_.back().value;
    if (top->is_array()) {
      top->get_ptr<Json::array_t*>()->emplace_back(nullptr);
      return &top->get_ptr<Json::array_t*>()->back();
    }
    return target_;
  }
  template <class V>
  bool put(V&& v) {
    *slot() = Json(std::forward<V>(v));
    return true;
  }
  bool open(Json empty) {
    if (stack_.size() >= (size_t)kMaxDepth)
      throw ApiError(ErrorKind::invalid_request, fmt::format("the JSON body is nested deeper than {} levels", kMaxDepth));
    Json* v = slot();
    *v = std::move(empty);
    stack_.push_back(Frame{v, {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  Json& root_;
  std::vector<Frame> stack_;
  Json* target_ = nullptr;
};

}  // namespace

Json parse_body(const std::string& body) {
  if (body.empty()) bad("", "the request body is empty; send a JSON object");
  Json j;
  DomBuilder builder(j);
  try {
    Json::sax_parse(body, &builder);
  } catch (const Json::exception& e) {  // the SAX parser's own failures (it reports most through parse_error)
    bad("", std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object, got " + type_name(j));
  return j;
}

std::optional<bool> get_bool(const Json& obj, const std::string& key, const std::string& param) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string& p = param.empty() ? key : param;
  if (!v->is_boolean()) bad(p, fmt::format("'{}' must be a boolean, got {}", p, type_name(*v)));
  return v->get<bool>();
}

std::optional<int64_t> get_int(const Json& obj, const std::string& key, int64_t lo, int64_t hi,
                               const std::string& param) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string& p = param.empty() ? key : param;
  int64_t x = 0;
  bool ok = true;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    ok = u <= (uint64_t)std::numeric_limits<int64_t>::max();
    x = (int64_t)u;
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    double d = v->get<double>();
    if (!(std::isfinite(d) && d == std::floor(d))) bad(p, fmt::format("'{}' must be an integer, got {}", p, d));
    ok = d >= -9.2e18 && d <= 9.2e18;
    x = ok ? (int64_t)d : 0;
  } else {
    bad(p, fmt::format("'{}' must be an integer, got {}", p, type_name(*v)));
  }
  if (!ok || x < lo || x > hi) bad(p, fmt::format("'{}' must be in [{}, {}], got {}", p, lo, hi, v->dump()));
  return x;
}

std::optional<double> get_number(const Json& obj, const std::string& key, double lo, double hi,
                                 const std::string& param) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string& p = param.empty() ? key : param;
  if (!v->is_number()) bad(p, fmt::format("'{}' must be a number, got {}", p, type_name(*v)));
  double d = v->get<double>();
  if (!(d >= lo && d <= hi)) bad(p, fmt::format("'{}' must be in [{}, {}], got {}", p, lo, hi, v->dump()));
  return d;
}

std::optional<std::string> get_string(const Json& obj, const std::string& key, const std::string& param) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string& p = param.empty() ? key : param;
  if (!v->is_string()) bad(p, fmt::format("'{}' must be a string, got {}", p, type_name(*v)));
  return v->get<std::string>();
}

namespace {

void parse_stop(const Json& body, GenParams& out) {
  const Json* v = field(body, "stop");
  if (!v) return;
  constexpr size_t kMaxStops = 16, kMaxStopBytes = 1024;
  auto add = [&](const Json& s, const std::string& p) {
    if (!s.is_string()) bad(p, fmt::format("'{}' must be a string, got {}", p, type_name(s)));
    const std::string& str = s.get_ref<const std::string&>();
    if (str.empty()) bad(p, fmt::format("'{}' must not be an empty string", p));
    if (str.size() > kMaxStopBytes) bad(p, fmt::format("'{}' is longer than {} bytes", p, kMaxStopBytes));
    out.stop.push_back(str);
  };
  if (v->is_string()) {
    add(*v, "stop");
  } else if (v->is_array()) {
    if (v->size() > kMaxStops) bad("stop", fmt::format("'stop' may hold at most {} strings, got {}", kMaxStops, v->size()));
    for (size_t i = 0; i < v->size(); ++i) add((*v)[i], fmt::format("stop[{}]", i));
  } else {
    bad("stop", "'stop' must be a string or an array of strings, got " + type_name(*v));
  }
}

void parse_logit_bias(const Json& body, GenParams& out, int32_t n_real_vocab) {
  const Json* v = field(body, "logit_bias");
  if (!v) return;
  if (!v->is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases, got " + type_name(*v));
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits &= c >= '0' && c <= '9';
    if (digits) id = std::stoll(key);
    if (!digits || id >= n_real_vocab)
      bad("logit_bias", fmt::format("'logit_bias' key '{}' is not a token id in [0, {})", key, n_real_vocab));
    const Json& b = it.value();
    if (!b.is_number() || !(b.get<double>() >= -100.0 && b.get<double>() <= 100.0))
      bad("logit_bias", fmt::format("'logit_bias' value for token {} must be a number in [-100, 100]", id));
    out.sampling.logit_bias.emplace_back((int32_t)id, (float)b.get<double>());
  }
}

}  // namespace

namespace {

std::vector<int32_t> token_ids(const Json& body, const char* key, int32_t n_real_vocab) {
  std::vector<int32_t> ids;
  const Json* v = field(body, key);
  if (!v) return ids;
  if (!v->is_array()) bad(key, fmt::format("'{}' must be an array of token ids, got {}", key, type_name(*v)));
  if (v->size() > (size_t)n_real_vocab) bad(key, fmt::format("'{}' has more entries than the vocabulary", key));
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    if (!(e.is_number_integer() || e.is_number_unsigned()) || e.get<int64_t>() < 0 || e.get<int64_t>() >= n_real_vocab)
      bad(key, fmt::format("'{}[{}]' must be a token id in [0, {})", key, i, n_real_vocab));
    ids.push_back((int32_t)e.get<int64_t>());
  }
  return ids;
}

// Fields of llama.cpp and vLLM that this server honours beyond OpenAI's (docs/server.md).
void parse_extensions(const Json& body, GenParams& out, int32_t n_real_vocab, std::set<std::string>& known) {
  for (const char* k : {"n_predict", "n_cmpl", "ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output",
                        "typical_p", "xtc_probability", "xtc_threshold", "repeat_last_n", "truncate_prompt_tokens",
                        "truncation_side", "allowed_token_ids", "spaces_between_special_tokens", "draft"})
    known.insert(k);
  runtime::SamplingParams& s = out.sampling;
  if (auto t = get_number(body, "typical_p", 0.0, 1.0)) {
    if (*t <= 0.0) bad("typical_p", "'typical_p' must be in (0, 1]; 1 turns it off");
    s.typical_p = (float)*t;
  }
  if (auto x = get_number(body, "xtc_probability", 0.0, 1.0)) s.xtc_probability = (float)*x;
  if (auto x = get_number(body, "xtc_threshold", 0.0, 1.0)) s.xtc_threshold = (float)*x;
  // llama.cpp: -1 = the whole context (here: every generated token), 0 = penalties off.
  if (auto n = get_int(body, "repeat_last_n", -1, std::numeric_limits<int32_t>::max())) s.penalty_last_n = (int32_t)*n;
  out.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  out.draft = get_bool(body, "draft").value_or(true);  // qrig: false decodes this request without speculation
  out.min_tokens = get_int(body, "min_tokens", 0, std::numeric_limits<int64_t>::max()).value_or(0);
  out.stop_token_ids = token_ids(body, "stop_token_ids", n_real_vocab);
  out.allowed_token_ids = token_ids(body, "allowed_token_ids", n_real_vocab);
  if (const Json* a = field(body, "allowed_token_ids"); a && a->empty())
    bad("allowed_token_ids", "'allowed_token_ids' must not be empty");
  out.include_stop_str = get_bool(body, "include_stop_str_in_output").value_or(false);
  out.truncate_prompt_tokens = get_int(body, "truncate_prompt_tokens", -1, std::numeric_limits<int64_t>::max()).value_or(0);
  if (out.truncate_prompt_tokens == 0 && field(body, "truncate_prompt_tokens"))
    bad("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 (the context) or at least 1");
  if (auto side = get_string(body, "truncation_side")) {
    if (*side != "left" && *side != "right")
      bad("truncation_side", fmt::format("'truncation_side' must be \"left\" or \"right\", got \"{}\"", *side));
    out.truncate_left = *side == "left";
  }
  // vLLM puts spaces around special tokens it prints (skip_special_tokens false) unless this is false; this
  // server never does.
  if (get_bool(body, "spaces_between_special_tokens").value_or(false) && !out.skip_special_tokens)
    throw ApiError(ErrorKind::unsupported,
                   "'spaces_between_special_tokens': true is not supported: special tokens are printed without spaces",
                   "spaces_between_special_tokens");

  if (auto np = get_int(body, "n_predict", -1, std::numeric_limits<int64_t>::max())) {
    if (field(body, "max_tokens") || field(body, "max_completion_tokens"))
      bad("n_predict", "give 'n_predict' or 'max_tokens' / 'max_completion_tokens', not both");
    if (*np == 0)
      throw ApiError(ErrorKind::unsupported, "'n_predict': 0 (evaluate the prompt only) is not supported", "n_predict");
    out.max_tokens = *np < 0 ? -1 : *np;
  }
  if (auto nc = get_int(body, "n_cmpl", 1, kMaxSamples)) {
    if (field(body, "n") && out.n != *nc) bad("n_cmpl", "give 'n' or its alias 'n_cmpl', not both");
    out.n = *nc;
  }
}

}  // namespace

std::vector<int32_t> truncated_prompt(std::vector<int32_t> prompt, const GenParams& g, int64_t n_ctx) {
  const int64_t keep = g.truncate_prompt_tokens < 0 ? n_ctx - 1 : g.truncate_prompt_tokens;
  if (g.truncate_prompt_tokens == 0 || (int64_t)prompt.size() <= keep || keep <= 0) return prompt;
  if (g.truncate_left) prompt.erase(prompt.begin(), prompt.end() - keep);
  else prompt.resize((size_t)keep);
  return prompt;
}

void parse_common(const Json& body, GenParams& out, int32_t n_real_vocab, int64_t default_max_tokens,
                  std::set<std::string>& known) {
  for (const char* k : {"model", "user", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                        "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                        "repetition_penalty", "repeat_penalty", "seed", "logit_bias", "stop", "n",
                        "skip_special_tokens"})
    known.insert(k);
  if (const Json* m = field(body, "model"); m && !m->is_string())
    bad("model", "'model' must be a string, got " + type_name(*m));
  if (const Json* u = field(body, "user"); u && !u->is_string()) bad("user", "'user' must be a string, got " + type_name(*u));

  runtime::SamplingParams& s = out.sampling;
  if (auto t = get_number(body, "temperature", 0.0, 100.0)) s.temperature = (float)*t;
  if (auto t = get_number(body, "top_p", 0.0, 1.0)) {
    if (*t <= 0.0) bad("top_p", "'top_p' must be in (0, 1]; use temperature 0 for greedy decoding");
    s.top_p = (float)*t;
  }
  if (auto k = get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = *k <= 0 ? 0 : (int32_t)*k;
  if (auto m = get_number(body, "min_p", 0.0, 1.0)) s.min_p = (float)*m;
  if (auto p = get_number(body, "presence_penalty", -2.0, 2.0)) s.presence_penalty = (float)*p;
  if (auto f = get_number(body, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = (float)*f;
  auto rep = get_number(body, "repetition_penalty", 1e-6, 10.0);
  auto rep2 = get_number(body, "repeat_penalty", 1e-6, 10.0);
  if (rep && rep2) bad("repeat_penalty", "give 'repetition_penalty' or its alias 'repeat_penalty', not both");
  if (rep || rep2) s.repetition_penalty = (float)(rep ? *rep : *rep2);

  if (const Json* seed = field(body, "seed")) {
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else {
      int64_t v = *get_int(body, "seed", -1, std::numeric_limits<int64_t>::max());
      if (v >= 0) s.seed = (uint64_t)v;  // -1: random (llama.cpp's convention)
    }
  }
  parse_logit_bias(body, out, n_real_vocab);
  parse_stop(body, out);

  auto mt = get_int(body, "max_tokens", 1, std::numeric_limits<int64_t>::max());
  auto mct = get_int(body, "max_completion_tokens", 1, std::numeric_limits<int64_t>::max());
  out.max_tokens = mct ? *mct : mt ? *mt : default_max_tokens;

  if (auto n = get_int(body, "n", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    if (*n < 1) bad("n", fmt::format("'n' must be at least 1, got {}", *n));
    if (*n > kMaxSamples)
      throw ApiError(ErrorKind::unsupported, fmt::format("n is at most {} here, got n = {}", kMaxSamples, *n), "n");
    out.n = *n;
  }

  out.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
  parse_extensions(body, out, n_real_vocab, known);
  out.stream = get_bool(body, "stream").value_or(false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object, got " + type_name(*so));
    if (!out.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    out.include_usage = get_bool(*so, "include_usage", "stream_options.include_usage").value_or(false);
  }
}

std::string unknown_fields(const Json& body, const std::set<std::string>& known) {
  std::string out;
  auto add = [&](const std::string& k) {
    if (!out.empty()) out += ",";
    out += k;
  };
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!known.count(it.key())) add(it.key());
  // Keys inside stream_options other than include_usage (parse_common records them with a prefix).
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object())
    for (auto it = so->begin(); it != so->end(); ++it)
      if (it.key() != "include_usage") add("stream_options." + it.key());
  return out;
}


}  // namespace qrig::server
