// Token-level constrained decoding: the server forces a well-formed output (OpenAI `response_format`
// json_object / json_schema, `tool_choice` "required" or a named function) by masking, at each sampling step,
// every token whose bytes cannot continue the grammar. The mask goes to Sampler::sample(..., &mask); the
// sampled token goes back through accept().
//
// How it works: a schema or tool set is compiled into a small context-free grammar over bytes
// (grammar_rules.h; JSON in grammar_json.cpp, tool calls in grammar_tool.cpp), interpreted by a pushdown
// machine whose state is a handful of "threads" (position + stack; several while the grammar is ambiguous,
// e.g. between anyOf branches). A mask is one depth-first walk over the vocabulary's byte trie
// (grammar_vocab.h) advancing a copy of the state per edge and skipping a subtree at its first refused byte;
// inside long free text (JSON strings, raw parameter values, reasoning) the tokens that stay inside come
// from a per-vocabulary cache instead, so such steps cost a bitset copy plus a check of the few tokens that
// end the text.
//
// JSON produced under a schema (see grammar_json.h for the supported keywords):
//   - compact JSON: at most one optional whitespace byte (space or newline) at each place JSON allows
//     whitespace inside a value; none before or after the top-level value;
//   - object members in the schema's order (the order of `properties` as given: pass nlohmann::ordered_json
//     to keep it; nlohmann::json sorts keys), required ones always, optional ones may be left out; extra
//     members (when allowed) after the declared ones;
//   - numbers: at most 16 integer digits, 16 fraction digits and 2 exponent digits (so generation cannot run
//     away in a number, and every number fits a double); under minimum/maximum/multipleOf, fixed point
//     without exponent or integers (grammar_number.h);
//   - strings under pattern / format: a lexer built from the pattern's automaton (grammar_regex.h), so the
//     mask inside them also comes from the per-state token-set cache.
// Tool calls (Qwen3.5 XML, QWEN35.md) - see tool_call() below.
//
// "complete" means the output so far is a whole sentence of the grammar: end-of-generation ids are then
// allowed. For grammars whose sentences are never prefixes of longer ones (a JSON object; a single tool call)
// nothing else is allowed then. A top-level number, or parallel tool calls, may still continue.
//
// Tokens: the text tokens whose bytes fit; never control tokens (except the Qwen tags, see
// TokenVocab::of) or padding; end-of-generation ids only where complete. Building a TokenVocab costs about
// 0.1 s for a 150k vocabulary; TokenVocab::of(tok) caches it but fingerprints the vocabulary on every call
// (about 1 ms for 150k tokens) to recognise the tokenizer, so a server should keep the shared_ptr and use the
// overloads that take it. Measured mask cost (tests/text/test_grammar_perf.cpp, one core): 0.2-0.6 ms per
// step on the real 151k Qwen3 vocabulary and on a synthetic 248k one, under 2 ms in the worst state seen (a
// string within reach of its maxLength); the first mask in a new lexer state fills a cache (2-10 ms, once
// per vocabulary and state).
//
// Overloads: the schema / tools may be nlohmann::ordered_json (keeps property order) or nlohmann::json; a
// braced literal or nullptr is ambiguous between them - name the type.
//
// One TokenGrammar per sequence; its methods must not be called concurrently, different grammars may be
// used from different threads (the shared TokenVocab is thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "text/grammar_error.h"
#include "text/grammar_vocab.h"

namespace qrig::text {

class Tokenizer;

namespace grammar {
struct Grammar;
}

class TokenGrammar {
 public:
  // JSON of `schema` (null or {} = any JSON object, what response_format json_object means). `thinking`:
  // the prompt ended inside <think> - free reasoning text up to and including "</think>", then "\n\n",
  // then the JSON (as for tool_call). Throws GrammarError for a schema it cannot honour (unsupported
  // construct, a schema no value satisfies, unresolvable $ref); the message says what.
  static std::unique_ptr<TokenGrammar> json_schema(const nlohmann::ordered_json& schema,
                                                   std::shared_ptr<const TokenVocab> vocab, bool thinking = false);
  static std::unique_ptr<TokenGrammar> json_schema(const nlohmann::ordered_json& schema, const Tokenizer& tok,
                                                   bool thinking = false);
  static std::unique_ptr<TokenGrammar> json_schema(const nlohmann::json& schema, const Tokenizer& tok,
                                                   bool thinking = false);
  static std::unique_ptr<TokenGrammar> json_schema(const nlohmann::json& schema,
                                                   std::shared_ptr<const TokenVocab> vocab, bool thinking = false);

