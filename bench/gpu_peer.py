"""bench/gpu_peer.py: the Hugging Face transformers peer of remax's GPU benchmarks, measured on the
same GPU in the same run (bench/gpu_train_step.sh, bench/gpu_generate.sh; tests/gpu/run.sh runs
both in a GPU window). Random weights from a Qwen2 config: nothing is downloaded.

  python3 bench/gpu_peer.py train --shape qwen1.5b --batch 16 --seq 1024 --steps 5
      the training step as a transformers user runs it at its best: f32 master weights under
      torch.autocast(bfloat16) (Hugging Face Trainer's bf16=True), SDPA attention, the model's own
      loss from labels, fused AdamW; the whole batch in one micro-batch, halved on out-of-memory
      (gradient accumulation), so a step is always batch x seq tokens
  python3 bench/gpu_peer.py generate --shape qwen0.5b --rows 1,64,256 --prompt 256 --new 512
      greedy decoding through model.generate with a static cache, bf16 weights, every row decoding
      exactly `new` tokens (no stop token); the prefill is included in the time, as on remax's side
  python3 bench/gpu_peer.py report < lines.jsonl
      the table of a benchmark's JSON lines (this peer's and remax's): tokens/s, MFU, memory, and
      remax's ratio to the peer; its rows start with "| "

Each measurement prints one JSON line. MFU counts 6 FLOPs per matmul weight per token (forward and
backward; the embedding lookup is no matmul, the tied head is one) plus causal attention, 6 * layers
* seq * hidden per token (QK^T and PV over the seq/2 keys a token sees on average, times 3 for the
backward), over the H200's dense bf16 peak of 989 TFLOP/s (datasheet) and over a bf16 matmul
measured here. Decoding at one row is bounded by HBM bandwidth: every weight (bf16) and the KV
cache read once per token, over 4.8 TB/s (datasheet) and over a device copy measured here.

--device cpu --shape tiny --impl plain runs the same harness on the CPU with bench/torch_peer.py's
plain decoder (PyTorch 1.13 and up, no transformers) to check the script, never for numbers.
Not a test (docs/gpu.md ("Running on a GPU"), docs/benchmarks.md).
"""
import argparse, copy, gc, json, math, os, statistics, sys, time

# read when PyTorch first allocates on the device: fewer fragments at the 1.5B shape's sizes
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch

SHAPES = {   # Qwen2.5-0.5B and Qwen2.5-1.5B (both tie the head to the embedding), and a CPU check
    "qwen0.5b": dict(hidden=896, layers=24, heads=14, kv=2, ffn=4864, vocab=151936, tied=True),
    "qwen1.5b": dict(hidden=1536, layers=28, heads=12, kv=2, ffn=8960, vocab=151936, tied=True),
    "tiny": dict(hidden=64, layers=2, heads=4, kv=2, ffn=160, vocab=512, tied=True),
}
PEAK = dict(gpu="H200 SXM (datasheet)", bf16_flops=989e12, hbm_bytes_per_s=4.8e12)


def matmul_params(s):
    """Weights that take part in a matmul per token: every layer's projections (q/k/v with bias),
    the norms, and the head (the embedding itself when tied)."""
    d = s["hidden"] // s["heads"]
    kvd = s["kv"] * d
    layer = (s["hidden"] * s["hidden"] + s["hidden"]) + 2 * (s["hidden"] * kvd + kvd) + s["hidden"] * s["hidden"] \
        + 3 * s["hidden"] * s["ffn"] + 2 * s["hidden"]
    return s["layers"] * layer + s["hidden"] + s["vocab"] * s["hidden"]


def total_params(s):
    return matmul_params(s) + (0 if s["tied"] else s["vocab"] * s["hidden"])


def train_flops_per_token(s, seq):
    return 6 * matmul_params(s) + 6 * s["layers"] * seq * s["hidden"]


