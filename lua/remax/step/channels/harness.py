# remax's Python worker: the one harness that serves the rewards, tools and environments of a
# Python file over the channels' wire format (lua/remax/step/channels/wire.lua): one JSON
# object per line on stdin, each with an "id", and one answer per request on stdout that
# echoes it. remax starts it as `python3 -u -c <this file> FILE.py`.
#
# It imports the file and answers {"ready": true} (or {"error": "loading ..."}). Reward requests
# then run one after another in this thread, in the order they came (a reward function keeps
# its state between batches, as TRL calls it); tool and environment requests each run in a
# thread of their own, so they answer in any order and a slow one holds up no other.
# Requests (docs/environments.md, "The wire format"): reward, describe (tools' schemas),
# environment (which kind a class is, and its tools), tool, reset, step, get_reward, close.
# A reward in the same file as the environment is served by the environment's worker, so that
# it can be handed the episodes' instances (TRL's `environments=`).
# print() goes to stderr, so it cannot corrupt the answers; Ctrl-C is remax's to handle (the
# worker is in its own process group, and remax stops it).
import sys, json, os, re, enum, math, signal, traceback, importlib.util, inspect, threading, typing, types, asyncio
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
# async def tools, rewards and environment methods: what they return is awaited on one event loop
# that runs in a thread of its own, as TRL runs them (so what an async reset makes, a session or a
# connection, serves the later calls of its episode, which run on the same loop).
loop, loop_lock = None, threading.Lock()
async def wait_for(awaitable):
    return await awaitable
def awaited(v):
    if not inspect.isawaitable(v):
        return v
    global loop
    with loop_lock:
        if loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="remax-async", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(wait_for(v), loop).result()

# A function's schema by transformers' get_json_schema rules (what TRL hands the chat template for
# a Python tool), keys in its order, and refused where it refuses one: no docstring, a parameter
# without a type hint or without a description in the docstring's "Args:", a hint it cannot
# convert (a return hint it cannot convert is only left out). *args and **kwargs are refused too:
# a call's arguments come as a JSON object, which cannot fill them. Checked against transformers
# itself by tests/lua/trl_shapes_spec.lua.
class SchemaError(Exception):
    pass
JSON_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
BARE_TYPES = {int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"}, bool: {"type": "boolean"},
              type(None): {"type": "null"}, list: {"type": "array"}, tuple: {"type": "array"}, dict: {"type": "object"}}
UNION_TYPES = tuple(t for t in (typing.Union, getattr(types, "UnionType", None)) if t is not None)
def enum_schema(values, what):
    if any(type(v) not in JSON_SCALARS for v in values):
        raise SchemaError("%s: values that are not JSON scalars (int, float, str, bool or None): %r" % (what, values))
    kinds = list(dict.fromkeys(JSON_SCALARS[type(v)] for v in values))   # in the order they first appear
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(values)}
def type_schema(t):
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is None and isinstance(t, type) and issubclass(t, enum.Enum):
        values = [m.value for m in t]
        if not values:
            raise SchemaError("the Enum %s has no members" % t.__name__)
        return enum_schema(values, "the Enum " + t.__name__)
    if origin is None:
        if t is typing.Any:
            return {}
        if t not in BARE_TYPES:
            raise SchemaError("cannot convert the type hint %r to a JSON schema (int, float, str, bool, Enum classes, "
                              "Literal, and list, tuple, dict and unions of those can be)" % (t,))
        return dict(BARE_TYPES[t])
    if origin in UNION_TYPES:   # Optional[int], int | None: "nullable"
        parts = [type_schema(a) for a in args if a is not type(None)]
        if len(parts) == 1:
            s = parts[0]
        elif all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            kinds = sorted(set(p["type"] for p in parts))
            s = {"type": kinds[0] if len(kinds) == 1 else kinds}
        else:
            s = {"anyOf": parts}
        if type(None) in args:
            s["nullable"] = True
        return s
    if origin is typing.Literal and args:
        return enum_schema(list(args), "a Literal")
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1:
            raise SchemaError("the type hint %s is a tuple of one element (use list[...], or the element itself)" % (t,))
        if Ellipsis in args:
            raise SchemaError("the type hint %s has '...' (use list[...] for a variable length)" % (t,))
        return {"type": "array", "prefixItems": [type_schema(a) for a in args]}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1])} if len(args) == 2 else {"type": "object"}
    raise SchemaError("cannot convert the type hint %r to a JSON schema" % (t,))
# A Google-style docstring: the description before "Args:"/"Returns:"/"Raises:"; under "Args:",
# `name: text` or `name (type): text` (text going on over lines indented deeper); "Returns:".
DOC_DESCRIPTION = re.compile(r"^(.*?)[\n\s]*(Args:|Returns:|Raises:|\Z)", re.DOTALL)
DOC_ARGS = re.compile(r"\n\s*Args:\n(.*?)[\n\s]*(Returns:|Raises:|\Z)", re.DOTALL)
DOC_ARG = re.compile(r"(?:^|\n)([ \t]*)(\w+)(?:[ \t]*\([^()\n]*\))?:\s*(.*?)\s*"
                     r"(?=\n(?!\1[ \t])[ \t]*\w+(?:[ \t]*\([^()\n]*\))?:|\Z)", re.DOTALL)
