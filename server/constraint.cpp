// GrammarConstraint: TokenGrammar behind runtime::TokenConstraint, with the optional reasoning prefix.
#include "server/constraint.h"

#include <utility>

#include <fmt/format.h>

#include "server/errors.h"

namespace qrig::server {

namespace {
const std::string kThinkEnd = "</think>";
}

GrammarConstraint::GrammarConstraint(std::unique_ptr<text::TokenGrammar> grammar,
                                     std::shared_ptr<const text::Tokenizer> tok, bool thinking_prefix)
    : grammar_(std::move(grammar)), tok_(std::move(tok)), phase_(thinking_prefix ? Phase::reasoning : Phase::grammar) {}

bool GrammarConstraint::allowed(std::vector<bool>& mask) {
  switch (phase_) {
    case Phase::grammar:
      grammar_->allowed(mask);
      return true;
    case Phase::reasoning:
      // Anything but the end: the answer must still come. Control tokens other than end-of-generation
      // stay allowed as the unconstrained output would have them.
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = !tok_->is_eog((int32_t)i);
      return true;
    case Phase::separator:
      // Tokens whose bytes are a non-empty prefix of what is left of the separator.
      for (size_t i = 0; i < mask.size(); ++i) {
        const std::string& b = tok_->token_to_bytes((int32_t)i);
        mask[i] = !b.empty() && separator_.compare(0, b.size(), b) == 0 && b.size() <= separator_.size() &&
                  !tok_->is_eog((int32_t)i);
      }
      return true;
  }
  return false;
}

void GrammarConstraint::accept(int32_t token) {
  switch (phase_) {
    case Phase::grammar:
      grammar_->accept(token);
      return;
    case Phase::reasoning:
      tail_ += tok_->token_to_bytes(token);
      if (size_t at = tail_.find(kThinkEnd); at != std::string::npos) {
        // Bytes after "</think>" in the same token count towards the separator.
        std::string rest = tail_.substr(at + kThinkEnd.size());
        separator_ = "\n\n";
        size_t n = 0;
        while (n < rest.size() && n < separator_.size() && rest[n] == '\n') ++n;
        separator_.erase(0, n);
        phase_ = separator_.empty() ? Phase::grammar : Phase::separator;
        return;
      }
      if (tail_.size() > kThinkEnd.size()) tail_.erase(0, tail_.size() - kThinkEnd.size());
      return;
    case Phase::separator:
      separator_.erase(0, tok_->token_to_bytes(token).size());
      if (separator_.empty()) phase_ = Phase::grammar;
      return;
  }
}

}  // namespace qrig::server

namespace qrig::server {

AllowedTokens::AllowedTokens(const std::vector<int32_t>& ids, size_t n_real) : allowed_(n_real, false) {
  for (int32_t id : ids)
    if (id >= 0 && (size_t)id < n_real) allowed_[(size_t)id] = true;
}

bool AllowedTokens::allowed(std::vector<bool>& mask) {
  for (size_t i = 0; i < mask.size() && i < allowed_.size(); ++i) mask[i] = allowed_[i];
  return true;
}

bool ThinkingBudget::allowed(std::vector<bool>& mask) {
  if (closed_ || used_ < budget_) return false;
  if ((size_t)think_end_ < mask.size()) mask[(size_t)think_end_] = true;
  return true;
}

void ThinkingBudget::accept(int32_t token) {
  if (closed_) return;
  if (token == think_end_) closed_ = true;
  else ++used_;
}

bool ConstraintChain::allowed(std::vector<bool>& mask) {
  bool any = false;
  for (auto& p : parts_) {
    scratch_.assign(mask.size(), false);
    if (!p->allowed(scratch_)) continue;
    if (!any) mask = scratch_;
    else
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = mask[i] && scratch_[i];
    any = true;
  }
  return any;
}

void ConstraintChain::accept(int32_t token) {
  for (auto& p : parts_) p->accept(token);
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(ErrorKind::invalid_request, message, param);
}

// A schema given as an object or as JSON text (vLLM accepts both).
Json schema_value(const Json& v, const std::string& param) {
  if (v.is_string()) {
    try {
      return Json::parse(v.get<std::string>());
    } catch (const Json::exception& e) {
      bad(param, fmt::format("'{}' is a string that is not JSON: {}", param, e.what()));
    }
  }
  if (!v.is_object() && !v.is_boolean()) bad(param, fmt::format("'{}' must be a JSON Schema object", param));
  return v;
}

std::vector<std::string> choice_list(const Json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) bad(param, fmt::format("'{}' must be a non-empty array of strings", param));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().empty())
      bad(param, fmt::format("'{}[{}]' must be a non-empty string", param, i));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

