/* test_kernels.c: the layer kernels (matmul, embedding, rmsnorm, rope, swiglu, logsoftmax,
 * logprob, add) against plain double references written here, their backwards against central
 * finite differences in float64, sentinel memory around every output, and the errors of bad
 * arguments. Inputs are drawn in f32 and copied exactly to f64, so both dtypes see the same values. */
#include "check.h"
#include "cpu/cpu.h"
#include "ops/engine_ops.h"
#include <omp.h>

static const int32_t dtypes[2] = {RX_F32, RX_F64};
static const double fwd_tol[2] = {1e-6, 1e-12};   /* normalised error of forward outputs */
static const double grad_tol[2] = {1e-6, 1e-7};   /* analytic gradient against finite differences */

/* ---- helpers: everything made through them is released by release_all() at the end of a case */

static void *kept[512];
static rx_tensor *kept_t[512];
static int nkept, nkept_t;
static uint64_t rng_offset = 1;

static void *keep(void *p) { if (nkept < 512) kept[nkept++] = p; return p; }
static rx_tensor *keep_t(rx_tensor *t) { if (nkept_t < 512) kept_t[nkept_t++] = t; return t; }
static void release_all(void) {
  while (nkept) free(kept[--nkept]);
  while (nkept_t) rx_tensor_free(kept_t[--nkept_t]);
}

static rx_tensor *tensor(int32_t dtype, int ndim, const int64_t *shape) {
  rx_tensor *t = NULL;
  CHECK_OK(rx_tensor_new(&t, dtype, RX_CPU, ndim, shape));
  return keep_t(t);
}
/* Normal(0, std) from Philox; each call draws from a fresh range of the stream. */
static rx_tensor *randn(int32_t dtype, int ndim, const int64_t *shape, double std) {
  rx_tensor *t = tensor(dtype, ndim, shape);
  CHECK_OK(rx_tensor_normal(t, 2024, rng_offset, 0.0, std));
  rng_offset += (uint64_t)t->numel;
  return t;
}
static rx_tensor *convert(const rx_tensor *t, int32_t dtype) {
  rx_tensor *c = tensor(dtype, t->ndim, t->shape);
  CHECK_OK(rx_tensor_copy(c, t));
  return c;
}
/* i32 tensor of integers drawn uniformly from [lo, hi). */
static rx_tensor *randint(int ndim, const int64_t *shape, int64_t lo, int64_t hi) {
  rx_tensor *u = tensor(RX_F64, ndim, shape), *t = tensor(RX_I32, ndim, shape);
  CHECK_OK(rx_tensor_uniform(u, 99, rng_offset, (double)lo, (double)hi));
  rng_offset += (uint64_t)u->numel;
  for (int64_t i = 0; i < u->numel; i++) ((int32_t *)t->data)[i] = (int32_t)floor(((double *)u->data)[i]);
  return t;
}
static rx_tensor *ints(int ndim, const int64_t *shape, const int32_t *values) {
  rx_tensor *t = tensor(RX_I32, ndim, shape);
  memcpy(t->data, values, (size_t)t->numel * sizeof(int32_t));
  return t;
}
static double *vals(const rx_tensor *t) {
  double *v = keep(malloc((size_t)t->numel * sizeof(double) + 8));
  CHECK_OK(rx_tensor_read_f64(t, v));
  return v;
}
static double *buffer(int64_t n) { return keep(calloc((size_t)n + 1, sizeof(double))); }
static double sum_prod(const rx_tensor *t, const double *r) {
  double s = 0;
  for (int64_t i = 0; i < t->numel; i++) s += (t->dtype == RX_F64 ? ((double *)t->data)[i] : ((float *)t->data)[i]) * r[i];
  return s;
}
static void check_close(const rx_tensor *got, const double *want, double tol, const char *what) {
  double e = check_nrmse(vals(got), want, got->numel);
  CHECK(e < tol, "%s (%s): normalised error %.3g > %.3g", what, rx_dtype_name(got->dtype), e, tol);
}
/* An output with sentinels around it, pre-filled with `fill` (overwrite/accumulate checks). */
static guarded out_like(int32_t dtype, int ndim, const int64_t *shape, double fill) {
  guarded g = guarded_new(dtype, ndim, shape);
  CHECK_OK(rx_tensor_fill(g.t, fill));
  return g;
}
#define CHECK_GUARD_OK(g, what) CHECK(guarded_free(g), "%s: write outside the tensor", what)

typedef double (*loss_fn)(void *ctx);
/* dL/dx by central differences, for every element of the f64 tensor x. */
static double *finite_diff(loss_fn loss, void *ctx, rx_tensor *x) {
  double *g = buffer(x->numel), *p = x->data, h = 1e-6;
  for (int64_t i = 0; i < x->numel; i++) {
    double s = p[i];
    p[i] = s + h;
    double lp = loss(ctx);
    p[i] = s - h;
    double lm = loss(ctx);
    p[i] = s;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}
/* analytic holds prefill + gradient (prefill 0 for overwritten input gradients). */
static void check_grad(const rx_tensor *analytic, double prefill, const double *fd, double tol, const char *what) {
  double *a = vals(analytic);
  for (int64_t i = 0; i < analytic->numel; i++) a[i] -= prefill;
  double e = check_nrmse(a, fd, analytic->numel);
  CHECK(e < tol, "%s (%s): error against finite differences %.3g > %.3g", what, rx_dtype_name(analytic->dtype), e, tol);
}

/* ---- the fast exp behind the f32 softmax and silu kernels */

static void fast_exp_is_accurate(void) {
  double worst = 0;
  for (int i = 0; i <= 200000; i++) {
    float x = -86.5f + 175.0f * (float)i / 200000.0f;
    double want = exp((double)x), got = rx_exp_f32(x);
    if (isfinite(want) && want < 3.4e38) worst = fmax(worst, fabs(got - want) / want);
  }
  CHECK(worst < 3e-7, "rx_exp_f32 worst relative error %.3g", worst);
  CHECK(rx_exp_f32(-INFINITY) == 0 && rx_exp_f32(-1000.0f) == 0, "exp(-inf) and exp(-1000) give 0");
  CHECK(isinf(rx_exp_f32(INFINITY)) && isinf(rx_exp_f32(89.0f)), "exp(89) and exp(inf) give inf");
  CHECK(isnan(rx_exp_f32(NAN)), "exp(NaN) is NaN");
  CHECK(rx_exp_f32(0.0f) == 1.0f, "exp(0) = %.9g", rx_exp_f32(0.0f));
}

/* ---- matmul */

static void matmul_ref(double *y, const double *x, const double *w, const double *b, int64_t N, int64_t C,
                       int64_t OC) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) {
      double s = b ? b[o] : 0;
      for (int64_t c = 0; c < C; c++) s += x[n * C + c] * w[o * C + c];
      y[n * OC + o] = s;
    }
}

static void matmul_forward_matches_reference(void) {
  /* rows 1 and 3 take the few-rows path (each weight row read once), 13, 39 and 111 the GEMM */
  for (int64_t B = 1; B <= 3; B += 2)
    for (int64_t T = 1; T <= 37; T += 12)
    for (int with_bias = 0; with_bias < 2; with_bias++)
      for (int d = 0; d < 2; d++) {
        int64_t C = 37, OC = 19, xs[3] = {B, T, C}, ws[2] = {OC, C}, bs[1] = {OC}, ys[3] = {B, T, OC};
        rx_tensor *x = randn(dtypes[d], 3, xs, 1), *w = randn(dtypes[d], 2, ws, 1);
        rx_tensor *b = with_bias ? randn(dtypes[d], 1, bs, 1) : NULL;
        double *ref = buffer(B * T * OC);
        matmul_ref(ref, vals(x), vals(w), b ? vals(b) : NULL, B * T, C, OC);
        guarded y = out_like(dtypes[d], 3, ys, 5.0);
        CHECK_OK(rx_matmul_forward(y.t, x, w, b));
        check_close(y.t, ref, fwd_tol[d], with_bias ? "matmul with bias" : "matmul");
        CHECK_GUARD_OK(y, "matmul out");
        release_all();
      }
}

/* The decoding path (up to 48 rows, W read in place, register tiles of 4 rows x 6 outputs):
 * every row count across the tile and path boundaries, K with and without a tail of 16, output
 * counts that leave partial tiles. A row's result must not depend on the rows beside it (so a
 * sampled row's tokens do not depend on the batch) nor on the thread count. */