DOC_RETURNS = re.compile(r"\n\s*Returns:\n\s*(.*?)[\n\s]*(Raises:|\Z)", re.DOTALL)
def doc_parts(doc):
    """(description, {argument: description}, returns or None) of a docstring."""
    m = DOC_DESCRIPTION.search(doc)
    description = m.group(1).strip() if m else None
    args = {}
    m = DOC_ARGS.search(doc)
    if m:
        block = "\n".join(line for line in m.group(1).split("\n") if line.strip())
        for _, name, text in DOC_ARG.findall(block):
            args[name] = re.sub(r"\s*\n+\s*", " ", text.strip())
    m = DOC_RETURNS.search(doc)
    return description, args, (m.group(1).strip() if m else None)
def schema_of(fn):
    name = getattr(fn, "__name__", "operation")
    def refuse(why):
        raise SchemaError("cannot make the JSON schema of %s: %s" % (name, why))
    doc = inspect.getdoc(fn)
    if not doc:
        refuse("it has no docstring")
    description, arg_docs, returns = doc_parts(doc.strip())
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        refuse("its type hints cannot be read: %s: %s" % (type(e).__name__, e))
    params = inspect.signature(fn).parameters
    first = next(iter(params), None)   # an unannotated self or cls is the receiver, not an argument
    receiver = first if first in ("self", "cls") and params[first].annotation is inspect.Parameter.empty else None
    required = []
    for p in params.values():
        if p.name == receiver:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            refuse("%s%s: a tool is called with the arguments the model writes as a JSON object, which cannot fill it"
                   % ("*" if p.kind == p.VAR_POSITIONAL else "**", p.name))
        if p.annotation is inspect.Parameter.empty:
            refuse("the argument %s has no type hint" % p.name)
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    props, ret = {}, None
    try:
        for pname, hint in hints.items():
            if pname == receiver:
                continue
            if pname == "return":
                try:
                    ret = type_schema(hint)
                except SchemaError:   # the model never writes the return value
                    ret = None
            elif pname in params:
                props[pname] = type_schema(hint)
    except SchemaError as e:
        refuse(str(e))
    for pname, s in props.items():
        if pname not in arg_docs:
            refuse("the docstring has no description of the argument '%s' (under Args:)" % pname)
        text = arg_docs[pname]
        choices = re.search(r"\(choices:\s*(.*?)\)\s*$", text, flags=re.IGNORECASE)
        if choices:
            try:
                values = json.loads(choices.group(1))
            except ValueError as e:
                refuse("the (choices: ...) of the argument '%s' is not a JSON list: %s" % (pname, e))
            s["enum"] = [c.strip() if isinstance(c, str) else c for c in values]
            text = text[:choices.start()].strip()
        s["description"] = text
    parameters = {"type": "object", "properties": props}
    if required:
        parameters["required"] = required
    schema = {"name": name, "description": description, "parameters": parameters}
    if ret is not None:
        if returns is not None:
            ret["description"] = returns
        schema["return"] = ret
    return schema
def describe(fn):
    """A tool's schema for the Lua side, or why it has none."""
    try:
        schema = schema_of(fn)
    except SchemaError as e:
        return {"error": str(e)}
    # the schema once more as JSON text: the Lua side keeps its key order for the template
    return {"description": schema["description"], "parameters": schema["parameters"],
            "schema": json.dumps(schema, ensure_ascii=False)}
def text_of(v):
    """A tool's result as the model sees it: str() of what is not a string, as TRL does."""
    return v if isinstance(v, str) else str(v)
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

# Environments. remax's kind answers each assistant turn: step(text) -> observation[, done[,
# reward]]. TRL's kind (environment_factory) has reset(**row) -> a string for the end of the last
# user message, or None; its other public methods are the model's tools, and get_reward(), when
# it has one, scores the episode. Told apart by their methods, on one instance made at the start
# (as TRL makes one to read its tools).
def public_methods(obj):
    return dict(inspect.getmembers(obj, predicate=inspect.ismethod))
def describe_environment(name):
    factory = get(name)
    env = awaited(factory())
    methods = {k: m for k, m in public_methods(env).items() if not k.startswith("_")}
    if callable(getattr(env, "step", None)):
        return {"kind": "remax", "class": type(env).__name__}
    if callable(getattr(env, "reset", None)):
        tools = {k: describe(m) for k, m in methods.items() if k not in ("reset", "get_reward")}
        return {"kind": "trl", "class": type(env).__name__, "tools": tools or {},
                "reward": callable(getattr(env, "get_reward", None))}
    raise TypeError("%s: %s is neither remax's environment (a step(text) method that answers each turn) nor TRL's "
                    "environment_factory kind (a reset(**row) method; its other public methods are the tools); its "
                    "methods: %s" % (path, name, ", ".join(sorted(methods)) or "none"))