void parse_response_format(const Json& rf, OutputSpec& spec) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad("response_format", "'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  auto direct = rf.find("schema");  // llama.cpp's shape: the schema next to the type
  if (type == "json_object") {
    spec.kind = OutputSpec::Kind::json;
    spec.schema = direct != rf.end() && !direct->is_null() ? schema_value(*direct, "response_format") : Json::object();
  } else if (type == "json_schema") {
    spec.kind = OutputSpec::Kind::json;
    auto js = rf.find("json_schema");
    if (js == rf.end() || js->is_null()) {
      if (direct == rf.end()) bad("response_format", "'response_format.json_schema' must be an object {\"name\", \"schema\"}");
      spec.schema = direct->is_null() ? Json::object() : schema_value(*direct, "response_format");
      return;
    }
    if (!js->is_object()) bad("response_format", "'response_format.json_schema' must be an object {\"name\", \"schema\"}");
    auto sc = js->find("schema");
    spec.schema = sc == js->end() || sc->is_null() ? Json::object() : *sc;
    if (!spec.schema.is_object() && !spec.schema.is_boolean())
      bad("response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
  } else if (type != "text") {
    bad("response_format", fmt::format("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", "
                                       "got \"{}\"", type));
  }
}

void parse_structured_outputs(const Json& so, OutputSpec& spec) {
  const std::string p = "structured_outputs";
  if (!so.is_object()) bad(p, "'structured_outputs' must be an object");
  int kinds = 0;
  for (auto it = so.begin(); it != so.end(); ++it) {
    const std::string& k = it.key();
    const Json& v = it.value();
    if (v.is_null()) continue;
    if (k == "json") {
      spec.kind = OutputSpec::Kind::json, spec.schema = schema_value(v, p + ".json"), ++kinds;
    } else if (k == "regex") {
      if (!v.is_string()) bad(p, "'structured_outputs.regex' must be a string");
      spec.kind = OutputSpec::Kind::regex, spec.regex = v.get<std::string>(), ++kinds;
    } else if (k == "choice") {
      spec.kind = OutputSpec::Kind::choice, spec.choices = choice_list(v, p + ".choice"), ++kinds;
    } else if (k == "json_object") {
      if (!v.is_boolean()) bad(p, "'structured_outputs.json_object' must be a boolean");
      if (v.get<bool>()) spec.kind = OutputSpec::Kind::json, spec.schema = Json::object(), ++kinds;
    } else if (k == "disable_fallback" || k == "disable_additional_properties") {
      // disable_fallback: there is one decoder; disable_additional_properties: undeclared members are never
      // written anyway (docs/server.md, "Constrained output").
    } else if (k == "disable_any_whitespace") {
      if (!(v.is_boolean() && !v.get<bool>()))
        throw ApiError(ErrorKind::unsupported,
                       "'structured_outputs.disable_any_whitespace' is not supported: JSON may hold single spaces", p);
    } else if (k == "grammar" || k == "structural_tag" || k == "whitespace_pattern") {
      throw ApiError(ErrorKind::unsupported, fmt::format("'structured_outputs.{}' is not supported", k), p);
    } else {
      bad(p, fmt::format("'structured_outputs' has an unknown member '{}'", k));
    }
  }
  if (kinds > 1) bad(p, "'structured_outputs' may hold one of json, regex, choice, json_object");
}

}  // namespace

