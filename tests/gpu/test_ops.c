#include <math.h>
/* test_ops.c: every CUDA op against the CPU op on the same random inputs, forward and backward, in
 * f32 (<= 1e-5 normalised error; cuBLAS with TF32 off) and bf16 (<= 2e-2: the CPU runs in f32 on
 * the bf16-rounded inputs), with sentinel guards around every device output, and two runs of each
 * backward compared bit for bit. Skips (exit 77) without a CUDA device. */
#include "gpu.h"
#include "ops/engine_ops.h"

static int32_t dt;   /* the dtype under test: RX_F32 or RX_BF16 */

/* A random CPU input, rounded through the dtype under test, and its device copy. */
typedef struct { rx_tensor *c, *g; } pair;
static pair input(int32_t ndim, const int64_t *shape, uint64_t seed, double lo, double hi) {
  pair p;
  p.c = cpu_uniform(ndim, shape, seed, lo, hi);
  cpu_round_through(p.c, dt);
  p.g = to_gpu(p.c, dt);
  return p;
}
static pair input_f32(int32_t ndim, const int64_t *shape, uint64_t seed, double lo, double hi) {
  pair p;
  p.c = cpu_uniform(ndim, shape, seed, lo, hi);
  p.g = to_gpu(p.c, RX_F32);
  return p;
}
static void pair_free(pair p) { rx_tensor_free(p.c); rx_tensor_free(p.g); }

static rx_tensor *cpu_zeros(int32_t ndim, const int64_t *shape) {
  rx_tensor *t;
  gpu_must(rx_tensor_new(&t, RX_F32, RX_CPU, ndim, shape), NULL);
  return t;
}

static rx_tensor *cpu_i32(int64_t n, const int32_t *v) {
  rx_tensor *t;
  gpu_must(rx_tensor_new(&t, RX_I32, RX_CPU, 1, &n), NULL);
  memcpy(t->data, v, (size_t)n * sizeof(int32_t));
  return t;
}

/* Compares device output g with CPU output c and checks g's guards; frees g. */
#define EXPECT_CLOSE(g, c, tol, what)                                                          \
  do {                                                                                         \
    double e_ = gpu_nrmse((g).t, (c));                                                         \
    CHECK(e_ <= (tol), "%s (%s): normalised error %.3g > %.1g", what, rx_dtype_name(dt), e_, (tol)); \
    CHECK(gpu_guarded_free(g), "%s (%s): a write outside the output", what, rx_dtype_name(dt)); \
  } while (0)

static void test_add(void) {
  int64_t s[2] = {37, 129};
  pair a = input(2, s, 1, -2, 2), b = input(2, s, 2, -2, 2);
  rx_tensor *c = cpu_zeros(2, s);
  gpu_guarded g = gpu_guarded_new(dt, 2, s, NULL);
  CHECK_OK(rx_add(c, a.c, b.c));
  CHECK_OK(rx_add(g.t, a.g, b.g));
  EXPECT_CLOSE(g, c, gpu_tol(dt), "add");
  CHECK_OK(rx_add(a.g, a.g, b.g));   /* out aliasing a */
  CHECK(gpu_nrmse(a.g, c) <= gpu_tol(dt), "add in place");
  pair_free(a); pair_free(b); rx_tensor_free(c);
}

/* x *= s in the dtype under test (clipping in f32; LoRA's alpha / r on bf16 activations) */
static void test_scale(void) {
  int64_t s[2] = {23, 301};
  pair x = input(2, s, 12, -3, 3);
  CHECK_OK(rx_scale(x.c, 0.37));
  CHECK_OK(rx_scale(x.g, 0.37));
  const double e = gpu_nrmse(x.g, x.c);
  CHECK(e <= (dt == RX_F32 ? 0 : gpu_tol(dt)), "scale (%s): normalised error %.3g", rx_dtype_name(dt), e);
  pair_free(x);
}

/* LoRA's dropout from the same f32 draws: xd = x * f and dy *= f, f = u >= p ? 1/(1-p) : 0 */
static void test_dropout(void) {
  int64_t s[2] = {29, 133};
  pair x = input(2, s, 21, -2, 2), dy = input(2, s, 22, -1, 1), u = input_f32(2, s, 23, 0, 1);
  rx_tensor *xd = cpu_zeros(2, s);
  gpu_guarded g = gpu_guarded_new(dt, 2, s, NULL);
  CHECK_OK(rx_dropout_apply(xd, x.c, u.c, 0.3, dy.c));
  CHECK_OK(rx_dropout_apply(g.t, x.g, u.g, 0.3, dy.g));
  int64_t dropped = 0;
  const float *xc = xd->data;
  for (int64_t i = 0; i < xd->numel; i++) dropped += xc[i] == 0;
  CHECK(dropped > xd->numel / 5 && dropped < xd->numel * 2 / 5, "dropout: %lld of %lld dropped at p = 0.3",
        (long long)dropped, (long long)xd->numel);
  CHECK(gpu_nrmse(dy.g, dy.c) <= (dt == RX_F32 ? 0 : gpu_tol(dt)), "dropout dy (%s)", rx_dtype_name(dt));
  EXPECT_CLOSE(g, xd, dt == RX_F32 ? 0 : gpu_tol(dt), "dropout");
  CHECK_FAILS(rx_dropout_apply(xd, x.c, u.c, 1.0, NULL), "p = 1 must be in [0, 1)");
  pair_free(x); pair_free(dy); pair_free(u); rx_tensor_free(xd);
}

