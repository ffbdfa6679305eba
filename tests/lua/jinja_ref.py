#!/usr/bin/env python3
"""jinja_ref.py: the reference renderer of tests/lua/jinja_spec.lua.

    jinja_ref.py CASES.json [TOOLS.py]  ->  JSON list, one answer per case

A case {"template": "...", "vars": {...}} renders with jinja2 set up as Hugging Face transformers
sets it up for chat templates (trim_blocks, lstrip_blocks, loop controls, tojson as json.dumps
without ensure_ascii, raise_exception, strftime_now): the constructs one by one.
  -> {"text": ...} or {"error": ...}

A case {"chat": {"tokenizer": NAME, "template": "...", "messages": [...], "tools": [...] | null,
"add_generation_prompt": bool, "kwargs": {...}}} goes through transformers' own
tokenizer.apply_chat_template, with the tokenizer NAME (qwen2, llama3) that tests/lua/tokenizer_ref.py
makes from llama.cpp's vocabularies: the text (tokenize=False) and the token ids (tokenize=True).
Each tool is a JSON schema, or {"py": FUNCTION}: a function of TOOLS.py, which transformers turns
into its schema with get_json_schema.  -> {"text": ..., "ids": [...]} or {"error": ...}
Used by the tests only."""
import importlib.util
import json
import os
import sys
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))

jinja_env = None


def constructs_env():
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


compiled = {}
tokenizers = {}
tool_module = None


def render(case):
    global jinja_env
    jinja_env = jinja_env or constructs_env()
    if case["template"] not in compiled:
        compiled[case["template"]] = jinja_env.from_string(case["template"])
    return {"text": compiled[case["template"]].render(**case["vars"])}


def tokenizer(name):
    if name not in tokenizers:
        from transformers import AutoTokenizer
        spec = importlib.util.spec_from_file_location("tokenizer_ref", os.path.join(HERE, "tokenizer_ref.py"))
        ref = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ref)
        tokenizers[name] = AutoTokenizer.from_pretrained(ref.prepare(name))
    return tokenizers[name]


def chat(c):
    tok = tokenizer(c["tokenizer"])
    tools = c.get("tools")
    if tools is not None:
        tools = [getattr(tool_module, t["py"]) if "py" in t else t for t in tools]
    args = dict(chat_template=c["template"], tools=tools, add_generation_prompt=c["add_generation_prompt"], **c.get("kwargs", {}))
    text = tok.apply_chat_template(c["messages"], tokenize=False, **args)
    ids = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=False, **args)
    return {"text": text, "ids": list(ids)}


def main(argv):
    global tool_module
    with open(argv[0], encoding="utf-8") as f:
        cases = json.load(f)
    if len(argv) > 1:
        spec = importlib.util.spec_from_file_location("chat_tools", argv[1])
        tool_module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool_module)
    out = []
    for case in cases:
        try:
            out.append(chat(case["chat"]) if "chat" in case else render(case))
        except Exception as e:  # the spec compares that both sides fail
            out.append({"error": "%s: %s" % (type(e).__name__, e)})
    sys.stdout.write(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main(sys.argv[1:])