OutputSpec parse_output_spec(const Json& body, std::set<std::string>& known) {
  static const char* const kKeys[] = {"response_format", "json_schema", "guided_json", "guided_regex", "guided_choice",
                                      "structured_outputs"};
  OutputSpec spec;
  std::string given;
  for (const char* k : kKeys) {
    known.insert(k);
    auto it = body.find(k);
    if (it == body.end() || it->is_null()) continue;
    OutputSpec one;
    one.param = k;
    const std::string key = k;
    if (key == "response_format") parse_response_format(*it, one);
    else if (key == "json_schema" || key == "guided_json") one.kind = OutputSpec::Kind::json, one.schema = schema_value(*it, key);
    else if (key == "guided_regex") {
      if (!it->is_string()) bad(key, "'guided_regex' must be a string");
      one.kind = OutputSpec::Kind::regex, one.regex = it->get<std::string>();
    } else if (key == "guided_choice") one.kind = OutputSpec::Kind::choice, one.choices = choice_list(*it, key);
    else parse_structured_outputs(*it, one);
    if (one.kind == OutputSpec::Kind::none) continue;
    if (spec.kind != OutputSpec::Kind::none)
      bad(key, fmt::format("'{}' and '{}' both constrain the output; give one", given, key));
    spec = std::move(one);
    given = key;
  }
  return spec;
}

ConstraintMaker output_constraint(const OutputSpec& spec, const ServedModel& model, bool thinking) {
  std::shared_ptr<const text::Tokenizer> tok = model.tokenizer;
  std::shared_ptr<const text::TokenVocab> vocab = model.grammar_vocab;
  auto build = [spec, tok, vocab, thinking]() -> std::shared_ptr<runtime::TokenConstraint> {
    std::unique_ptr<text::TokenGrammar> g;
    switch (spec.kind) {
      case OutputSpec::Kind::json: g = text::TokenGrammar::json_schema(spec.schema, vocab); break;
      case OutputSpec::Kind::regex: g = text::TokenGrammar::regex(spec.regex, vocab); break;
      case OutputSpec::Kind::choice: g = text::TokenGrammar::choice(spec.choices, vocab); break;
      case OutputSpec::Kind::none: return nullptr;
    }
    return std::make_shared<GrammarConstraint>(std::move(g), tok, thinking);
  };
  // Compiled once now, so that a grammar it cannot honour is a 400 before anything runs; the first sample
  // takes this one, the others compile their own.
  std::shared_ptr<runtime::TokenConstraint> first;
  try {
    first = build();
  } catch (const text::GrammarError& e) {
    throw ApiError(ErrorKind::invalid_request, std::string("cannot constrain the output: ") + e.what(), spec.param);
  }
  auto cached = std::make_shared<std::shared_ptr<runtime::TokenConstraint>>(std::move(first));
  return [cached, build]() {
    if (*cached) return std::exchange(*cached, nullptr);
    return build();
  };
}

ConstraintMaker combine(std::vector<ConstraintMaker> parts) {
  std::erase_if(parts, [](const ConstraintMaker& m) { return !m; });
  if (parts.empty()) return nullptr;
  if (parts.size() == 1) return parts.front();
  return [parts]() -> std::shared_ptr<runtime::TokenConstraint> {
    std::vector<std::shared_ptr<runtime::TokenConstraint>> made;
    for (const auto& m : parts)
      if (auto c = m()) made.push_back(std::move(c));
    if (made.empty()) return nullptr;
    if (made.size() == 1) return made.front();
    return std::make_shared<ConstraintChain>(std::move(made));
  };
}

}  // namespace qrig::server
