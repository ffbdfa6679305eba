/* test_bf16.c: weights stored in bf16 under f32 compute (engine/cpu/matmul_bf16.c): the linear
 * layer (inputs rounded to bf16, exact products, f32 sums), its input gradient and the embedding
 * gather against double references on the widened weights, at every row count of the decode
 * kernels and past them into the widened-block GEMM, with sentinels around outputs; the AVX-512
 * BF16 kernel (matmul_bf16dot.c) against the f32 kernels on the rounded inputs, where the CPU has
 * it; a row's result independent of the rows beside it and of the thread count; and the refusals
 * (mismatched dtypes); the GEMMs of bf16 training (cpu/bf16_gemm.c) on each kernel. */
#include "check.h"
#include "cpu/cpu.h"
#include "internal.h"
#include <omp.h>

static uint64_t offset = 1;

static rx_tensor *randn(int32_t dtype, int ndim, const int64_t *shape) {
  rx_tensor *t = NULL;
  CHECK_OK(rx_tensor_new(&t, dtype, RX_CPU, ndim, shape));
  CHECK_OK(rx_tensor_normal(t, 77, offset, 0.0, 1.0));
  offset += (uint64_t)t->numel;
  return t;
}

static double *values(const rx_tensor *t) {
  double *v = malloc((size_t)t->numel * sizeof(double) + 8);
  CHECK_OK(rx_tensor_read_f64(t, v));
  return v;
}

/* y[n,o] = sum_c x[n,c] w[o,c] + b[o] in double */
static void ref_forward(double *y, const double *x, const double *w, const double *b, int64_t N, int64_t C, int64_t OC) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) {
      double s = b ? b[o] : 0;
      for (int64_t c = 0; c < C; c++) s += x[n * C + c] * w[o * C + c];
      y[n * OC + o] = s;
    }
}

/* Largest |got - want| / (sum_c |x w| + |b|): the f32 rounding bound of each dot product. */
static double worst_rel(const rx_tensor *got, const double *want, const double *x, const double *w, const double *b,
                        int64_t N, int64_t C, int64_t OC) {
  double worst = 0;
  const float *g = got->data;
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) {
      double scale = b ? fabs(b[o]) : 0;
      for (int64_t c = 0; c < C; c++) scale += fabs(x[n * C + c] * w[o * C + c]);
      double e = fabs(g[n * OC + o] - want[n * OC + o]) / (scale > 0 ? scale : 1);
      if (e > worst) worst = e;
    }
  return worst;
}

/* The same bound for dinp [N, C] against dout [N, OC] @ w [OC, C]. */
static double worst_rel_dinp(const rx_tensor *got, const double *dout, const double *w, int64_t N, int64_t C, int64_t OC) {
  double worst = 0;
  const float *g = got->data;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) {
      double want = 0, scale = 0;
      for (int64_t o = 0; o < OC; o++) { want += dout[n * OC + o] * w[o * C + c]; scale += fabs(dout[n * OC + o] * w[o * C + c]); }
      worst = fmax(worst, fabs(g[n * C + c] - want) / (scale > 0 ? scale : 1));
    }
  return worst;
}

/* x rounded to bf16 (nearest even) in place: what a bf16-stored weight multiplies. */
static void round_to_bf16(double *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = rx_bf16_to_f32(rx_f32_to_bf16((float)x[i]));
}

/* For bf16 weights (with and without the AVX-512 BF16 kernel, where the CPU has it) and for f32
 * ones (whose decode path is the widening kernel where the build has no AVX-512, and
 * matmul_rows.c's where it has). */
