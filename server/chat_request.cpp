// Chat-completions request validation and output shaping (see chat_request.h).
#include "server/chat_request.h"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "server/constraint.h"
#include "server/errors.h"
#include "text/chat.h"
#include "text/grammar.h"

namespace qrig::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::invalid_request, message, param);
}

// Images, video and audio would render as placeholder tokens with nothing behind them: refuse them.
void reject_media(const Json& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object()) continue;  // the renderer names the problem
    auto c = m.find("content");
    if (c == m.end() || !c->is_array()) continue;
    for (const Json& part : *c) {
      if (!part.is_object()) continue;
      std::string type = part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
      bool media = type == "image_url" || type == "image" || type == "video" || type == "input_audio" ||
                   type == "file" || part.contains("image_url") || part.contains("image") || part.contains("video");
      if (media)
        throw ApiError(ErrorKind::unsupported,
                       fmt::format("messages[{}] has a '{}' content part; this server has no vision or audio encoder "
                                   "and accepts text parts only", i, type.empty() ? "media" : type),
                       "messages");
    }
  }
}

// Tool definitions the grammar and the template would otherwise bend: parameters that are not an object
// schema (a string, a number, an array) were replaced by {} under a forced call.
void check_tool_definitions(const Json& tools) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    if (!t.is_object()) continue;  // the output parser names the problem
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) continue;
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_null() && !params->is_object())
      bad("tools", fmt::format("'tools[{}].function.parameters' must be a JSON Schema object, got {}", i,
                               params->is_string() ? "a string" : params->is_array() ? "an array" : params->is_boolean() ? "a boolean" : "a number"));
  }
}

}  // namespace

void check_messages(const Json& messages) {
  if (!messages.is_array()) return;  // the caller or the renderer names the problem
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object()) continue;
    auto role = m.find("role");
    const std::string r = role != m.end() && role->is_string() ? role->get<std::string>() : "";
    auto c = m.find("content");
    const bool has_content = c != m.end() && !c->is_null();
    if ((r == "user" || r == "system" || r == "developer" || r == "tool") && !has_content)
      bad("messages", fmt::format("'messages[{}]' (role '{}') has no 'content'", i, r));
    auto rc = m.find("reasoning_content");
    if (rc != m.end() && !rc->is_null() && !rc->is_string())
      bad("messages", fmt::format("'messages[{}].reasoning_content' must be a string", i));
  }
}

namespace {

ToolChoice parse_tool_choice(const Json& body, bool has_tools) {
  ToolChoice tc;
  tc.mode = has_tools ? ToolChoice::Mode::automatic : ToolChoice::Mode::none;
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return tc;
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    if (s == "none") tc.mode = ToolChoice::Mode::none;
    else if (s == "auto") tc.mode = ToolChoice::Mode::automatic;
    else if (s == "required") tc.mode = ToolChoice::Mode::required;
    else bad("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                        "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got \"{}\"", s));
  } else if (it->is_object()) {
    auto fn = it->find("function");
    auto type = it->find("type");
    if (type != it->end() && !(type->is_string() && *type == "function"))
      bad("tool_choice", "'tool_choice.type' must be \"function\"");
    if (fn == it->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      bad("tool_choice", "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
    tc.mode = ToolChoice::Mode::named;
    tc.name = (*fn)["name"].get<std::string>();
  } else {
    bad("tool_choice", "'tool_choice' must be a string or an object");
  }
  if (!has_tools && tc.mode != ToolChoice::Mode::none && tc.mode != ToolChoice::Mode::automatic)
    bad("tool_choice", "'tool_choice' asks for a tool call but the request has no 'tools'");
  return tc;
}

}  // namespace