static void test_swiglu(void) {
  int64_t s[2] = {19, 300};
  pair gate = input(2, s, 3, -6, 6), up = input(2, s, 4, -2, 2), dout = input(2, s, 5, -1, 1);
  rx_tensor *c = cpu_zeros(2, s), *dg = cpu_zeros(2, s), *du = cpu_zeros(2, s);
  gpu_guarded g = gpu_guarded_new(dt, 2, s, NULL), gdg = gpu_guarded_new(dt, 2, s, NULL), gdu = gpu_guarded_new(dt, 2, s, NULL);
  CHECK_OK(rx_swiglu_forward(c, gate.c, up.c));
  CHECK_OK(rx_swiglu_forward(g.t, gate.g, up.g));
  CHECK_OK(rx_swiglu_backward(dg, du, dout.c, gate.c, up.c));
  CHECK_OK(rx_swiglu_backward(gdg.t, gdu.t, dout.g, gate.g, up.g));
  EXPECT_CLOSE(g, c, gpu_tol(dt), "swiglu");
  EXPECT_CLOSE(gdg, dg, gpu_tol(dt), "swiglu dgate");
  EXPECT_CLOSE(gdu, du, gpu_tol(dt), "swiglu dup");
  pair_free(gate); pair_free(up); pair_free(dout);
  rx_tensor_free(c); rx_tensor_free(dg); rx_tensor_free(du);
}

static void test_rmsnorm(void) {
  int64_t s[2] = {23, 1000}, sc[1] = {1000}, sn[1] = {23};
  pair x = input(2, s, 6, -3, 3), w = input(1, sc, 7, 0.5, 1.5), dy = input(2, s, 8, -1, 1);
  pair dw0 = input_f32(1, sc, 9, -1, 1);   /* dweight accumulates: start from random values */
  rx_tensor *y = cpu_zeros(2, s), *rstd = cpu_zeros(1, sn), *dx = cpu_zeros(2, s);
  gpu_guarded gy = gpu_guarded_new(dt, 2, s, NULL), grstd = gpu_guarded_new(RX_F32, 1, sn, NULL);
  gpu_guarded gdx = gpu_guarded_new(dt, 2, s, NULL), gdw = gpu_guarded_new(RX_F32, 1, sc, dw0.c);
  CHECK_OK(rx_rmsnorm_forward(y, rstd, x.c, w.c, 1e-6));
  CHECK_OK(rx_rmsnorm_forward(gy.t, grstd.t, x.g, w.g, 1e-6));
  CHECK_OK(rx_rmsnorm_backward(dx, dw0.c, dy.c, x.c, w.c, rstd));
  CHECK_OK(rx_rmsnorm_backward(gdx.t, gdw.t, dy.g, x.g, w.g, grstd.t));
  EXPECT_CLOSE(gy, y, gpu_tol(dt), "rmsnorm");
  EXPECT_CLOSE(grstd, rstd, 1e-5, "rmsnorm rstd");
  EXPECT_CLOSE(gdx, dx, gpu_tol(dt), "rmsnorm dinp");
  EXPECT_CLOSE(gdw, dw0.c, dt == RX_BF16 ? 2e-2 : 1e-5, "rmsnorm dweight");
  /* statistics stay f32 on the device: a bf16 rstd is refused, naming the dtype wanted */
  if (dt == RX_BF16) {
    rx_tensor *bad;
    gpu_must(rx_tensor_new(&bad, RX_BF16, RX_CUDA, 1, sn), NULL);
    CHECK_FAILS(rx_rmsnorm_forward(x.g, bad, x.g, w.g, 1e-6), "expected f32");
    rx_tensor_free(bad);
  }
  pair_free(x); pair_free(w); pair_free(dy); pair_free(dw0);
  rx_tensor_free(y); rx_tensor_free(rstd); rx_tensor_free(dx);
}

/* The backward in place, as the model runs it: dinp is dout's memory. The column sums of dweight
 * read dout, so they must run before dinp overwrites it. */
