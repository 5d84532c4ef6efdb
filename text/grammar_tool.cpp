// TokenGrammar::tool_call (grammar.h): the Qwen3.5 XML tool-call format as grammar rules, with each
// parameter's value shaped the way OutputStreamParser (output_parser.h) will read it back: raw text for
// parameters whose schema admits a string, JSON of the schema otherwise.
#include <algorithm>
#include <set>

#include "text/grammar.h"
#include "text/grammar_dfa.h"
#include "text/grammar_json.h"
#include "text/grammar_lexer.h"
#include "text/grammar_schema.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace qrig::text {

namespace {

using json = nlohmann::ordered_json;
using grammar::GrammarBuilder;
using grammar::Item;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// A function or parameter name the parser reads back unchanged: non-empty, one line, no '<' or '>', no
// surrounding whitespace (it trims).
bool valid_tag_name(const std::string& n) {
  return !n.empty() && n.find_first_of("<>\n") == std::string::npos && !is_space(n.front()) && !is_space(n.back());
}

bool contains_tag(const std::string& text) {
  for (const std::string& t : grammar::tool_call_tags())
    if (text.find(t) != std::string::npos) return true;
  return false;
}

class ToolCompiler {
 public:
  explicit ToolCompiler(GrammarBuilder& b) : b_(b) {
    raw_def_.base = grammar::LexBase::Utf8Text;
    raw_def_.patterns.push_back({"\n</parameter>", true});
    for (const std::string& t : grammar::tool_call_tags()) raw_def_.patterns.push_back({t, false});
  }

  // The parameter blocks of one function (appended to seq).
  void parameters(const std::string& fn, const json& params, std::vector<Item>& seq) {
    if (params.is_null()) return;
    fn_ = fn;
    // The call writes the declared parameters (object members) and nothing else: keywords of the
    // parameters object beyond those are refused by name, none ignored.
    for (const auto& [k, v] : params.items())
      if (k != "type" && k != "properties" && k != "required" && k != "additionalProperties" && !grammar::is_annotation(k))
        throw GrammarError("function \"" + fn + "\": keyword \"" + k + "\" of the parameters object is not supported");
    if (auto t = params.find("type"); t != params.end() && *t != "object")
      throw GrammarError("function \"" + fn + "\": parameters must be an object schema (type \"object\")");
    const json empty = json::object();
    const json* props = &empty;
    if (auto p = params.find("properties"); p != params.end()) {
      if (!p->is_object()) throw GrammarError("function \"" + fn + "\": parameters.properties must be an object");
      props = &*p;
    }
    std::vector<std::string> required;
    if (auto r = params.find("required"); r != params.end()) {
      if (!r->is_array()) throw GrammarError("function \"" + fn + "\": parameters.required must be an array");
      for (const json& n : *r)
        if (n.is_string()) required.push_back(n.get<std::string>());
    }
    grammar::JsonSchemaCompiler jc(b_, params, /*tool_safe=*/true);
    std::vector<uint32_t> members;
    std::vector<bool> member_required;
    auto add = [&](const std::string& name, const json& schema) {
      const bool req = std::find(required.begin(), required.end(), name) != required.end();
      if (!valid_tag_name(name)) {
        if (req) throw GrammarError("function \"" + fn + "\": required parameter name \"" + name + "\" cannot be written in a tool call");
        return;
      }
      if (schema.is_boolean() && !schema.get<bool>()) {
        if (req) throw GrammarError("function \"" + fn + "\": required parameter \"" + name + "\" has the schema false");
        return;
      }
      members.push_back(member(jc, name, schema));
      member_required.push_back(req);
    };
    for (const auto& [name, schema] : props->items()) add(name, schema);
    // a required name that is not declared follows additionalProperties (false: impossible)
    const json undeclared = params.contains("additionalProperties") ? params["additionalProperties"] : json(true);
    for (const std::string& name : required)
      if (!props->contains(name)) add(name, undeclared);
    if (members.empty()) return;
    if (members.size() <= 32) {
      grammar::PermGroup group;
      group.members = members;
      for (size_t i = 0; i < members.size(); ++i)
        if (member_required[i]) group.required |= uint32_t{1} << i;
      seq.push_back(b_.perm(std::move(group)));
      return;
    }
    // Too many for a "seen" mask: the declared order, optional ones skippable.
    uint32_t next = b_.rule_of({{}});
    for (size_t i = members.size(); i-- > 0;) {
      std::vector<std::vector<Item>> alts{{GrammarBuilder::call(members[i]), GrammarBuilder::call(next)}};
      if (!member_required[i]) alts.push_back({GrammarBuilder::call(next)});
      next = b_.rule_of(std::move(alts));
    }
    seq.push_back(GrammarBuilder::call(next));
  }