static void matmul_few_rows_match_reference_and_each_other(void) {
  /* rows are independent up to 48 rows with the AVX-512 kernel, up to 8 with the portable dot */
  float one = 1, out = 0;
  const int64_t independent = rx_cpu_matmul_rows_f32(&out, &one, &one, NULL, 1, 1, 1) ? 48 : 8;
  static const int64_t shapes[3][2] = {{37, 19}, {64, 131}, {300, 301}};   /* {C, OC}; the last is threaded */
  for (int s = 0; s < 3; s++) {
    const int64_t C = shapes[s][0], OC = shapes[s][1];
    int64_t xs[2] = {50, C}, ws[2] = {OC, C}, bs[1] = {OC};
    rx_tensor *x = randn(RX_F32, 2, xs, 1), *w = randn(RX_F32, 2, ws, 1), *b = randn(RX_F32, 1, bs, 1);
    double *ref = buffer(50 * OC);
    matmul_ref(ref, vals(x), vals(w), vals(b), 50, C, OC);
    for (int64_t n = 1; n <= 50; n++) {
      int64_t ys[2] = {n, OC};
      rx_tensor *xv, *y = tensor(RX_F32, 2, ys);
      CHECK_OK(rx_tensor_narrow(&xv, x, 0, 0, n));
      keep_t(xv);
      CHECK_OK(rx_matmul_forward(y, xv, w, b));
      check_close(y, ref, fwd_tol[0], "few-row matmul");
      /* row n-1 computed as the last of n rows, then alone */
      rx_tensor *x1, *y1 = tensor(RX_F32, 2, (int64_t[2]){1, OC});
      CHECK_OK(rx_tensor_narrow(&x1, x, 0, n - 1, 1));
      keep_t(x1);
      CHECK_OK(rx_matmul_forward(y1, x1, w, b));
      if (n <= independent)
        CHECK(memcmp((float *)y->data + (n - 1) * OC, y1->data, (size_t)OC * sizeof(float)) == 0,
              "C=%lld OC=%lld: row %lld of %lld rows differs from the same row alone", (long long)C, (long long)OC,
              (long long)n, (long long)n);
    }
    int threads = omp_get_max_threads();
    const int64_t nt = independent < 11 ? independent : 11;   /* rows for the thread check */
    int64_t ys[2] = {nt, OC};
    rx_tensor *x11, *y_1 = tensor(RX_F32, 2, ys), *y_2 = tensor(RX_F32, 2, ys);
    CHECK_OK(rx_tensor_narrow(&x11, x, 0, 0, nt));
    keep_t(x11);
    omp_set_num_threads(1);
    CHECK_OK(rx_matmul_forward(y_1, x11, w, b));
    omp_set_num_threads(2);
    CHECK_OK(rx_matmul_forward(y_2, x11, w, b));
    omp_set_num_threads(threads);
    CHECK(memcmp(y_1->data, y_2->data, (size_t)(nt * OC) * sizeof(float)) == 0,
          "C=%lld OC=%lld: %lld-row matmul differs between 1 and 2 threads", (long long)C, (long long)OC, (long long)nt);
    release_all();
  }
}

typedef struct { rx_tensor *out, *inp, *weight, *bias; const double *R; } matmul_ctx;
static double matmul_loss(void *p) {
  matmul_ctx *c = p;
  CHECK_OK(rx_matmul_forward(c->out, c->inp, c->weight, c->bias));
  return sum_prod(c->out, c->R);
}

static void matmul_backward_matches_finite_differences(void) {
  int64_t B = 2, T = 5, C = 11, OC = 7, xs[3] = {B, T, C}, ws[2] = {OC, C}, bs[1] = {OC}, ys[3] = {B, T, OC};
  rx_tensor *x[2], *w[2], *b[2], *dout[2];
  x[0] = randn(RX_F32, 3, xs, 1), w[0] = randn(RX_F32, 2, ws, 1), b[0] = randn(RX_F32, 1, bs, 1);
  dout[0] = randn(RX_F32, 3, ys, 1);
  x[1] = convert(x[0], RX_F64), w[1] = convert(w[0], RX_F64), b[1] = convert(b[0], RX_F64);
  dout[1] = convert(dout[0], RX_F64);
  matmul_ctx ctx = {tensor(RX_F64, 3, ys), x[1], w[1], b[1], vals(dout[1])};
  double *fx = finite_diff(matmul_loss, &ctx, x[1]), *fw = finite_diff(matmul_loss, &ctx, w[1]);
  double *fb = finite_diff(matmul_loss, &ctx, b[1]);
  for (int d = 0; d < 2; d++) {
    guarded dx = out_like(dtypes[d], 3, xs, 7.0), dw = out_like(dtypes[d], 2, ws, 0.25), db = out_like(dtypes[d], 1, bs, 0.25);
    CHECK_OK(rx_matmul_backward(dx.t, dw.t, db.t, dout[d], x[d], w[d]));
    check_grad(dx.t, 0, fx, grad_tol[d], "matmul dinp (overwritten)");
    check_grad(dw.t, 0.25, fw, grad_tol[d], "matmul dweight (accumulated)");
    check_grad(db.t, 0.25, fb, grad_tol[d], "matmul dbias (accumulated)");
    CHECK_GUARD_OK(dx, "matmul dinp");
    CHECK_GUARD_OK(dw, "matmul dweight");
    CHECK_GUARD_OK(db, "matmul dbias");
  }
  /* NULL gradients are skipped; the others come out the same */
  guarded dw = out_like(RX_F64, 2, ws, 0), dx = out_like(RX_F64, 3, xs, 0);
  CHECK_OK(rx_matmul_backward(NULL, dw.t, NULL, dout[1], x[1], w[1]));
  check_grad(dw.t, 0, fw, 1e-6, "matmul dweight alone");
  CHECK_OK(rx_matmul_backward(dx.t, NULL, NULL, dout[1], x[1], w[1]));
  check_grad(dx.t, 0, fx, 1e-6, "matmul dinp alone");
  CHECK_OK(rx_matmul_backward(NULL, NULL, NULL, dout[1], x[1], w[1]));
  CHECK_GUARD_OK(dw, "matmul dweight");
  CHECK_GUARD_OK(dx, "matmul dinp");
  release_all();
}

/* ---- embedding */

static void embedding_forward_matches_reference(void) {
  for (int64_t B = 1; B <= 3; B += 2)
    for (int d = 0; d < 2; d++) {
      int64_t T = 13, V = 11, C = 37, ts[2] = {B, T}, ws[2] = {V, C}, ys[3] = {B, T, C};
      rx_tensor *tok = randint(2, ts, 0, V), *w = randn(dtypes[d], 2, ws, 1);
      const int32_t *tv = tok->data;
      double *wv = vals(w), *ref = buffer(B * T * C);
      for (int64_t n = 0; n < B * T; n++)
        for (int64_t c = 0; c < C; c++) ref[n * C + c] = wv[tv[n] * C + c];
      guarded y = out_like(dtypes[d], 3, ys, 5.0);
      CHECK_OK(rx_embedding_forward(y.t, tok, w));
      double *yv = vals(y.t);
      int same = 1;
      for (int64_t i = 0; i < B * T * C; i++) same &= yv[i] == ref[i];
      CHECK(same, "embedding out is not an exact copy of the weight rows (%s)", rx_dtype_name(dtypes[d]));
      CHECK_GUARD_OK(y, "embedding out");
      release_all();
    }
}

typedef struct { rx_tensor *out, *tokens, *weight; const double *R; } embedding_ctx;
static double embedding_loss(void *p) {
  embedding_ctx *c = p;
  CHECK_OK(rx_embedding_forward(c->out, c->tokens, c->weight));
  return sum_prod(c->out, c->R);
}

static void embedding_backward_matches_finite_differences(void) {
  /* 26 tokens over a vocabulary of 7: repeated tokens exercise the scatter-add */
  int64_t B = 2, T = 13, V = 7, C = 9, ts[2] = {B, T}, ws[2] = {V, C}, ys[3] = {B, T, C};
  rx_tensor *tok = randint(2, ts, 0, V), *w32 = randn(RX_F32, 2, ws, 1), *w = convert(w32, RX_F64);
  rx_tensor *dout32 = randn(RX_F32, 3, ys, 1), *dout = convert(dout32, RX_F64);
  embedding_ctx ctx = {tensor(RX_F64, 3, ys), tok, w, vals(dout)};
  double *fw = finite_diff(embedding_loss, &ctx, w);
  for (int d = 0; d < 2; d++) {
    guarded dw = out_like(dtypes[d], 2, ws, 0.25);
    CHECK_OK(rx_embedding_backward(dw.t, d ? dout : dout32, tok));
    check_grad(dw.t, 0.25, fw, grad_tol[d], "embedding dweight (accumulated)");
    CHECK_GUARD_OK(dw, "embedding dweight");
  }
  CHECK_OK(rx_embedding_backward(NULL, dout, tok));
  release_all();
}

static void embedding_backward_is_deterministic(void) {
  /* above the threading threshold: 1 and 2 threads must give the same bits */
  int64_t N = 400, V = 50, C = 300, ts[1] = {N}, ws[2] = {V, C}, ys[2] = {N, C};
  rx_tensor *tok = randint(1, ts, 0, V), *dout = randn(RX_F32, 2, ys, 1);
  rx_tensor *a = tensor(RX_F32, 2, ws), *b = tensor(RX_F32, 2, ws);
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  CHECK_OK(rx_embedding_backward(a, dout, tok));
  omp_set_num_threads(2);
  CHECK_OK(rx_embedding_backward(b, dout, tok));
  omp_set_num_threads(threads);
  CHECK(memcmp(a->data, b->data, (size_t)(V * C) * sizeof(float)) == 0, "embedding dweight differs with the thread count");
  release_all();
}

