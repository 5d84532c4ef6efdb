// Qwen3.5 output parsing: reasoning / content / tool calls, whole and streaming (see output_parser.h for
// the rules). One state machine serves both; it only ever waits, never guesses, so its output does not
// depend on how the text is cut into pieces.
#include "text/output_parser.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <set>
#include <stdexcept>

#include "text/stop.h"

namespace qrig::text {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

size_t leading_newlines(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[i] == '\n') ++i;
  return i;
}

size_t trailing_newlines(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[s.size() - 1 - i] == '\n') ++i;
  return i;
}

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_prefix() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd());
  std::string s = "call_";
  for (int i = 0; i < 16; ++i) s += kAlphabet[gen() % 36];
  return s + "_";
}

bool has_type(const ordered_json& v, const std::string& t) {
  if (t == "integer") return v.is_number_integer();
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  return false;
}

}  // namespace

ordered_json coerce_parameter(std::string_view raw, const json* schema) {
  std::set<std::string> types;
  if (schema) collect_schema_types(*schema, types);
  const std::string text(raw);
  if (types.size() == 1 && types.count("string")) return text;

  ordered_json parsed = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() && types.count("boolean")) {
    std::string lower(trim(raw));
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == "true" || lower == "false") parsed = lower == "true";
  }
  if (parsed.is_discarded()) return text;
  if (types.count("string")) {  // a union with string: only a value of one of the other types wins
    for (const std::string& t : types)
      if (t != "string" && has_type(parsed, t)) return parsed;
    return text;
  }
  return parsed;
}

void apply_delta(ParsedOutput& out, const Delta& d) {
  switch (d.kind) {
    case Delta::Kind::reasoning: out.reasoning_content += d.text; return;
    case Delta::Kind::content: out.content += d.text; return;
    case Delta::Kind::tool_call_start:
      if (d.index != int32_t(out.tool_calls.size()))
        throw std::invalid_argument("tool call start delta with index " + std::to_string(d.index) + ", expected " +
                                    std::to_string(out.tool_calls.size()));
      out.tool_calls.push_back({d.id, d.name, d.text});
      return;
    case Delta::Kind::tool_call_arguments:
      if (d.index < 0 || d.index >= int32_t(out.tool_calls.size()))
        throw std::invalid_argument("tool call arguments delta for unknown index " + std::to_string(d.index));
      out.tool_calls[size_t(d.index)].arguments += d.text;
      return;
  }
}

OutputStreamParser::OutputStreamParser(const json& tools, bool thinking, std::string call_id_prefix)
    : id_prefix_(call_id_prefix.empty() ? random_prefix() : std::move(call_id_prefix)),
      state_(thinking ? State::think_open : State::content) {
  if (tools.is_null()) return;
  if (!tools.is_array()) throw std::invalid_argument("tools must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw std::invalid_argument(where + " must be an object");
    if (auto ty = t.find("type"); ty != t.end() && !(ty->is_string() && *ty == "function"))
      throw std::invalid_argument(where + ".type must be \"function\"");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) throw std::invalid_argument(where + ".function must be an object");
    auto n = f->find("name");
    if (n == f->end() || !n->is_string() || n->get<std::string>().empty())
      throw std::invalid_argument(where + ".function.name must be a non-empty string");
    json params = nullptr;
    if (auto p = f->find("parameters"); p != f->end() && !p->is_null()) {
      if (!p->is_object()) throw std::invalid_argument(where + ".function.parameters must be an object");
      params = *p;
    }
    tools_[n->get<std::string>()] = std::move(params);
  }
}

void OutputStreamParser::emit_text(Delta::Kind kind, std::string_view text, std::vector<Delta>& out) {
  if (text.empty()) return;
  at_start_ = false;
  if (!out.empty() && out.back().kind == kind) {
    out.back().text += text;
    return;
  }
  Delta d;
  d.kind = kind;
  d.text = std::string(text);
  out.push_back(std::move(d));
}

