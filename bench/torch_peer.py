"""PyTorch peer for remax benchmarks: a plain Qwen2-architecture decoder written for PyTorch
(embedding, RMSNorm, rotate-half RoPE, grouped-query attention through
scaled_dot_product_attention, SwiGLU, tied or untied head), trained the usual way: full
[B, T, vocab] logits, log_softmax, gather, backward, torch.optim.AdamW.

  python3 bench/torch_peer.py train --shape small --steps 3
  python3 bench/torch_peer.py generate --shape small --rows 8 --prompt 64 --new 128 [--cache static|cat]

Prints one JSON line with tokens/s and peak RSS (MiB). Not a test: see bench/README.md.
"""
import argparse, json, math, resource, sys, time
import torch
import torch.nn.functional as F

SHAPES = {
    "small": dict(hidden=256, layers=4, heads=8, kv=2, inter=688, vocab=1024, tied=False),
    "qwen0.5b": dict(hidden=896, layers=24, heads=14, kv=2, inter=4864, vocab=151936, tied=True),
}


def sdpa(q, k, v, is_causal):
    """F.scaled_dot_product_attention where PyTorch has it (2.0+); the same math otherwise."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        Tq, Tk = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


class Decoder(torch.nn.Module):
    def __init__(self, hidden, layers, heads, kv, inter, vocab, tied, theta=1e6, eps=1e-6):
        super().__init__()
        self.h, self.nh, self.nkv, self.d, self.eps, self.theta = hidden, heads, kv, hidden // heads, eps, theta
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
        return x * cos + torch.cat([-x2, x1], -1) * sin

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
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = sdpa(q, k, v, is_causal=(cache is None or T > 1))
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
            return sdpa(q, K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1), is_causal=True)
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


def train(args, shape):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Decoder(**shape)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, shape["vocab"], (args.batch, args.seq))
    pos = torch.arange(args.seq)[None].expand(args.batch, -1)
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            logits = model.logits(model.hidden_states(tokens, pos)[:, :-1])
        logp = torch.log_softmax(logits.float(), -1)
        lp = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        loss = -lp.mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    per_step = sum(times) / len(times)
    print(json.dumps(dict(peer="pytorch " + torch.__version__ + (" bf16 autocast" if args.autocast == "bf16" else " fp32"),
                          mode="train", shape=args.shape, batch=args.batch,
                          seq=args.seq, seconds_per_step=per_step, tokens_per_s=args.batch * args.seq / per_step,
                          best_tokens_per_s=args.batch * args.seq / min(times),
                          peak_rss_mib=peak_rss_mib(), threads=torch.get_num_threads())))


@torch.no_grad()
def generate(args, shape):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Decoder(**shape).eval()
    prompt = torch.randint(0, shape["vocab"], (args.rows, args.prompt))
    def new_cache():
        if args.cache == "cat":   # the way Hugging Face's DynamicCache grows: torch.cat every step
            return dict()
        shape = (args.rows, model.nkv, args.prompt + args.new, model.d)
        return dict(K=torch.empty(shape), V=torch.empty(shape), n=0)
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
    run() if args.warmup else None
    t0 = time.perf_counter()
    tokens = run()
    dt = time.perf_counter() - t0
    print(json.dumps(dict(peer="pytorch " + torch.__version__, mode="generate", shape=args.shape, rows=args.rows,
                          prompt=args.prompt, new=args.new, cache=args.cache, seconds=dt,
                          tokens_per_s=args.rows * args.new / dt, tokens_checksum=int((tokens * torch.arange(1, tokens.numel() + 1).view_as(tokens)).sum()),
                          peak_rss_mib=peak_rss_mib(), threads=torch.get_num_threads())))


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
    ap.add_argument("--cache", default="static", choices=["static", "cat"])
    ap.add_argument("--autocast", default="none", choices=["none", "bf16"],
                    help="train: forward under torch.autocast(cpu, bfloat16); log-softmax and loss in fp32")
    a = ap.parse_args()
    (train if a.mode == "train" else generate)(a, SHAPES[a.shape])