static void test_rmsnorm_in_place(void) {
  int64_t s[2] = {37, 300}, sc[1] = {300}, sn[1] = {37};
  pair x = input(2, s, 60, -3, 3), w = input(1, sc, 61, 0.5, 1.5), dy = input(2, s, 62, -1, 1);
  pair dw0 = input_f32(1, sc, 63, -1, 1);
  rx_tensor *y = cpu_zeros(2, s), *rstd = cpu_zeros(1, sn), *dx = cpu_zeros(2, s), *grstd;
  gpu_must(rx_tensor_new(&grstd, RX_F32, RX_CUDA, 1, sn), NULL);
  gpu_guarded gdw = gpu_guarded_new(RX_F32, 1, sc, dw0.c);
  CHECK_OK(rx_rmsnorm_forward(y, rstd, x.c, w.c, 1e-6));
  CHECK_OK(rx_rmsnorm_backward(dx, dw0.c, dy.c, x.c, w.c, rstd));   /* the reference, out of place */
  CHECK_OK(rx_tensor_copy(grstd, rstd));
  CHECK_OK(rx_rmsnorm_backward(dy.g, gdw.t, dy.g, x.g, w.g, grstd));
  CHECK(gpu_nrmse(dy.g, dx) <= gpu_tol(dt), "rmsnorm dinp in place (dinp == dout): error %.3g", gpu_nrmse(dy.g, dx));
  EXPECT_CLOSE(gdw, dw0.c, gpu_tol(dt), "rmsnorm dweight with dinp == dout");
  pair_free(x); pair_free(w); pair_free(dy); pair_free(dw0);
  rx_tensor_free(y); rx_tensor_free(rstd); rx_tensor_free(dx); rx_tensor_free(grstd);
}

static void test_rope(void) {
  int64_t s[4] = {2, 17, 3, 64};
  int32_t pos[34];
  for (int i = 0; i < 34; i++) pos[i] = (i * 977) % 5000;
  rx_tensor *pc = cpu_i32(34, pos), *pg = to_gpu(pc, RX_I32);
  pair x = input(4, s, 10, -2, 2);
  rx_tensor *y = cpu_zeros(4, s), *dx = cpu_zeros(4, s);
  gpu_guarded gy = gpu_guarded_new(dt, 4, s, NULL), gdx = gpu_guarded_new(dt, 4, s, NULL);
  CHECK_OK(rx_rope_forward(y, x.c, pc, 1e6));
  CHECK_OK(rx_rope_forward(gy.t, x.g, pg, 1e6));
  CHECK_OK(rx_rope_backward(dx, x.c, pc, 1e6));
  CHECK_OK(rx_rope_backward(gdx.t, x.g, pg, 1e6));
  EXPECT_CLOSE(gy, y, gpu_tol(dt), "rope");
  EXPECT_CLOSE(gdx, dx, gpu_tol(dt), "rope backward");
  /* frequencies of a scaled rope (as Llama 3.1's rope_scaling makes them): no longer theta^(-2i/D) */
  double inv_freq[32];
  for (int i = 0; i < 32; i++) inv_freq[i] = (i % 3 == 0 ? 0.125 : 1.0) * pow(5e5, -2.0 * i / 64.0);
  gy = gpu_guarded_new(dt, 4, s, NULL);   /* EXPECT_CLOSE freed the first ones */
  gdx = gpu_guarded_new(dt, 4, s, NULL);
  CHECK_OK(rx_rope_forward_freq(y, x.c, pc, inv_freq));
  CHECK_OK(rx_rope_forward_freq(gy.t, x.g, pg, inv_freq));
  CHECK_OK(rx_rope_backward_freq(dx, x.c, pc, inv_freq));
  CHECK_OK(rx_rope_backward_freq(gdx.t, x.g, pg, inv_freq));
  EXPECT_CLOSE(gy, y, gpu_tol(dt), "rope with scaled frequencies");
  EXPECT_CLOSE(gdx, dx, gpu_tol(dt), "rope backward with scaled frequencies");
  pair_free(x); rx_tensor_free(y); rx_tensor_free(dx); rx_tensor_free(pc); rx_tensor_free(pg);
}

static void test_embedding(void) {
  enum { N = 300, V = 50, C = 96 };
  int64_t sw[2] = {V, C}, so[2] = {N, C};
  int32_t tok[N];
  for (int i = 0; i < N; i++) tok[i] = (i * 7 + i / 3) % V;   /* many repeats */
  rx_tensor *tc = cpu_i32(N, tok), *tg = to_gpu(tc, RX_I32);
  pair w = input(2, sw, 11, -1, 1), dy = input(2, so, 12, -1, 1), dw = input_f32(2, sw, 13, -1, 1);
  rx_tensor *y = cpu_zeros(2, so);
  gpu_guarded gy = gpu_guarded_new(dt, 2, so, NULL), gdw = gpu_guarded_new(RX_F32, 2, sw, dw.c);
  CHECK_OK(rx_embedding_forward(y, tc, w.c));
  CHECK_OK(rx_embedding_forward(gy.t, tg, w.g));
  CHECK_OK(rx_embedding_backward(dw.c, dy.c, tc));
  CHECK_OK(rx_embedding_backward(gdw.t, dy.g, tg));
  EXPECT_CLOSE(gy, y, 0.0, "embedding");   /* a gather of the same (rounded) values: exact */
  EXPECT_CLOSE(gdw, dw.c, dt == RX_BF16 ? 2e-2 : 1e-5, "embedding dweight");
  /* a token out of range on the device: the error names it and its row */
  tok[123] = V + 5;
  rx_tensor *bc = cpu_i32(N, tok), *bg = to_gpu(bc, RX_I32);
  rx_tensor *out;
  gpu_must(rx_tensor_new(&out, dt, RX_CUDA, 2, so), NULL);
  CHECK_FAILS(rx_embedding_forward(out, bg, w.g), "token 55 at row 123");
  rx_tensor_free(out); rx_tensor_free(bc); rx_tensor_free(bg);
  pair_free(w); pair_free(dy); pair_free(dw); rx_tensor_free(y); rx_tensor_free(tc); rx_tensor_free(tg);
}