ChatRequest parse_chat_request(const Json& body, const ServedModel& model, const FieldPolicy& policy) {
  ChatRequest c;
  std::set<std::string> known = {"messages", "tools", "tool_choice", "parallel_tool_calls", "logprobs",
                                 "top_logprobs", "chat_template_kwargs", "add_generation_prompt", "parse_special",
                                 "enable_thinking", "reasoning_effort", "continue_final_message", "include_reasoning",
                                 "reasoning_format", "thinking_token_budget"};
  std::string refused;
  check_table_fields(body, Endpoint::chat, policy, known, refused);
  if (auto mod = body.find("modalities"); mod != body.end() && !mod->is_null()) {
    known.insert("modalities");
    if (!mod->is_array()) bad("modalities", "'modalities' must be an array");
    for (const Json& m : *mod)
      if (!(m.is_string() && m == "text"))
        throw ApiError(ErrorKind::unsupported, "only the \"text\" modality is supported", "modalities");
  }

  auto msgs = body.find("messages");
  if (msgs == body.end() || msgs->is_null()) bad("messages", "'messages' is required");
  if (!msgs->is_array() || msgs->empty()) bad("messages", "'messages' must be a non-empty array of messages");
  reject_media(*msgs);
  check_messages(*msgs);

  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", "'tools' must be an array");
    if (!t->empty()) {
      check_tool_definitions(*t);
      nlohmann::json tools = nlohmann::json::parse(t->dump());  // validate with the parser's own rules
      try {
        text::OutputStreamParser probe(tools, false);
      } catch (const std::invalid_argument& e) {
        bad("tools", e.what());
      }
      c.tools = std::move(tools);
    }
  }
  c.choice = parse_tool_choice(body, !c.tools.is_null());
  if (c.choice.mode == ToolChoice::Mode::named) {
    bool found = false;
    for (const auto& t : c.tools) found |= t.contains("function") && t["function"].value("name", "") == c.choice.name;
    if (!found) bad("tool_choice", fmt::format("'tool_choice' names function '{}', which is not in 'tools'", c.choice.name));
  }
  c.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  c.include_reasoning = get_bool(body, "include_reasoning").value_or(true);
  if (auto rf = get_string(body, "reasoning_format")) {
    if (*rf == "none") c.parse_reasoning = false;
    else if (*rf == "deepseek-legacy")
      throw ApiError(ErrorKind::unsupported, "'reasoning_format' \"deepseek-legacy\" (the tags kept in the content as well) "
                     "is not supported", "reasoning_format");
    else if (*rf != "auto" && *rf != "deepseek")
      bad("reasoning_format", fmt::format("'reasoning_format' must be \"auto\", \"deepseek\" or \"none\", got \"{}\"", *rf));
  }

  const OutputSpec spec = parse_output_spec(body, known);
  const bool forced_call = c.choice.mode == ToolChoice::Mode::required || c.choice.mode == ToolChoice::Mode::named;
  if (forced_call && spec.kind != OutputSpec::Kind::none)
    bad(spec.param, fmt::format("'{}' and a forced tool call ('tool_choice') cannot be combined", spec.param));

  const bool logprobs = get_bool(body, "logprobs").value_or(false);
  const auto top = get_int(body, "top_logprobs", 0, 20);
  if (top && *top > 0 && !logprobs) bad("top_logprobs", "'top_logprobs' requires 'logprobs': true");

  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && kw->is_object())
    for (auto it = kw->begin(); it != kw->end(); ++it)
      if (it.key() != "enable_thinking" && it.key() != "preserve_thinking" && it.key() != "add_vision_id")
        c.ignored += (c.ignored.empty() ? "" : ",") + ("chat_template_kwargs." + it.key());

  // Special tokens written in the request's own text (messages, tools) stay text unless parse_special.
  const bool parse_special = get_bool(body, "parse_special").value_or(false);
  text::RenderedChat rendered;
  try {
    rendered = text::render_chat_request_with_spans(body);
  } catch (const text::ChatError& e) {
    const std::string m = e.what();
    bad(m.find("enable_thinking") != std::string::npos   ? "enable_thinking"
        : m.find("reasoning_effort") != std::string::npos ? "reasoning_effort"
        : m.find("continue_final_message") != std::string::npos ? "continue_final_message"
                                                                 : "messages",
        m);
  }
  c.thinking = rendered.output_in_reasoning;
  c.continued = rendered.continued;
  if (c.continued && !c.thinking && (forced_call || spec.kind != OutputSpec::Kind::none))
    bad("messages", "a continued assistant message (assistant prefill) cannot be combined with constrained output "
                    "('response_format', guided fields, or a forced tool call): the constraint would start over after "
                    "the prefill");

  c.gen.sampling = runtime::SamplingParams::qwen_defaults(c.thinking);
  parse_common(body, c.gen, model.tokenizer->n_real(), -1, known);
  c.gen.top_logprobs = logprobs ? (int32_t)top.value_or(0) : -1;
  if (c.choice.mode == ToolChoice::Mode::none && !c.tools.is_null() && model.tool_call_token)
    c.gen.sampling.logit_bias.emplace_back(*model.tool_call_token, -100.0f);  // "none" means no call, enforced

  std::vector<ConstraintMaker> parts;
  if (forced_call) {
    std::optional<std::string> name;
    if (c.choice.mode == ToolChoice::Mode::named) name = c.choice.name;
    const Json tools = body["tools"];
    const bool parallel = c.parallel_tool_calls, thinking = c.thinking;
    auto vocab = model.grammar_vocab;
    auto tok = model.tokenizer;
    auto build = [tools, name, parallel, thinking, vocab, tok]() -> std::shared_ptr<runtime::TokenConstraint> {
      return std::make_shared<GrammarConstraint>(text::TokenGrammar::tool_call(tools, name, parallel, thinking, vocab), tok,
                                                 false);
    };
    try {
      build();  // a tool set the grammar cannot honour is a 400 now
    } catch (const text::GrammarError& e) {
      throw ApiError(ErrorKind::invalid_request, std::string("cannot constrain the output: ") + e.what(), "tools");
    }
    parts.push_back(build);
  } else if (spec.kind != OutputSpec::Kind::none) {
    parts.push_back(output_constraint(spec, model, c.thinking));
  }
  if (!c.gen.allowed_token_ids.empty()) {
    const std::vector<int32_t> ids = c.gen.allowed_token_ids;
    const size_t n_real = (size_t)model.tokenizer->n_real();
    parts.push_back([ids, n_real]() { return std::make_shared<AllowedTokens>(ids, n_real); });
  }
  if (auto budget = get_int(body, "thinking_token_budget", 0, std::numeric_limits<int32_t>::max()); budget && c.thinking) {
    std::optional<int32_t> end = model.tokenizer->find_token("</think>");
    if (!end) throw ApiError(ErrorKind::unsupported, "this vocabulary has no single </think> token", "thinking_token_budget");
    const int64_t b = *budget;
    const int32_t e = *end;
    parts.push_back([b, e]() { return std::make_shared<ThinkingBudget>(b, e); });
  }
  if (c.gen.min_tokens > 0 && !parts.empty())
    bad("min_tokens", "'min_tokens' cannot be combined with constrained output: the constraint may have to end the output");
  c.make_constraint = combine(std::move(parts));
  c.prompt = truncated_prompt(text::encode_chat(*model.tokenizer, rendered, !parse_special), c.gen,
                              model.engine->context_length());
  std::string unknown = unknown_fields(body, known);
  if (!refused.empty()) append_name(unknown, refused);
  if (!unknown.empty()) c.ignored = unknown + (c.ignored.empty() ? "" : "," + c.ignored);
  return c;
}