envs = {}
def episode(req):
    env = envs.get(req.get("episode"))
    if env is None:
        raise KeyError("no episode %r (reset was not called, it was closed, or the worker was restarted)" % req.get("episode"))
    return env

class TrainerState:
    """The run's state under transformers' TrainerState names (what TRL passes as trainer_state)."""
    def __init__(self, d):
        self.__dict__.update(d or {})
    def __repr__(self):
        return "TrainerState(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self.__dict__.items()))
class ProbeSkipped(Exception):
    pass
class NoEnvironments:
    """`environments` where the instances cannot be had: any use says why (in the first-rows check
    before training, where no episode has run yet, it skips the reward's check instead)."""
    def __init__(self, why, probe):
        self.why, self.probe = why, probe
    def fail(self, *args, **kwargs):
        raise (ProbeSkipped if self.probe else LookupError)(self.why)
    __iter__ = __len__ = __getitem__ = __contains__ = __bool__ = fail
    def __getattr__(self, name):
        self.fail()
    def __repr__(self):
        return "<no environments: %s>" % self.why
noted = set()
def dropped(what):
    def note(*args, **kwargs):
        if what not in noted:
            noted.add(what)
            print("remax: a reward function called %s; remax does not log what it gives yet, so it is dropped" % what)
    return note
def score(req):
    """A reward request: the function called as TRL calls a reward function, its scores checked.
    prompts and completions are messages for conversational data and for episodes (as TRL's are),
    strings otherwise; remax's own columns come too (completion_messages always)."""
    fn = get(req.get("name") or "reward", "function")
    texts = list(req.get("completions") or [])
    kw = dict(req.get("batch") or {})
    dataset_prompts = kw.pop("prompt", None)
    prompts = kw.get("prompt_messages") or dataset_prompts or [None] * len(texts)
    if "completion_messages" not in kw:
        kw["completion_messages"] = [[{"role": "assistant", "content": t}] for t in texts]
    conversational = len(prompts) > 0 and isinstance(prompts[0], list)
    kw["prompts"] = prompts
    kw["completions"] = kw["completion_messages"] if conversational else texts
    kw["trainer_state"] = TrainerState(req.get("trainer_state"))
    kw["log_extra"], kw["log_metric"] = dropped("log_extra"), dropped("log_metric")
    if req.get("environments") is not None:
        kw["environments"] = [None if e is None else episode({"episode": e}) for e in req["environments"]]
    elif req.get("environments_missing") is not None or req.get("probe"):
        kw["environments"] = NoEnvironments(req.get("environments_missing") or "no episode has run yet", bool(req.get("probe")))
    try:
        scores = awaited(fn(**kw))
    except ProbeSkipped:
        return [None] * len(texts)
    out = []
    for i, s in enumerate(list(scores)):
        if s is None:
            out.append(None)
        elif isinstance(s, (int, float)) and not isinstance(s, bool):
            out.append(float(s) if math.isfinite(s) else str(s))
        else:
            raise TypeError("score %d is %r (a %s); expected a number or None" % (i + 1, s, type(s).__name__))
    return out
def handle(req):
    rid = req.get("id")
    try:
        t = req.get("type")
        if t == "reward":
            answer({"id": rid, "scores": score(req)})
        elif t == "describe":
            answer({"id": rid, "tools": {n: describe(get(n)) for n in req.get("names") or []}})
        elif t == "environment":
            answer(dict(describe_environment(req["name"]), id=rid))
        elif t == "tool":
            # a tool of the file, or a method of an episode's environment (TRL's kind)
            fn = getattr(episode(req), req["name"]) if req.get("episode") is not None else get(req["name"])
            answer({"id": rid, "result": text_of(awaited(fn(**(req.get("arguments") or {}))))})
        elif t == "reset":
            env = awaited(get(req["name"])())
            envs[req["episode"]] = env
            r = None
            if hasattr(env, "reset"):
                r = awaited(env.reset(**reset_keywords(env.reset, req)))
            answer({"id": rid, "messages": r})
        elif t == "step":
            r = awaited(episode(req).step(req["text"]))
            done, reward = False, None
            if isinstance(r, tuple):
                r, done, reward = (tuple(r) + (False, None))[:3]
            answer({"id": rid, "messages": r, "done": bool(done), "reward": reward})
        elif t == "get_reward":
            answer({"id": rid, "reward": awaited(episode(req).get_reward())})
        elif t == "close":
            # remax's kind is closed (close(), when it has one); TRL's is only dropped: its close,
            # if it has one, is one of its tools
            env = envs.pop(req.get("episode"), None)
            if env is not None and req.get("call", True) and hasattr(env, "close"):
                awaited(env.close())
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