static void forward_matches_reference_at_every_row_count(void) {
  /* {C, OC}: tails of the 8/16-lane loops, partial tiles, and one shape large enough to thread */
  static const int64_t shapes[4][2] = {{37, 19}, {64, 131}, {300, 301}, {1, 5}};
  const int dot = rx_cpu_bf16_dot();
  for (int s = 0; s < 12; s++) {
    const int32_t wdt = s < 8 ? RX_BF16 : RX_F32;
    rx_cpu_bf16_dot_set(s < 4);   /* shapes 4..7: the widening kernel on a CPU with the instruction */
    if (s >= 4 && s < 8 && !dot) continue;   /* the same path as shapes 0..3 */
    const int64_t C = shapes[s % 4][0], OC = shapes[s % 4][1], NMAX = 70;
    int64_t xs[2] = {NMAX, C}, ws[2] = {OC, C}, bs[1] = {OC};
    rx_tensor *x = randn(RX_F32, 2, xs), *w32 = randn(RX_F32, 2, ws), *b = randn(RX_F32, 1, bs), *w = NULL;
    CHECK_OK(rx_tensor_new(&w, wdt, RX_CPU, 2, ws));
    CHECK_OK(rx_tensor_copy(w, w32));   /* rounded to bf16, or the same */
    double *xv = values(x), *wv = values(w), *bv = values(b), *ref = malloc(sizeof(double) * (size_t)(NMAX * OC));
    if (wdt == RX_BF16) round_to_bf16(xv, NMAX * C);
    ref_forward(ref, xv, wv, bv, NMAX, C, OC);
    for (int64_t n = 1; n <= NMAX; n++) {
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        int64_t ys[2] = {n, OC};
        guarded y = guarded_new(RX_F32, 2, ys);
        rx_tensor *xn = NULL;
        CHECK_OK(rx_tensor_narrow(&xn, x, 0, 0, n));
        CHECK_OK(rx_matmul_forward(y.t, xn, w, with_bias ? b : NULL));
        double *r = ref;
        double *nob = NULL;
        if (!with_bias) {
          nob = malloc(sizeof(double) * (size_t)(n * OC));
          ref_forward(nob, xv, wv, NULL, n, C, OC);
          r = nob;
        }
        double e = worst_rel(y.t, r, xv, wv, with_bias ? bv : NULL, n, C, OC);
        CHECK(e < 1e-6, "%s%s C=%lld OC=%lld rows=%lld bias=%d: error %.3g of the f32 bound", rx_dtype_name(wdt),
              rx_cpu_bf16_dot() ? " (vdpbf16ps)" : "", (long long)C, (long long)OC, (long long)n, with_bias, e);
        if (n <= RX_BF16_FEW_ROWS && with_bias) {   /* the last row alone gives the same bits */
          rx_tensor *x1 = NULL, *y1 = NULL;
          CHECK_OK(rx_tensor_narrow(&x1, x, 0, n - 1, 1));
          CHECK_OK(rx_tensor_new(&y1, RX_F32, RX_CPU, 2, (int64_t[2]){1, OC}));
          CHECK_OK(rx_matmul_forward(y1, x1, w, b));
          CHECK(memcmp((float *)y.t->data + (n - 1) * OC, y1->data, (size_t)OC * sizeof(float)) == 0,
                "%s C=%lld OC=%lld: row %lld of %lld rows differs from the same row alone", rx_dtype_name(wdt),
                (long long)C, (long long)OC, (long long)n, (long long)n);
          rx_tensor_free(x1);
          rx_tensor_free(y1);
        }
        CHECK(guarded_free(y), "rows=%lld: write outside the output", (long long)n);
        rx_tensor_free(xn);
        free(nob);
      }
    }
    /* thread count: 1 and 2 threads give the same bits, for a decode batch and a GEMM batch */
    const int threads = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
      const int64_t n = k ? NMAX : 11;
      rx_tensor *xn = NULL, *y1 = NULL, *y2 = NULL;
      CHECK_OK(rx_tensor_narrow(&xn, x, 0, 0, n));
      CHECK_OK(rx_tensor_new(&y1, RX_F32, RX_CPU, 2, (int64_t[2]){n, OC}));
      CHECK_OK(rx_tensor_new(&y2, RX_F32, RX_CPU, 2, (int64_t[2]){n, OC}));
      omp_set_num_threads(1);
      CHECK_OK(rx_matmul_forward(y1, xn, w, b));
      omp_set_num_threads(2);
      CHECK_OK(rx_matmul_forward(y2, xn, w, b));
      omp_set_num_threads(threads);
      if (k == 0)   /* the decode kernel promises it; sgemm's threading is OpenBLAS's */
        CHECK(memcmp(y1->data, y2->data, (size_t)(n * OC) * sizeof(float)) == 0,
              "C=%lld OC=%lld: %lld rows differ between 1 and 2 threads", (long long)C, (long long)OC, (long long)n);
      rx_tensor_free(xn);
      rx_tensor_free(y1);
      rx_tensor_free(y2);
    }
    free(xv); free(wv); free(bv); free(ref);
    rx_tensor_free(x); rx_tensor_free(w32); rx_tensor_free(b); rx_tensor_free(w);
  }
  rx_cpu_bf16_dot_set(1);
}