static void test_matmul(void) {
  enum { N = 67, C = 200, OC = 130 };
  int64_t sx[2] = {N, C}, sw[2] = {OC, C}, sy[2] = {N, OC}, sb[1] = {OC};
  pair x = input(2, sx, 14, -1, 1), w = input(2, sw, 15, -1, 1), b = input(1, sb, 16, -1, 1), dy = input(2, sy, 17, -1, 1);
  pair dw = input_f32(2, sw, 18, -1, 1), db = input_f32(1, sb, 19, -1, 1);
  rx_tensor *y = cpu_zeros(2, sy), *y0 = cpu_zeros(2, sy), *dx = cpu_zeros(2, sx);
  gpu_guarded gy = gpu_guarded_new(dt, 2, sy, NULL), gy0 = gpu_guarded_new(dt, 2, sy, NULL);
  gpu_guarded gdx = gpu_guarded_new(dt, 2, sx, NULL), gdw = gpu_guarded_new(RX_F32, 2, sw, dw.c);
  gpu_guarded gdb = gpu_guarded_new(RX_F32, 1, sb, db.c);
  CHECK_OK(rx_matmul_forward(y, x.c, w.c, b.c));
  CHECK_OK(rx_matmul_forward(gy.t, x.g, w.g, b.g));
  CHECK_OK(rx_matmul_forward(y0, x.c, w.c, NULL));
  CHECK_OK(rx_matmul_forward(gy0.t, x.g, w.g, NULL));
  CHECK_OK(rx_matmul_backward(dx, dw.c, db.c, dy.c, x.c, w.c));
  CHECK_OK(rx_matmul_backward(gdx.t, gdw.t, gdb.t, dy.g, x.g, w.g));
  EXPECT_CLOSE(gy, y, gpu_tol(dt), "matmul");
  EXPECT_CLOSE(gy0, y0, gpu_tol(dt), "matmul without bias");
  EXPECT_CLOSE(gdx, dx, gpu_tol(dt), "matmul dinp");
  EXPECT_CLOSE(gdw, dw.c, gpu_tol(dt), "matmul dweight");
  EXPECT_CLOSE(gdb, db.c, gpu_tol(dt), "matmul dbias");
  /* determinism: the same backward twice gives the same bits */
  rx_tensor *w1, *w2;
  gpu_must(rx_tensor_new(&w1, RX_F32, RX_CUDA, 2, sw), NULL);
  gpu_must(rx_tensor_new(&w2, RX_F32, RX_CUDA, 2, sw), NULL);
  CHECK_OK(rx_matmul_backward(NULL, w1, NULL, dy.g, x.g, w.g));
  CHECK_OK(rx_matmul_backward(NULL, w2, NULL, dy.g, x.g, w.g));
  CHECK(gpu_same_bits(w1, w2), "matmul dweight differs between two runs");
  rx_tensor_free(w1); rx_tensor_free(w2);
  pair_free(x); pair_free(w); pair_free(b); pair_free(dy); pair_free(dw); pair_free(db);
  rx_tensor_free(y); rx_tensor_free(y0); rx_tensor_free(dx);
}

/* A layer with no inputs (C = 0) still adds its bias: out = bias on every row. */
static void test_matmul_without_inputs(void) {
  int64_t sx[2] = {5, 0}, sw[2] = {7, 0}, sy[2] = {5, 7}, sb[1] = {7};
  pair x = input(2, sx, 70, -1, 1), w = input(2, sw, 71, -1, 1), b = input(1, sb, 72, -1, 1);
  rx_tensor *y = cpu_zeros(2, sy);
  gpu_guarded gy = gpu_guarded_new(dt, 2, sy, NULL);
  CHECK_OK(rx_matmul_forward(y, x.c, w.c, b.c));
  CHECK_OK(rx_matmul_forward(gy.t, x.g, w.g, b.g));
  CHECK(((float *)y->data)[7 + 3] == ((float *)b.c->data)[3], "the CPU reference lost the bias");
  EXPECT_CLOSE(gy, y, 0.0, "matmul with C = 0 and a bias");
  pair_free(x); pair_free(w); pair_free(b); rx_tensor_free(y);
}

/* dbias sums more rows than the column sums' 1024 row chunks of 128 hold (N > 131072): each
 * thread then walks more than its first stretch of rows. */
