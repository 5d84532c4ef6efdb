// POST /tokenize and POST /detokenize, in the shapes llama.cpp's and vLLM's servers use:
//   /tokenize   {"content" | "prompt": text, "parse_special"?: true, "with_pieces"?: false}
//               or {"messages": [...], ...chat fields, "parse_special"?: false} (the chat prompt the chat
//               endpoint would build: the template's markup always with special tokens, the request's own
//               text, as there, with special tokens only when parse_special is true)
//               -> {"tokens": [ids] | [{"id", "piece"}], "count", "max_model_len"}
//   /detokenize {"tokens": [ids]} -> {"content": text, "prompt": text}
// "piece" is the token's text, or its bytes as an array of numbers when they are not valid UTF-8 on their
// own (llama.cpp's convention). add_special is accepted and has no effect (Qwen adds no BOS).
#include <optional>
#include <set>

#include <fmt/format.h>

#include "server/chat_request.h"
#include "server/generation.h"
#include "server/handlers.h"
#include "server/request_parse.h"
#include "server/sse.h"
#include "text/chat.h"
#include "text/unicode.h"

namespace qrig::server {

using nlohmann::json;

void handle_tokenize(Context& ctx, const ModelPtr& model, const Request& req, Response& res) {
  const Json body = parse_body(req.body);
  const text::Tokenizer& tok = *model->tokenizer;
  std::set<std::string> known = {"content", "prompt", "messages", "parse_special", "with_pieces", "add_special", "model"};
  const std::optional<bool> parse_special = get_bool(body, "parse_special");
  const bool with_pieces = get_bool(body, "with_pieces").value_or(false);
  (void)get_bool(body, "add_special");
  (void)get_string(body, "model");
  std::string text;
  int given = 0;
  if (auto c = get_string(body, "content")) text = *c, ++given;
  if (auto p = get_string(body, "prompt")) text = *p, ++given;
  std::optional<text::RenderedChat> chat;
  if (body.contains("messages") && !body["messages"].is_null()) {
    ++given;
    for (const char* k : {"tools", "chat_template_kwargs", "add_generation_prompt"}) known.insert(k);
    check_messages(body["messages"]);
    try {
      chat = text::render_chat_request_with_spans(body);
    } catch (const text::ChatError& e) {
      throw ApiError(ErrorKind::invalid_request, e.what(), "messages");
    }
  }
  if (given != 1) throw ApiError(ErrorKind::invalid_request, "give exactly one of 'content', 'prompt' or 'messages'", "content");
  const std::vector<int32_t> ids = chat ? text::encode_chat(tok, *chat, !parse_special.value_or(false))
                                        : tok.encode(text, parse_special.value_or(true));
  // The answer is written as text: a DOM of a few million {"id", "piece"} objects took gigabytes.
  report_ignored(req, res, unknown_fields(body, known));
  std::string out = "{\"tokens\":[";
  out.reserve(16 + ids.size() * (with_pieces ? 24 : 7));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    const int32_t id = ids[i];
    if (!with_pieces) {
      out += std::to_string(id);
      continue;
    }
    const std::string& bytes = tok.token_to_bytes(id);
    out += "{\"id\":" + std::to_string(id) + ",\"piece\":";
    out += text::is_valid_utf8(bytes) ? json_text(json(bytes)) : json_text(token_bytes(tok, id));
    out += '}';
  }
  out += fmt::format("],\"count\":{},\"max_model_len\":{}}}", ids.size(), model->engine->context_length());
  res.status = 200;
  res.set_content(std::move(out), "application/json");
}

void handle_detokenize(Context& ctx, const ModelPtr& model, const Request& req, Response& res) {
  const Json body = parse_body(req.body);
  const text::Tokenizer& tok = *model->tokenizer;
  auto t = body.find("tokens");
  if (t == body.end() || !t->is_array()) throw ApiError(ErrorKind::invalid_request, "'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t->size(); ++i) {
    const Json& v = (*t)[i];
    if (!(v.is_number_integer() || v.is_number_unsigned()) || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok.n_vocab())
      throw ApiError(ErrorKind::invalid_request, fmt::format("'tokens[{}]' must be a token id in [0, {})", i, tok.n_vocab()),
                     "tokens");
    ids.push_back((int32_t)v.get<int64_t>());
  }
  report_ignored(req, res, unknown_fields(body, {"tokens", "model"}));
  const std::string text = text::sanitize_utf8(tok.decode(ids));
  send_json(res, 200, json{{"content", text}, {"prompt", text}});
}

}  // namespace qrig::server
