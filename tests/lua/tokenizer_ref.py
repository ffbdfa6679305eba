#!/usr/bin/env python3
"""tokenizer_ref.py: the reference tokenizer of tests/lua/tokenizer_spec.lua, jinja_spec.lua and
bench/tokenizer.lua: Hugging Face `tokenizers` on real vocabularies.

The vocabularies are llama.cpp's vocab-only GGUFs (.cache/llama.cpp/models/ggml-vocab-NAME.gguf,
from llama-cpp-python's sdist): qwen2 (Qwen1.5's vocabulary, which Qwen2, Qwen2.5 and Qwen3 keep),
qwen35 (the same vocabulary with Qwen3.5's split regex) and llama-bpe (Llama 3). transformers' own
GGUF tokenizer loading, AutoTokenizer.from_pretrained(models, gguf_file=...) and save_pretrained,
turns each into tokenizer.json, tokenizer_config.json and chat_template.jinja, once, in
.cache/tokenizers/NAME. That converter leaves out three things the vocabulary's own definition
says; they are put back here, each through the tokenizers / transformers API:
  - llama3: `ignore_merges` (a word that is a token is taken whole) and a BOS before the text:
    llama.cpp's llama-vocab.cpp sets both for the "llama-bpe" pre-tokenizer, and Meta's tokenizer
    converted by transformers' own TikTokenConverter has ignore_merges. Without it the
    converted file fails llama.cpp's vector "Cửa Việt".
  - llama3: the `<|endoftext|>` token 128256 is dropped: the file declares 128256 tokens; the
    converter's byte-level builder (GPT2Tokenizer) adds its default unk token past them.
  - qwen2: the NFC normalizer, as transformers' own Qwen2Tokenizer class sets it (the converter
    builds every byte-level vocabulary as GPT2Tokenizer, without one). qwen35 keeps none: its
    llama.cpp vectors hold decomposed accents that the real tokenizer leaves alone.
Each file is checked against llama.cpp's vectors (ggml-vocab-NAME.gguf.inp/.out, made by llama.cpp's
convert_hf_to_gguf_update.py with the real tokenizer: encode(text, add_special_tokens=False)).

  tokenizer_ref.py prepare                  -> {"qwen2": DIR, "qwen35": DIR, "llama3": DIR}
  tokenizer_ref.py run JOBS.json            -> JSON list, one answer per job:
      {"op": "encode", "tokenizer": NAME|DIR, "texts": [...]}  -> {"plain": [[ids]...], "special": [[ids]...]}
          (without, then with the special tokens the file's post-processor adds)
      {"op": "nfc", "texts": [...]}                            -> {"texts": [unicodedata.normalize("NFC", t)...]}
      {"op": "vectors", "tokenizer": NAME}                     -> {"inputs": [...], "want": [[ids]...], "got": [[ids]...]}
          (llama.cpp's inputs and ids, parsed as tests/test-tokenizer-0.cpp does, and `tokenizers`' ids)
  tokenizer_ref.py bench NAME FILE SECONDS  -> "MB/s MB/s": encode FILE on one thread, a call per
                                               line, then one encode_batch of all lines
Used by the tests and the benchmark only."""
import json
import os
import shutil
import sys
import time
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(ROOT, ".cache")
MODELS = os.path.join(CACHE, "llama.cpp", "models")
VOCABS = {"qwen2": "qwen2", "qwen35": "qwen35", "llama3": "llama-bpe"}   # name -> ggml-vocab-X.gguf
STAMP = "reference.json"   # what made a prepared folder; a different one is made again
REPAIRS = {
    "qwen2": ["normalizer NFC"],
    "qwen35": [],
    "llama3": ["ignore_merges", "add_bos_token", "drop added tokens past the file's vocabulary"],
}


def gguf_path(name):
    return os.path.join(MODELS, "ggml-vocab-%s.gguf" % VOCABS[name])


def stamp(name):
    from importlib.metadata import version
    return {"gguf": os.path.basename(gguf_path(name)), "size": os.path.getsize(gguf_path(name)),
            "transformers": version("transformers"), "tokenizers": version("tokenizers"), "repairs": REPAIRS[name]}