static void test_matmul_dbias_many_rows(void) {
  enum { N = 140001, C = 2, OC = 3 };
  int64_t sx[2] = {N, C}, sw[2] = {OC, C}, sy[2] = {N, OC}, sb[1] = {OC};
  pair x = input(2, sx, 73, -1, 1), w = input(2, sw, 74, -1, 1), dy = input(2, sy, 75, -1, 1);
  pair db = input_f32(1, sb, 76, -1, 1);
  gpu_guarded gdb = gpu_guarded_new(RX_F32, 1, sb, db.c);
  CHECK_OK(rx_matmul_backward(NULL, NULL, db.c, dy.c, x.c, w.c));
  CHECK_OK(rx_matmul_backward(NULL, NULL, gdb.t, dy.g, x.g, w.g));
  EXPECT_CLOSE(gdb, db.c, 1e-5, "matmul dbias over 140001 rows");
  pair_free(x); pair_free(w); pair_free(dy); pair_free(db);
}

/* rx_logprob_forward and _backward on the device against the CPU: logits [N, V] uniform in
 * [-range, range] (seed), the gradient of the log-probabilities uniform in [-1, 1] (seed + 1),
 * targets tg (-1: a padding row); `at` ends each message. With in_place the backward also runs
 * with dlogits == logits, as the chunked head runs it. */
static void check_logprob(int64_t N, int64_t V, const int32_t *tg, double range, uint64_t seed, const char *at, int in_place) {
  int64_t sl[2] = {N, V}, sn[1] = {N};
  rx_tensor *tc = cpu_i32(N, tg), *tgd = to_gpu(tc, RX_I32);
  pair x = input(2, sl, seed, -range, range), dlp = input_f32(1, sn, seed + 1, -1, 1);
  rx_tensor *lp = cpu_zeros(1, sn), *lse = cpu_zeros(1, sn), *ent = cpu_zeros(1, sn), *dx = cpu_zeros(2, sl);
  gpu_guarded glp = gpu_guarded_new(RX_F32, 1, sn, NULL), glse = gpu_guarded_new(RX_F32, 1, sn, NULL);
  gpu_guarded gent = gpu_guarded_new(RX_F32, 1, sn, NULL), gdx = gpu_guarded_new(dt, 2, sl, NULL);
  CHECK_OK(rx_logprob_forward(lp, lse, ent, x.c, tc));
  CHECK_OK(rx_logprob_forward(glp.t, glse.t, gent.t, x.g, tgd));
  CHECK_OK(rx_logprob_backward(dx, dlp.c, x.c, tc, lse));
  CHECK_OK(rx_logprob_backward(gdx.t, dlp.g, x.g, tgd, glse.t));
  if (in_place) {
    rx_tensor *xl = to_gpu(x.c, dt);
    CHECK_OK(rx_logprob_backward(xl, dlp.g, xl, tgd, glse.t));
    CHECK(gpu_nrmse(xl, dx) <= gpu_tol(dt), "logprob backward in place%s", at);
    rx_tensor_free(xl);
  }
  char what[4][96];
  snprintf(what[0], sizeof what[0], "logprob%s", at);
  snprintf(what[1], sizeof what[1], "logprob lse%s", at);
  snprintf(what[2], sizeof what[2], "logprob entropy%s", at);
  snprintf(what[3], sizeof what[3], "logprob dlogits%s", at);
  EXPECT_CLOSE(glp, lp, 1e-5, what[0]);
  EXPECT_CLOSE(glse, lse, 1e-5, what[1]);
  EXPECT_CLOSE(gent, ent, 1e-5, what[2]);
  EXPECT_CLOSE(gdx, dx, gpu_tol(dt), what[3]);
  pair_free(x); pair_free(dlp);
  rx_tensor_free(lp); rx_tensor_free(lse); rx_tensor_free(ent); rx_tensor_free(dx); rx_tensor_free(tc); rx_tensor_free(tgd);
}

static void test_logprob(void) {
  enum { N = 29, V = 3001 };
  int64_t sl[2] = {N, V}, sn[1] = {N};
  int32_t tg[N];
  for (int i = 0; i < N; i++) tg[i] = i % 7 == 3 ? -1 : (i * 419) % V;   /* some padding rows */
  check_logprob(N, V, tg, 8, 20, "", 1);
  /* a target outside the vocabulary is refused, naming it and its row */
  pair x = input(2, sl, 20, -8, 8);
  tg[5] = V;
  rx_tensor *bc = cpu_i32(N, tg), *bg = to_gpu(bc, RX_I32);
  rx_tensor *o;
  gpu_must(rx_tensor_new(&o, RX_F32, RX_CUDA, 1, sn), NULL);
  CHECK_FAILS(rx_logprob_forward(o, NULL, NULL, x.g, bg), "target 3001 at row 5");
  rx_tensor_free(o); rx_tensor_free(bc); rx_tensor_free(bg);
  pair_free(x);
}

/* The head at Qwen2's vocabulary (151936): a row is longer than a block's threads cover 296 times. */
static void test_logprob_large_vocab(void) {
  enum { N = 3, V = 151936 };
  const int32_t tg[N] = {0, V - 1, 77777};
  check_logprob(N, V, tg, 12, 77, " at V = 151936", 0);
}