def decode_bytes_per_token(s, prompt, new, weight_bytes=2, cache_bytes=2):
    """One row: every matmul weight read once, and the cache of the tokens before (mean over the run)."""
    d = s["hidden"] // s["heads"]
    mean_len = prompt + (new - 1) / 2
    return weight_bytes * matmul_params(s) + cache_bytes * 2 * s["layers"] * s["kv"] * d * mean_len


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def measured_ceilings(dev):
    """A bf16 8192^3 matmul (FLOP/s) and a 2 GiB device copy (bytes read + written per second), on
    random data, after warm-up; None on the CPU."""
    if dev.type != "cuda":
        return None, None
    n = 8192
    a, b = torch.randn(n, n, device=dev, dtype=torch.bfloat16), torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    src = torch.randint(0, 255, (2 << 30,), device=dev, dtype=torch.uint8)
    dst = torch.empty_like(src)
    def timed(fn, reps):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    flops = 2 * n ** 3 / timed(lambda: a @ b, 10)
    bw = 2 * src.numel() / timed(lambda: dst.copy_(src), 10)
    a = b = src = dst = None   # free them before the model is built
    torch.cuda.empty_cache()
    return flops, bw


def build(shape, impl, dev, dtype):
    """A randomly initialised Qwen2 of the shape on dev; returns (model, loss_fn, generate_fn, attention)."""
    s = SHAPES[shape]
    if impl == "plain":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch_peer
        m = torch_peer.Decoder(s["hidden"], s["layers"], s["heads"], s["kv"], s["ffn"], s["vocab"], s["tied"]).to(dev, dtype)
        def loss_fn(x):
            pos = torch.arange(x.shape[1], device=dev)[None].expand(x.shape[0], -1)
            logits = m.logits(m.hidden_states(x, pos)[:, :-1])
            return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        return m, loss_fn, None, "plain sdpa (bench/torch_peer.py)"
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
                      num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                      max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=s["tied"],
                      use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    with torch.device(dev):   # initialised on the device: no host copy of 1.5B random weights
        try:
            m = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        except TypeError:      # a transformers that takes the choice only through the config
            cfg._attn_implementation = "sdpa"
            m = AutoModelForCausalLM.from_config(cfg)
    m = m.to(dtype)
    def loss_fn(x):
        return m(input_ids=x, labels=x, use_cache=False).loss
    return m, loss_fn, m.generate, getattr(m.config, "_attn_implementation", "?")


def dynamo_graphs():
    """Graphs torch.compile has compiled in this process (None before PyTorch 2)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


def versions():
    v = dict(torch=torch.__version__)
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except ImportError:
        pass
    return v


def device_name(dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def side(a):
    return "transformers" if a.impl == "hf" else "torch_peer"


def emit(obj):
    print(json.dumps(obj), flush=True)


def train(a):
    dev = torch.device(a.device)
    s = SHAPES[a.shape]
    flops_peak, bw = measured_ceilings(dev)
    torch.manual_seed(0)
    model, loss_fn, _, attention = build(a.shape, a.impl, dev, torch.float32)
    model.train()
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0, fused=dev.type == "cuda")
        fused = dev.type == "cuda"
    except TypeError:     # PyTorch before 2.0 has no fused AdamW
        opt, fused = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0), False
    tokens = torch.randint(0, s["vocab"], (a.batch, a.seq), device=dev)
    amp = dict(device_type=dev.type, dtype=torch.bfloat16)

    def step(micro):
        opt.zero_grad(set_to_none=True)
        for i in range(0, a.batch, micro):
            x = tokens[i:i + micro]
            with torch.autocast(**amp):
                loss = loss_fn(x)
            (loss * (x.shape[0] / a.batch)).backward()
        opt.step()

    micro = a.micro or a.batch
    while True:   # the largest micro-batch that fits (the first step also allocates AdamW's moments)
        try:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            step(micro)
            sync(dev)
            break
        except torch.cuda.OutOfMemoryError:
            if micro == 1:
                raise
        # out of the except block, so that the failed step's tensors are no longer referenced
        opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        micro //= 2
    times = []
    for i in range(max(a.warmup, 1) - 1 + a.steps):   # the step above was the first warm-up
        sync(dev)
        t0 = time.perf_counter()
        step(micro)
        sync(dev)
        if i >= max(a.warmup, 1) - 1:
            times.append(time.perf_counter() - t0)
    per_step = statistics.median(times)
    tps = a.batch * a.seq / per_step
    fpt = train_flops_per_token(s, a.seq)
    out = dict(side=side(a), bench="train_step", shape=a.shape, device=device_name(dev), params=total_params(s),
               batch=a.batch, seq=a.seq, micro_batch=micro, steps=len(times),
               precision="f32 master weights, autocast bf16", attention=attention,
               optimizer="AdamW" + (" fused" if fused else ""), seconds_per_step=per_step,
               best_seconds_per_step=min(times), tokens_per_s=tps, flops_per_token=fpt,
               tflops=fpt * tps / 1e12, mfu=fpt * tps / PEAK["bf16_flops"], **versions())
    if flops_peak:
        out.update(measured_bf16_tflops=flops_peak / 1e12, mfu_of_measured=fpt * tps / flops_peak,
                   measured_copy_tb_s=bw / 1e12)
    if dev.type == "cuda":
        out.update(peak_allocated_mib=torch.cuda.max_memory_allocated() / 2 ** 20,
                   peak_reserved_mib=torch.cuda.max_memory_reserved() / 2 ** 20)
    emit(out)


@torch.no_grad()
def plain_generate(model, prompt, new, dev):
    """Greedy decoding with bench/torch_peer.py's preallocated cache (the CPU check of --impl plain)."""
    rows, plen = prompt.shape
    caches = [dict(K=torch.empty(rows, model.nkv, plen + new, model.d, device=dev, dtype=model.embed.weight.dtype),
                   V=torch.empty(rows, model.nkv, plen + new, model.d, device=dev, dtype=model.embed.weight.dtype), n=0)
              for _ in model.layers]
    h = model.hidden_states(prompt, torch.arange(plen, device=dev)[None].expand(rows, -1), caches)
    nxt = model.logits(h[:, -1]).argmax(-1)
    out = [nxt]
    for i in range(new - 1):
        h = model.hidden_states(nxt[:, None], torch.full((rows, 1), plen + i, device=dev), caches)
        nxt = model.logits(h[:, -1]).argmax(-1)
        out.append(nxt)
    return torch.cat([prompt, torch.stack(out, 1)], 1)


