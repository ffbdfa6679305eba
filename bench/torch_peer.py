"""PyTorch peer for remax benchmarks: a plain Qwen2-architecture decoder written for PyTorch
(embedding, RMSNorm, rotate-half RoPE, grouped-query attention through
scaled_dot_product_attention, SwiGLU, tied or untied head), trained the usual way: full
[B, T, vocab] logits, log_softmax, gather, backward, torch.optim.AdamW; and decoding greedily,
either with that decoder (--impl hand: a preallocated KV cache, or torch.cat per step as
transformers' DynamicCache grows) or with transformers' own Qwen2ForCausalLM.generate (--impl hf).

  python bench/torch_peer.py train --shape small --steps 3 [--autocast bf16] [--compile]
  python bench/torch_peer.py generate --shape small --rows 8 --prompt 64 --new 128 [--impl hand|hf]
      [--cache static|cat] [--dtype f32|bf16] [--compile]

Runs under Debian's torch 1.13 (/usr/bin/python3) and torch 2.x (.cache/bench-venv, made by
bench/peers.sh); what 1.13 lacks (scaled_dot_product_attention, its grouped-query form, fused
AdamW, torch.compile) is written out or left off, and the JSON line says what ran. Prints one
JSON line with tokens/s and peak RSS (MiB). Not a test: see docs/benchmarks.md.
"""
import argparse, json, math, resource, sys, time
import torch
import torch.nn.functional as F

SHAPES = {
    "small": dict(hidden=256, layers=4, heads=8, kv=2, inter=688, vocab=1024, tied=False),
    "qwen0.5b": dict(hidden=896, layers=24, heads=14, kv=2, inter=4864, vocab=151936, tied=True),
}

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def sdpa_has_gqa():
    """SDPA's own grouped-query attention (torch 2.5+: enable_gqa), no repeated keys."""
    if not HAS_SDPA:
        return False
    try:
        q, kv = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 2, 8)
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except TypeError:
        return False


HAS_GQA = sdpa_has_gqa()


def attention(q, k, v, is_causal, use_gqa):
    """Causal attention of q [B, H, T, d] over k, v [B, KV, S, d]: SDPA where PyTorch has it
    (2.0+), with its grouped-query form where it has that (2.5+); the same math otherwise."""
    rep = q.shape[1] // k.shape[1]
    if HAS_SDPA and use_gqa and rep > 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        Tq, Tk = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).triu(1 + Tk - Tq), float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


