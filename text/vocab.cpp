// Loading a byte-level BPE vocabulary from GGUF metadata or a Hugging Face tokenizer.json, and the
// consistency checks both share (see vocab.h).
#include "text/vocab.h"

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/gguf.h"

namespace qrig::text {

namespace {

// The Split regexes of the tokenizer.json files, as HF writes them, for recognising the pre-tokenizer.
constexpr std::string_view kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool known_pre(std::string_view pre) { return pre == "qwen35" || pre == "qwen2"; }

std::optional<int32_t> opt_id(const gguf::File& f, std::string_view key) {
  auto v = f.opt_uint(key);
  if (!v) return std::nullopt;
  if (*v > static_cast<uint64_t>(INT32_MAX)) {
    throw TokenizerError(std::string(key) + " = " + std::to_string(*v) + " is not a token id");
  }
  return static_cast<int32_t>(*v);
}

std::pair<std::string, std::string> split_merge(const std::string& m, size_t rank) {
  // Byte-level tokens never contain a raw space (it is mapped to U+0120), so the first space that is
  // not the very first character separates the two parts.
  const size_t sp = m.find(' ', 1);
  if (sp == std::string::npos || sp + 1 >= m.size() || m.find(' ', sp + 1) != std::string::npos) {
    throw TokenizerError("merge " + std::to_string(rank) + " '" + m + "' is not of the form 'A B'");
  }
  return {m.substr(0, sp), m.substr(sp + 1)};
}

}  // namespace

void Vocab::finalize() {
  if (tokens.empty()) throw TokenizerError("vocabulary has no tokens");
  if (tokens.size() != types.size()) {
    throw TokenizerError("vocabulary has " + std::to_string(tokens.size()) + " tokens but " +
                         std::to_string(types.size()) + " token types");
  }
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) throw TokenizerError("vocabulary too large");
  if (!known_pre(pre)) {
    throw TokenizerError("unsupported pre-tokenizer '" + pre + "' (supported: qwen35, qwen2)");
  }
  auto check = [&](const char* what, std::optional<int32_t> id) {
    if (id && (*id < 0 || *id >= size())) {
      throw TokenizerError(std::string(what) + " id " + std::to_string(*id) + " is outside the vocabulary of " +
                           std::to_string(size()) + " tokens");
    }
  };
  if (eos_id < 0) throw TokenizerError("vocabulary has no end-of-sequence token");
  check("eos", eos_id);
  check("eot", eot_id);
  check("padding", padding_id);
  check("bos", bos_id);
  int32_t last = size() - 1;
  while (last >= 0 && types[last] == TokenType::Unused) --last;
  n_real = last + 1;
  if (n_real == 0) throw TokenizerError("vocabulary has only unused tokens");
}

Vocab Vocab::from_gguf(const gguf::File& f) {
  try {
    Vocab v;
    const std::string& model = f.get_string("tokenizer.ggml.model");
    if (model != "gpt2") {
      throw TokenizerError("tokenizer.ggml.model is '" + model + "'; only byte-level BPE ('gpt2') is supported");
    }
    v.pre = f.opt_string("tokenizer.ggml.pre").value_or("");
    if (!known_pre(v.pre)) {
      throw TokenizerError("tokenizer.ggml.pre is '" + v.pre + "'; supported: qwen35, qwen2");
    }
    v.tokens = f.get_string_array("tokenizer.ggml.tokens");
    const std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != v.tokens.size()) {
      throw TokenizerError("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
                           std::to_string(v.tokens.size()) + " tokens");
    }
    v.types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < 1 || types[i] > 6) {
        throw TokenizerError("tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(types[i]) +
                             " is not a known token type (1..6)");
      }
      v.types.push_back(static_cast<TokenType>(types[i]));
    }
    const auto& merges = f.get_string_array("tokenizer.ggml.merges");
    v.merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) v.merges.push_back(split_merge(merges[r], r));
    const auto eos = opt_id(f, "tokenizer.ggml.eos_token_id");
    if (!eos) throw TokenizerError("tokenizer.ggml.eos_token_id is missing");
    v.eos_id = *eos;
    v.eot_id = opt_id(f, "tokenizer.ggml.eot_token_id");
    v.padding_id = opt_id(f, "tokenizer.ggml.padding_token_id");
    v.bos_id = opt_id(f, "tokenizer.ggml.bos_token_id");
    v.nfc = true;
    v.finalize();
    return v;
  } catch (const gguf::Error& e) {
    throw TokenizerError(std::string("vocabulary: ") + e.what());
  } catch (const TokenizerError& e) {
    throw TokenizerError(f.path() + ": " + e.what());
  }
}