/* ---- rmsnorm */

static void rmsnorm_ref(double *y, double *rstd, const double *x, const double *w, int64_t N, int64_t C, double eps) {
  for (int64_t n = 0; n < N; n++) {
    double ss = 0;
    for (int64_t c = 0; c < C; c++) ss += x[n * C + c] * x[n * C + c];
    rstd[n] = 1 / sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; c++) y[n * C + c] = x[n * C + c] * rstd[n] * w[c];
  }
}

static void rmsnorm_forward_matches_reference(void) {
  for (int64_t B = 1; B <= 3; B += 2)
    for (int d = 0; d < 2; d++) {
      int64_t T = 13, C = 37, xs[3] = {B, T, C}, ws[1] = {C}, rs[2] = {B, T};
      rx_tensor *x = randn(dtypes[d], 3, xs, 2), *w = randn(dtypes[d], 1, ws, 1);
      double *ref = buffer(B * T * C), *rref = buffer(B * T);
      rmsnorm_ref(ref, rref, vals(x), vals(w), B * T, C, 1e-5);
      guarded y = out_like(dtypes[d], 3, xs, 5.0), r = out_like(dtypes[d], 2, rs, 5.0);
      CHECK_OK(rx_rmsnorm_forward(y.t, r.t, x, w, 1e-5));
      check_close(y.t, ref, fwd_tol[d], "rmsnorm out");
      check_close(r.t, rref, fwd_tol[d], "rmsnorm rstd");
      CHECK_GUARD_OK(y, "rmsnorm out");
      CHECK_GUARD_OK(r, "rmsnorm rstd");
      release_all();
    }
}

typedef struct { rx_tensor *out, *rstd, *inp, *weight; const double *R; } rmsnorm_ctx;
static double rmsnorm_loss(void *p) {
  rmsnorm_ctx *c = p;
  CHECK_OK(rx_rmsnorm_forward(c->out, c->rstd, c->inp, c->weight, 1e-5));
  return sum_prod(c->out, c->R);
}

static void rmsnorm_backward_matches_finite_differences(void) {
  int64_t B = 2, T = 5, C = 13, xs[3] = {B, T, C}, ws[1] = {C}, rs[1] = {B * T};
  rx_tensor *x[2], *w[2], *dout[2], *rstd[2];
  x[0] = randn(RX_F32, 3, xs, 2), w[0] = randn(RX_F32, 1, ws, 1), dout[0] = randn(RX_F32, 3, xs, 1);
  x[1] = convert(x[0], RX_F64), w[1] = convert(w[0], RX_F64), dout[1] = convert(dout[0], RX_F64);
  rmsnorm_ctx ctx = {tensor(RX_F64, 3, xs), tensor(RX_F64, 1, rs), x[1], w[1], vals(dout[1])};
  double *fx = finite_diff(rmsnorm_loss, &ctx, x[1]), *fw = finite_diff(rmsnorm_loss, &ctx, w[1]);
  for (int d = 0; d < 2; d++) {
    rstd[d] = tensor(dtypes[d], 1, rs);
    CHECK_OK(rx_rmsnorm_forward(tensor(dtypes[d], 3, xs), rstd[d], x[d], w[d], 1e-5));
    guarded dx = out_like(dtypes[d], 3, xs, 7.0), dw = out_like(dtypes[d], 1, ws, 0.25);
    CHECK_OK(rx_rmsnorm_backward(dx.t, dw.t, dout[d], x[d], w[d], rstd[d]));
    check_grad(dx.t, 0, fx, grad_tol[d], "rmsnorm dinp (overwritten)");
    check_grad(dw.t, 0.25, fw, grad_tol[d], "rmsnorm dweight (accumulated)");
    CHECK_GUARD_OK(dx, "rmsnorm dinp");
    CHECK_GUARD_OK(dw, "rmsnorm dweight");
  }
  guarded dx = out_like(RX_F64, 3, xs, 0), dw = out_like(RX_F64, 1, ws, 0);
  CHECK_OK(rx_rmsnorm_backward(NULL, dw.t, dout[1], x[1], w[1], rstd[1]));
  check_grad(dw.t, 0, fw, 1e-6, "rmsnorm dweight alone");
  CHECK_OK(rx_rmsnorm_backward(dx.t, NULL, dout[1], x[1], w[1], rstd[1]));
  check_grad(dx.t, 0, fx, 1e-6, "rmsnorm dinp alone");
  CHECK_GUARD_OK(dx, "rmsnorm dinp");
  CHECK_GUARD_OK(dw, "rmsnorm dweight");
  /* dweight sums over rows in a fixed order: the thread count does not change the bits */
  int64_t bs[2] = {300, 256}, bw[1] = {256}, br[1] = {300};
  rx_tensor *bx = randn(RX_F32, 2, bs, 1), *bwt = randn(RX_F32, 1, bw, 1), *bd = randn(RX_F32, 2, bs, 1);
  rx_tensor *br_t = tensor(RX_F32, 1, br), *g1 = tensor(RX_F32, 1, bw), *g2 = tensor(RX_F32, 1, bw);
  CHECK_OK(rx_rmsnorm_forward(tensor(RX_F32, 2, bs), br_t, bx, bwt, 1e-6));
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  CHECK_OK(rx_rmsnorm_backward(NULL, g1, bd, bx, bwt, br_t));
  omp_set_num_threads(2);
  CHECK_OK(rx_rmsnorm_backward(NULL, g2, bd, bx, bwt, br_t));
  omp_set_num_threads(threads);
  CHECK(memcmp(g1->data, g2->data, 256 * sizeof(float)) == 0, "rmsnorm dweight differs with the thread count");
  /* both gradients in one call (one parallel region) give the bits of separate calls, also in
   * place (dinp == dout), where dweight must read dout before it is overwritten */
  rx_tensor *dx1 = tensor(RX_F32, 2, bs), *both = tensor(RX_F32, 2, bs), *gb = tensor(RX_F32, 1, bw);
  rx_tensor *inplace = convert(bd, RX_F32), *gi = tensor(RX_F32, 1, bw);
  omp_set_num_threads(2);
  CHECK_OK(rx_rmsnorm_backward(dx1, NULL, bd, bx, bwt, br_t));
  CHECK_OK(rx_rmsnorm_backward(both, gb, bd, bx, bwt, br_t));
  CHECK_OK(rx_rmsnorm_backward(inplace, gi, inplace, bx, bwt, br_t));
  omp_set_num_threads(threads);
  CHECK(memcmp(dx1->data, both->data, 300 * 256 * sizeof(float)) == 0, "rmsnorm dinp differs when dweight is taken too");
  CHECK(memcmp(g2->data, gb->data, 256 * sizeof(float)) == 0, "rmsnorm dweight differs when dinp is taken too");
  CHECK(memcmp(dx1->data, inplace->data, 300 * 256 * sizeof(float)) == 0, "rmsnorm dinp in place differs");
  CHECK(memcmp(g2->data, gi->data, 256 * sizeof(float)) == 0, "rmsnorm dweight in place differs");
  release_all();
}

/* ---- rope */

/* The Hugging Face formulation: cos/sin tables of width D per position (frequencies repeated),
 * y = x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1]. */
static void rope_ref(double *y, const double *x, const int32_t *pos, int64_t P, int64_t H, int64_t D, double theta) {
  double *cs = malloc((size_t)D * sizeof(double)), *sn = malloc((size_t)D * sizeof(double));
  int64_t half = D / 2;
  for (int64_t p = 0; p < P; p++) {
    for (int64_t j = 0; j < D; j++) {
      double inv_freq = 1.0 / pow(theta, (double)(2 * (j % half)) / (double)D);
      cs[j] = cos(pos[p] * inv_freq);
      sn[j] = sin(pos[p] * inv_freq);
    }
    for (int64_t h = 0; h < H; h++) {
      const double *xr = x + (p * H + h) * D;
      double *yr = y + (p * H + h) * D;
      for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * cs[j] + (j < half ? -xr[j + half] : xr[j - half]) * sn[j];
    }
  }
  free(cs);
  free(sn);
}

static const int32_t rope_positions[14] = {5, 0, 3, 3, 17, 2, 1000, 9, 31999, 1, 8, 4, 123, 6};

