"""The references of tests/lua/gguf_spec.lua: the GGUF files remax exports, read by gguf-py (the
`gguf` package, llama.cpp's own Python reader) and loaded by llama.cpp itself through
llama-cpp-python's bindings of its C API (libllama). One process per spec file.

  llamacpp_ref.py check REQUEST.json          -> {"results": [one object per job]} on stdout

check: REQUEST.json is {"jobs": [job, ...]}; each job names a GGUF file and what to do with it:
  {"path": FILE,
   "read": {"arrays": bool, "values": F32FILE, "cache": PATH},   gguf-py: every key and tensor
   "llama": {"vocab_only": bool, "threads": n,             llama.cpp: load the file, then
             "rows": [[ids]],                              log p(next token) after every prefix
             "texts": [str],                               llama_tokenize / llama_token_to_piece
             "renders": [str],                             llama_tokenize of a rendered prompt
             "chats": [{"messages": [...], "add_generation_prompt": bool}]}}  llama_chat_apply_template
and its result is
  {"gguf": {"version", "alignment", "data_offset", "keys": [{"key", "types": [GGUFValueType names],
            "value"}] (in file order; arrays only with "arrays", else their length as "count"),
            "tensors": [{"name", "type" (GGMLQuantizationType name), "shape" (ggml order, ne[0]
            first), "n_elements", "n_bytes", "offset" (absolute), "at" (first value in F32FILE)}]},
   "llama": {"n_vocab", "bos", "eos", "add_bos", "template" (llama_model_chat_template),
             "logprobs": [[[log p over the vocabulary] per position] per row],
             "tokens": [[ids] per text], "detokenized": [str] (the pieces of those ids), "render_tokens": [[ids]],
             "chats": [str or null]}}
F32FILE receives every tensor's values as float32, dequantized by gguf.quants.dequantize, in
tensor order. "cache": PATH in "read" keeps gguf-py's reading of a file that does not change (llama.cpp's
vocab files: gguf-py takes about ten seconds on the 150-280 thousand strings of each) in PATH,
made again when the file's size or the gguf package's version differ.
"""
import ctypes
import json
import math
import os
import sys


def read_gguf_cached(path, want):
    from importlib.metadata import version
    stamp = {"size": os.path.getsize(path), "gguf": version("gguf")}
    try:
        with open(want["cache"]) as f:
            kept = json.load(f)
        if kept["stamp"] == stamp:
            return kept["read"]
    except (OSError, ValueError, KeyError):
        pass
    out = read_gguf(path, {k: v for k, v in want.items() if k != "cache"})
    os.makedirs(os.path.dirname(want["cache"]), exist_ok=True)
    tmp = "%s.tmp%d" % (want["cache"], os.getpid())
    with open(tmp, "w") as f:
        json.dump({"stamp": stamp, "read": out}, f)
    os.replace(tmp, want["cache"])
    return out


def read_gguf(path, want):
    if want.get("cache"):
        return read_gguf_cached(path, want)
    import numpy as np
    from gguf import GGUFReader, GGUFValueType
    from gguf.quants import dequantize

    r = GGUFReader(path)
    out = {"version": int(r.fields["GGUF.version"].contents()), "alignment": int(r.alignment),
           "data_offset": int(r.data_offset), "keys": [], "tensors": []}
    for field in r.fields.values():
        if field.name.startswith("GGUF."):   # the header's version and counts, not metadata
            continue
        entry = {"key": field.name, "types": [GGUFValueType(t).name for t in field.types]}
        if field.types[0] == GGUFValueType.ARRAY and not want.get("arrays"):
            entry["count"] = len(field.data)
        else:
            value = field.contents()
            if isinstance(value, float) and not math.isfinite(value):
                value = repr(value)
            entry["value"] = value
        out["keys"].append(entry)
    values = want.get("values")
    sink = open(values, "wb") if values else None
    at = 0
    for t in r.tensors:
        out["tensors"].append({"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in t.shape],
                               "n_elements": int(t.n_elements), "n_bytes": int(t.n_bytes),
                               "offset": int(t.data_offset), "at": at})
        if sink:
            x = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
            assert x.size == t.n_elements, t.name
            sink.write(x.tobytes())
            at += x.size
    if sink:
        sink.close()
    return out