/* The AVX-512 BF16 kernel against remax's f32 kernel on the bf16-rounded inputs and widened
 * weights: equal up to the order of the sums, at every row count of a decode step and at prefill
 * row counts (blocks of 48 rows and a remainder), at the Qwen2.5-0.5B
 * widths (k chunks, a 4864 tail) and odd ones; and its rounding is nearest even, as rx_f32_to_bf16. */
static void dot_kernel_matches_f32_kernel_on_rounded_inputs(void) {
  if (!rx_cpu_bf16_dot()) {
    fprintf(stderr, "skip: no AVX-512 BF16 (vdpbf16ps) here (the CPU lacks it, or REMAX_NO_BF16_DOT is set): its kernel is not tested\n");
    return;
  }
  static const int64_t shapes[4][2] = {{896, 160}, {4864, 37}, {33, 301}, {5000, 13}};   /* {C, OC} */
  for (int s = 0; s < 4; s++) {
    /* every row count of one block of 48, then blocks of 48 and a remainder (a prefill) */
    const int64_t C = shapes[s][0], OC = shapes[s][1], N = 2 * RX_BF16_FEW_ROWS + 5;
    int64_t xs[2] = {N, C}, ws[2] = {OC, C};
    rx_tensor *x = randn(RX_F32, 2, xs), *w32 = randn(RX_F32, 2, ws), *w = NULL;
    CHECK_OK(rx_tensor_new(&w, RX_BF16, RX_CPU, 2, ws));
    CHECK_OK(rx_tensor_copy(w, w32));
    float *xr = malloc(sizeof(float) * (size_t)(N * C)), *wr = malloc(sizeof(float) * (size_t)(OC * C));
    float *yd = malloc(sizeof(float) * (size_t)(N * OC + 1)), *yf = malloc(sizeof(float) * (size_t)(N * OC));
    for (int64_t i = 0; i < N * C; i++) xr[i] = rx_bf16_to_f32(rx_f32_to_bf16(((float *)x->data)[i]));
    for (int64_t i = 0; i < OC * C; i++) wr[i] = rx_bf16_to_f32(((uint16_t *)w->data)[i]);
    for (int64_t n = 1; n <= N; n = n < RX_BF16_FEW_ROWS + 1 ? n + 1 : n == RX_BF16_FEW_ROWS + 1 ? 2 * RX_BF16_FEW_ROWS : n + 5) {
      yd[n * OC] = 12345.0f;   /* sentinel past the output */
      CHECK(rx_cpu_matmul_rows_bf16dot(yd, x->data, w->data, NULL, n, C, OC) == 1, "rows=%lld: kernel declined",
            (long long)n);
      rx_cpu_matmul_forward_f32(yf, xr, wr, NULL, n, C, OC);
      double worst = 0;
      for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < OC; o++) {
          double scale = 0;
          for (int64_t c = 0; c < C; c++) scale += fabs((double)xr[r * C + c] * wr[o * C + c]);
          worst = fmax(worst, fabs((double)yd[r * OC + o] - yf[r * OC + o]) / scale);
        }
      CHECK(worst < 2e-6, "C=%lld OC=%lld rows=%lld: vdpbf16ps and the f32 kernel differ by %.3g of sum |x w|",
            (long long)C, (long long)OC, (long long)n, worst);
      CHECK(yd[n * OC] == 12345.0f, "rows=%lld: write past the output", (long long)n);
    }
    free(xr); free(wr); free(yd); free(yf);
    rx_tensor_free(x); rx_tensor_free(w32); rx_tensor_free(w);
  }
  /* rounding: one input value per row against a weight of 1 picks out round(x) exactly */
  static const float probe[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.14159265f, 1e-3f, -7.77e5f, 65504.0f,
                                1.0f + 1.0f / 512 + 1.0f / 4096, INFINITY, -INFINITY};
  const int64_t P = sizeof probe / sizeof probe[0], C = 40;
  float x[10 * 40] = {0}, y[10];
  uint16_t w[40] = {0};
  w[C - 1] = rx_f32_to_bf16(1.0f);   /* the masked tail */
  for (int64_t i = 0; i < P; i++) x[i * C + C - 1] = probe[i];
  CHECK(rx_cpu_matmul_rows_bf16dot(y, x, w, NULL, P, C, 1) == 1, "kernel declined");
  for (int64_t i = 0; i < P; i++) {
    const float want = rx_bf16_to_f32(rx_f32_to_bf16(probe[i]));
    CHECK(y[i] == want, "round(%.9g): %.9g, want %.9g", probe[i], y[i], want);
    CHECK(rx_cpu_f32_to_bf16(probe[i]) == rx_f32_to_bf16(probe[i]), "rx_cpu_f32_to_bf16(%.9g)", probe[i]);
  }
  CHECK(rx_cpu_f32_to_bf16(NAN) == rx_f32_to_bf16(NAN), "NaN");
}