static void rope_forward_matches_reference(void) {
  const double thetas[2] = {10000.0, 1e6};
  for (int64_t B = 1; B <= 2; B++)
    for (int t = 0; t < 2; t++)
      for (int d = 0; d < 2; d++) {
        int64_t T = 7, H = 3, D = 18, xs[4] = {B, T, H, D}, ps[2] = {B, T};
        rx_tensor *x = randn(dtypes[d], 4, xs, 1), *pos = ints(2, ps, rope_positions);
        double *ref = buffer(x->numel);
        rope_ref(ref, vals(x), rope_positions, B * T, H, D, thetas[t]);
        guarded y = out_like(dtypes[d], 4, xs, 5.0);
        CHECK_OK(rx_rope_forward(y.t, x, pos, thetas[t]));
        check_close(y.t, ref, fwd_tol[d], thetas[t] == 1e6 ? "rope theta 1e6" : "rope theta 1e4");
        CHECK_GUARD_OK(y, "rope out");
        CHECK_OK(rx_rope_forward(x, x, pos, thetas[t]));  /* in place */
        check_close(x, ref, fwd_tol[d], "rope in place");
        release_all();
      }
}

typedef struct { rx_tensor *out, *inp, *positions; const double *R; } rope_ctx;
static double rope_loss(void *p) {
  rope_ctx *c = p;
  CHECK_OK(rx_rope_forward(c->out, c->inp, c->positions, 10000.0));
  return sum_prod(c->out, c->R);
}

static void rope_backward_matches_finite_differences(void) {
  int64_t xs[4] = {2, 7, 2, 8}, ps[2] = {2, 7};
  rx_tensor *pos = ints(2, ps, rope_positions);
  rx_tensor *x = convert(randn(RX_F32, 4, xs, 1), RX_F64), *dout32 = randn(RX_F32, 4, xs, 1);
  rx_tensor *dout = convert(dout32, RX_F64);
  rope_ctx ctx = {tensor(RX_F64, 4, xs), x, pos, vals(dout)};
  double *fx = finite_diff(rope_loss, &ctx, x);
  for (int d = 0; d < 2; d++) {
    guarded dx = out_like(dtypes[d], 4, xs, 7.0);
    CHECK_OK(rx_rope_backward(dx.t, d ? dout : dout32, pos, 10000.0));
    check_grad(dx.t, 0, fx, grad_tol[d], "rope dinp (overwritten)");
    CHECK_GUARD_OK(dx, "rope dinp");
  }
  CHECK_OK(rx_rope_backward(NULL, dout, pos, 10000.0));
  release_all();
}

/* ---- swiglu */

static double silu(double g) { return g / (1 + exp(-g)); }

static void swiglu_forward_matches_reference(void) {
  for (int64_t B = 1; B <= 3; B += 2)
    for (int d = 0; d < 2; d++) {
      int64_t xs[3] = {B, 13, 37};
      rx_tensor *g = randn(dtypes[d], 3, xs, 3), *u = randn(dtypes[d], 3, xs, 1);
      double *gv = vals(g), *uv = vals(u), *ref = buffer(g->numel);
      for (int64_t i = 0; i < g->numel; i++) ref[i] = silu(gv[i]) * uv[i];
      guarded y = out_like(dtypes[d], 3, xs, 5.0);
      CHECK_OK(rx_swiglu_forward(y.t, g, u));
      check_close(y.t, ref, fwd_tol[d], "swiglu out");
      CHECK_GUARD_OK(y, "swiglu out");
      release_all();
    }
  /* saturated gates: silu(-200) = -0 (no 0 * inf NaN), silu(200) = 200 */
  int64_t s[1] = {4};
  for (int d = 0; d < 2; d++) {
    rx_tensor *g = tensor(dtypes[d], 1, s), *u = tensor(dtypes[d], 1, s), *y = tensor(dtypes[d], 1, s);
    rx_tensor *dg = tensor(dtypes[d], 1, s), *du = tensor(dtypes[d], 1, s);
    const double gs[4] = {-200, -90, 90, 200};
    CHECK_OK(rx_tensor_write_f64(g, gs));
    CHECK_OK(rx_tensor_fill(u, 2.0));
    CHECK_OK(rx_swiglu_forward(y, g, u));
    CHECK_OK(rx_swiglu_backward(dg, du, u, g, u));
    double *yv = vals(y), *dgv = vals(dg), *duv = vals(du);
    for (int i = 0; i < 4; i++) {
      double want = gs[i] > 0 ? 2 * gs[i] : 0;
      CHECK(fabs(yv[i] - want) < 1e-5 * fabs(gs[i]) && isfinite(dgv[i]) && isfinite(duv[i]),
            "swiglu at gate %g (%s): out %g dgate %g dup %g", gs[i], rx_dtype_name(dtypes[d]), yv[i], dgv[i], duv[i]);
    }
    release_all();
  }
}

typedef struct { rx_tensor *out, *gate, *up; const double *R; } swiglu_ctx;
static double swiglu_loss(void *p) {
  swiglu_ctx *c = p;
  CHECK_OK(rx_swiglu_forward(c->out, c->gate, c->up));
  return sum_prod(c->out, c->R);
}

static void swiglu_backward_matches_finite_differences(void) {
  int64_t xs[2] = {5, 13};
  rx_tensor *g[2], *u[2], *dout[2];
  g[0] = randn(RX_F32, 2, xs, 3), u[0] = randn(RX_F32, 2, xs, 1), dout[0] = randn(RX_F32, 2, xs, 1);
  g[1] = convert(g[0], RX_F64), u[1] = convert(u[0], RX_F64), dout[1] = convert(dout[0], RX_F64);
  swiglu_ctx ctx = {tensor(RX_F64, 2, xs), g[1], u[1], vals(dout[1])};
  double *fg = finite_diff(swiglu_loss, &ctx, g[1]), *fu = finite_diff(swiglu_loss, &ctx, u[1]);
  for (int d = 0; d < 2; d++) {
    guarded dg = out_like(dtypes[d], 2, xs, 7.0), du = out_like(dtypes[d], 2, xs, 7.0);
    CHECK_OK(rx_swiglu_backward(dg.t, du.t, dout[d], g[d], u[d]));
    check_grad(dg.t, 0, fg, grad_tol[d], "swiglu dgate (overwritten)");
    check_grad(du.t, 0, fu, grad_tol[d], "swiglu dup (overwritten)");
    CHECK_GUARD_OK(dg, "swiglu dgate");
    CHECK_GUARD_OK(du, "swiglu dup");
  }
  guarded dg = out_like(RX_F64, 2, xs, 0), du = out_like(RX_F64, 2, xs, 0);
  CHECK_OK(rx_swiglu_backward(dg.t, NULL, dout[1], g[1], u[1]));
  check_grad(dg.t, 0, fg, 1e-6, "swiglu dgate alone");
  CHECK_OK(rx_swiglu_backward(NULL, du.t, dout[1], g[1], u[1]));
  check_grad(du.t, 0, fu, 1e-6, "swiglu dup alone");
  CHECK_GUARD_OK(dg, "swiglu dgate");
  CHECK_GUARD_OK(du, "swiglu dup");
  release_all();
}

/* ---- add */

static void add_matches_reference(void) {
  for (int64_t B = 1; B <= 3; B += 2)
    for (int d = 0; d < 2; d++) {
      int64_t xs[3] = {B, 13, 37};
      rx_tensor *a = randn(dtypes[d], 3, xs, 1), *b = randn(dtypes[d], 3, xs, 1);
      double *av = vals(a), *bv = vals(b), *ref = buffer(a->numel);
      for (int64_t i = 0; i < a->numel; i++) ref[i] = av[i] + bv[i];
      guarded y = out_like(dtypes[d], 3, xs, 5.0);
      CHECK_OK(rx_add(y.t, a, b));
      check_close(y.t, ref, fwd_tol[d], "add out");
      CHECK_GUARD_OK(y, "add out");
      CHECK_OK(rx_add(b, a, b));   /* residual update in place */
      check_close(b, ref, fwd_tol[d], "add in place");
      release_all();
    }
}

/* ---- logsoftmax */

/* Row-wise log-softmax in double; -inf inputs stay -inf. */
static void logsoftmax_ref(double *y, double *lse, const double *x, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; n++) {
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < V; v++) m = fmax(m, x[n * V + v]);
    for (int64_t v = 0; v < V; v++) s += exp(x[n * V + v] - m);
    lse[n] = m + log(s);
    for (int64_t v = 0; v < V; v++) y[n * V + v] = x[n * V + v] - lse[n];
  }
}

/* log p(target) (0 where the target is negative), the log-sum-exp and the entropy of each row of
 * logits x [N, V], in double, into buffers of N. */
static void logprob_ref(double *logp, double *lse, double *ent, const double *x, const int32_t *tv, int64_t N,
                        int64_t V) {
  double *lsm = buffer(N * V);
  logsoftmax_ref(lsm, lse, x, N, V);
  for (int64_t n = 0; n < N; n++) {
    logp[n] = tv[n] < 0 ? 0 : lsm[n * V + tv[n]];
    ent[n] = 0;
    for (int64_t v = 0; v < V; v++)
      if (!isinf(lsm[n * V + v])) ent[n] -= exp(lsm[n * V + v]) * lsm[n * V + v];
  }
}