/* One attention case: q [B,Tq,H,D], k/v [B,Tk,KV,D] as views of a cache of Tcache >= Tk rows when
 * Tcache > Tk (batch stride larger than one entry), mask with `pad` left-padded keys in batch row 1. */
static void attention_case(int64_t B, int64_t Tq, int64_t Tk, int64_t Tcache, int64_t H, int64_t KV, int64_t D, int pad) {
  char what[120];
  snprintf(what, sizeof what, "attention B=%lld Tq=%lld Tk=%lld H=%lld KV=%lld D=%lld pad=%d", (long long)B,
           (long long)Tq, (long long)Tk, (long long)H, (long long)KV, (long long)D, pad);
  int64_t sq[4] = {B, Tq, H, D}, sc[4] = {B, Tcache, KV, D}, skv[4] = {B, Tk, KV, D}, sl[3] = {B, H, Tq}, sm[2] = {B, Tk};
  pair q = input(4, sq, 30 + D, -1, 1), kc = input(4, sc, 31 + D, -1, 1), vc = input(4, sc, 32 + D, -1, 1);
  pair dout = input(4, sq, 33 + D, -1, 1);
  rx_tensor *kcv, *vcv, *kgv, *vgv;   /* views [B, Tk, KV, D] of the caches */
  gpu_must(rx_tensor_narrow(&kcv, kc.c, 1, 0, Tk), NULL);
  gpu_must(rx_tensor_narrow(&vcv, vc.c, 1, 0, Tk), NULL);
  gpu_must(rx_tensor_narrow(&kgv, kc.g, 1, 0, Tk), NULL);
  gpu_must(rx_tensor_narrow(&vgv, vc.g, 1, 0, Tk), NULL);
  int32_t *m = malloc((size_t)(B * Tk) * sizeof(int32_t));
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < Tk; s++) m[b * Tk + s] = !(b == 1 && s < pad);
  rx_tensor *mc, *mg;
  gpu_must(rx_tensor_new(&mc, RX_I32, RX_CPU, 2, sm), NULL);
  memcpy(mc->data, m, (size_t)(B * Tk) * sizeof(int32_t));
  mg = to_gpu(mc, RX_I32);
  rx_tensor *out = cpu_zeros(4, sq), *lse = cpu_zeros(3, sl), *dq = cpu_zeros(4, sq), *dk = cpu_zeros(4, skv),
            *dv = cpu_zeros(4, skv);
  gpu_guarded gout = gpu_guarded_new(dt, 4, sq, NULL), glse = gpu_guarded_new(RX_F32, 3, sl, NULL);
  gpu_guarded gdq = gpu_guarded_new(dt, 4, sq, NULL), gdk = gpu_guarded_new(dt, 4, skv, NULL),
              gdv = gpu_guarded_new(dt, 4, skv, NULL);
  const rx_tensor *mask_c = pad ? mc : NULL, *mask_g = pad ? mg : NULL;
  CHECK_OK(rx_attention_forward(out, lse, q.c, kcv, vcv, mask_c, 0));
  CHECK_OK(rx_attention_forward(gout.t, glse.t, q.g, kgv, vgv, mask_g, 0));
  /* the backward's reference runs on the CPU outputs; the device on its own */
  CHECK_OK(rx_attention_backward(dq, dk, dv, dout.c, q.c, kcv, vcv, out, lse, mask_c, 0));
  CHECK_OK(rx_attention_backward(gdq.t, gdk.t, gdv.t, dout.g, q.g, kgv, vgv, gout.t, glse.t, mask_g, 0));
  double tol = gpu_tol(dt);
  snprintf(what + strlen(what), sizeof what - strlen(what), ": out");
  EXPECT_CLOSE(gout, out, tol, what);
  EXPECT_CLOSE(glse, lse, dt == RX_BF16 ? 2e-2 : 1e-5, "attention lse");
  EXPECT_CLOSE(gdq, dq, tol, "attention dq");
  EXPECT_CLOSE(gdk, dk, tol, "attention dk");
  EXPECT_CLOSE(gdv, dv, tol, "attention dv");
  free(m);
  rx_tensor_free(kcv); rx_tensor_free(vcv); rx_tensor_free(kgv); rx_tensor_free(vgv);
  rx_tensor_free(mc); rx_tensor_free(mg);
  rx_tensor_free(out); rx_tensor_free(lse); rx_tensor_free(dq); rx_tensor_free(dk); rx_tensor_free(dv);
  pair_free(q); pair_free(kc); pair_free(vc); pair_free(dout);
}

static void test_attention(void) {
  attention_case(2, 37, 37, 37, 4, 2, 16, 0);      /* GQA, D < 32 */
  attention_case(2, 70, 70, 70, 2, 1, 64, 5);      /* MQA, left padding in row 1 */
  attention_case(1, 130, 130, 130, 4, 4, 128, 0);  /* plain MHA, D = 128 (Qwen2.5) */
  attention_case(2, 33, 33, 33, 6, 2, 80, 3);      /* D not a multiple of 32 */
  attention_case(2, 9, 40, 48, 4, 2, 64, 7);       /* decoding-style: Tq < Tk, strided cache views */
  attention_case(1, 20, 20, 20, 2, 1, 256, 0);     /* the largest head dim */
}