/* dinp = dout W (overwritten) and dbias (accumulated) through a frozen bf16 weight. */
static void backward_gives_input_and_bias_gradients(void) {
  static const int64_t shapes[3][3] = {{5, 37, 19}, {60, 64, 131}, {9, 300, 2100}};   /* {N, C, OC} */
  for (int s = 0; s < 3; s++) {
    const int64_t N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
    int64_t xs[2] = {N, C}, ws[2] = {OC, C}, ds[2] = {N, OC}, bs[1] = {OC};
    rx_tensor *x = randn(RX_F32, 2, xs), *w32 = randn(RX_F32, 2, ws), *dout = randn(RX_F32, 2, ds), *w = NULL;
    CHECK_OK(rx_tensor_new(&w, RX_BF16, RX_CPU, 2, ws));
    CHECK_OK(rx_tensor_copy(w, w32));
    double *wv = values(w), *dv = values(dout), *dvb = values(dout);   /* dbias sums dout as it is */
    /* oneDNN (bf16_gemm auto on AMX, or AMD with AVX-512 BF16) rounds dout to bf16 for dinp above
     * the decode kernels' row count: the reference multiplies the same numbers */
    if (N > RX_BF16_FEW_ROWS && rx_cpu_bf16_gemm_kind() == RX_BF16_GEMM_ONEDNN) round_to_bf16(dv, N * OC);
    guarded dx = guarded_new(RX_F32, 2, xs), db = guarded_new(RX_F32, 1, bs);
    CHECK_OK(rx_tensor_fill(dx.t, 7.0));    /* overwritten */
    CHECK_OK(rx_tensor_fill(db.t, 0.25));   /* accumulated */
    CHECK_OK(rx_matmul_backward(dx.t, NULL, db.t, dout, x, w));
    const double worst = worst_rel_dinp(dx.t, dv, wv, N, C, OC);
    double worst_b = 0;
    const float *gb = db.t->data;
    for (int64_t o = 0; o < OC; o++) {
      double want = 0.25, scale = 0.25;
      for (int64_t n = 0; n < N; n++) { want += dvb[n * OC + o]; scale += fabs(dvb[n * OC + o]); }
      worst_b = fmax(worst_b, fabs(gb[o] - want) / scale);
    }
    CHECK(worst < 1e-6, "N=%lld C=%lld OC=%lld: dinp error %.3g of the f32 bound", (long long)N, (long long)C,
          (long long)OC, worst);
    CHECK(worst_b < 1e-6, "dbias error %.3g", worst_b);
    CHECK(guarded_free(dx) && guarded_free(db), "write outside dinp or dbias");
    /* the gradient of a bf16 weight is the f32 master's: an f64 one is refused */
    rx_tensor *dw = NULL;
    CHECK_OK(rx_tensor_new(&dw, RX_F64, RX_CPU, 2, ws));
    CHECK_FAILS(rx_matmul_backward(NULL, dw, NULL, dout, x, w), "dtype");
    free(wv); free(dv); free(dvb);
    rx_tensor_free(dw); rx_tensor_free(x); rx_tensor_free(w32); rx_tensor_free(dout); rx_tensor_free(w);
  }
}

/* oneDNN's bf16 GEMM (engine/cpu/dnnl.c), the training step's three products of a linear layer
 * (y = x W^T, dx = dy W, dW += dy^T x: transposes as strides), against a double reference on the
 * bf16 inputs: f32 sums, so within the f32 bound; accumulate adds onto what is there. */