/* Logits with a few -inf entries (never all of a row) and one row shifted by +500. */
static rx_tensor *awkward_logits(int32_t dtype, int ndim, const int64_t *shape) {
  rx_tensor *x = randn(dtype, ndim, shape, 3);
  int64_t V = shape[ndim - 1], N = x->numel / V;
  for (int64_t n = 0; n < N; n++)
    for (int64_t v = 0; v < V; v++) {
      double val;
      CHECK_OK(rx_tensor_get(x, n * V + v, &val));
      if ((n * 7 + v * 3) % 11 == 0) val = -INFINITY;
      if (n == 1) val += 500;
      CHECK_OK(rx_tensor_set(x, n * V + v, val));
    }
  return x;
}

/* Equal infinities count as equal, the rest by normalised error. */
static void check_close_inf(const rx_tensor *got, const double *want, double tol, const char *what) {
  double *g = vals(got), *w = buffer(got->numel);
  int same_inf = 1;
  for (int64_t i = 0; i < got->numel; i++) {
    if (isinf(want[i]) || isinf(g[i])) { same_inf &= g[i] == want[i]; g[i] = w[i] = 0; }
    else w[i] = want[i];
  }
  CHECK(same_inf, "%s (%s): infinities differ from the reference", what, rx_dtype_name(got->dtype));
  double e = check_nrmse(g, w, got->numel);
  CHECK(e < tol, "%s (%s): normalised error %.3g > %.3g", what, rx_dtype_name(got->dtype), e, tol);
}

static void logsoftmax_forward_matches_reference(void) {
  for (int64_t B = 1; B <= 3; B += 2)
    for (int d = 0; d < 2; d++) {
      int64_t xs[3] = {B, 13, 37};
      rx_tensor *x = awkward_logits(dtypes[d], 3, xs);
      double *ref = buffer(x->numel), *lse = buffer(B * 13);
      logsoftmax_ref(ref, lse, vals(x), B * 13, 37);
      guarded y = out_like(dtypes[d], 3, xs, 5.0);
      CHECK_OK(rx_logsoftmax_forward(y.t, x));
      check_close_inf(y.t, ref, fwd_tol[d], "logsoftmax out");
      /* -inf logits carry no probability: their gradient is dout itself */
      guarded dx = out_like(dtypes[d], 3, xs, 7.0);
      rx_tensor *dout = randn(dtypes[d], 3, xs, 1);
      CHECK_OK(rx_logsoftmax_backward(dx.t, dout, y.t));
      double *dxv = vals(dx.t), *dov = vals(dout), *xv = vals(x);
      int ok = 1;
      for (int64_t i = 0; i < x->numel; i++) ok &= isfinite(dxv[i]) && (!isinf(xv[i]) || dxv[i] == dov[i]);
      CHECK(ok, "logsoftmax backward with -inf logits (%s)", rx_dtype_name(dtypes[d]));
      CHECK_GUARD_OK(y, "logsoftmax out");
      CHECK_GUARD_OK(dx, "logsoftmax dinp");
      release_all();
    }
}

typedef struct { rx_tensor *out, *inp; const double *R; } logsoftmax_ctx;
static double logsoftmax_loss(void *p) {
  logsoftmax_ctx *c = p;
  CHECK_OK(rx_logsoftmax_forward(c->out, c->inp));
  return sum_prod(c->out, c->R);
}

static void logsoftmax_backward_matches_finite_differences(void) {
  int64_t xs[2] = {5, 13};
  rx_tensor *x = convert(randn(RX_F32, 2, xs, 3), RX_F64), *dout32 = randn(RX_F32, 2, xs, 1);
  rx_tensor *dout = convert(dout32, RX_F64);
  logsoftmax_ctx ctx = {tensor(RX_F64, 2, xs), x, vals(dout)};
  double *fx = finite_diff(logsoftmax_loss, &ctx, x);
  for (int d = 0; d < 2; d++) {
    rx_tensor *out = tensor(dtypes[d], 2, xs);
    CHECK_OK(rx_logsoftmax_forward(out, d ? x : convert(x, RX_F32)));
    guarded dx = out_like(dtypes[d], 2, xs, 7.0);
    CHECK_OK(rx_logsoftmax_backward(dx.t, d ? dout : dout32, out));
    check_grad(dx.t, 0, fx, grad_tol[d], "logsoftmax dinp (overwritten)");
    CHECK_GUARD_OK(dx, "logsoftmax dinp");
  }
  CHECK_OK(rx_logsoftmax_backward(NULL, dout, ctx.out));
  release_all();
}

/* ---- logprob (the training head) */

static const int32_t targets_13[13] = {4, -1, 0, 36, 17, 2, -1, 9, 30, 11, 25, 1, 33};

static void logprob_forward_matches_reference(void) {
  for (int64_t B = 1; B <= 3; B += 2)
    for (int d = 0; d < 2; d++) {
      int64_t N = 13 * B, V = 37, xs[3] = {B, 13, V}, ts[2] = {B, 13};
      int32_t tv[39];
      for (int64_t n = 0; n < N; n++) tv[n] = targets_13[n % 13];
      rx_tensor *x = awkward_logits(dtypes[d], 3, xs), *tg = ints(2, ts, tv);
      double *xv = vals(x);
      for (int64_t n = 0; n < N; n++)   /* no -inf at a target */
        if (tv[n] >= 0 && isinf(xv[n * V + tv[n]])) { xv[n * V + tv[n]] = 1.5; CHECK_OK(rx_tensor_set(x, n * V + tv[n], 1.5)); }
      double *lse = buffer(N), *logp = buffer(N), *ent = buffer(N);
      logprob_ref(logp, lse, ent, xv, tv, N, V);
      guarded lp = out_like(dtypes[d], 2, ts, 5.0), ls = out_like(dtypes[d], 1, &N, 5.0), en = out_like(dtypes[d], 2, ts, 5.0);
      CHECK_OK(rx_logprob_forward(lp.t, ls.t, en.t, x, tg));
      check_close(lp.t, logp, fwd_tol[d], "logprob logp");
      check_close(ls.t, lse, fwd_tol[d], "logprob lse");
      check_close(en.t, ent, fwd_tol[d], "logprob entropy");
      double *lpv = vals(lp.t);
      for (int64_t n = 0; n < N; n++)
        if (tv[n] < 0) CHECK(lpv[n] == 0, "padding row %lld has logp %g", (long long)n, lpv[n]);
      /* lse and entropy are optional */
      guarded lp2 = out_like(dtypes[d], 2, ts, 5.0);
      CHECK_OK(rx_logprob_forward(lp2.t, NULL, NULL, x, tg));
      check_close(lp2.t, logp, fwd_tol[d], "logprob logp alone");
      CHECK_GUARD_OK(lp, "logprob logp");
      CHECK_GUARD_OK(ls, "logprob lse");
      CHECK_GUARD_OK(en, "logprob entropy");
      CHECK_GUARD_OK(lp2, "logprob logp");
      release_all();
    }
}

static void logprob_on_a_real_vocabulary(void) {
  /* Qwen2's vocabulary size, f32: the vectorised exp over 151936 logits per row */
  int64_t N = 3, V = 151936, xs[2] = {N, V}, ts[1] = {N};
  const int32_t tv[3] = {0, 151935, 77777};
  rx_tensor *x = randn(RX_F32, 2, xs, 4), *tg = ints(1, ts, tv);
  double *xv = vals(x), *lse = buffer(N), *logp = buffer(N), *ent = buffer(N);
  logprob_ref(logp, lse, ent, xv, tv, N, V);
  rx_tensor *lp = tensor(RX_F32, 1, ts), *ls = tensor(RX_F32, 1, ts), *en = tensor(RX_F32, 1, ts);
  CHECK_OK(rx_logprob_forward(lp, ls, en, x, tg));
  check_close(lp, logp, 2e-6, "logprob logp, V=151936");
  check_close(ls, lse, 2e-6, "logprob lse, V=151936");
  check_close(en, ent, 2e-6, "logprob entropy, V=151936");
  release_all();
}

/* The head on vocabulary slices (engine/model/head.c): folding slices of width 8 (and one slice
 * of the whole row) gives the reference logp, lse and entropy, and each slice's backward equals
 * the columns of the whole-row backward (itself checked against finite differences below). */
