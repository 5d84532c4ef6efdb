#!/usr/bin/env python3
# Oracle for qrig's native chat formatter (text/chat.cpp): generates a deterministic corpus of
# varied chat requests and renders each with python3-jinja2 set up exactly as Hugging Face
# transformers sets it up for apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks,
# lstrip_blocks, loopcontrols, tojson = json.dumps(ensure_ascii=False), raise_exception).
# tests/text/test_chat_corpus.cpp runs this script and compares every line with the C++ output.
#
# usage: chat_corpus.py MODEL.gguf|TEMPLATE.jinja
# Output: one JSON object per line: {"case": {name, messages, tools?, add_generation_prompt,
# enable_thinking?, preserve_thinking?, add_vision_id?}, "rendered": str} or, when rendering fails,
# {"case": ..., "error": message, "kind": "template" (raise_exception in the template) | the Python
# exception class | "normalize" (arguments string that is not JSON)}.
#
# Two deliberate steps beyond plain transformers, mirrored by the C++ formatter:
#  - tool-call "arguments" given as a JSON string (OpenAI wire format) are parsed before rendering
#    (transformers would fail on them: the template applies |items to the arguments);
#  - "preserve_thinking" (Qwen3.6) is rendered with the Qwen3.6 condition patched into the Qwen3.5
#    template: (preserve_thinking is defined and preserve_thinking is true) or (index > last query).
import json
import random
import struct
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.stderr.write("chat_corpus.py: python3-jinja2 is required (apt install python3-jinja2)\n")
    sys.exit(2)


# ---------------------------------------------------------------- template loading
def read_gguf_chat_template(path):
    """Return the value of tokenizer.chat_template from a GGUF v2/v3 file."""
    scalar_sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(data):
            raise ValueError(f"{path}: truncated GGUF")
        chunk = data[pos:pos + n]
        pos += n
        return chunk

    def u32():
        return struct.unpack("<I", take(4))[0]

    def u64():
        return struct.unpack("<Q", take(8))[0]

    def string():
        return take(u64()).decode("utf-8")

    def skip(vtype):
        if vtype in scalar_sizes:
            take(scalar_sizes[vtype])
        elif vtype == 8:
            take(u64())
        elif vtype == 9:
            elem, count = u32(), u64()
            for _ in range(count):
                skip(elem)
        else:
            raise ValueError(f"{path}: unknown GGUF value type {vtype}")

    if take(4) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version = u32()
    if version not in (2, 3):
        raise ValueError(f"{path}: unsupported GGUF version {version}")
    u64()  # tensor count
    for _ in range(u64()):
        key, vtype = string(), u32()
        if key == "tokenizer.chat_template":
            if vtype != 8:
                raise ValueError(f"{path}: tokenizer.chat_template is not a string")
            return string()
        skip(vtype)
    raise ValueError(f"{path}: no tokenizer.chat_template")


QWEN35_CONDITION = "{%- if loop.index0 > ns.last_query_index %}"
QWEN36_CONDITION = ("{%- if (preserve_thinking is defined and preserve_thinking is true) "
                    "or (loop.index0 > ns.last_query_index) %}")


class TemplateRaised(Exception):
    pass


def make_environment():
    def raise_exception(message):
        raise TemplateRaised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


# ---------------------------------------------------------------- rendering
def normalize_arguments(messages):
    """Parse tool-call arguments given as JSON strings, as the C++ formatter does."""
    out = json.loads(json.dumps(messages))
    for m in out if isinstance(out, list) else []:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if not isinstance(calls, list):
            continue
        for call in calls:
            target = call.get("function", call) if isinstance(call, dict) else None
            if isinstance(target, dict) and isinstance(target.get("arguments"), str):
                target["arguments"] = json.loads(target["arguments"])
    return out


def render(templates, case):
    kwargs = {}
    for key in ("enable_thinking", "preserve_thinking", "add_vision_id"):
        if key in case:
            kwargs[key] = case[key]
    template = templates["qwen36" if "preserve_thinking" in case else "qwen35"]
    try:
        messages = normalize_arguments(case["messages"])
    except json.JSONDecodeError as e:
        return {"error": str(e), "kind": "normalize"}
    try:
        text = template.render(messages=messages, tools=case.get("tools"), documents=None,
                               add_generation_prompt=case["add_generation_prompt"], **kwargs)
        return {"rendered": text}
    except TemplateRaised as e:
        return {"error": str(e), "kind": "template"}
    except Exception as e:  # Jinja UndefinedError, TypeError...: malformed input
        return {"error": str(e), "kind": type(e).__name__}