static void dnnl_gemm_matches_reference(void) {
  if (!rx_cpu_dnnl()) {
    fprintf(stderr, "skip: no oneDNN bf16 GEMM here (%s)\n", rx_cpu_dnnl_kernel());
    return;
  }
  static const int64_t shapes[3][3] = {{37, 19, 45}, {128, 96, 64}, {5, 300, 7}};   /* {M, N, K} */
  for (int s = 0; s < 3; s++)
    for (int form = 0; form < 3; form++)   /* b transposed, plain, a transposed */
      for (int acc = 0; acc < 2; acc++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        uint16_t *a = malloc((size_t)(M * K) * 2), *b = malloc((size_t)(K * N) * 2);
        for (int64_t i = 0; i < M * K; i++) a[i] = rx_f32_to_bf16((float)sin(0.37 * (double)i + s) * 2);
        for (int64_t i = 0; i < K * N; i++) b[i] = rx_f32_to_bf16((float)cos(0.53 * (double)i - form));
        /* a[m,k] at sa[0] m + sa[1] k, b[k,n] at sb[0] k + sb[1] n */
        const int64_t sa[2] = {form == 2 ? 1 : K, form == 2 ? M : 1}, sb[2] = {form == 0 ? 1 : N, form == 0 ? K : 1};
        const int64_t ldc = N + 3;   /* rows of c apart by more than N: the gap stays untouched */
        float *c = malloc(sizeof(float) * (size_t)(M * ldc));
        for (int64_t i = 0; i < M * ldc; i++) c[i] = 0.5f;
        CHECK(rx_cpu_dnnl_gemm_bf16(c, ldc, a, sa, b, sb, M, N, K, acc) == 1, "oneDNN failed");
        double worst = 0;
        int gap = 1;
        for (int64_t m = 0; m < M; m++) {
          for (int64_t n = 0; n < N; n++) {
            double want = acc ? 0.5 : 0, scale = acc ? 0.5 : 0;
            for (int64_t k = 0; k < K; k++) {
              const double p = (double)rx_bf16_to_f32(a[m * sa[0] + k * sa[1]]) * rx_bf16_to_f32(b[k * sb[0] + n * sb[1]]);
              want += p;
              scale += fabs(p);
            }
            worst = fmax(worst, fabs(c[m * ldc + n] - want) / (scale > 0 ? scale : 1));
          }
          for (int64_t n = N; n < ldc; n++) gap &= c[m * ldc + n] == 0.5f;
        }
        CHECK(worst < 1e-6, "M=%lld N=%lld K=%lld form %d accumulate %d: error %.3g of the f32 bound", (long long)M,
              (long long)N, (long long)K, form, acc, worst);
        CHECK(gap, "form %d: wrote between the rows of c", form);
        free(a); free(b); free(c);
      }
}

/* The GEMMs of bf16 training (cpu/bf16_gemm.c) on each kernel this machine has (OpenBLAS on
 * widened weights always, oneDNN where it runs): forward, dinp and dweight (accumulated) through
 * rx_matmul_*, against double references on the numbers each kernel multiplies (the forward's
 * inputs rounded to bf16 on both; dout and dweight's operands rounded on oneDNN's only), within
 * the f32 bound; below and above the decode kernels' row count. */