@torch.no_grad()
def generate(a):
    dev = torch.device(a.device)
    s = SHAPES[a.shape]
    flops_peak, bw = measured_ceilings(dev)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model, _, hf_generate, attention = build(a.shape, a.impl, dev, dtype)
    model.eval()
    if hf_generate:
        gc_base = copy.deepcopy(model.generation_config)
        gc_base.do_sample, gc_base.eos_token_id, gc_base.pad_token_id = False, None, 0
        gc_base.cache_implementation = "static"
        gc_base.disable_compile = not a.compile   # transformers compiles a static-cache forward on its own unless told not to
    def run(prompt, new):
        if not hf_generate:
            return plain_generate(model, prompt, new, dev)
        g = copy.deepcopy(gc_base)
        g.max_new_tokens = new   # no eos token: every row decodes all of them (checked below)
        return hf_generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=g)
    deadline = a.deadline or math.inf
    last = None   # seconds of the previous row count: the estimate for the next
    for rows in [int(r) for r in a.rows.split(",")]:
        need = 2.5 * last if last is not None else 0   # the next row count takes longer than the last
        if time.time() + need > deadline:
            emit(dict(side=side(a), bench="generate", shape=a.shape, rows=rows, skipped="deadline",
                      why="about %.0f s needed, %.0f s left" % (need, deadline - time.time())))
            continue
        prompt = torch.randint(0, s["vocab"], (rows, a.prompt), device=dev)
        t0 = time.perf_counter()
        run(prompt, a.new if a.compile else min(a.new, 16))   # warm-up (a full one when compiling: one graph per shape)
        sync(dev)
        warm = time.perf_counter() - t0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = run(prompt, a.new)
        sync(dev)
        dt = time.perf_counter() - t0
        last = dt + warm
        assert out.shape == (rows, a.prompt + a.new), "generate returned %s, not %d rows of %d tokens" % (
            tuple(out.shape), rows, a.prompt + a.new)
        tps = rows * a.new / dt
        res = dict(side=side(a), bench="generate", shape=a.shape, device=device_name(dev), rows=rows,
                   prompt=a.prompt, new=a.new, dtype=str(dtype).replace("torch.", ""), attention=attention,
                   cache="static", compiled=bool(a.compile and hf_generate), seconds=dt, warmup_seconds=warm,
                   tokens_per_s=tps, **versions())
        if rows == 1:
            nbytes = decode_bytes_per_token(s, a.prompt, a.new, weight_bytes=2 if dtype == torch.bfloat16 else 4)
            res.update(bytes_per_token=nbytes, bound_tokens_per_s=PEAK["hbm_bytes_per_s"] / nbytes,
                       of_bound=tps * nbytes / PEAK["hbm_bytes_per_s"])
            if bw:
                res.update(measured_copy_tb_s=bw / 1e12, of_measured_bound=tps * nbytes / bw)
        if dev.type == "cuda":
            res.update(peak_allocated_mib=torch.cuda.max_memory_allocated() / 2 ** 20)
        graphs = dynamo_graphs()
        if graphs is not None:   # what torch.compile actually did, whatever was asked
            res.update(dynamo_graphs=graphs)
        emit(res)