Vocab Vocab::from_hf_json(const std::string& path, std::optional<std::string> pre) {
  using nlohmann::json;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError("cannot open tokenizer file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    throw TokenizerError(path + ": not valid JSON: " + e.what());
  }
  try {
    Vocab v;
    const json& model = j.at("model");
    if (model.contains("type") && model["type"] != "BPE") {
      throw TokenizerError("model.type is " + model["type"].dump() + "; only BPE is supported");
    }
    if (model.value("byte_fallback", false)) throw TokenizerError("byte_fallback BPE is not supported");
    v.ignore_merges = model.value("ignore_merges", false);

    // Tokens: model.vocab then added_tokens (which may repeat or extend it).
    auto place = [&](int64_t id, const std::string& text, TokenType type) {
      if (id < 0 || id >= INT32_MAX) throw TokenizerError("token id " + std::to_string(id) + " out of range");
      if (static_cast<size_t>(id) >= v.tokens.size()) {
        v.tokens.resize(id + 1);
        v.types.resize(id + 1, TokenType::Unused);
      }
      v.tokens[id] = text;
      v.types[id] = type;
    };
    for (const auto& [text, id] : model.at("vocab").items()) place(id.get<int64_t>(), text, TokenType::Normal);
    if (j.contains("added_tokens")) {
      for (const json& a : j["added_tokens"]) {
        place(a.at("id").get<int64_t>(), a.at("content").get<std::string>(),
              a.value("special", false) ? TokenType::Control : TokenType::UserDefined);
      }
    }
    // Holes in the id space (rare) become unused padding entries, named as GGUF converters do.
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.types[i] == TokenType::Unused && v.tokens[i].empty()) v.tokens[i] = "[PAD" + std::to_string(i) + "]";
    }

    const json& merges = model.at("merges");
    v.merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& m = merges[r];
      if (m.is_string()) {
        v.merges.push_back(split_merge(m.get<std::string>(), r));
      } else if (m.is_array() && m.size() == 2) {
        v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        throw TokenizerError("model.merges[" + std::to_string(r) + "] is neither 'A B' nor [A, B]");
      }
    }

    // Normalizer: none, NFC, or a sequence of NFC.
    std::function<bool(const json&)> is_nfc = [&](const json& n) -> bool {
      if (n.is_null()) return false;
      const std::string t = n.at("type").get<std::string>();
      if (t == "NFC") return true;
      if (t == "Sequence") {
        bool any = false;
        for (const json& s : n.at("normalizers")) any = is_nfc(s) || any;
        return any;
      }
      throw TokenizerError("unsupported normalizer '" + t + "'");
    };
    v.nfc = j.contains("normalizer") ? is_nfc(j["normalizer"]) : false;

    if (pre) {
      v.pre = *pre;
    } else {
      // Find the Split regex in the pre_tokenizer (alone or inside a Sequence).
      std::string regex;
      std::function<void(const json&)> find_split = [&](const json& p) {
        if (p.is_null()) return;
        const std::string t = p.value("type", "");
        if (t == "Split" && p.contains("pattern") && p["pattern"].contains("Regex")) {
          regex = p["pattern"]["Regex"].get<std::string>();
        } else if (t == "Sequence") {
          for (const json& s : p.at("pretokenizers")) find_split(s);
        }
      };
      if (j.contains("pre_tokenizer")) find_split(j["pre_tokenizer"]);
      if (regex == kQwen35Regex) {
        v.pre = "qwen35";
      } else if (regex == kQwen2Regex) {
        v.pre = "qwen2";
      } else {
        throw TokenizerError("pre-tokenizer regex not recognised as qwen35 or qwen2: '" + regex + "'");
      }
    }

    // tokenizer.json does not name eos/pad (tokenizer_config.json does); Qwen's are fixed texts.
    auto find = [&](std::string_view text) -> std::optional<int32_t> {
      for (size_t i = 0; i < v.tokens.size(); ++i) {
        if (v.types[i] != TokenType::Normal && v.tokens[i] == text) return static_cast<int32_t>(i);
      }
      return std::nullopt;
    };
    const auto im_end = find("<|im_end|>");
    const auto eot = find("<|endoftext|>");
    if (!im_end && !eot) throw TokenizerError("neither <|im_end|> nor <|endoftext|> is an added token");
    v.eos_id = im_end ? *im_end : *eot;
    v.padding_id = eot;
    v.finalize();
    return v;
  } catch (const json::exception& e) {
    throw TokenizerError(path + ": malformed tokenizer.json: " + e.what());
  } catch (const TokenizerError& e) {
    throw TokenizerError(path + ": " + e.what());
  }
}

}  // namespace qrig::text
