#!/usr/bin/env python3
"""jinja_ref.py: the reference renderer for tests/lua/jinja_spec.lua: Python's jinja2 set up as
Hugging Face transformers sets it up for chat templates (trim_blocks, lstrip_blocks, loop
controls, tojson as json.dumps without ensure_ascii, raise_exception, strftime_now).

    python3 jinja_ref.py CASES.json  ->  JSON list, one {"text": ...} or {"error": ...} per case
CASES.json: [{"template": "...", "vars": {...}}, ...]. Used by the tests only."""
import json
import sys
from datetime import datetime

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

compiled = {}
out = []
with open(sys.argv[1], encoding="utf-8") as f:
    cases = json.load(f)
for case in cases:
    try:
        if case["template"] not in compiled:
            compiled[case["template"]] = env.from_string(case["template"])
        out.append({"text": compiled[case["template"]].render(**case["vars"])})
    except Exception as e:  # the spec compares that both sides fail
        out.append({"error": "%s: %s" % (type(e).__name__, e)})
sys.stdout.write(json.dumps(out, ensure_ascii=False))