  // Qwen3.5 XML tool calls for the OpenAI `tools` array (the shapes OutputStreamParser accepts; a later
  // tool of the same name replaces an earlier one, as there), or only the tool `forced_name`:
  //   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
  // - parameters in any order, each at most once, the required ones all present (tools with more than 32
  //   parameters: in schema order); only declared parameters (and required names not declared: raw text);
  // - VALUE follows output_parser.h's coercion: a parameter whose schema admits "string" (or has no usable
  //   schema) is raw text - valid UTF-8 containing none of "</parameter>", "<parameter=", "</function>",
  //   "</tool_call>", no length cap beyond the schema's minLength/maxLength (code points), or exactly one of
  //   its enum/const values; any other parameter is compact JSON of its schema (strings inside never contain
  //   those tags either), and a boolean may also be written True/False as the chat template renders it;
  // - `parallel`: further calls may follow, each after one "\n";
  // - `thinking`: the prompt ended inside <think> - free UTF-8 text up to and including "</think>", then
  //   "\n\n", then the call(s). Without it the output starts with "<tool_call>".
  // Throws GrammarError for a malformed tools array, no usable tool, or forced_name not among the tools.
  static std::unique_ptr<TokenGrammar> tool_call(const nlohmann::ordered_json& tools,
                                                 const std::optional<std::string>& forced_name, bool parallel,
                                                 bool thinking, std::shared_ptr<const TokenVocab> vocab);
  static std::unique_ptr<TokenGrammar> tool_call(const nlohmann::ordered_json& tools,
                                                 const std::optional<std::string>& forced_name, bool parallel,
                                                 bool thinking, const Tokenizer& tok);
  static std::unique_ptr<TokenGrammar> tool_call(const nlohmann::json& tools,
                                                 const std::optional<std::string>& forced_name, bool parallel,
                                                 bool thinking, const Tokenizer& tok);
  static std::unique_ptr<TokenGrammar> tool_call(const nlohmann::json& tools,
                                                 const std::optional<std::string>& forced_name, bool parallel,
                                                 bool thinking, std::shared_ptr<const TokenVocab> vocab);

  // The whole output matches the ECMA-262 regular expression `pattern` (grammar_regex.h's subset; a full
  // match, as vLLM's guided_regex: the pattern is anchored at both ends). Throws GrammarError for what the
  // regex compiler refuses or a pattern that matches nothing.
  static std::unique_ptr<TokenGrammar> regex(const std::string& pattern, std::shared_ptr<const TokenVocab> vocab);
  // The whole output is exactly one of `choices` (vLLM's guided_choice). Throws GrammarError for an empty list.
  static std::unique_ptr<TokenGrammar> choice(const std::vector<std::string>& choices,
                                              std::shared_ptr<const TokenVocab> vocab);

  // A compiled grammar (the factories above use this).
  TokenGrammar(grammar::Grammar&& g, std::shared_ptr<const TokenVocab> vocab);
  ~TokenGrammar();
  TokenGrammar(const TokenGrammar&) = delete;
  TokenGrammar& operator=(const TokenGrammar&) = delete;

  // mask (resized to vocab size, i.e. tok.n_real()): true for every id that may come next - text tokens
  // whose bytes continue the grammar (control and padding tokens never; see TokenVocab::of for the Qwen
  // tags), and the end-of-generation ids when
  // complete(). Never all false before the end. After an end-of-generation id was accepted: only those ids.
  void allowed(std::vector<bool>& mask) const;
  // The same as a bitset: bit (id & 63) of words[id >> 6].
  void allowed_bits(std::vector<uint64_t>& words) const;
  // Advances by one token. Throws GrammarError (state unchanged) when the token is not allowed, naming it
  // and the first byte that fails.
  // allowed() and accept() also throw GrammarError ("grammar too ambiguous") when a schema keeps more than
  // 512 parses alive at once (e.g. identical anyOf branches nested recursively), instead of blowing up.
  void accept(int32_t token);
  // Whether accept(token) would succeed, without changing anything (speculative decoding, tests). Follows
  // the token byte by byte, as accept() does, not through the mask machinery.
  bool accepts(int32_t token) const;
  // The output so far is a whole sentence (end-of-generation allowed).
  bool complete() const;
  // An end-of-generation id has been accepted.
  bool finished() const;
  const TokenVocab& vocab() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qrig::text