def report(a):
    """The table of the JSON lines on stdin: each remax line beside the peer line of the same shape
    (and row count)."""
    rows = []
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                print("| (not JSON: %s)" % line[:80])
    def bench(r):
        b = r.get("bench") or r.get("mode") or "?"
        return {"train": "train_step"}.get(b, b)
    def key(r):
        return (bench(r), r.get("shape"), r.get("rows"))
    def is_remax(r):
        return r.get("engine") == "remax" or r.get("side") == "remax"
    peers = {key(r): r for r in rows if not is_remax(r) and "tokens_per_s" in r}
    for r in rows:
        who = "remax" if is_remax(r) else r.get("side", "?")
        what = bench(r) + " " + str(r.get("shape"))
        if r.get("rows") is not None:
            what += " rows=%s" % r["rows"]
        if "skipped" in r or "unavailable" in r:
            print("| %-12s %-28s %s" % (who[:12], what, "skipped: " + str(r.get("why") or r.get("skipped") or r.get("unavailable"))))
            continue
        tps = r.get("tokens_per_s", 0)
        cols = ["%10.0f tok/s" % tps]
        s = SHAPES.get(r.get("shape"))
        if bench(r) == "train_step" and s and r.get("seq"):
            fpt = train_flops_per_token(s, r["seq"])
            cols.append("MFU %4.1f%%" % (100 * fpt * tps / PEAK["bf16_flops"]))
        if bench(r) == "generate" and r.get("rows") == 1 and s and r.get("prompt") and r.get("new"):
            wb = 4 if str(r.get("dtype")) in ("f32", "float32") else 2
            nbytes = decode_bytes_per_token(s, r["prompt"], r["new"], weight_bytes=wb)
            cols.append("%4.1f%% of the HBM bound" % (100 * tps * nbytes / PEAK["hbm_bytes_per_s"]))
        mem = r.get("peak_allocated_mib") or r.get("device_peak_mib")
        if mem:
            cols.append("%6.0f MiB peak" % mem)
        p = peers.get(key(r))
        if who == "remax" and p:
            cols.append("%.2fx %s" % (tps / p["tokens_per_s"], p.get("side")))
            pm = p.get("peak_allocated_mib")
            if mem and pm:
                cols.append("memory %.2fx" % (mem / pm))
        print("| %-12s %-28s %s" % (who[:12], what, "  ".join(cols)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["train", "generate", "report"])
    ap.add_argument("--shape", default="qwen0.5b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--impl", default="hf", choices=["hf", "plain"], help="plain: bench/torch_peer.py's decoder (CPU check)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro", type=int, default=0, help="train: micro-batch rows (0: the whole batch, halved on OOM)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", default="1,64,256")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--compile", action="store_true", help="generate: let transformers compile the static-cache forward")
    ap.add_argument("--deadline", type=float, default=0, help="generate: epoch seconds; row counts that would end later are skipped")
    a = ap.parse_args()
    if a.mode != "report" and a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_peer.py: no CUDA device for PyTorch %s here (--device cpu --shape tiny --impl plain checks the script)" % torch.__version__)
    {"train": train, "generate": generate, "report": report}[a.mode](a)