class Decoder(torch.nn.Module):
    def __init__(self, hidden, layers, heads, kv, inter, vocab, tied, theta=1e6, eps=1e-6, gqa=True):
        super().__init__()
        self.h, self.nh, self.nkv, self.d, self.eps, self.theta = hidden, heads, kv, hidden // heads, eps, theta
        self.gqa = gqa
        lin = lambda i, o, b=False: torch.nn.Linear(i, o, bias=b)
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            layer = torch.nn.Module()
            layer.ln1 = torch.nn.Parameter(torch.ones(hidden))
            layer.q = lin(hidden, heads * self.d, True)
            layer.k = lin(hidden, kv * self.d, True)
            layer.v = lin(hidden, kv * self.d, True)
            layer.o = lin(heads * self.d, hidden)
            layer.ln2 = torch.nn.Parameter(torch.ones(hidden))
            layer.gate = lin(hidden, inter)
            layer.up = lin(hidden, inter)
            layer.down = lin(inter, hidden)
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        self.head = None if tied else lin(hidden, vocab)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, pos):
        d = x.shape[-1]
        inv = self.theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        f = pos[..., None].float() * inv
        cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return (x * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)

    def attend(self, layer, x, pos, cache=None):
        B, T, _ = x.shape
        q = layer.q(x).view(B, T, self.nh, self.d).transpose(1, 2)
        k = layer.k(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        v = layer.v(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        q, k = self.rope(q, pos), self.rope(k, pos)
        if cache is not None and "K" in cache:
            return layer.o(self.attend_static(q, k, v, cache).transpose(1, 2).reshape(B, T, -1))
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
            cache["k"], cache["v"] = k, v
        o = attention(q, k, v, cache is None or T > 1, self.gqa)
        return layer.o(o.transpose(1, 2).reshape(B, T, -1))

    def attend_static(self, q, k, v, cache):
        """Preallocated cache [B, kv, S, d] written in place (no torch.cat per step); a one-token
        query attends grouped, as [B, kv, rep, d] against its kv head, with no repeated keys."""
        B, _, T, d = q.shape
        n = cache["n"]
        cache["K"][:, :, n:n + T] = k
        cache["V"][:, :, n:n + T] = v
        cache["n"] = n = n + T
        K, V = cache["K"][:, :, :n], cache["V"][:, :, :n]
        rep = self.nh // self.nkv
        if T > 1:   # prefill: plain causal attention
            return attention(q, K, V, True, self.gqa)
        s = torch.matmul(q.view(B, self.nkv, rep, d), K.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        return torch.matmul(torch.softmax(s, -1), V).view(B, self.nh, 1, d)

    def hidden_states(self, tokens, pos, caches=None):
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = x + self.attend(layer, self.rms(x, layer.ln1), pos, caches[i] if caches is not None else None)
            h = self.rms(x, layer.ln2)
            x = x + layer.down(F.silu(layer.gate(h)) * layer.up(h))
        return self.rms(x, self.norm)

    def logits(self, h):
        return h @ self.embed.weight.t() if self.head is None else self.head(h)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def settings(args):
    """What ran, for the JSON line."""
    if args.mode == "generate" and args.impl == "hf":
        attention = "transformers' sdpa"
    else:
        attention = ("sdpa, grouped" if HAS_GQA and args.gqa else "sdpa") if HAS_SDPA else "matmul + softmax"
    out = dict(torch=torch.__version__, threads=torch.get_num_threads(), attention=attention)
    if args.compile:
        out["compiled"] = True
    return out


def train(args, shape):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Decoder(**shape, gqa=args.gqa)
    try:   # one fused kernel over all parameters where this torch has it on the CPU (2.4+)
        opt, fused = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True), True
    except (TypeError, RuntimeError):
        opt, fused = torch.optim.AdamW(model.parameters(), lr=1e-5), False
    tokens = torch.randint(0, shape["vocab"], (args.batch, args.seq))
    pos = torch.arange(args.seq)[None].expand(args.batch, -1)

    def loss_of(tokens, pos):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            logits = model.logits(model.hidden_states(tokens, pos)[:, :-1])
        logp = torch.log_softmax(logits.float(), -1)
        return -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1).mean()

    if args.compile:
        loss_of = torch.compile(loss_of)
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = loss_of(tokens, pos)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        elif step == 0:
            first = time.perf_counter() - t0
    per_step = sum(times) / len(times)
    label = ("bf16 autocast" if args.autocast == "bf16" else "fp32") + (", compiled" if args.compile else "")
    print(json.dumps(dict(peer="pytorch " + torch.__version__ + " " + label, mode="train", shape=args.shape,
                          batch=args.batch, seq=args.seq, seconds_per_step=per_step,
                          tokens_per_s=args.batch * args.seq / per_step,
                          best_tokens_per_s=args.batch * args.seq / min(times), first_step_s=first,
                          fused_adamw=fused, peak_rss_mib=peak_rss_mib(), **settings(args))))


def hf_model(shape, dtype):
    """transformers' Qwen2ForCausalLM of a shape, random weights, SDPA attention."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                      num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"],
                      intermediate_size=shape["inter"], vocab_size=shape["vocab"],
                      tie_word_embeddings=shape["tied"], rope_theta=1e6, rms_norm_eps=1e-6,
                      max_position_embeddings=32768, use_sliding_window=False)
    model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=dtype).eval()
    model.generation_config.eos_token_id = None   # every row decodes exactly --new tokens
    model.generation_config.pad_token_id = 0
    return model


def generate(args, shape):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    prompt = torch.randint(0, shape["vocab"], (args.rows, args.prompt))
    if args.impl == "hf":
        model = hf_model(shape, dtype)
        gen = dict(do_sample=False, max_new_tokens=args.new, min_new_tokens=args.new)
        if args.cache == "static":   # transformers' StaticCache; else its default, DynamicCache (torch.cat per step)
            gen["cache_implementation"] = "static"
            # transformers compiles a static-cache forward on its own on some devices: only when asked
            model.generation_config.disable_compile = not args.compile
        if args.compile and args.cache != "static":
            model.forward = torch.compile(model.forward)

        def run():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), **gen)
            return out[:, args.prompt:]
    else:
        model = Decoder(**shape, gqa=args.gqa).to(dtype).eval()

        def new_cache():
            if args.cache == "cat":   # the way Hugging Face's DynamicCache grows: torch.cat every step
                return dict()
            size = (args.rows, model.nkv, args.prompt + args.new, model.d)
            return dict(K=torch.empty(size, dtype=dtype), V=torch.empty(size, dtype=dtype), n=0)

        def run():
            caches = [new_cache() for _ in model.layers]
            pos = torch.arange(args.prompt)[None].expand(args.rows, -1)
            h = model.hidden_states(prompt, pos, caches)
            nxt = model.logits(h[:, -1]).argmax(-1)
            out = [nxt]
            for i in range(args.new - 1):
                pos = torch.full((args.rows, 1), args.prompt + i)
                h = model.hidden_states(nxt[:, None], pos, caches)
                nxt = model.logits(h[:, -1]).argmax(-1)
                out.append(nxt)
            return torch.stack(out, 1)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            run()
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        tokens = run()
        dt = time.perf_counter() - t0
    assert tokens.shape == (args.rows, args.new), "a row ended early"
    if args.impl == "hf":
        label = "transformers generate, " + ("StaticCache" if args.cache == "static" else "DynamicCache")
    else:
        label = "plain decoder, " + ("preallocated" if args.cache == "static" else "torch.cat") + " KV cache"
    label += ", bf16" if args.dtype == "bf16" else ""
    label += ", compiled" if args.compile else ""
    print(json.dumps(dict(peer="pytorch " + torch.__version__ + " " + label, mode="generate", impl=args.impl,
                          shape=args.shape, rows=args.rows, prompt=args.prompt, new=args.new, cache=args.cache,
                          dtype=args.dtype, seconds=dt, warmup_s=warm, tokens_per_s=args.rows * args.new / dt,
                          peak_rss_mib=peak_rss_mib(), **settings(args))))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "generate"])
    ap.add_argument("--shape", default="small", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--impl", default="hand", choices=["hand", "hf"],
                    help="generate: the plain decoder here, or transformers' Qwen2ForCausalLM.generate")
    ap.add_argument("--cache", default=None, choices=["static", "cat"],
                    help="generate: a preallocated KV cache (hand's default; hf: StaticCache), or one grown by "
                         "torch.cat (hf: DynamicCache, its default)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"], help="generate: the weights' dtype")
    ap.add_argument("--autocast", default="none", choices=["none", "bf16"],
                    help="train: forward under torch.autocast(cpu, bfloat16); log-softmax and loss in fp32")
    ap.add_argument("--compile", action="store_true", help="torch.compile (torch 2): train's loss, hf's forward")
    ap.add_argument("--no-gqa", dest="gqa", action="store_false",
                    help="repeat the kv heads instead of SDPA's enable_gqa (torch 2.5+)")
    a = ap.parse_args()
    if a.compile and not TORCH2:
        sys.exit("torch_peer.py: --compile needs torch 2 (this is %s)" % torch.__version__)
    if a.cache is None:
        a.cache = "cat" if a.impl == "hf" else "static"
    (train if a.mode == "train" else generate)(a, SHAPES[a.shape])