#define SLICE_CASE(REAL, SFX)                                                                         \
  static void logprob_slices_##SFX(const double *xv, const int32_t *tv, int64_t N, int64_t V, int64_t W, \
                                   const double *logp, const double *lse, const double *ent, double tol) { \
    REAL *x = keep(malloc(sizeof(REAL) * (size_t)(N * V))), *tile = keep(malloc(sizeof(REAL) * (size_t)(N * W)));  \
    REAL *rmax = keep(calloc((size_t)N, sizeof(REAL))), *lp = keep(calloc((size_t)N, sizeof(REAL)));     \
    REAL *ls = keep(calloc((size_t)N, sizeof(REAL))), *en = keep(calloc((size_t)N, sizeof(REAL)));       \
    REAL *dl = keep(malloc(sizeof(REAL) * (size_t)N)), *de = keep(malloc(sizeof(REAL) * (size_t)N));     \
    REAL *whole = keep(malloc(sizeof(REAL) * (size_t)(N * V)));                                         \
    double *rsum = buffer(N), *rsz = buffer(N);                                                         \
    for (int64_t i = 0; i < N * V; i++) x[i] = (REAL)xv[i];                                              \
    for (int64_t v0 = 0; v0 < V; v0 += W) {                                                             \
      const int64_t vs = V - v0 < W ? V - v0 : W;                                                       \
      for (int64_t n = 0; n < N; n++) memcpy(tile + n * vs, x + n * V + v0, sizeof(REAL) * (size_t)vs); \
      rx_cpu_logprob_slice_forward_##SFX(rmax, rsum, rsz, lp, tile, tv, N, vs, v0, v0 == 0);            \
    }                                                                                                   \
    rx_cpu_logprob_slice_finish_##SFX(lp, ls, en, rmax, rsum, rsz, tv, N);                              \
    double worst = 0;                                                                                   \
    for (int64_t n = 0; n < N; n++) {                                                                   \
      worst = fmax(worst, fabs(lp[n] - logp[n]) / (1 + fabs(logp[n])));                                 \
      worst = fmax(worst, fabs(ls[n] - lse[n]) / (1 + fabs(lse[n])));                                   \
      worst = fmax(worst, fabs(en[n] - ent[n]) / (1 + fabs(ent[n])));                                   \
      CHECK(fabs(rsz[n] - en[n]) <= tol * (1 + fabs(en[n])), "slice finish keeps H %g for %g", rsz[n], (double)en[n]); \
    }                                                                                                   \
    CHECK(worst < tol, #SFX " head on slices of %lld: forward off the reference by %g", (long long)W, worst); \
    for (int64_t n = 0; n < N; n++) { dl[n] = (REAL)sin(1.0 + n); de[n] = (REAL)cos(2.0 + n); }         \
    for (int with_e = 0; with_e < 2; with_e++) {                                                        \
      if (with_e) rx_cpu_logprob_entropy_backward_##SFX(whole, dl, de, x, tv, ls, N, V);                \
      else rx_cpu_logprob_backward_##SFX(whole, dl, x, tv, ls, N, V);                                   \
      double bad = 0;                                                                                   \
      for (int64_t v0 = 0; v0 < V; v0 += W) {                                                           \
        const int64_t vs = V - v0 < W ? V - v0 : W;                                                     \
        for (int64_t n = 0; n < N; n++) memcpy(tile + n * vs, x + n * V + v0, sizeof(REAL) * (size_t)vs); \
        rx_cpu_logprob_slice_backward_##SFX(tile, dl, with_e ? de : NULL, rsz, tile, tv, ls, N, vs, v0); \
        for (int64_t n = 0; n < N; n++)                                                                 \
          for (int64_t v = 0; v < vs; v++) bad = fmax(bad, fabs(tile[n * vs + v] - whole[n * V + v0 + v])); \
      }                                                                                                 \
      CHECK(bad < tol, #SFX " head backward on slices of %lld (entropy %d) differs by %g", (long long)W, with_e, bad); \
    }                                                                                                   \
  }
SLICE_CASE(float, f32)
SLICE_CASE(double, f64)

/* The slice ops (engine/ops/logprob_slice.c, what the model's head calls): the same numbers as
 * the kernels above, over the whole vocabulary as one slice, and bad arguments named. */
static void logprob_slice_ops(void) {
  const int64_t N = 5, V = 11, xs[2] = {N, V}, ns[1] = {N};
  rx_tensor *x, *tg, *rmax, *rsum, *rsz, *lp, *ls, *en, *dl, *g, *ref, *rls, *ren, *bad;
  CHECK_OK(rx_tensor_new(&x, RX_F64, RX_CPU, 2, xs));
  CHECK_OK(rx_tensor_new(&g, RX_F64, RX_CPU, 2, xs));
  CHECK_OK(rx_tensor_new(&tg, RX_I32, RX_CPU, 1, ns));
  rx_tensor **vec[] = {&rmax, &lp, &ls, &en, &dl, &ref, &rls, &ren};
  for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) CHECK_OK(rx_tensor_new(vec[i], RX_F64, RX_CPU, 1, ns));
  CHECK_OK(rx_tensor_new(&rsum, RX_F64, RX_CPU, 1, ns));
  CHECK_OK(rx_tensor_new(&rsz, RX_F64, RX_CPU, 1, ns));
  CHECK_OK(rx_tensor_new(&bad, RX_F32, RX_CPU, 1, ns));
  rx_tensor_normal(x, 3, 0, 0.0, 2.0);
  rx_tensor_fill(dl, 0.5);
  for (int64_t n = 0; n < N; n++) ((int32_t *)tg->data)[n] = n == 2 ? -1 : (int32_t)(n * 3 % V);
  CHECK_OK(rx_logprob_slice_forward(rmax, rsum, rsz, lp, x, tg, 0, 1));
  CHECK_OK(rx_logprob_slice_finish(lp, ls, en, rmax, rsum, rsz, tg));
  CHECK_OK(rx_logprob_forward(ref, rls, ren, x, tg));
  for (int64_t n = 0; n < N; n++) {
    const double *a = lp->data, *b = ref->data, *c = ls->data, *d = rls->data, *e = en->data, *f = ren->data;
    CHECK(fabs(a[n] - b[n]) < 1e-12 && fabs(c[n] - d[n]) < 1e-12 && fabs(e[n] - f[n]) < 1e-12,
          "row %lld: slice op logp %g lse %g H %g, whole-row op %g %g %g", (long long)n, a[n], c[n], e[n], b[n], d[n], f[n]);
  }
  CHECK_OK(rx_logprob_slice_backward(g, dl, NULL, NULL, x, tg, ls, 0));
  CHECK(((double *)g->data)[2 * V + 4] == 0, "a padding row's gradient is 0");
  CHECK_FAILS(rx_logprob_slice_forward(rmax, bad, rsz, lp, x, tg, 0, 1), "logprob_slice: rsum has dtype f32, expected f64");
  CHECK_FAILS(rx_logprob_slice_forward(rmax, rsum, rsz, lp, x, tg, -3, 1), "slice start v0 = -3 must be >= 0");
  CHECK_FAILS(rx_logprob_slice_forward(bad, rsum, rsz, lp, x, tg, 0, 1), "rmax has dtype f32, expected f64");
  CHECK_FAILS(rx_logprob_slice_finish(lp, ls, en, rmax, rsum, rsz, x), "logprob_slice_finish: targets has dtype f64");
  CHECK_FAILS(rx_logprob_slice_backward(g, dl, dl, bad, x, tg, ls, 0), "logprob_slice_backward: entropy has dtype f32");
  CHECK_FAILS(rx_logprob_slice_backward(rmax, dl, NULL, NULL, x, tg, ls, 0), "dlogits has shape [5], expected 5 rows of 11");
  rx_tensor *all[] = {x, g, tg, rmax, lp, ls, en, dl, ref, rls, ren, rsum, rsz, bad};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rx_tensor_free(all[i]);
}

static void logprob_on_vocabulary_slices(void) {
  int64_t N = 13, V = 37, xs[2] = {N, V};
  int32_t tv[13];
  memcpy(tv, targets_13, sizeof tv);
  rx_tensor *x = awkward_logits(RX_F64, 2, xs);
  double *xv = vals(x);
  for (int64_t n = 0; n < N; n++)
    if (tv[n] >= 0 && isinf(xv[n * V + tv[n]])) xv[n * V + tv[n]] = 1.5;
  for (int64_t v = 0; v < 8; v++) xv[2 * V + v] = -INFINITY;   /* a first slice of -inf only */
  double *lse = buffer(N), *logp = buffer(N), *ent = buffer(N);
  logprob_ref(logp, lse, ent, xv, tv, N, V);
  const int64_t widths[3] = {8, 16, 37};
  for (int w = 0; w < 3; w++) {
    logprob_slices_f32(xv, tv, N, V, widths[w], logp, lse, ent, 1e-5);   /* inputs rounded to f32 near 500 */
    logprob_slices_f64(xv, tv, N, V, widths[w], logp, lse, ent, 1e-12);
  }
  release_all();
}

typedef struct { rx_tensor *logp, *logits, *targets; const double *R; } logprob_ctx;
static double logprob_loss(void *p) {
  logprob_ctx *c = p;
  CHECK_OK(rx_logprob_forward(c->logp, NULL, NULL, c->logits, c->targets));
  return sum_prod(c->logp, c->R);
}

static void logprob_backward_matches_finite_differences(void) {
  int64_t N = 13, V = 37, xs[2] = {N, V}, ts[1] = {N};
  rx_tensor *tg = ints(1, ts, targets_13);
  rx_tensor *x32 = randn(RX_F32, 2, xs, 3), *x = convert(x32, RX_F64);
  rx_tensor *dlogp32 = randn(RX_F32, 1, ts, 1), *dlogp = convert(dlogp32, RX_F64);
  logprob_ctx ctx = {tensor(RX_F64, 1, ts), x, tg, vals(dlogp)};
  double *fx = finite_diff(logprob_loss, &ctx, x);
  for (int d = 0; d < 2; d++) {
    rx_tensor *X = d ? x : x32, *lse = tensor(dtypes[d], 1, ts);
    CHECK_OK(rx_logprob_forward(tensor(dtypes[d], 1, ts), lse, NULL, X, tg));
    guarded dx = out_like(dtypes[d], 2, xs, 7.0);
    CHECK_OK(rx_logprob_backward(dx.t, d ? dlogp : dlogp32, X, tg, lse));
    check_grad(dx.t, 0, fx, grad_tol[d], "logprob dlogits (overwritten)");
    double *g = vals(dx.t);
    for (int64_t n = 0; n < N; n++)
      if (targets_13[n] < 0)
        for (int64_t v = 0; v < V; v++) CHECK(g[n * V + v] == 0, "padding row %lld has gradient %g", (long long)n, g[n * V + v]);
    /* in place: the logits buffer becomes the gradient, the same values as out of place */
    rx_tensor *inplace = convert(X, dtypes[d]);
    CHECK_OK(rx_logprob_backward(inplace, d ? dlogp : dlogp32, inplace, tg, lse));
    CHECK(memcmp(inplace->data, dx.t->data, (size_t)(N * V) * rx_dtype_size(dtypes[d])) == 0,
          "logprob backward in place differs from out of place (%s)", rx_dtype_name(dtypes[d]));
    CHECK_GUARD_OK(dx, "logprob dlogits");
  }
  release_all();
}

/* The entropy bonus's head backward: d/dlogits of sum(R * logp) + sum(E * entropy). */
typedef struct { rx_tensor *logp, *ent, *logits, *targets; const double *R, *E; } logprob_ent_ctx;
static double logprob_ent_loss(void *p) {
  logprob_ent_ctx *c = p;
  CHECK_OK(rx_logprob_forward(c->logp, NULL, c->ent, c->logits, c->targets));
  double s = sum_prod(c->logp, c->R);
  const double *h = c->ent->data;
  for (int64_t n = 0; n < c->ent->numel; n++)
    if (((const int32_t *)c->targets->data)[n] >= 0) s += c->E[n] * h[n];   /* padding rows carry no loss */
  return s;
}

static void logprob_entropy_backward_matches_finite_differences(void) {
  int64_t N = 13, V = 37, xs[2] = {N, V}, ts[1] = {N};
  rx_tensor *tg = ints(1, ts, targets_13);
  rx_tensor *x32 = randn(RX_F32, 2, xs, 5), *x = convert(x32, RX_F64);
  rx_tensor *dlogp32 = randn(RX_F32, 1, ts, 6), *dlogp = convert(dlogp32, RX_F64);
  rx_tensor *dent32 = randn(RX_F32, 1, ts, 7), *dent = convert(dent32, RX_F64);
  logprob_ent_ctx ctx = {tensor(RX_F64, 1, ts), tensor(RX_F64, 1, ts), x, tg, vals(dlogp), vals(dent)};
  double *fx = finite_diff(logprob_ent_loss, &ctx, x);
  for (int d = 0; d < 2; d++) {
    rx_tensor *X = d ? x : x32, *lse = tensor(dtypes[d], 1, ts);
    CHECK_OK(rx_logprob_forward(tensor(dtypes[d], 1, ts), lse, NULL, X, tg));
    guarded dx = out_like(dtypes[d], 2, xs, 7.0);
    CHECK_OK(rx_logprob_entropy_backward(dx.t, d ? dlogp : dlogp32, d ? dent : dent32, X, tg, lse));
    check_grad(dx.t, 0, fx, grad_tol[d], "logprob dlogits with entropy");
    rx_tensor *inplace = convert(X, dtypes[d]);
    CHECK_OK(rx_logprob_entropy_backward(inplace, d ? dlogp : dlogp32, d ? dent : dent32, inplace, tg, lse));
    CHECK(memcmp(inplace->data, dx.t->data, (size_t)(N * V) * rx_dtype_size(dtypes[d])) == 0,
          "logprob entropy backward in place differs from out of place (%s)", rx_dtype_name(dtypes[d]));
    /* a zero entropy gradient is the plain backward */
    rx_tensor *zero = tensor(dtypes[d], 1, ts), *plain = tensor(dtypes[d], 2, xs);
    CHECK_OK(rx_tensor_fill(zero, 0.0));
    CHECK_OK(rx_logprob_backward(plain, d ? dlogp : dlogp32, X, tg, lse));
    CHECK_OK(rx_logprob_entropy_backward(inplace, d ? dlogp : dlogp32, zero, X, tg, lse));
    check_close(inplace, vals(plain), d ? 1e-15 : 1e-7, "entropy backward with dentropy 0");
    CHECK_GUARD_OK(dx, "logprob dlogits with entropy");
  }
  release_all();
}

/* ---- threading: the cases above are mostly below the OpenMP thresholds; these are above them */

typedef void (*op_run)(rx_tensor **t);
static void run_rmsnorm(rx_tensor **t) {
  CHECK_OK(rx_rmsnorm_forward(t[2], t[3], t[0], t[1], 1e-6));
  CHECK_OK(rx_rmsnorm_backward(t[4], t[5], t[6], t[0], t[1], t[3]));
}
static void run_swiglu(rx_tensor **t) {
  CHECK_OK(rx_swiglu_forward(t[2], t[0], t[6]));
  CHECK_OK(rx_swiglu_backward(t[4], t[7], t[6], t[0], t[2]));
}
static void run_softmax(rx_tensor **t) {
  CHECK_OK(rx_logsoftmax_forward(t[2], t[0]));
  CHECK_OK(rx_logsoftmax_backward(t[4], t[6], t[2]));
  CHECK_OK(rx_logprob_forward(t[3], t[8], t[9], t[0], t[10]));
  CHECK_OK(rx_logprob_backward(t[7], t[3], t[0], t[10], t[8]));
}
static void run_bias_and_add(rx_tensor **t) {
  CHECK_OK(rx_matmul_backward(NULL, NULL, t[5], t[6], t[0], t[11]));
  CHECK_OK(rx_add(t[2], t[0], t[6]));
  CHECK_OK(rx_rope_forward(t[4], t[13], t[12], 1e4));
  CHECK_OK(rx_rope_backward(t[7], t[14], t[12], 1e4));
}

static void threads_do_not_change_results(void) {
  /* 1100 rows of 256: above every threshold; 1 and 2 threads must agree bit for bit */
  int64_t N = 1100, C = 256, x[2] = {N, C}, c[1] = {C}, n[1] = {N}, w[2] = {C, C}, r[3] = {N, 4, 64};
  op_run ops[4] = {run_rmsnorm, run_swiglu, run_softmax, run_bias_and_add};
  const char *names[4] = {"rmsnorm", "swiglu", "logsoftmax/logprob", "dbias/add/rope"};
  rx_tensor *in0 = randn(RX_F32, 2, x, 2), *in1 = randn(RX_F32, 1, c, 1), *in6 = randn(RX_F32, 2, x, 1);
  rx_tensor *tg = randint(1, n, -1, C), *w11 = randn(RX_F32, 2, w, 1), *pos = randint(1, n, 0, 5000);
  rx_tensor *in0r, *in6r, *out[2][15];
  CHECK_OK(rx_tensor_reshape(&in0r, in0, 3, r));
  CHECK_OK(rx_tensor_reshape(&in6r, in6, 3, r));
  keep_t(in0r), keep_t(in6r);
  int threads = omp_get_max_threads();
  for (int k = 0; k < 4; k++) {
    for (int th = 0; th < 2; th++) {
      rx_tensor **t = out[th];
      t[0] = in0, t[1] = in1, t[6] = in6, t[10] = tg, t[11] = w11, t[12] = pos, t[13] = in0r, t[14] = in6r;
      t[2] = tensor(RX_F32, 2, x), t[4] = tensor(RX_F32, 2, x), t[7] = tensor(RX_F32, 2, x);
      if (k == 3) t[4] = tensor(RX_F32, 3, r), t[7] = tensor(RX_F32, 3, r);
      t[3] = tensor(RX_F32, 1, n), t[5] = tensor(RX_F32, 1, c);
      t[8] = tensor(RX_F32, 1, n), t[9] = tensor(RX_F32, 1, n);
      omp_set_num_threads(th + 1);
      ops[k](t);
    }
    omp_set_num_threads(threads);
    static const int outputs[7] = {2, 3, 4, 5, 7, 8, 9};
    for (int j = 0; j < 7; j++) {
      rx_tensor *a = out[0][outputs[j]], *b = out[1][outputs[j]];
      CHECK(memcmp(a->data, b->data, (size_t)a->numel * sizeof(float)) == 0, "%s: output %d differs between 1 and 2 threads",
            names[k], outputs[j]);
    }
  }
  release_all();
}

/* ---- bad arguments */

static void bad_arguments_name_the_problem(void) {
  int64_t s38[2] = {3, 8}, s7[1] = {7}, s8[1] = {8}, s3[1] = {3}, w58[2] = {5, 8}, w57[2] = {5, 7}, s35[2] = {3, 5};
  rx_tensor *x = randn(RX_F32, 2, s38, 1), *y = tensor(RX_F32, 2, s38), *w7 = randn(RX_F32, 1, s7, 1);
  rx_tensor *w8 = randn(RX_F32, 1, s8, 1), *r3 = tensor(RX_F32, 1, s3);
  CHECK_FAILS(rx_rmsnorm_forward(y, r3, x, w7, 1e-6), "rmsnorm: weight has shape [7], expected [8] (C of inp [3,8])");
  CHECK_FAILS(rx_rmsnorm_forward(y, r3, x, convert(w8, RX_F64), 1e-6), "rmsnorm: weight has dtype f64, expected f32");
  CHECK_FAILS(rx_rmsnorm_forward(y, r3, x, w8, -1), "eps -1");
  CHECK_FAILS(rx_rmsnorm_backward(y, NULL, y, x, w8, NULL), "rmsnorm_backward: rstd is missing");
  CHECK_FAILS(rx_rmsnorm_forward(y, r3, convert(x, RX_I32), w8, 1e-6), "inp has dtype i32, expected a float dtype");
  CHECK_FAILS(rx_rmsnorm_forward(convert(y, RX_BF16), convert(r3, RX_BF16), convert(x, RX_BF16), convert(w8, RX_BF16), 1e-6),
              "rmsnorm: rstd has dtype bf16, expected f32 (for inp of dtype bf16)");   /* statistics stay f32 */
  CHECK_FAILS(rx_rmsnorm_forward(convert(y, RX_BF16), r3, convert(x, RX_BF16), convert(w8, RX_BF16), 1e-6),
              "rmsnorm: no cpu kernel for dtype bf16");

  /* matmul */
  rx_tensor *out = tensor(RX_F32, 2, s35), *W = randn(RX_F32, 2, w58, 1);
  CHECK_FAILS(rx_matmul_forward(out, x, randn(RX_F32, 2, w57, 1), NULL), "matmul: weight has shape [5,7], expected [out,8]");
  CHECK_FAILS(rx_matmul_forward(out, x, convert(W, RX_F64), NULL), "weight has dtype f64, expected f32");
  CHECK_FAILS(rx_matmul_forward(y, x, W, NULL), "out has shape [3,8], expected 3 rows of 5");
  CHECK_FAILS(rx_matmul_forward(out, x, W, w8), "bias has shape [8], expected [5]");
  CHECK_FAILS(rx_matmul_forward(NULL, x, W, NULL), "matmul: out is missing");
  CHECK_FAILS(rx_matmul_backward(NULL, tensor(RX_F32, 2, s38), NULL, out, x, W), "dweight has shape [3,8], expected [5,8]");
  rx_tensor *strided;
  CHECK_OK(rx_tensor_narrow(&strided, x, 1, 0, 4));
  keep_t(strided);
  CHECK_FAILS(rx_matmul_forward(out, strided, W, NULL), "matmul: inp [3,4] is not contiguous");

  /* cuda tensors without a usable device (host memory labelled cuda: only where no GPU would run
   * them), and mixed devices */
  rx_tensor xc = *x, wc = *W, oc = *out;
  xc.device = wc.device = oc.device = RX_CUDA;
  if (!rx_has_cuda()) CHECK_FAILS(rx_matmul_forward(&oc, &xc, &wc, NULL), "cuda: ");
  CHECK_FAILS(rx_matmul_forward(out, x, &wc, NULL), "weight is on cuda:0, expected cpu:0");

  /* embedding: bad token ids name the token and the row */
  int64_t ts[1] = {4}, e[2] = {4, 8}, v8[2] = {11, 8};
  rx_tensor *emb = randn(RX_F32, 2, v8, 1), *eo = tensor(RX_F32, 2, e);
  const int32_t big[4] = {0, 1, 2, 11}, neg[4] = {0, -3, 2, 1};
  CHECK_FAILS(rx_embedding_forward(eo, ints(1, ts, big), emb), "token 11 at row 3 is outside the vocabulary [0, 11)");
  CHECK_FAILS(rx_embedding_forward(eo, ints(1, ts, neg), emb), "token -3 at row 1");
  CHECK_FAILS(rx_embedding_backward(emb, eo, ints(1, ts, big)), "token 11 at row 3");
  CHECK_FAILS(rx_embedding_forward(eo, convert(ints(1, ts, neg), RX_F32), emb), "tokens has dtype f32, expected i32");
  CHECK_FAILS(rx_embedding_forward(y, ints(1, ts, neg), emb), "out has shape [3,8], expected 4 rows of 8");

  /* logprob: out-of-range targets name row and value; negative ones are padding */
  int64_t ls[2] = {3, 37}, ls3[1] = {3};
  const int32_t bad_t[3] = {1, -1, 37}, ok_t[3] = {1, -1, 36};
  rx_tensor *logits = randn(RX_F32, 2, ls, 1), *lp = tensor(RX_F32, 1, ls3);
  CHECK_FAILS(rx_logprob_forward(lp, NULL, NULL, logits, ints(1, ls3, bad_t)), "target 37 at row 2 is outside the vocabulary [0, 37)");
  CHECK_FAILS(rx_logprob_backward(logits, lp, logits, ints(1, ls3, bad_t), lp), "target 37 at row 2");
  CHECK_FAILS(rx_logprob_backward(logits, lp, logits, ints(1, ls3, ok_t), NULL), "logprob_backward: lse is missing");
  CHECK_FAILS(rx_logprob_forward(lp, NULL, NULL, logits, ints(1, ts, big)), "targets has shape [4] (4 elements), expected 3");
  CHECK_FAILS(rx_logprob_forward(tensor(RX_F32, 1, ts), NULL, NULL, logits, ints(1, ls3, ok_t)), "logp has shape [4]");

  /* rope */
  int64_t q[3] = {2, 3, 8}, q7[3] = {2, 3, 7}, p2[1] = {2}, p3[1] = {3};
  const int32_t pv[3] = {0, 1, 2};
  rx_tensor *qt = randn(RX_F32, 3, q, 1), *q7t = randn(RX_F32, 3, q7, 1);
  CHECK_FAILS(rx_rope_forward(q7t, q7t, ints(1, p2, pv), 1e4), "head_dim 7 of inp [2,3,7] must be even");
  CHECK_FAILS(rx_rope_forward(qt, qt, ints(1, p3, pv), 1e4), "positions has shape [3] (3 elements), expected 2");
  CHECK_FAILS(rx_rope_forward(qt, qt, ints(1, p2, pv), 0), "theta 0");
  CHECK_FAILS(rx_rope_forward(randn(RX_F32, 1, s8, 1), randn(RX_F32, 1, s8, 1), ints(1, p2, pv), 1e4),
              "inp has shape [8], expected [..,heads,head_dim]");

  /* elementwise ops */
  CHECK_FAILS(rx_swiglu_forward(y, x, out), "swiglu: up has shape [3,5], expected 3 rows of 8");
  CHECK_FAILS(rx_add(y, x, convert(x, RX_F64)), "add: b has dtype f64, expected f32");
  CHECK_FAILS(rx_logsoftmax_forward(out, x), "logsoftmax: out has shape [3,5], expected 3 rows of 8");
  release_all();
}

int main(void) {
  RUN(fast_exp_is_accurate);
  RUN(matmul_forward_matches_reference);
  RUN(matmul_few_rows_match_reference_and_each_other);
  RUN(matmul_backward_matches_finite_differences);
  RUN(embedding_forward_matches_reference);
  RUN(embedding_backward_matches_finite_differences);
  RUN(embedding_backward_is_deterministic);
  RUN(rmsnorm_forward_matches_reference);
  RUN(rmsnorm_backward_matches_finite_differences);
  RUN(rope_forward_matches_reference);
  RUN(rope_backward_matches_finite_differences);
  RUN(swiglu_forward_matches_reference);
  RUN(swiglu_backward_matches_finite_differences);
  RUN(add_matches_reference);
  RUN(logsoftmax_forward_matches_reference);
  RUN(logsoftmax_backward_matches_finite_differences);
  RUN(logprob_forward_matches_reference);
  RUN(logprob_on_a_real_vocabulary);
  RUN(logprob_on_vocabulary_slices);
  RUN(logprob_slice_ops);
  RUN(logprob_backward_matches_finite_differences);
  RUN(logprob_entropy_backward_matches_finite_differences);
  RUN(threads_do_not_change_results);
  RUN(bad_arguments_name_the_problem);
  return check_summary("test_kernels");
}