static void training_gemms_match_reference_on_each_kernel(void) {
  static const int64_t shapes[3][3] = {{7, 40, 33}, {130, 96, 70}, {300, 64, 2100}};   /* {N, C, OC} */
  for (int kernel = 0; kernel < 2; kernel++) {
    if (kernel == 1 && !rx_cpu_dnnl()) {
      fprintf(stderr, "skip: the oneDNN kernel of bf16 training (%s)\n", rx_cpu_dnnl_kernel());
      break;
    }
    CHECK_OK(rx_set_option("bf16_gemm", kernel ? "onednn" : "sgemm"));   /* re-decided when an option moves */
    CHECK(rx_cpu_bf16_gemm_kind() == (kernel ? RX_BF16_GEMM_ONEDNN : RX_BF16_GEMM_SGEMM), "kernel %d chosen", kernel);
    for (int s = 0; s < 3; s++) {
      const int64_t N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
      const int rounds = kernel == 1 && N > RX_BF16_FEW_ROWS;   /* oneDNN rounds dout and dweight's x */
      int64_t xs[2] = {N, C}, ws[2] = {OC, C}, ds[2] = {N, OC}, bs[1] = {OC};
      rx_tensor *x = randn(RX_F32, 2, xs), *w32 = randn(RX_F32, 2, ws), *dout = randn(RX_F32, 2, ds), *b = randn(RX_F32, 1, bs);
      rx_tensor *w = NULL;
      CHECK_OK(rx_tensor_new(&w, RX_BF16, RX_CPU, 2, ws));
      CHECK_OK(rx_tensor_copy(w, w32));
      double *xv = values(x), *xr = values(x), *wv = values(w), *dv = values(dout), *bv = values(b);
      round_to_bf16(xr, N * C);
      if (rounds) round_to_bf16(dv, N * OC);
      guarded y = guarded_new(RX_F32, 2, ds), dx = guarded_new(RX_F32, 2, xs), dw = guarded_new(RX_F32, 2, ws);
      CHECK_OK(rx_matmul_forward(y.t, x, w, b));
      double *want = malloc(sizeof(double) * (size_t)(N * OC));
      ref_forward(want, xr, wv, bv, N, C, OC);
      const double ey = worst_rel(y.t, want, xr, wv, bv, N, C, OC);
      CHECK_OK(rx_tensor_fill(dx.t, 7.0));    /* overwritten */
      CHECK_OK(rx_tensor_fill(dw.t, 0.25));   /* accumulated */
      CHECK_OK(rx_matmul_backward(dx.t, dw.t, NULL, dout, x, w));
      const double *xd = rounds ? xr : xv;
      const double edx = worst_rel_dinp(dx.t, dv, wv, N, C, OC);
      double edw = 0;
      const float *gw = dw.t->data;
      for (int64_t o = 0; o < OC; o++)
        for (int64_t c = 0; c < C; c++) {
          double v = 0.25, scale = 0.25;
          for (int64_t n = 0; n < N; n++) { v += dv[n * OC + o] * xd[n * C + c]; scale += fabs(dv[n * OC + o] * xd[n * C + c]); }
          edw = fmax(edw, fabs(gw[o * C + c] - v) / scale);
        }
      CHECK(ey < 1e-6 && edx < 1e-6 && edw < 1e-6, "kernel %s N=%lld C=%lld OC=%lld: errors of the f32 bound: forward "
            "%.3g dinp %.3g dweight %.3g", kernel ? "onednn" : "sgemm", (long long)N, (long long)C, (long long)OC, ey, edx, edw);
      CHECK(guarded_free(y) && guarded_free(dx) && guarded_free(dw), "write outside an output");
      free(want); free(xv); free(xr); free(wv); free(dv); free(bv);
      rx_tensor_free(x); rx_tensor_free(w32); rx_tensor_free(dout); rx_tensor_free(b); rx_tensor_free(w);
    }
  }
  CHECK_OK(rx_set_option("bf16_gemm", "auto"));
}

static void embedding_widens_rows(void) {
  const int64_t V = 50, C = 37, N = 300;
  int64_t ws[2] = {V, C}, ts[1] = {N}, ys[2] = {N, C};
  rx_tensor *w32 = randn(RX_F32, 2, ws), *w = NULL, *tok = NULL;
  CHECK_OK(rx_tensor_new(&w, RX_BF16, RX_CPU, 2, ws));
  CHECK_OK(rx_tensor_copy(w, w32));
  CHECK_OK(rx_tensor_new(&tok, RX_I32, RX_CPU, 1, ts));
  for (int64_t i = 0; i < N; i++) ((int32_t *)tok->data)[i] = (int32_t)((i * 17 + 3) % V);
  guarded y = guarded_new(RX_F32, 2, ys);
  CHECK_OK(rx_embedding_forward(y.t, tok, w));
  double *wv = values(w);
  int same = 1;
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = 0; c < C; c++)
      if (((float *)y.t->data)[i * C + c] != (float)wv[((i * 17 + 3) % V) * C + c]) same = 0;
  CHECK(same, "embedding rows of a bf16 table are its values exactly");
  CHECK(guarded_free(y), "write outside the embedding output");
  /* a bf16 output is refused: the rows are widened into f32 */
  rx_tensor *yb = NULL;
  CHECK_OK(rx_tensor_new(&yb, RX_BF16, RX_CPU, 2, ys));
  CHECK_FAILS(rx_embedding_forward(yb, tok, w), "expected f32");
  ((int32_t *)tok->data)[7] = (int32_t)V;   /* out of range: named, nothing written */
  guarded z = guarded_new(RX_F32, 2, ys);
  CHECK_FAILS(rx_embedding_forward(z.t, tok, w), "token");
  CHECK(guarded_free(z), "write outside the embedding output");
  free(wv);
  rx_tensor_free(yb); rx_tensor_free(w32); rx_tensor_free(w); rx_tensor_free(tok);
}