 private:
  // "<parameter=NAME>\nVALUE\n</parameter>\n" as one rule.
  uint32_t member(grammar::JsonSchemaCompiler& jc, const std::string& name, const json& schema) {
    std::vector<Item> head;
    b_.lit(head, "<parameter=" + name + ">\n");
    std::set<std::string> types;
    collect_schema_types(schema, types);  // the output parser's rule (text/output_parser.h)
    bool structural = false;
    if (schema.is_object())
      for (const char* k : {"$ref", "properties", "items", "prefixItems", "additionalProperties", "required"})
        structural = structural || schema.contains(k);
    const bool raw = types.count("string") || (types.empty() && !structural && !constrains_non_strings(schema));
    if (!raw) {
      uint32_t value = jc.compile(schema);
      if (types.count("boolean")) {  // the chat template renders Python's str(True)
        std::vector<Item> t, f;
        b_.lit(t, "True");
        b_.lit(f, "False");
        value = b_.rule_of({{GrammarBuilder::call(value)}, std::move(t), std::move(f)});
      }
      head.push_back(GrammarBuilder::call(value));
      b_.lit(head, "\n</parameter>\n");
      return b_.rule_of({std::move(head)});
    }
    const json* values = nullptr;
    json one;
    if (schema.is_object()) {
      if (auto c = schema.find("const"); c != schema.end()) {
        one = json::array({*c});
        values = &one;
      } else if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
        values = &*e;
      }
    }
    if (values) {  // raw literals: a string as itself, anything else as the JSON the parser will read
      const uint32_t lits = b_.new_rule();
      for (const json& v : *values) {
        const std::string text = v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace);
        if (contains_tag(text) || !jc.accepts(v, schema)) continue;
        std::vector<Item> seq;
        b_.lit(seq, text);
        b_.add_alt(lits, std::move(seq));
      }
      head.push_back(GrammarBuilder::call(lits));
      b_.lit(head, "\n</parameter>\n");
      return b_.rule_of({std::move(head)});
    }
    check_raw_keywords(schema);
    // Raw text: the string's constraints (those of the string branch of a union) hold for it. Text the
    // output parser reads as another type of a union must then be valid as that type: refused where the
    // schema constrains those types.
    const json* str = &schema;
    if (schema.is_object() && !schema.contains("type"))
      for (const char* key : {"anyOf", "oneOf"})
        if (auto it = schema.find(key); it != schema.end() && it->is_array()) {
          const json* found = nullptr;
          size_t n = 0;
          for (const json& branch : *it) {
            std::set<std::string> bt;
            collect_schema_types(branch, bt);
            if (bt.count("string") || bt.empty()) found = &branch, ++n;
            else if (constrains_non_strings(branch))
              throw GrammarError("function \"" + fn_ + "\": parameter \"" + name +
                                 "\" may be a string or a constrained other type, which a raw tool-call value cannot "
                                 "keep apart");
          }
          if (n == 1) str = found;
          else if (n > 1) {
            for (const json& branch : *it)
              if (branch.is_object() && (branch.size() > 1 || !branch.contains("type")))
                throw GrammarError("function \"" + fn_ + "\": parameter \"" + name +
                                   "\" has several string branches with constraints, which are not supported");
            str = nullptr;
          }
        }
    if (schema.is_object() && schema.contains("type") && types.size() > 1 && constrains_non_strings(schema))
      throw GrammarError("function \"" + fn_ + "\": parameter \"" + name +
                         "\" may be a string or a constrained other type, which a raw tool-call value cannot keep apart");
    uint32_t min_chars = 0, max_chars = UINT32_MAX;
    if (str && str->is_object()) {
      if (auto v = jc.string_dfa(*str)) {
        const std::string key = grammar::JsonSchemaCompiler::string_key(*str) +
                                (v->max_chars != UINT32_MAX || v->min_chars ? "|counted" : "");
        auto lexer = grammar::string_lexer(v->dfa, grammar::StringLexerMode::RawToolValue, key);
        if (!lexer) return b_.new_rule();  // no value can be written
        head.push_back(b_.lex(std::move(lexer), v->min_chars, v->max_chars));
        b_.lit(head, "\n");
        return b_.rule_of({std::move(head)});
      }
      min_chars = grammar::schema_count(*str, "minLength", 0);
      max_chars = grammar::schema_count(*str, "maxLength", UINT32_MAX);
    }
    head.push_back(b_.lex(raw_def_, min_chars, max_chars));  // ends with "\n</parameter>"
    b_.lit(head, "\n");
    return b_.rule_of({std::move(head)});
  }

  // A raw value's schema is not compiled as JSON: its keywords (and its branches') are checked here, so
  // that none is ignored there either.
  void check_raw_keywords(const json& s, int depth = 0) {
    if (!s.is_object() || depth > 16) return;
    grammar::check_keywords(s);
    for (const char* key : {"anyOf", "oneOf", "allOf"})
      if (auto it = s.find(key); it != s.end() && it->is_array())
        for (const json& b : *it) check_raw_keywords(b, depth + 1);
  }

  // Keywords that constrain values other than strings (beyond their type).
  static bool constrains_non_strings(const json& s) {
    if (!s.is_object()) return false;
    for (const auto& [k, v] : s.items()) {
      if (k == "type" || k == "nullable" || k == "minLength" || k == "maxLength" || k == "pattern" || k == "format" ||
          grammar::is_annotation(k))
        continue;
      if (k == "anyOf" || k == "oneOf" || k == "allOf") {
        if (v.is_array())
          for (const json& b : v)
            if (constrains_non_strings(b)) return true;
        continue;
      }
      return true;
    }
    return false;
  }

  GrammarBuilder& b_;
  grammar::LexerDef raw_def_;
  std::string fn_;
};

}  // namespace