# ---------------------------------------------------------------- corpus generation
WORDS = ["hello", "world", "Paris", "weather", "naïve", "café", "中文", "日本語", "emoji 🙂",
         "Ünïcödé", "שלום", "quote \"x\"", "back\\slash", "tab\there", "a<b>c", "{{ not jinja }}",
         "{% raw %}", "<think>", "</think>", "<tool_call>", "line\nbreak", "ctl\x01char", "del\x7f",
         "zero\u200bwidth", "nbsp\u00a0in", "42", "3.14", "null", "True", "x" * 40]
PAD = ["", "", "", " ", "\n", "  \n\t", "\u3000", "\u00a0", "\u2028", "\x1c", "\u200b", "\r\n"]


def words(rng, lo=1, hi=8):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def padded(rng, text):
    return rng.choice(PAD) + text + rng.choice(PAD)


def text_parts(rng, allow_media):
    parts = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if allow_media and r < 0.15:
            parts.append(rng.choice([
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image", "image": "file:///tmp/a.png"},
                {"type": "image"},
                {"image_url": "http://x/y.jpg"},
            ]))
        elif allow_media and r < 0.22:
            parts.append(rng.choice([{"type": "video", "video": ["f1.jpg", "f2.jpg"]},
                                     {"video": "clip.mp4"}, {"type": "video"}]))
        else:
            part = {"type": "text", "text": padded(rng, words(rng))}
            if rng.random() < 0.2:
                part = {"text": part["text"], "type": "text"}  # other key order
            parts.append(part)
    return parts


def content(rng, allow_media=True, allow_none=False):
    r = rng.random()
    if allow_none and r < 0.1:
        return None
    if r < 0.3:
        return text_parts(rng, allow_media)
    return padded(rng, words(rng))


def py_value(rng, depth=0):
    choices = ["str", "int", "float", "bool", "null"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(choices)
    if kind == "str":
        return rng.choice([words(rng, 1, 3), "", "multi\nline\nvalue", " spaced ", "ünï 中文"])
    if kind == "int":
        return rng.choice([0, 1, -7, 42, 2**31, -2**40, 9007199254740993, 18446744073709551615])
    if kind == "float":
        return rng.choice([0.1, -2.5, 1e16, 1e15, 1234567890123456.0, 1e-5, 1e-4, 1e300, 2.5e-8,
                           3.0, -0.0, 0.0, 1 / 3, 123456.789, 6.02214076e23])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [py_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["k", "zeta", "alpha", "ключ", "m n"]) + str(i): py_value(rng, depth + 1)
            for i in range(rng.randint(0, 3))}


