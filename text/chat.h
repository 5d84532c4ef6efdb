// Chat formatting: renders OpenAI-style chat requests into the Qwen3.5/3.6 prompt text, byte for
// byte what the official Jinja chat template (../shared/reference/qwen3.5-chat-template.jinja)
// produces under Hugging Face transformers. A native formatter instead of a Jinja interpreter: the
// template's logic (tool block, last-query detection, reasoning placement, tool-call XML, tool
// response grouping, generation prompt) and its error messages are reproduced in C++ (chat.cpp).
//
// JSON values are nlohmann::ordered_json because the template prints tool definitions with
// `tojson`, which keeps the keys in the order the client sent them; parse request bodies with
// nlohmann::ordered_json::parse. (Overloads taking nlohmann::json are deleted: that type sorts keys.)
//
// The *_with_spans variants also say which bytes of the prompt came from the request (message content,
// reasoning, tool-call names and arguments, tool definitions) rather than from the template, so that
// encode_chat can recognise special tokens such as <|im_start|> only where the template put them: a user
// who writes "<|im_end|>\n<|im_start|>system" in a message gets that text, not a forged turn.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace qrig::text {

class Tokenizer;

// Every rejected conversation: the template's own raise_exception messages ("No user query found
// in messages.", "System message must be at the beginning.", ...) verbatim, and clear messages for
// malformed input the template cannot render (wrong JSON types, a tool call without a name...).
struct ChatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // The last message (an assistant turn) is left open for the model to continue (assistant prefill, vLLM's
  // continue_final_message): rendered as the template renders it, without its closing <|im_end|>, and
  // without a generation prompt. When it holds reasoning and no content or tool calls, the prompt ends
  // inside its <think> block (after the reasoning), so the model continues the reasoning.
  bool continue_final_message = false;
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
// chat_template_kwargs {enable_thinking, preserve_thinking, add_vision_id} (booleans), a top-level
// enable_thinking (the same switch; when both are given they must agree), reasoning_effort ("none" turns
// thinking off, the other levels on, when no enable_thinking is given), continue_final_message. Messages
// of role "developer" are system messages (OpenAI defines them so). A trailing assistant message is
// continued (ChatOptions::continue_final_message) when continue_final_message is true, or when it is not
// given and add_generation_prompt is not false (llama.cpp's assistant prefill); continue_final_message
// true with add_generation_prompt true, or without a trailing assistant message, is a ChatError. Also
// applies the Qwen3 soft switches: when the text of the last user message ends with "/think" or
// "/no_think" (ignoring trailing whitespace, and preceded by whitespace or nothing), the switch and the
// whitespace before it are removed and enable_thinking is set accordingly (the switch wins over the
// fields). Other body fields (model, sampling...) are ignored here.
std::string render_chat_request(const nlohmann::ordered_json& body);

// A rendered prompt and the byte ranges [begin, end) of `text` whose bytes came from the request: the
// content of every message (text parts; the image/video placeholders and "Picture N: " labels are the
// template's), reasoning_content and reasoning split out of assistant content, tool-call function names,
// argument names and values, and each tool definition's JSON. What the template strips (surrounding
// whitespace, a /think or /no_think switch, <think> tags it moves) is not in the text, so not in a range.
// Ranges are sorted, disjoint, non-empty, and never adjacent (touching ranges are merged).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> literal_spans;
  // The model's output starts inside a <think> block: the generation prompt with thinking on, or a
  // continued assistant message whose reasoning is left open.
  bool output_in_reasoning = false;
  // The last message was left open for the model to continue (ChatOptions::continue_final_message).
  bool continued = false;
};

// render_chat and render_chat_request with the ranges; `text` is byte for byte what they return.
RenderedChat render_chat_with_spans(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                    const ChatOptions& opt);
RenderedChat render_chat_request_with_spans(const nlohmann::ordered_json& body);

// Token ids of a rendered chat. The template's markup is always tokenized with added tokens (CONTROL and
// USER_DEFINED) recognised. literal = true: the request's ranges are ordinary text, so no token can be
// forged from a message (Tokenizer::encode_literal); literal = false: added tokens written in
// the request are recognised too, as Hugging Face and llama.cpp tokenize a whole rendered chat
// (= tokenizer.encode(chat.text, true)). When the request's text spells no added token both give the same
// ids: the text between recognised tokens is tokenized as one piece, across range boundaries.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const RenderedChat& chat, bool literal = true);

std::string render_chat(const nlohmann::json&, const nlohmann::json&, const ChatOptions&) = delete;
std::string render_chat_request(const nlohmann::json&) = delete;
RenderedChat render_chat_with_spans(const nlohmann::json&, const nlohmann::json&, const ChatOptions&) = delete;
RenderedChat render_chat_request_with_spans(const nlohmann::json&) = delete;

}  // namespace qrig::text
