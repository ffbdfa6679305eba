# bench_torch.py: the PyTorch peer of tests/gpu/bench_ops.c, on the same GPU in the same run: the
# same shapes and dtypes, F.linear for the GEMMs and scaled_dot_product_attention (causal, GQA) for
# attention. Prints lines in bench_ops.c's format. A benchmark, not a test.
import time
import torch
import torch.nn.functional as F

def bench(label, flops, reps, fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / reps
    print(f"bench torch {label:<44} {ms:9.3f} ms {flops / (ms * 1e-3) / 1e12:8.1f} TFLOP/s", flush=True)

def main():
    dev = torch.device("cuda")
    print(f"bench torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    N, C, Fd, B, T, H, KV, D = 16 * 1024, 1536, 8960, 16, 1024, 12, 2, 128
    x = torch.randn(N, C, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(Fd, C, device=dev, dtype=torch.bfloat16, requires_grad=True)
    mm = 2.0 * N * C * Fd
    bench("matmul_fwd bf16 [16384,1536]x[8960,1536]^T", mm, 10, lambda: F.linear(x, w))
    y = F.linear(x, w)
    g = torch.randn_like(y)
    bench("matmul_bwd bf16 (dinp + dweight)", 2 * mm, 10,
          lambda: torch.autograd.grad(y, (x, w), g, retain_graph=True))
    del x, w, y, g
    q = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, KV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    att = 2.0 * B * T * T * H * D
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    bench("attention_fwd bf16 B=16 T=1024 H=12 KV=2 D=128", att, 5, sdpa)
    o = sdpa()
    do = torch.randn_like(o)
    bench("attention_bwd bf16 B=16 T=1024 H=12 KV=2 D=128", 2.5 * att, 3,
          lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    print(f"bench torch peak device memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")

if __name__ == "__main__":
    main()
