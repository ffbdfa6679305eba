# remax's Python worker: the one harness that serves the rewards, tools and environments of a
# Python file over the channels' wire format (lua/remax/step/channels/wire.lua): one JSON
# object per line on stdin, each with an "id", and one answer per request on stdout that
# echoes it. remax starts it as `python3 -u -c <this file> FILE.py`.
#
# It imports the file and answers {"ready": true} (or {"error": "loading ..."}). Reward requests
# then run one after another in this thread, in the order they came (a reward function keeps
# its state between batches, as TRL calls it); tool and environment requests each run in a
# thread of their own, so they answer in any order and a slow one holds up no other.
# print() goes to stderr, so it cannot corrupt the answers; Ctrl-C is remax's to handle (the
# worker is in its own process group, and remax stops it).
import sys, json, os, re, enum, math, signal, traceback, importlib.util, inspect, threading, typing
signal.signal(signal.SIGINT, signal.SIG_IGN)
proto = sys.stdout
sys.stdout = sys.stderr
lock = threading.Lock()
def answer(obj):
    # json.dumps escapes non-ASCII (ensure_ascii), so a lone surrogate in Python text goes out as
    # \udXXX, which remax reads as U+FFFD; an answer that JSON cannot hold fails only its request
    try:
        line = json.dumps(obj, default=str)
    except Exception as e:
        line = json.dumps({"id": obj.get("id"), "error": "the answer cannot be written as JSON: %s: %s" % (type(e).__name__, e)})
    with lock:
        proto.write(line + "\n")
        proto.flush()
path = sys.argv[1]
try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("remax_py_" + os.path.basename(path)[:-3].replace("-", "_"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
except BaseException:
    answer({"error": "loading " + path + ": " + traceback.format_exc(limit=-3)})
    sys.exit(0)
answer({"ready": True})
def get(name, what="function or class"):
    obj = getattr(mod, name, None)
    if not callable(obj):
        have = sorted(k for k, v in vars(mod).items()
                      if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == mod.__name__)
        raise LookupError("%s has no %s '%s' (%s: %s)" % (path, what, name, "functions" if what == "function" else "have",
                                                          ", ".join(have) or "none"))
    return obj
# A function's schema as transformers' get_json_schema writes it (what TRL hands the chat template
# for a Python tool), keys in its order: the type hints give each parameter's JSON-schema type,
# the Google-style docstring the descriptions ("Args:", "Returns:", an argument's trailing
# "(choices: [...])"). Where get_json_schema refuses a function (a hint it cannot convert, an
# argument without a description), this leaves the part out instead.
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null",
              list: "array", tuple: "array", dict: "object"}
def enum_schema(values):
    kinds = []
    for v in values:
        k = JSON_TYPES.get(type(v), "string")
        if k not in kinds:
            kinds.append(k)
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(values)}
class Unconvertible(Exception):
    pass
def type_schema(t):
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is None and isinstance(t, type) and issubclass(t, enum.Enum):
        return enum_schema([m.value for m in t])
    if origin is None:
        if t is typing.Any:
            return {}
        if t not in JSON_TYPES:
            raise Unconvertible(t)
        return {"type": JSON_TYPES[t]}
    if origin is typing.Union or type(t).__name__ == "UnionType":   # Optional[int], int | None
        parts = [type_schema(a) for a in args if a is not type(None)]
        if len(parts) == 1:
            s = parts[0]
        elif all(list(p) == ["type"] and isinstance(p["type"], str) for p in parts):
            kinds = sorted(set(p["type"] for p in parts))
            s = {"type": kinds[0] if len(kinds) == 1 else kinds}
        else:
            s = {"anyOf": parts}
        if type(None) in args:
            s["nullable"] = True
        return s
    if origin is typing.Literal and args:
        return enum_schema(list(args))
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if len(args) > 1 and Ellipsis not in args:
            return {"type": "array", "prefixItems": [type_schema(a) for a in args]}
        return {"type": "array"}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1])} if len(args) == 2 else {"type": "object"}
    raise Unconvertible(t)
def doc_parts(doc):
    """(description, {argument: description}, returns) of a Google-style docstring."""
    head, arg_lines, ret_lines, section = [], [], [], None
    for line in doc.split("\n"):
        word = line.strip()
        if word in ("Args:", "Returns:", "Raises:"):
            section = word
        elif section is None:
            head.append(line)
        elif section == "Args:":
            arg_lines.append(line)
        elif section == "Returns:":
            ret_lines.append(line)
    args, name, base = {}, None, None
    for line in arg_lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        m = re.match(r"\s*(\w+)(?:\s*\([^()]*\))?:\s*(.*)$", line)
        if m and (base is None or indent <= base):
            base, name = indent, m.group(1)
            args[name] = m.group(2).strip()
        elif name is not None:
            args[name] = (args[name] + " " + line.strip()).strip()
    returns = "\n".join(ret_lines).strip() or None
    return "\n".join(head).strip(), args, returns
