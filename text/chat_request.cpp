// render_chat_request: turns a chat-completions request body into ChatOptions (template kwargs,
// enable_thinking / reasoning_effort, add_generation_prompt, continue_final_message), maps the "developer"
// role to "system", and applies Qwen3's /think and /no_think soft switches before rendering with
// render_chat (chat.cpp). The switch is cut from the message before rendering, so the literal spans of the
// result never include it. Kept apart from the template logic so that file mirrors only the template.
#include "text/chat.h"

#include "text/chat_pyfmt.h"

#include <optional>
#include <string_view>

namespace qrig::text {
namespace {

using Json = nlohmann::ordered_json;

bool bool_field(const Json& obj, const char* key, bool fallback, const char* where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw ChatError(std::string("chat: ") + where + key + " must be a boolean");
  return it->get<bool>();
}

// Removes a trailing "/think" or "/no_think" switch (and the whitespace around it) from `text`.
// The switch must stand alone: at the start of the text or after whitespace, so a path such as
// "cat /tmp/think" is left alone. Returns the thinking mode it asks for.
std::optional<bool> strip_switch(std::string& text) {
  std::string_view t = py::rstrip(text);
  for (auto [word, thinking] : {std::pair{std::string_view("/no_think"), false},
                                std::pair{std::string_view("/think"), true}}) {
    if (t.size() < word.size() || t.substr(t.size() - word.size()) != word) continue;
    std::string_view rest = t.substr(0, t.size() - word.size());
    std::string_view kept = py::rstrip(rest);
    if (!rest.empty() && kept.size() == rest.size()) continue;  // glued to the previous word
    text.resize(kept.size());
    return thinking;
  }
  return std::nullopt;
}

// The soft switch, looked up in the last user message: in its content string, or in the last part
// of a content array when that part is a text part.
std::optional<bool> apply_soft_switch(Json& messages) {
  if (!messages.is_array()) return std::nullopt;
  for (size_t i = messages.size(); i-- > 0;) {
    Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || m["role"] != "user") continue;
    auto c = m.find("content");
    if (c == m.end()) return std::nullopt;
    Json* text = nullptr;
    if (c->is_string()) {
      text = &*c;
    } else if (c->is_array() && !c->empty() && c->back().is_object()) {
      Json& part = c->back();
      bool media = part.contains("image") || part.contains("image_url") || part.contains("video") ||
                   part.value("type", Json()) == "image" || part.value("type", Json()) == "video";
      auto t = part.find("text");
      if (!media && t != part.end() && t->is_string()) text = &*t;
    }
    if (!text) return std::nullopt;
    return strip_switch(text->get_ref<std::string&>());
  }
  return std::nullopt;
}


std::optional<bool> optional_bool(const Json& obj, const char* key, const char* where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  return bool_field(obj, key, false, where);
}

// enable_thinking from the body: chat_template_kwargs, the top-level field, reasoning_effort.
std::optional<bool> thinking_of(const Json& body, const Json* kw) {
  std::optional<bool> from_kw = kw ? optional_bool(*kw, "enable_thinking", "chat_template_kwargs.") : std::nullopt;
  std::optional<bool> top = optional_bool(body, "enable_thinking", "");
  if (from_kw && top && *from_kw != *top)
    throw ChatError("chat: enable_thinking and chat_template_kwargs.enable_thinking disagree");
  if (from_kw || top) return from_kw ? from_kw : top;
  auto effort = body.find("reasoning_effort");
  if (effort == body.end() || effort->is_null()) return std::nullopt;
  static const char* const kLevels[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
  if (effort->is_string())
    for (const char* l : kLevels)
      if (*effort == l) return *effort != "none";
  throw ChatError("chat: reasoning_effort must be one of none, minimal, low, medium, high, xhigh, max");
}

}  // namespace

RenderedChat render_chat_request_with_spans(const nlohmann::ordered_json& body) {
  if (!body.is_object()) throw ChatError("chat: request body must be a JSON object");
  ChatOptions opt;
  const std::optional<bool> gen_prompt = optional_bool(body, "add_generation_prompt", "");
  opt.add_generation_prompt = gen_prompt.value_or(true);
  const Json* kw = nullptr;
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw ChatError("chat: chat_template_kwargs must be an object");
    kw = &*it;
    opt.preserve_thinking = bool_field(*kw, "preserve_thinking", false, "chat_template_kwargs.");
    opt.add_vision_id = bool_field(*kw, "add_vision_id", false, "chat_template_kwargs.");
  }
  if (std::optional<bool> t = thinking_of(body, kw)) opt.enable_thinking = *t;
  Json messages = body.value("messages", Json());
  if (messages.is_array())
    for (Json& m : messages)
      if (m.is_object() && m.contains("role") && m["role"] == "developer") m["role"] = "system";
  const bool last_assistant = messages.is_array() && !messages.empty() && messages.back().is_object() &&
                              messages.back().value("role", Json()) == "assistant";
  if (std::optional<bool> cont = optional_bool(body, "continue_final_message", "")) {
    if (*cont && gen_prompt.value_or(false))
      throw ChatError("chat: continue_final_message and add_generation_prompt cannot both be true");
    opt.continue_final_message = *cont;
  } else {
    opt.continue_final_message = last_assistant && opt.add_generation_prompt;
  }
  if (auto thinking = apply_soft_switch(messages)) opt.enable_thinking = *thinking;
  return render_chat_with_spans(messages, body.value("tools", Json()), opt);
}

std::string render_chat_request(const nlohmann::ordered_json& body) {
  return render_chat_request_with_spans(body).text;
}

}  // namespace qrig::text