def tool_def(rng, i):
    props = {}
    for j in range(rng.randint(0, 3)):
        props[f"p{j}_" + rng.choice(["city", "x", "zulu", "ämne"])] = rng.choice([
            {"type": "string", "description": words(rng, 1, 4)},
            {"type": "integer", "minimum": 0, "maximum": 10},
            {"type": "number", "default": 0.5},
            {"type": "array", "items": {"type": "number"}},
            {"type": "object", "properties": {}, "additionalProperties": False},
            {"enum": ["a", "b", None], "nullable": True},
        ])
    fn = {"name": f"tool_{i}_" + rng.choice(["get", "set", "zap", "calc"]),
          "description": padded(rng, words(rng, 0, 5)),
          "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}
    if rng.random() < 0.3:
        fn = {"parameters": fn["parameters"], "name": fn["name"]}  # unusual key order
    return {"type": "function", "function": fn}


def tool_call(rng, tools, i):
    name = rng.choice(tools)["function"]["name"] if tools else f"fn_{i}"
    args = {f"a{k}_" + rng.choice(["q", "n", "z", "b"]): py_value(rng) for k in range(rng.randint(0, 4))}
    r = rng.random()
    if r < 0.3:
        sep = rng.choice([(",", ":"), (", ", ": ")])
        args = json.dumps(args, ensure_ascii=rng.random() < 0.5, separators=sep)
    fn = {"name": name, "arguments": args}
    if r > 0.9:
        return fn  # flat form: the template uses the call itself when "function" is absent
    if r > 0.85:
        del fn["arguments"]
    return {"id": f"call_{i}", "type": "function", "function": fn}


def assistant(rng, tools, with_calls):
    msg = {"role": "assistant"}
    r = rng.random()
    if r < 0.15:
        body = f"<think>\n{words(rng)}\n</think>\n\n{words(rng)}"
    elif r < 0.22:
        body = f"{words(rng)}</think>{padded(rng, words(rng))}"
    elif r < 0.27:
        body = f"\n\n<think>{words(rng)}</think>"
    elif r < 0.30:
        body = f"<think>a</think>b</think>\n\nc<think>d"
    elif r < 0.35:
        body = text_parts(rng, False)
    elif with_calls and r < 0.55:
        body = rng.choice([None, "", " \n"])
    else:
        body = padded(rng, words(rng))
    if body is not None or rng.random() < 0.5:
        msg["content"] = body
    r = rng.random()
    if r < 0.3:
        msg["reasoning_content"] = padded(rng, words(rng))
    elif r < 0.38:
        msg["reasoning_content"] = rng.choice([None, "", 7])
    if with_calls:
        msg["tool_calls"] = [tool_call(rng, tools, i) for i in range(rng.randint(1, 3))]
    return msg


def tool_responses(rng, n):
    if rng.random() < 0.2:  # results sent back as a user turn wrapped in <tool_response> tags
        return [{"role": "user", "content": padded(rng, f"<tool_response>\n{words(rng)}\n</tool_response>")}]
    out = []
    for i in range(n):
        c = rng.choice([words(rng), json.dumps({"result": py_value(rng)}, ensure_ascii=False),
                        text_parts(rng, False), ""])
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": c})
    return out


def conversation(rng, name):
    tools = [tool_def(rng, i) for i in range(rng.randint(1, 3))] if rng.random() < 0.45 else None
    if tools is None and rng.random() < 0.1:
        tools = []
    msgs = []
    if rng.random() < 0.55:
        msgs.append({"role": "system", "content": content(rng, allow_media=False, allow_none=True)})
    for turn in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": content(rng)})
        for step in range(rng.randint(0, 3) if turn < 3 else 0):
            calls = rng.random() < 0.6
            msgs.append(assistant(rng, tools, calls))
            if not calls:
                break
            msgs += tool_responses(rng, len(msgs[-1]["tool_calls"]))
    case = {"name": name, "messages": msgs, "add_generation_prompt": rng.random() < 0.8}
    if rng.random() < 0.15 and msgs[-1]["role"] == "user":  # a final assistant turn (prefill style)
        msgs.append(assistant(rng, tools, False))
    if tools is not None:
        case["tools"] = tools
    for key, p in (("enable_thinking", 0.6), ("preserve_thinking", 0.3), ("add_vision_id", 0.15)):
        if rng.random() < p:
            case[key] = rng.random() < 0.5
    return case


def edge_cases():
    u = {"role": "user", "content": "hi"}
    a = {"role": "assistant", "content": "ok"}
    img = {"type": "image_url", "image_url": {"url": "x"}}
    vid = {"type": "video", "video": "v.mp4"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    call = {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    E = [  # (name, messages, extra)
        ("tool_first", [{"role": "tool", "content": "r"}, u], {}),
        ("tool_after_user", [u, {"role": "tool", "content": "r"}], {}),
        ("assistant_first", [a, u], {}),
        ("empty_tools_list", [u], {"tools": []}),
        ("system_empty_with_tools", [{"role": "system", "content": " \n"}, u], {"tools": tools}),
        ("system_blank_no_tools", [{"role": "system", "content": "\u3000"}, u], {}),
        ("system_none", [{"role": "system", "content": None}, u], {}),
        ("system_no_content_key", [{"role": "system"}, u], {}),
        ("user_no_content_key", [{"role": "user"}], {}),
        ("text_and_image_keys", [{"role": "user", "content": [{"type": "text", "text": "t", "image": "i"}]}], {}),
        ("typed_image_url_with_text", [{"role": "user", "content": [{"type": "image_url", "text": "t"}]}], {}),
        ("reasoning_number", [u, {"role": "assistant", "content": "r</think>x", "reasoning_content": 5}, u], {}),
        ("reasoning_and_think_content", [u, {"role": "assistant", "content": "<think>a</think>b",
                                             "reasoning_content": "R"}], {}),
        ("only_tool_response_users_then_query", [u, {"role": "user", "content": "<tool_response>x</tool_response>"}], {}),
        ("tool_response_prefix_only", [{"role": "user", "content": "<tool_response>x"}], {}),
        ("vision_ids", [{"role": "user", "content": [img, vid, img, {"type": "text", "text": "q"}]},
                        {"role": "assistant", "content": [img]}, {"role": "user", "content": [vid, img]}],
         {"add_vision_id": True}),
        ("calls_after_think_only", [u, {"role": "assistant", "content": "<think>plan</think>",
                                        "tool_calls": [call, call]}], {"tools": tools}),
        ("calls_no_content_key", [u, {"role": "assistant", "tool_calls": [call]},
                                  {"role": "tool", "content": "1"}], {"tools": tools}),
        ("preserve_history", [u, {"role": "assistant", "content": "a", "reasoning_content": "r1"}, u,
                              {"role": "assistant", "content": "b"}, u], {"preserve_thinking": True}),
        ("preserve_false", [u, {"role": "assistant", "content": "a", "reasoning_content": "r1"}, u],
         {"preserve_thinking": False}),
        ("no_gen_prompt", [u, a], {"add_generation_prompt": False}),
        ("empty_tool_calls", [u, {"role": "assistant", "content": "x", "tool_calls": []}], {}),
        ("null_tool_calls", [u, {"role": "assistant", "content": "x", "tool_calls": None}], {}),
        ("args_nested_unicode", [u, {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "g", "arguments": {"o": {"z": [1, "é\n\"", None, True, 1.5e16]},
                                                      "s": "raw \"string\"\n", "b": False, "n": None,
                                                      "f": 2.0}}}]}], {}),
        ("args_json_string_spacing", [u, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "g", "arguments": "{\"b\":1.50,\"a\":[1,2,{\"x\":\"\\u00e9\"}],\"c\":1e2}"}}]}], {}),
        # errors
        ("err_no_messages", [], {}),
        ("err_only_system", [{"role": "system", "content": "s"}], {}),
        ("err_only_assistant", [a], {}),
        ("err_only_tool_responses", [{"role": "user", "content": " <tool_response>x</tool_response>\n"}], {}),
        ("err_system_second", [u, {"role": "system", "content": "s"}], {}),
        ("err_system_second_tools", [u, {"role": "system", "content": "s"}], {"tools": tools}),
        ("err_system_image", [{"role": "system", "content": [img]}, u], {}),
        ("err_system_image_tools", [{"role": "system", "content": [{"type": "text", "text": "a"}, img]}, u],
         {"tools": tools}),
        ("err_system_video", [{"role": "system", "content": [vid]}, u], {}),
        ("err_unknown_role", [u, {"role": "developer", "content": "d"}], {}),
        ("err_missing_role", [u, {"content": "d"}], {}),
        ("err_content_number", [{"role": "user", "content": 42}], {}),
        ("err_content_object", [u, {"role": "assistant", "content": {"text": "x"}}], {}),
        ("err_content_bool", [{"role": "user", "content": True}], {}),
        ("err_part_audio", [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], {}),
        ("err_part_audio_system", [{"role": "system", "content": [{"type": "audio"}]}, u], {}),
        ("err_call_no_name", [u, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}], {}),
        ("err_call_name_number", [u, {"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}], {}),
        ("err_call_args_list", [u, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}], {}),
        ("err_call_args_null", [u, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": None}}]}], {}),
        ("err_call_args_bad_json", [u, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}], {}),
        ("err_call_args_json_list", [u, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}], {}),
        ("err_call_function_null", [u, {"role": "assistant", "tool_calls": [{"function": None}]}], {}),
        ("err_call_is_string", [u, {"role": "assistant", "tool_calls": ["f"]}], {}),
        ("err_tool_content_number", [u, a, {"role": "tool", "content": 1.5}], {}),
    ]
    out = []
    for name, msgs, extra in E:
        case = {"name": name, "messages": msgs, "add_generation_prompt": True}
        case.update(extra)
        out.append(case)
    return out


def injected_errors(rng, base):
    """Valid conversations with one defect injected at a random place."""
    case = json.loads(json.dumps(base))
    msgs = case["messages"]
    kind = rng.choice(["system_late", "bad_content", "bad_role", "system_image"])
    i = rng.randrange(len(msgs))
    if kind == "system_late":
        msgs.insert(max(1, i), {"role": "system", "content": "late"})
    elif kind == "bad_content":
        msgs[i]["content"] = rng.choice([1, 2.5, False, {"a": 1}])
    elif kind == "bad_role":
        msgs[i]["role"] = rng.choice(["function", "ipython", "USER", ""])
    else:
        msgs.insert(0, {"role": "system", "content": [{"type": "image", "image": "x"}]})
    case["name"] += "_err_" + kind
    return case


def corpus():
    rng = random.Random(20240531)
    cases = edge_cases()
    generated = [conversation(rng, f"gen{i:03d}") for i in range(360)]
    cases += generated
    cases += [injected_errors(rng, rng.choice(generated)) for _ in range(40)]
    return cases


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: chat_corpus.py MODEL.gguf|TEMPLATE.jinja\n")
        return 2
    path = sys.argv[1]
    if path.endswith(".gguf"):
        source = read_gguf_chat_template(path)
    else:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    if source.count(QWEN35_CONDITION) != 1:
        sys.stderr.write(f"{path}: not the Qwen3.5 template (last-query condition not found once)\n")
        return 2
    env = make_environment()
    templates = {"qwen35": env.from_string(source),
                 "qwen36": env.from_string(source.replace(QWEN35_CONDITION, QWEN36_CONDITION))}
    out = sys.stdout
    for case in corpus():
        record = {"case": case}
        record.update(render(templates, case))
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
