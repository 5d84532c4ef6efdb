// Chat formatting: renders OpenAI-style chat requests into the Qwen3.5/3.6 prompt text, byte for
// byte what the official Jinja chat template (../shared/reference/qwen3.5-chat-template.jinja)
// produces under Hugging Face transformers. A native formatter instead of a Jinja interpreter: the
// template's logic (tool block, last-query detection, reasoning placement, tool-call XML, tool
// response grouping, generation prompt) and its error messages are reproduced in C++ (chat.cpp).
//
// JSON values are nlohmann::ordered_json because the template prints tool definitions with
// `tojson`, which keeps the keys in the order the client sent them; parse request bodies with
// nlohmann::ordered_json::parse. (Overloads taking nlohmann::json are deleted: that type sorts keys.)
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace qrig::text {

// Every rejected conversation: the template's own raise_exception messages ("No user query found
// in messages.", "System message must be at the beginning.", ...) verbatim, and clear messages for
// malformed input the template cannot render (wrong JSON types, a tool call without a name...).
struct ChatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;    // false: the prompt ends with an empty <think></think> block
  bool preserve_thinking = false; // Qwen3.6: keep <think> blocks of every past assistant turn
  bool add_vision_id = false;     // the template's "Picture N: " / "Video N: " labels
};

// messages: array of {role: system|user|assistant|tool, content: string | null | array of parts}.
// Parts: {type:text, text}, {type:image_url, image_url} / {type:image} / {image: ...} (one
// <|vision_start|><|image_pad|><|vision_end|> each), {type:video} / {video: ...}. Assistant turns may
// carry reasoning_content (string) and tool_calls [{id, type:function, function:{name, arguments}}]
// (arguments a JSON object or a string holding one; the flat {name, arguments} form also works).
// tools: an OpenAI tools array, or null.
std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                        const ChatOptions& opt);

// A whole chat-completions request body: messages, tools, add_generation_prompt (default true),
// chat_template_kwargs {enable_thinking, preserve_thinking, add_vision_id} (booleans). Also applies
// the Qwen3 soft switches: when the text of the last user message ends with "/think" or "/no_think"
// (ignoring trailing whitespace, and preceded by whitespace or nothing), the switch and the
// whitespace before it are removed and enable_thinking is set accordingly (the switch wins over
// chat_template_kwargs). Other body fields (model, sampling...) are ignored here.
std::string render_chat_request(const nlohmann::ordered_json& body);

std::string render_chat(const nlohmann::json&, const nlohmann::json&, const ChatOptions&) = delete;
std::string render_chat_request(const nlohmann::json&) = delete;

}  // namespace qrig::text