/* Packed rows (cu_seqlens) on the device against the CPU: rows of several lengths end to end in
 * q [1,N,H,D], including rows shorter than a block's queries and rows crossing blocks. */
static void attention_packed_case(const int32_t *len, int64_t S, int64_t H, int64_t KV, int64_t D) {
  char what[120];
  int64_t N = 0;
  for (int64_t r = 0; r < S; r++) N += len[r];
  snprintf(what, sizeof what, "packed attention S=%lld N=%lld H=%lld KV=%lld D=%lld", (long long)S, (long long)N,
           (long long)H, (long long)KV, (long long)D);
  int64_t sq[4] = {1, N, H, D}, skv[4] = {1, N, KV, D}, sl[3] = {1, H, N};
  pair q = input(4, sq, 60 + D, -1, 1), k = input(4, skv, 61 + D, -1, 1), v = input(4, skv, 62 + D, -1, 1);
  pair dout = input(4, sq, 63 + D, -1, 1);
  int32_t *cu = malloc((size_t)(S + 1) * sizeof(int32_t));
  cu[0] = 0;
  for (int64_t r = 0; r < S; r++) cu[r + 1] = cu[r] + len[r];
  rx_tensor *cc = cpu_i32(S + 1, cu), *cg = to_gpu(cc, RX_I32);
  rx_tensor *out = cpu_zeros(4, sq), *lse = cpu_zeros(3, sl), *dq = cpu_zeros(4, sq), *dk = cpu_zeros(4, skv),
            *dv = cpu_zeros(4, skv);
  gpu_guarded gout = gpu_guarded_new(dt, 4, sq, NULL), glse = gpu_guarded_new(RX_F32, 3, sl, NULL);
  gpu_guarded gdq = gpu_guarded_new(dt, 4, sq, NULL), gdk = gpu_guarded_new(dt, 4, skv, NULL),
              gdv = gpu_guarded_new(dt, 4, skv, NULL);
  CHECK_OK(rx_attention_forward_seq(out, lse, q.c, k.c, v.c, NULL, cc, 0));
  CHECK_OK(rx_attention_forward_seq(gout.t, glse.t, q.g, k.g, v.g, NULL, cg, 0));
  CHECK_OK(rx_attention_backward_seq(dq, dk, dv, dout.c, q.c, k.c, v.c, out, lse, NULL, cc, 0));
  CHECK_OK(rx_attention_backward_seq(gdq.t, gdk.t, gdv.t, dout.g, q.g, k.g, v.g, gout.t, glse.t, NULL, cg, 0));
  double tol = gpu_tol(dt);
  snprintf(what + strlen(what), sizeof what - strlen(what), ": out");
  EXPECT_CLOSE(gout, out, tol, what);
  EXPECT_CLOSE(glse, lse, dt == RX_BF16 ? 2e-2 : 1e-5, "packed attention lse");
  EXPECT_CLOSE(gdq, dq, tol, "packed attention dq");
  EXPECT_CLOSE(gdk, dk, tol, "packed attention dk");
  EXPECT_CLOSE(gdv, dv, tol, "packed attention dv");
  free(cu);
  rx_tensor_free(cc); rx_tensor_free(cg);
  rx_tensor_free(out); rx_tensor_free(lse); rx_tensor_free(dq); rx_tensor_free(dk); rx_tensor_free(dv);
  pair_free(q); pair_free(k); pair_free(v); pair_free(dout);
}

static void test_attention_packed(void) {
  const int32_t a[] = {5, 1, 40, 3, 17}, b[] = {33, 2, 50};
  attention_packed_case(a, 5, 4, 2, 16);   /* GQA, rows shorter than a block's 16 queries */
  attention_packed_case(b, 3, 2, 1, 64);   /* MQA, rows crossing blocks */
}

static void test_attention_determinism(void) {
  int64_t sq[4] = {2, 96, 4, 64}, skv[4] = {2, 96, 2, 64}, sl[3] = {2, 4, 96};
  pair q = input(4, sq, 40, -1, 1), k = input(4, skv, 41, -1, 1), v = input(4, skv, 42, -1, 1), dout = input(4, sq, 43, -1, 1);
  rx_tensor *out, *lse, *g[6];
  gpu_must(rx_tensor_new(&out, dt, RX_CUDA, 4, sq), NULL);
  gpu_must(rx_tensor_new(&lse, RX_F32, RX_CUDA, 3, sl), NULL);
  for (int i = 0; i < 6; i++) gpu_must(rx_tensor_new(&g[i], dt, RX_CUDA, 4, i % 3 == 0 ? sq : skv), NULL);
  CHECK_OK(rx_attention_forward(out, lse, q.g, k.g, v.g, NULL, 0));
  CHECK_OK(rx_attention_backward(g[0], g[1], g[2], dout.g, q.g, k.g, v.g, out, lse, NULL, 0));
  CHECK_OK(rx_attention_backward(g[3], g[4], g[5], dout.g, q.g, k.g, v.g, out, lse, NULL, 0));
  CHECK(gpu_same_bits(g[0], g[3]) && gpu_same_bits(g[1], g[4]) && gpu_same_bits(g[2], g[5]),
        "attention gradients differ between two runs");
  for (int i = 0; i < 6; i++) rx_tensor_free(g[i]);
  rx_tensor_free(out); rx_tensor_free(lse);
  pair_free(q); pair_free(k); pair_free(v); pair_free(dout);
}