def convert(name, out):
    """Writes NAME's tokenizer files into the folder out."""
    from tokenizers import normalizers
    from transformers import AutoTokenizer
    kwargs = {"add_bos_token": True} if name == "llama3" else {}
    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=os.path.basename(gguf_path(name)), **kwargs)
    backend = tok.backend_tokenizer
    if name == "llama3":
        backend.model.ignore_merges = True
    if name == "qwen2":
        backend.normalizer = normalizers.NFC()
    tok.save_pretrained(out)
    if name == "llama3":
        size = len(backend.get_vocab(with_added_tokens=False))
        path = os.path.join(out, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < size]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=2)


def prepare(name):
    """The folder of NAME's tokenizer files, made once (atomically: other runs share .cache)."""
    folder = os.path.join(CACHE, "tokenizers", name)
    want = stamp(name)
    try:
        with open(os.path.join(folder, STAMP), encoding="utf-8") as f:
            if json.load(f) == want:
                return folder
    except (OSError, ValueError):
        pass
    tmp = "%s.tmp%d" % (folder, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    convert(name, tmp)
    with open(os.path.join(tmp, STAMP), "w", encoding="utf-8") as f:
        json.dump(want, f)
    old = "%s.old%d" % (folder, os.getpid())
    if os.path.exists(folder):
        os.rename(folder, old)
    os.rename(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


loaded = {}


def tokenizer(name_or_dir):
    from tokenizers import Tokenizer
    if name_or_dir not in loaded:
        folder = prepare(name_or_dir) if name_or_dir in VOCABS else name_or_dir
        loaded[name_or_dir] = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    return loaded[name_or_dir]


def vectors(name):
    """llama.cpp's test inputs and ids, read as tests/test-tokenizer-0.cpp reads them."""
    base = gguf_path(name)
    with open(base + ".inp", encoding="utf-8", newline="") as f:
        raw = f.read()
    sep = "\n__ggml_vocab_test__\n"
    inputs, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(sep)
    with open(base + ".out", encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":   # the newline that ends the last line
        lines.pop()
    want = [[int(x) for x in line.split()] for line in lines]
    if len(want) != len(inputs):
        raise SystemExit("%s: %d inputs, %d outputs" % (base, len(inputs), len(want)))
    return inputs, want


def answer(job):
    op = job["op"]
    if op == "encode":
        tok = tokenizer(job["tokenizer"])
        texts = job["texts"]
        return {"plain": [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)],
                "special": [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]}
    if op == "nfc":
        return {"texts": [unicodedata.normalize("NFC", t) for t in job["texts"]]}
    if op == "vectors":
        inputs, want = vectors(job["tokenizer"])
        tok = tokenizer(job["tokenizer"])
        return {"inputs": inputs, "want": want,
                "got": [e.ids for e in tok.encode_batch(inputs, add_special_tokens=False)]}
    raise SystemExit("unknown op %r" % op)


def bench(name, path, seconds):
    """MB/s encoding the file line by line, one call a line; then MB/s with one encode_batch call
    for all lines (one thread: TOKENIZERS_PARALLELISM=false), which spares Python's per-call cost."""
    tok = tokenizer(name)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    size = len(text.encode("utf-8"))
    rates = []
    for batch in (False, True):
        n, done, t0 = 0, 0, time.perf_counter()
        while True:
            if batch:
                n += sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False))
            else:
                for line in lines:
                    n += len(tok.encode(line, add_special_tokens=False).ids)
            done += size
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        rates.append(done / dt / 1e6)
    return "%.3f %.3f" % tuple(rates)


def main(argv):
    if argv[:1] == ["prepare"]:
        out = {name: prepare(name) for name in VOCABS}
    elif argv[:1] == ["run"] and len(argv) == 2:
        with open(argv[1], encoding="utf-8") as f:
            jobs = json.load(f)
        out = [answer(job) for job in jobs]
    elif argv[:1] == ["bench"] and len(argv) == 4:
        sys.stdout.write(bench(argv[1], argv[2], float(argv[3])) + "\n")
        return
    else:
        raise SystemExit(__doc__)
    sys.stdout.write(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1:])