class Llama:
    """One GGUF file loaded by libllama through llama_cpp's ctypes bindings (its C API as is)."""

    def __init__(self, path, vocab_only):
        import llama_cpp as L
        self.L = L
        params = L.llama_model_default_params()
        params.vocab_only = vocab_only
        params.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)

    def tokenize(self, text, add_special, parse_special):
        L = self.L
        data = text.encode()
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed ({n}) on {text!r}")
        return list(buf[:n])

    def detokenize(self, ids):
        """The text of the ids as llama.cpp hands out generated text: llama_token_to_piece of each
        token, special tokens as their text, joined (llama_detokenize would also apply
        clean_up_tokenization_spaces, which llama.cpp sets for most BPE vocabularies)."""
        L = self.L
        out = b""
        buf = ctypes.create_string_buffer(256)
        for tok in ids:
            n = L.llama_token_to_piece(self.vocab, tok, buf, len(buf), 0, True)
            if n < 0:
                raise RuntimeError(f"llama_token_to_piece failed ({n}) on token {tok}")
            out += buf.raw[:n]
        return out.decode("utf-8", errors="replace")

    def chat(self, template, messages, add_generation_prompt):
        """llama.cpp's own llama_chat_apply_template (its built-in formats, picked from the
        template's text; it runs no Jinja), or None when it knows no format for the template."""
        L = self.L
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (L.llama_chat_message * len(keep))()
        for i, (role, content) in enumerate(keep):
            arr[i].role, arr[i].content = role, content
        cap = 256 + sum(len(c) + len(r) for r, c in keep) * 4
        buf = ctypes.create_string_buffer(cap)
        n = L.llama_chat_apply_template(template, arr, len(keep), add_generation_prompt, buf, cap)
        if n < 0:
            return None
        if n > cap:
            buf = ctypes.create_string_buffer(n)
            n = L.llama_chat_apply_template(template, arr, len(keep), add_generation_prompt, buf, n)
        return buf.raw[:n].decode()

    def logprobs(self, rows, threads):
        """log p(next token) over the vocabulary after every prefix of each row: the row decoded
        in one batch with logits at every position, f32 K/V cache and no flash attention (llama.cpp's
        defaults, an f16 cache and f16 flash attention on CPUs, would round what remax keeps in
        f32), then log-softmax in float64."""
        import numpy as np
        L = self.L
        width = max(len(r) for r in rows)
        params = L.llama_context_default_params()
        params.n_ctx = max(64, width + 8)
        params.n_batch = params.n_ubatch = max(64, width)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.type_k = params.type_v = L.GGML_TYPE_F32
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError("llama_init_from_model failed")
        n_vocab = L.llama_vocab_n_tokens(self.vocab)
        batch = L.llama_batch_init(width, 0, 1)
        out = []
        try:
            for row in rows:
                L.llama_memory_clear(L.llama_get_memory(ctx), True)
                batch.n_tokens = len(row)
                for i, tok in enumerate(row):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                rc = L.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode returned {rc}")
                per_pos = []
                for i in range(len(row)):
                    z = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).astype(np.float64)
                    m = z.max()
                    per_pos.append((z - (m + math.log(np.exp(z - m).sum()))).tolist())
                out.append(per_pos)
        finally:
            L.llama_batch_free(batch)
            L.llama_free(ctx)
        return out

    def close(self):
        self.L.llama_model_free(self.model)


def run_llama(path, job):
    import llama_cpp as L
    m = Llama(path, bool(job.get("vocab_only")))
    try:
        template = L.llama_model_chat_template(m.model, None)
        out = {"n_vocab": L.llama_vocab_n_tokens(m.vocab), "bos": L.llama_vocab_bos(m.vocab),
               "eos": L.llama_vocab_eos(m.vocab), "add_bos": bool(L.llama_vocab_get_add_bos(m.vocab)),
               "template": template.decode() if template else None}
        # token ids as remax's encode(text, add_special_tokens=false) gives them: special tokens
        # written in the text are parsed as such, nothing added
        out["tokens"] = [m.tokenize(t, False, True) for t in job.get("texts", [])]
        out["detokenized"] = [m.detokenize(ids) for ids in out["tokens"]]
        out["render_tokens"] = [m.tokenize(t, False, True) for t in job.get("renders", [])]
        out["chats"] = [m.chat(template, c["messages"], c.get("add_generation_prompt", True))
                        for c in job.get("chats", [])]
        if job.get("rows"):
            out["logprobs"] = m.logprobs(job["rows"], job.get("threads", 1))
        return out
    finally:
        m.close()


def check(request_path):
    with open(request_path) as f:
        jobs = json.load(f)["jobs"]
    if any(j.get("llama") is not None for j in jobs):
        import llama_cpp as L
        # libllama logs every load to stderr; keep only errors (level 4 = GGML_LOG_LEVEL_ERROR)
        @L.llama_log_callback
        def quiet(level, text, user_data):
            if level == 4:
                sys.stderr.write(text.decode(errors="replace"))
        check.quiet = quiet   # the C side keeps the pointer: so must Python
        L.llama_log_set(quiet, ctypes.c_void_p())
        L.llama_backend_init()
    results = []
    for job in jobs:
        res = {}
        if job.get("read") is not None:
            res["gguf"] = read_gguf(job["path"], job["read"])
        if job.get("llama") is not None:
            res["llama"] = run_llama(job["path"], job["llama"])
        results.append(res)
    json.dump({"results": results}, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        sys.exit(__doc__)