ChatOutput::ChatOutput(const ChatRequest& req, const ServedModel& model)
    : model_(model),
      parser_(req.choice.mode == ToolChoice::Mode::none ? nlohmann::json() : req.tools, req.thinking && req.parse_reasoning),
      thinking_(req.thinking),
      parallel_(req.parallel_tool_calls),
      include_reasoning_(req.include_reasoning),
      think_end_(model.tokenizer->find_token("</think>")) {}

ChatOutput::Fed ChatOutput::feed(const Generation::Step& step, Generation& gen) {
  Fed fed;
  if (finished_) return fed;
  // Keeps the deltas the output allows; true once the output has ended (one call, no parallel calls).
  auto take = [&](std::vector<text::Delta>&& ds) {
    for (auto& d : ds) {
      if (!include_reasoning_ && d.kind == text::Delta::Kind::reasoning) continue;
      if (!parallel_ && any_call_ && !(d.kind == text::Delta::Kind::tool_call_arguments && d.index == 0)) break;
      if (d.kind == text::Delta::Kind::tool_call_start) any_call_ = true;
      fed.deltas.push_back(std::move(d));
    }
    return !parallel_ && any_call_;
  };
  for (size_t i = 0; i < step.tokens.size(); ++i) {
    if (thinking_ && !think_closed_) {
      if (think_end_ && step.tokens[i].token == *think_end_) think_closed_ = true;
      else ++reasoning_tokens_;
    }
    fed.tokens_used = i + 1;
    if (!step.pieces[i].empty() && take(parser_.feed(step.pieces[i]))) {
      finished_ = true;
      gen.stop_early("tool_calls", step.tokens.size() - fed.tokens_used);
      return fed;
    }
  }
  if (step.done) {
    finished_ = true;
    std::vector<text::Delta> ds;
    if (!step.tail.empty()) ds = parser_.feed(step.tail);
    std::vector<text::Delta> rest = parser_.finish();
    ds.insert(ds.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
    if (take(std::move(ds))) gen.stop_early("tool_calls");
  }
  return fed;
}

std::string ChatOutput::finish_reason(const Generation& gen) const {
  const std::string& r = gen.finish_reason();
  if (any_call_ && (r == "stop" || r == "tool_calls")) return "tool_calls";
  return r;
}

nlohmann::json ChatOutput::logprob_entries(const std::vector<runtime::TokenEvent>& tokens) const {
  auto lp = [](float v) { return std::isfinite(v) ? (double)v : -9999.0; };
  const text::Tokenizer& tok = *model_.tokenizer;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : tokens) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& alt : t.top)
      top.push_back({{"token", token_text(tok, alt.id)}, {"logprob", lp(alt.logprob)}, {"bytes", token_bytes(tok, alt.id)}});
    out.push_back({{"token", token_text(tok, t.token)},
                   {"logprob", lp(t.logprob)},
                   {"bytes", token_bytes(tok, t.token)},
                   {"top_logprobs", std::move(top)}});
  }
  return out;
}

}  // namespace qrig::server
