// The Qwen3.5/3.6 chat template, natively: each step below mirrors one block of
// ../shared/reference/qwen3.5-chat-template.jinja as transformers renders it (Python string
// semantics from chat_pyfmt.h). Qwen3.6's only change, preserve_thinking, widens the condition for
// rendering an assistant turn's <think> block from "after the last user query" to "every turn".
//
// Where the template would print nonsense for malformed input (content parts that are not objects,
// non-string text parts, tool_calls that are not an array) or fail with a Python error (a tool call
// without a name, arguments that are not a mapping), this throws ChatError with a clear message.
// One deliberate extension: tool-call arguments given as a JSON string (the OpenAI wire format,
// which transformers would reject) are parsed and rendered as the object they hold.
//
// The output is a Piece: every append says whether its bytes are template markup (mark) or request
// text (lit), which gives RenderedChat::literal_spans; the text is the same either way.
#include "text/chat.h"

#include "text/chat_pyfmt.h"
#include "text/tokenizer.h"

#include <algorithm>
#include <string_view>

namespace qrig::text {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kToolsIntro =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsInstructions =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
    "Required parameters MUST be specified\n- You may provide optional reasoning for your function "
    "call in natural language BEFORE the function call, but NOT after\n- If there is no function "
    "call available, answer the question like normal with your current knowledge and do not tell "
    "the user about function calls\n</IMPORTANT>";

// Jinja attribute access on a JSON value: the member when `v` is an object holding `key`, else
// nullptr (Jinja's undefined).
const Json* attr(const Json& v, const char* key) {
  if (!v.is_object()) return nullptr;
  auto it = v.find(key);
  return it == v.end() ? nullptr : &*it;
}

bool equals(const Json* v, std::string_view s) {
  return v && v->is_string() && v->get_ref<const std::string&>() == s;
}

std::string_view role_of(const Json& message) {
  const Json* r = attr(message, "role");
  return r && r->is_string() ? std::string_view(r->get_ref<const std::string&>()) : "";
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Text built from template markup and request text, with the byte ranges of the latter (what
// RenderedChat::literal_spans reports; see chat.h).
struct Piece {
  std::string text;
  std::vector<std::pair<size_t, size_t>> spans;  // sorted, disjoint, non-empty, never touching

  // Template markup.
  Piece& mark(std::string_view s) {
    text += s;
    return *this;
  }
  // Request text.
  Piece& lit(std::string_view s) {
    if (s.empty()) return *this;
    if (!spans.empty() && spans.back().second == text.size()) spans.back().second += s.size();
    else spans.emplace_back(text.size(), text.size() + s.size());
    text += s;
    return *this;
  }
  // p.text[b, e), each byte keeping its origin.
  Piece& add(const Piece& p, size_t b, size_t e) {
    for (auto [sb, se] : p.spans) {
      if (se <= b || sb >= e) continue;
      size_t lb = std::max(sb, b), le = std::min(se, e);
      mark(std::string_view(p.text).substr(b, lb - b));
      lit(std::string_view(p.text).substr(lb, le - lb));
      b = le;
    }
    return mark(std::string_view(p.text).substr(b, e - b));
  }
  Piece& add(const Piece& p) { return add(p, 0, p.text.size()); }
  // The part of this piece that `view` (a view into text) covers.
  Piece slice(std::string_view view) const {
    size_t b = static_cast<size_t>(view.data() - text.data());
    return Piece().add(*this, b, b + view.size());
  }
};

class Renderer {
 public:
  Renderer(const Json& messages, const Json& tools, const ChatOptions& opt)
      : msgs_(messages), tools_(tools), opt_(opt) {}

  RenderedChat run() {
    if (msgs_.is_null() || (msgs_.is_array() && msgs_.empty()))
      throw ChatError("No messages provided.");
    if (!msgs_.is_array()) throw ChatError("chat: messages must be an array");
    for (size_t i = 0; i < msgs_.size(); ++i)
      if (!msgs_[i].is_object())
        throw ChatError("chat: message " + std::to_string(i) + " is not an object");
    if (!tools_.is_null() && !tools_.is_array())
      throw ChatError("chat: tools must be an array or null");
    for (size_t i = 0; i < tools_.size() && tools_.is_array(); ++i)
      if (!tools_[i].is_object())
        throw ChatError("chat: tool " + std::to_string(i) + " is not an object");

    if (opt_.continue_final_message && role_of(msgs_.back()) != "assistant")
      throw ChatError("chat: continue_final_message needs an assistant message last");
    system_header();
    size_t last_query = last_query_index();
    for (size_t i = 0; i < msgs_.size(); ++i) message(i, last_query);
    bool in_reasoning = open_reasoning_;
    if (opt_.add_generation_prompt && !opt_.continue_final_message) {
      out_.mark(opt_.enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                     : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
      in_reasoning = opt_.enable_thinking;
    }
    return RenderedChat{std::move(out_.text), std::move(out_.spans), in_reasoning, opt_.continue_final_message};
  }

 private:
  // The template's render_content macro followed by |trim. Text parts are request text, the media
  // placeholders (and their labels) markup.
  Piece content(const Json& message, bool count_vision, bool is_system) {
    const Json* c = attr(message, "content");
    Piece text;
    if (!c || c->is_null()) return text;
    if (c->is_string()) return text.lit(py::strip(c->get_ref<const std::string&>()));
    if (!c->is_array()) throw ChatError("Unexpected content type.");
    for (size_t k = 0; k < c->size(); ++k) {
      const Json& item = (*c)[k];
      if (!item.is_object())
        throw ChatError("chat: content part " + std::to_string(k) + " is not an object");
      const Json* type = attr(item, "type");
      if (item.contains("image") || item.contains("image_url") || equals(type, "image")) {
        if (is_system) throw ChatError("System message cannot contain images.");
        if (count_vision) ++images_;
        if (opt_.add_vision_id) text.mark("Picture " + std::to_string(images_) + ": ");
        text.mark("<|vision_start|><|image_pad|><|vision_end|>");
      } else if (item.contains("video") || equals(type, "video")) {
        if (is_system) throw ChatError("System message cannot contain videos.");
        if (count_vision) ++videos_;
        if (opt_.add_vision_id) text.mark("Video " + std::to_string(videos_) + ": ");
        text.mark("<|vision_start|><|video_pad|><|vision_end|>");
      } else if (const Json* t = attr(item, "text")) {
        if (!t->is_string())
          throw ChatError("chat: content part " + std::to_string(k) + " has a non-string text");
        text.lit(t->get_ref<const std::string&>());
      } else {
        throw ChatError("Unexpected item type in content.");
      }
    }
    return text.slice(py::strip(text.text));
  }

  // The system turn, preceded by the tool definitions when there are tools.
  void system_header() {
    const Json& first = msgs_[0];
    bool has_system = role_of(first) == "system";
    if (tools_.is_array() && !tools_.empty()) {
      out_.mark(kToolsIntro);
      for (const Json& tool : tools_) {
        out_.mark("\n");
        out_.lit(py::json_dumps(tool));
      }
      out_.mark(kToolsInstructions);
      if (has_system) {
        Piece c = content(first, false, true);
        if (!c.text.empty()) out_.mark("\n\n").add(c);
      }
      out_.mark("<|im_end|>\n");
    } else if (has_system) {
      out_.mark("<|im_start|>system\n").add(content(first, false, true)).mark("<|im_end|>\n");
    }
  }

  // Index of the last user turn that is a real query, not tool results wrapped in <tool_response>.
  size_t last_query_index() {
    for (size_t i = msgs_.size(); i-- > 0;) {
      if (role_of(msgs_[i]) != "user") continue;
      std::string c = content(msgs_[i], false, false).text;
      if (!(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) return i;
    }
    throw ChatError("No user query found in messages.");
  }

  void message(size_t i, size_t last_query) {
    const Json& m = msgs_[i];
    Piece c = content(m, true, false);
    std::string_view role = role_of(m);
    if (role == "system") {
      if (i != 0) throw ChatError("System message must be at the beginning.");
    } else if (role == "user") {
      out_.mark("<|im_start|>user\n").add(c).mark("<|im_end|>\n");
    } else if (role == "assistant") {
      assistant(m, c, opt_.preserve_thinking || i > last_query, opt_.continue_final_message && i + 1 == msgs_.size());
    } else if (role == "tool") {
      if (i > 0 && role_of(msgs_[i - 1]) != "tool") out_.mark("<|im_start|>user");
      out_.mark("\n<tool_response>\n").add(c).mark("\n</tool_response>");
      if (i + 1 == msgs_.size() || role_of(msgs_[i + 1]) != "tool") out_.mark("<|im_end|>\n");
    } else {
      throw ChatError("Unexpected message role.");
    }
  }

  // `reasoning` and `c` are views into the reasoning_content string or into content.text; the
  // <think> tags the template takes out of the content are not printed from it. open: the message is
  // continued by the model (no <|im_end|>; reasoning left open when there is nothing after it).
  void assistant(const Json& m, const Piece& content, bool with_think, bool open) {
    std::string_view c = content.text;
    std::string_view reasoning;
    bool reasoning_in_content = false;
    const Json* rc = attr(m, "reasoning_content");
    if (rc && rc->is_string()) {
      reasoning = rc->get_ref<const std::string&>();
    } else if (size_t close = c.find("</think>"); close != std::string_view::npos) {
      std::string_view before = rstrip_newlines(c.substr(0, close));
      if (size_t open = before.rfind("<think>"); open != std::string_view::npos)
        before = before.substr(open + 7);
      reasoning = lstrip_newlines(before);
      reasoning_in_content = true;
      c = lstrip_newlines(c.substr(c.rfind("</think>") + 8));
    }
    reasoning = py::strip(reasoning);
    out_.mark("<|im_start|>assistant\n");
    const Json* calls_field = attr(m, "tool_calls");
    const bool has_calls = calls_field && calls_field->is_array() && !calls_field->empty();
    if (open && with_think && !reasoning.empty() && py::strip(c).empty() && !has_calls) {
      out_.mark("<think>\n");
      if (reasoning_in_content) out_.add(content.slice(reasoning));
      else out_.lit(reasoning);
      open_reasoning_ = true;
      return;
    }
    if (with_think) {
      out_.mark("<think>\n");
      if (reasoning_in_content) out_.add(content.slice(reasoning));
      else out_.lit(reasoning);
      out_.mark("\n</think>\n\n");
    }
    out_.add(content.slice(c));
    if (const Json* calls = attr(m, "tool_calls"); calls && !calls->is_null()) {
      if (!calls->is_array()) throw ChatError("chat: assistant tool_calls must be an array or null");
      for (size_t k = 0; k < calls->size(); ++k) tool_call((*calls)[k], k, c);
    }
    if (!open) out_.mark("<|im_end|>\n");
  }

  void tool_call(const Json& call, size_t k, std::string_view content) {
    std::string where = "chat: tool call " + std::to_string(k);
    if (!call.is_object()) throw ChatError(where + " is not an object");
    const Json* fn = attr(call, "function");
    if (!fn) fn = &call;
    if (!fn->is_object()) throw ChatError(where + ": function is not an object");
    const Json* name = attr(*fn, "name");
    if (!name || !name->is_string()) throw ChatError(where + " has no function name (string)");
    if (k > 0) out_.mark("\n");
    else if (!py::strip(content).empty()) out_.mark("\n\n");
    out_.mark("<tool_call>\n<function=").lit(name->get_ref<const std::string&>()).mark(">\n");
    if (const Json* args = attr(*fn, "arguments")) {
      Json parsed;
      if (args->is_string()) {
        try {
          parsed = Json::parse(args->get_ref<const std::string&>());
        } catch (const nlohmann::json::exception& e) {
          throw ChatError(where + ": arguments string is not valid JSON: " + e.what());
        }
        args = &parsed;
      }
      if (!args->is_object()) throw ChatError(where + ": arguments must be a JSON object");
      for (const auto& [key, value] : args->items()) {
        out_.mark("<parameter=").lit(key).mark(">\n");
        out_.lit(value.is_object() || value.is_array() ? py::json_dumps(value) : py::scalar_str(value));
        out_.mark("\n</parameter>\n");
      }
    }
    out_.mark("</function>\n</tool_call>");
  }

  const Json& msgs_;
  const Json& tools_;
  const ChatOptions& opt_;
  Piece out_;
  int images_ = 0;
  int videos_ = 0;
  bool open_reasoning_ = false;  // the continued final message ends inside its reasoning
};

}  // namespace

RenderedChat render_chat_with_spans(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                    const ChatOptions& opt) {
  return Renderer(messages, tools, opt).run();
}

std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                        const ChatOptions& opt) {
  return Renderer(messages, tools, opt).run().text;
}

std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, const RenderedChat& chat, bool literal) {
  if (!literal) return tokenizer.encode(chat.text, true);
  return tokenizer.encode_literal(chat.text, chat.literal_spans);
}

}  // namespace qrig::text