static void mismatched_dtypes_are_refused(void) {
  int64_t xs[2] = {3, 8}, ws[2] = {4, 8}, ys[2] = {3, 4};
  rx_tensor *x64 = randn(RX_F64, 2, xs), *w32 = randn(RX_F32, 2, ws), *w = NULL, *y = NULL;
  CHECK_OK(rx_tensor_new(&w, RX_BF16, RX_CPU, 2, ws));
  CHECK_OK(rx_tensor_copy(w, w32));
  CHECK_OK(rx_tensor_new(&y, RX_F64, RX_CPU, 2, ys));
  CHECK_FAILS(rx_matmul_forward(y, x64, w, NULL), "dtype");   /* f64 inputs against bf16 weights */
  rx_tensor_free(x64); rx_tensor_free(w32); rx_tensor_free(w); rx_tensor_free(y);
}

/* A model config asking for bf16 weights: matrices in bf16, vectors in f32, about half the bytes. */
static void model_keeps_matrices_in_bf16(void) {
  rx_model_config c = {0};
  c.vocab_size = 64; c.hidden_size = 32; c.intermediate_size = 48; c.num_hidden_layers = 2;
  c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 8; c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6; c.rope_theta = 10000; c.attention_bias = 1; c.dtype = RX_F32; c.device = RX_CPU;
  rx_model *f = NULL, *h = NULL;
  CHECK_OK(rx_model_new(&f, &c));
  c.weight_dtype = RX_BF16;
  CHECK_OK(rx_model_new(&h, &c));
  CHECK(rx_model_weight_dtype(rx_model_get_config(h)) == RX_BF16, "weight dtype reported");
  for (int64_t i = 0; i < rx_model_param_count(h); i++) {
    const rx_tensor *p = rx_model_param(h, i);
    CHECK(p->dtype == (p->ndim == 2 ? RX_BF16 : RX_F32), "%s has dtype %s", rx_model_param_name(h, i),
          rx_dtype_name(p->dtype));
  }
  rx_model_memory mf, mh;
  rx_model_memory_usage(f, &mf);
  rx_model_memory_usage(h, &mh);
  CHECK(mh.param_bytes < 0.6 * mf.param_bytes, "%lld vs %lld parameter bytes", (long long)mh.param_bytes,
        (long long)mf.param_bytes);
  CHECK(rx_model_grad(h, 0) == NULL, "no gradient buffers for bf16 weights");
  CHECK(strstr(rx_last_error(), "stored in bf16") != NULL, "error: %s", rx_last_error());
  rx_model_free(f);
  rx_model_free(h);
  c.dtype = RX_F64;
  CHECK_FAILS(rx_model_new(&h, &c), "f32 compute");
  /* bf16 compute on the cpu: f32 master weights and activations (the config reads f32), a bf16
   * working copy for the GEMMs, gradients for every parameter */
  c.dtype = RX_BF16;
  c.weight_dtype = RX_BF16;
  CHECK_OK(rx_model_new(&h, &c));
  CHECK(rx_model_get_config(h)->dtype == RX_F32 && rx_model_gemm_dtype(h) == RX_BF16, "cpu bf16: f32 activations, bf16 GEMMs");
  for (int64_t i = 0; i < rx_model_param_count(h); i++)
    CHECK(rx_model_param(h, i)->dtype == RX_F32 && rx_model_grad(h, i) != NULL, "%s: f32 master with a gradient",
          rx_model_param_name(h, i));
  rx_model_free(h);
}

int main(void) {
  RUN(forward_matches_reference_at_every_row_count);
  RUN(dot_kernel_matches_f32_kernel_on_rounded_inputs);
  RUN(backward_gives_input_and_bias_gradients);
  RUN(dnnl_gemm_matches_reference);
  RUN(training_gemms_match_reference_on_each_kernel);
  RUN(embedding_widens_rows);
  RUN(mismatched_dtypes_are_refused);
  RUN(model_keeps_matrices_in_bf16);
  return check_summary("test_bf16");
}