static void test_adamw_and_norm(void) {
  int64_t s1[1] = {10007}, s2[2] = {33, 65};
  pair p = input_f32(1, s1, 50, -1, 1), gr = input_f32(1, s1, 51, -1, 1), m = input_f32(1, s1, 52, -0.1, 0.1);
  pair v = input_f32(1, s1, 53, 0, 0.1), g2 = input_f32(2, s2, 54, -3, 3);
  rx_adamw_config cfg = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 3};
  CHECK_OK(rx_adamw_step(p.c, gr.c, m.c, v.c, &cfg, 1));
  CHECK_OK(rx_adamw_step(p.g, gr.g, m.g, v.g, &cfg, 1));
  CHECK(gpu_nrmse(p.g, p.c) <= 1e-6, "adamw param");
  CHECK(gpu_nrmse(m.g, m.c) <= 1e-6, "adamw m");
  CHECK(gpu_nrmse(v.g, v.c) <= 1e-6, "adamw v");
  const rx_tensor *gc[2] = {gr.c, g2.c}, *gg[2] = {gr.g, g2.g};
  double nc, ng, ng2;
  CHECK_OK(rx_grad_norm(gc, 2, &nc));
  CHECK_OK(rx_grad_norm(gg, 2, &ng));
  CHECK_OK(rx_grad_norm(gg, 2, &ng2));
  CHECK(fabs(ng - nc) <= 1e-9 * nc, "grad norm %.17g on cuda, %.17g on cpu", ng, nc);
  CHECK(ng == ng2, "grad norm differs between two runs");
  rx_tensor *cc[2] = {gr.c, g2.c}, *cg[2] = {gr.g, g2.g};
  CHECK_OK(rx_clip_grad_norm(cc, 2, 1.0, &nc));
  CHECK_OK(rx_clip_grad_norm(cg, 2, 1.0, &ng));
  CHECK(gpu_nrmse(gr.g, gr.c) <= 1e-6 && gpu_nrmse(g2.g, g2.c) <= 1e-6, "clipped gradients");
  CHECK_OK(rx_grad_norm(gg, 2, &ng));
  CHECK(fabs(ng - 1.0) < 1e-5, "norm after clipping %g", ng);
  pair_free(p); pair_free(gr); pair_free(m); pair_free(v); pair_free(g2);
}

/* Qwen2.5-1.5B's attention (head_dim 128, 12 query heads over 2 key/value heads) at T = 1024. On a
 * GPU all 1024 queries; under the emulator the last 16 of them, so that every query still sees up
 * to 1024 keys (32 key tiles) and every key block loops over 6 query heads: all 1024 would cost
 * the emulator 60 times as much for no other code path (the grid only grows in x). */
static void test_attention_long(void) {
  attention_case(1, strcmp(rx_cuda_backend(), "emulated") == 0 ? 16 : 1024, 1024, 1024, 12, 2, 128, 0);
}

int main(void) {
  if (gpu_skip_unless_present("gpu_test_ops")) return GPU_SKIP;
  /* REMAX_CUDA_MAX_BLOCKS (a small cap, so that every grid-stride loop runs more than once) runs
   * the ops whose kernels have such loops; attention has none. */
  const int capped = getenv("REMAX_CUDA_MAX_BLOCKS") != NULL;
  for (int k = 0; k < 2; k++) {
    dt = k == 0 ? RX_F32 : RX_BF16;
    fprintf(stderr, "-- dtype %s\n", rx_dtype_name(dt));
    RUN(test_add);
    RUN(test_scale);
    RUN(test_dropout);
    RUN(test_swiglu);
    RUN(test_rmsnorm);
    RUN(test_rmsnorm_in_place);
    RUN(test_rope);
    RUN(test_embedding);
    RUN(test_matmul);
    RUN(test_matmul_without_inputs);
    RUN(test_matmul_dbias_many_rows);
    RUN(test_logprob);
    RUN(test_logprob_large_vocab);
    if (capped) continue;
    RUN(test_attention);
    RUN(test_attention_determinism);
    RUN(test_attention_packed);
  }
  if (!capped) {
    dt = RX_F32;
    RUN(test_attention_long);
  }
  dt = RX_F32;
  RUN(test_adamw_and_norm);
  return check_summary("gpu_test_ops");
}