def describe(fn):
    description, args_doc, returns = doc_parts((inspect.getdoc(fn) or "").strip())
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
            continue
        if p.default is p.empty:
            required.append(p.name)
        try:
            s = type_schema(hints[p.name]) if p.name in hints else {}
        except Unconvertible:
            s = {}
        desc = args_doc.get(p.name)
        if desc is not None:
            choices = re.search(r"\(choices:\s*(.*?)\)\s*$", desc, flags=re.IGNORECASE)
            if choices:
                try:
                    s["enum"] = [c.strip() if isinstance(c, str) else c for c in json.loads(choices.group(1))]
                    desc = desc[:choices.start()].strip()
                except ValueError:
                    pass
            s["description"] = desc
        props[p.name] = s
    params = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    schema = {"name": fn.__name__, "description": description, "parameters": params}
    try:
        ret = type_schema(hints["return"]) if "return" in hints else None
    except Unconvertible:
        ret = None
    if ret is not None:
        if returns is not None:
            ret["description"] = returns
        schema["return"] = ret
    # the schema once more as JSON text: the Lua side keeps its key order for the template
    return {"description": description, "parameters": params, "schema": json.dumps(schema, ensure_ascii=False)}
def text_of(v):
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return json.dumps(v, default=str)
def keywords(fn, d):
    """The entries of d that fn takes (all of them when it has **kwargs)."""
    ps = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in ps):
        return dict(d)
    names = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in d.items() if k in names}
def reset_keywords(fn, req):
    """A reset's keywords: the row's columns it takes, and the prompt's seed (every episode of a
    prompt gets the same) when it names a `seed` parameter and the row has no `seed` column."""
    kw = keywords(fn, req.get("sample") or {})
    if "seed" not in kw and req.get("seed") is not None and "seed" in inspect.signature(fn).parameters:
        kw["seed"] = req["seed"]
    return kw
class TrainerState:
    """The run's state under transformers' TrainerState names (what TRL passes as trainer_state)."""
    def __init__(self, d):
        self.__dict__.update(d or {})
    def __repr__(self):
        return "TrainerState(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self.__dict__.items()))
def score(req):
    """A reward request: the function called as TRL calls a reward function, its scores checked."""
    fn = get(req.get("name") or "reward", "function")
    kw = dict(req.get("batch") or {})
    if "prompt" in kw:
        kw["prompts"] = kw.pop("prompt")
    kw["trainer_state"] = TrainerState(req.get("trainer_state"))
    scores = fn(completions=req["completions"], **kw)
    out = []
    for i, s in enumerate(list(scores)):
        if s is None:
            out.append(None)
        elif isinstance(s, (int, float)) and not isinstance(s, bool):
            out.append(float(s) if math.isfinite(s) else str(s))
        else:
            raise TypeError("score %d is %r (a %s); expected a number or None" % (i + 1, s, type(s).__name__))
    return out
envs = {}
def handle(req):
    rid = req.get("id")
    try:
        t = req.get("type")
        if t == "reward":
            answer({"id": rid, "scores": score(req)})
        elif t == "describe":
            answer({"id": rid, "tools": {n: describe(get(n)) for n in req.get("names") or []}})
        elif t == "tool":
            fn = get(req["name"])
            answer({"id": rid, "result": text_of(fn(**(req.get("arguments") or {})))})
        elif t == "reset":
            env = get(req["name"])()
            ep = req["episode"]
            envs[ep] = env
            r = None
            if hasattr(env, "reset"):
                r = env.reset(**reset_keywords(env.reset, req))
            answer({"id": rid, "messages": r})
        elif t == "step":
            env = envs.get(req["episode"])
            if env is None:
                raise KeyError("no episode %r (reset was not called, or the worker was restarted)" % req["episode"])
            r = env.step(req["text"])
            done, reward = False, None
            if isinstance(r, tuple):
                r, done, reward = (tuple(r) + (False, None))[:3]
            answer({"id": rid, "messages": r, "done": bool(done), "reward": reward})
        elif t == "close":
            env = envs.pop(req.get("episode"), None)
            if env is not None and hasattr(env, "close"):
                env.close()
            answer({"id": rid})
        else:
            raise ValueError("unknown request type %r" % (t,))
    except BaseException as e:
        answer({"id": rid, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc(limit=-4)})
for line in sys.stdin:
    try:
        req = json.loads(line)
        if not isinstance(req, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        answer({"id": None, "error": "a request that is not a JSON object: %r" % line[:200]})
        continue
    if req.get("type") == "reward":
        handle(req)
    else:
        threading.Thread(target=handle, args=(req,), daemon=True).start()