void OutputStreamParser::emit_call(const std::string& name, const std::vector<Param>& params,
                                   std::vector<Delta>& out) {
  const int32_t index = next_index_++;
  Delta start;
  start.kind = Delta::Kind::tool_call_start;
  start.index = index;
  start.id = id_prefix_ + std::to_string(index);
  start.name = name;
  out.push_back(std::move(start));
  // One fragment per parameter ("{"k":v", ","k":v", ..., "}"): together exactly the compact JSON object.
  auto fragment = [&](std::string text) {
    Delta d;
    d.kind = Delta::Kind::tool_call_arguments;
    d.index = index;
    d.text = std::move(text);
    out.push_back(std::move(d));
  };
  if (params.empty()) {
    fragment("{}");
    return;
  }
  for (size_t i = 0; i < params.size(); ++i)
    fragment((i == 0 ? "{" : ",") + dump(ordered_json(params[i].name)) + ":" + dump(params[i].value));
  fragment("}");
}

bool OutputStreamParser::parse_block(std::string_view block, std::string& name, std::vector<Param>& params) const {
  std::string_view in = block.substr(kCallOpen.size(), block.size() - kCallOpen.size() - kCallClose.size());
  size_t pos = 0;
  auto skip_space = [&] {
    while (pos < in.size() && is_space(in[pos])) ++pos;
  };
  auto at = [&](std::string_view tag) { return in.substr(pos, tag.size()) == tag; };
  // "<open NAME>" -> NAME (trimmed, one line, no '<'), or false.
  auto tag_name = [&](std::string_view open, std::string& out_name) {
    pos += open.size();
    const size_t gt = in.find('>', pos);
    if (gt == std::string_view::npos) return false;
    std::string_view n = trim(in.substr(pos, gt - pos));
    if (n.empty() || n.find_first_of("<\n") != std::string_view::npos) return false;
    out_name = std::string(n);
    pos = gt + 1;
    return true;
  };

  skip_space();
  if (!at(kFunctionOpen) || !tag_name(kFunctionOpen, name)) return false;
  auto tool = tools_.find(name);
  if (tool == tools_.end()) return false;
  const json* properties = nullptr;
  if (tool->second.is_object())
    if (auto p = tool->second.find("properties"); p != tool->second.end() && p->is_object()) properties = &*p;

  params.clear();
  for (;;) {
    skip_space();
    if (at(kFunctionClose)) {
      pos += kFunctionClose.size();
      break;
    }
    if (!at(kParamOpen)) return false;
    Param p;
    if (!tag_name(kParamOpen, p.name)) return false;
    const size_t close = in.find(kParamClose, pos);
    if (close == std::string_view::npos) return false;
    std::string_view raw = in.substr(pos, close - pos);
    // A parameter or function tag inside the value means a missing "</parameter>": bad nesting.
    if (raw.find(kParamOpen) != std::string_view::npos || raw.find(kFunctionClose) != std::string_view::npos)
      return false;
    if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
    if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
    for (const Param& q : params)
      if (q.name == p.name) return false;  // given twice: keep the text rather than drop a value
    const json* schema = nullptr;
    if (properties)
      if (auto s = properties->find(p.name); s != properties->end()) schema = &*s;
    p.value = coerce_parameter(raw, schema);
    params.push_back(std::move(p));
    pos = close + kParamClose.size();
  }
  skip_space();
  return pos == in.size();
}