std::unique_ptr<TokenGrammar> TokenGrammar::tool_call(const json& tools, const std::optional<std::string>& forced_name,
                                                      bool parallel, bool thinking,
                                                      std::shared_ptr<const TokenVocab> vocab) {
  if (!tools.is_array() || tools.empty()) throw GrammarError("a tool call needs a non-empty tools array");
  // name -> parameters; a later definition replaces an earlier one (as OutputStreamParser does)
  std::vector<std::pair<std::string, json>> defs;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw GrammarError(where + " must be an object");
    if (auto ty = t.find("type"); ty != t.end() && !(ty->is_string() && *ty == "function"))
      throw GrammarError(where + ".type must be \"function\"");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) throw GrammarError(where + ".function must be an object");
    auto n = f->find("name");
    if (n == f->end() || !n->is_string() || n->get<std::string>().empty())
      throw GrammarError(where + ".function.name must be a non-empty string");
    json params = nullptr;
    if (auto p = f->find("parameters"); p != f->end() && !p->is_null()) {
      if (!p->is_object()) throw GrammarError(where + ".function.parameters must be an object");
      params = *p;
    }
    const std::string name = n->get<std::string>();
    std::erase_if(defs, [&](const auto& d) { return d.first == name; });
    defs.emplace_back(name, std::move(params));
  }

  GrammarBuilder b;
  ToolCompiler tc(b);
  const uint32_t functions = b.new_rule();
  size_t n_functions = 0;
  for (const auto& [name, params] : defs) {
    if (forced_name && name != *forced_name) continue;
    if (!valid_tag_name(name)) {
      if (forced_name) throw GrammarError("function name \"" + name + "\" cannot be written in a tool call");
      continue;
    }
    std::vector<Item> seq;
    b.lit(seq, "<function=" + name + ">\n");
    tc.parameters(name, params, seq);
    b.lit(seq, "</function>\n</tool_call>");
    b.add_alt(functions, std::move(seq));
    ++n_functions;
  }
  if (n_functions == 0)
    throw GrammarError(forced_name ? "tool_choice names function \"" + *forced_name + "\", which is not among the tools"
                                   : std::string("no tool in the tools array can be called"));
  std::vector<Item> one;
  b.lit(one, "<tool_call>\n");
  one.push_back(GrammarBuilder::call(functions));
  const uint32_t call = b.rule_of({std::move(one)});
  uint32_t calls = call;
  if (parallel) {
    const uint32_t more = b.new_rule();
    std::vector<Item> next;
    b.lit(next, "\n");
    next.push_back(GrammarBuilder::call(call));
    next.push_back(GrammarBuilder::call(more));
    b.add_alt(more, std::move(next));
    b.add_alt(more, {});
    calls = b.rule_of({{GrammarBuilder::call(call), GrammarBuilder::call(more)}});
  }
  std::vector<Item> top;
  if (thinking) grammar::append_reasoning(b, top);
  top.push_back(GrammarBuilder::call(calls));
  const uint32_t root = b.rule_of({std::move(top)});
  return std::make_unique<TokenGrammar>(b.finish(root), std::move(vocab));
}

std::unique_ptr<TokenGrammar> TokenGrammar::tool_call(const json& tools, const std::optional<std::string>& forced_name,
                                                      bool parallel, bool thinking, const Tokenizer& tok) {
  return tool_call(tools, forced_name, parallel, thinking, TokenVocab::of(tok));
}

std::unique_ptr<TokenGrammar> TokenGrammar::tool_call(const nlohmann::json& tools,
                                                      const std::optional<std::string>& forced_name, bool parallel,
                                                      bool thinking, const Tokenizer& tok) {
  return tool_call(json(tools), forced_name, parallel, thinking, TokenVocab::of(tok));
}

std::unique_ptr<TokenGrammar> TokenGrammar::tool_call(const nlohmann::json& tools,
                                                      const std::optional<std::string>& forced_name, bool parallel,
                                                      bool thinking, std::shared_ptr<const TokenVocab> vocab) {
  return tool_call(json(tools), forced_name, parallel, thinking, std::move(vocab));
}

}  // namespace qrig::text