void OutputStreamParser::process(bool final, std::vector<Delta>& out) {
  for (;;) {
    switch (state_) {
      case State::think_open: {
        pending_.erase(0, leading_newlines(pending_));
        if (pending_.empty()) return;
        if (pending_.starts_with(kThinkOpen)) {
          pending_.erase(0, kThinkOpen.size());
        } else if (!final && kThinkOpen.starts_with(pending_)) {
          return;  // maybe "<think>", maybe not: wait
        }
        state_ = State::reasoning;
        at_start_ = true;
        continue;
      }

      case State::reasoning: {
        if (at_start_) pending_.erase(0, leading_newlines(pending_));
        const size_t close = pending_.find(kThinkClose);
        if (close != std::string::npos) {
          std::string_view r(pending_.data(), close);
          r.remove_suffix(trailing_newlines(r));
          emit_text(Delta::Kind::reasoning, r, out);
          pending_.erase(0, close + kThinkClose.size());
          state_ = State::content;
          at_start_ = true;
          continue;
        }
        if (final) {  // unfinished reasoning stays reasoning, as written
          emit_text(Delta::Kind::reasoning, pending_, out);
          pending_.clear();
          return;
        }
        std::string_view safe(pending_.data(), pending_.size() - partial_tag_suffix(pending_, kThinkClose));
        safe.remove_suffix(trailing_newlines(safe));  // may be the separator before "</think>"
        safe.remove_suffix(incomplete_utf8_suffix(safe));
        const size_t n = safe.size();
        emit_text(Delta::Kind::reasoning, safe, out);
        pending_.erase(0, n);
        return;
      }

      case State::content: {
        if (at_start_) pending_.erase(0, leading_newlines(pending_));
        const bool calls = !tools_.empty();
        if (calls) {
          const size_t open = pending_.find(kCallOpen);
          if (open != std::string::npos) {
            std::string_view before(pending_.data(), open);
            const size_t nl = trailing_newlines(before);
            emit_text(Delta::Kind::content, before.substr(0, open - nl), out);
            held_newlines_ = pending_.substr(open - nl, nl);
            pending_.erase(0, open);
            call_scan_ = 0;
            state_ = State::tool_call;
            continue;
          }
        }
        if (final) {
          emit_text(Delta::Kind::content, pending_, out);
          pending_.clear();
          return;
        }
        std::string_view safe(pending_);
        if (calls) {
          safe.remove_suffix(partial_tag_suffix(safe, kCallOpen));
          safe.remove_suffix(trailing_newlines(safe));  // may be the separator before "<tool_call>"
        }
        safe.remove_suffix(incomplete_utf8_suffix(safe));
        const size_t n = safe.size();
        emit_text(Delta::Kind::content, safe, out);
        pending_.erase(0, n);
        return;
      }

      case State::tool_call: {
        const size_t close = pending_.find(kCallClose, std::max(call_scan_, kCallOpen.size()));
        if (close == std::string::npos) {
          // Next time search only the new text (and a tag that may straddle): long blocks stay linear.
          call_scan_ = pending_.size() >= kCallClose.size() ? pending_.size() - kCallClose.size() + 1 : 0;
          if (!final) return;  // the block is still open: wait for "</tool_call>" or the end
          emit_text(Delta::Kind::content, held_newlines_ + pending_, out);  // unclosed: content
          held_newlines_.clear();
          pending_.clear();
          state_ = State::content;
          return;
        }
        const size_t end = close + kCallClose.size();
        std::string name;
        std::vector<Param> params;
        if (parse_block(std::string_view(pending_).substr(0, end), name, params)) {
          emit_call(name, params, out);
          at_start_ = true;  // newlines after a call are separators
        } else {
          emit_text(Delta::Kind::content, held_newlines_ + pending_.substr(0, end), out);
        }
        held_newlines_.clear();
        pending_.erase(0, end);
        state_ = State::content;
        continue;
      }
    }
  }
}

std::vector<Delta> OutputStreamParser::feed(std::string_view piece) {
  if (finished_) throw std::logic_error("OutputStreamParser::feed after finish");
  pending_.append(piece);
  std::vector<Delta> out;
  process(false, out);
  return out;
}

std::vector<Delta> OutputStreamParser::finish() {
  if (finished_) throw std::logic_error("OutputStreamParser::finish called twice");
  finished_ = true;
  std::vector<Delta> out;
  process(true, out);
  return out;
}

ParsedOutput parse_output(std::string_view text, const json& tools, bool thinking, std::string call_id_prefix) {
  OutputStreamParser parser(tools, thinking, std::move(call_id_prefix));
  ParsedOutput out;
  for (const Delta& d : parser.feed(text)) apply_delta(out, d);
  for (const Delta& d : parser.finish()) apply_delta(out, d);
  return out;
}

}  // namespace qrig::text
