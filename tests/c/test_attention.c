/* test_attention.c: causal grouped-query attention against a plain reference (materialised
 * scores, mask, softmax, weighted sum), its backward against central finite differences in
 * float64, sentinel-guarded outputs, thread-count independence, and the argument errors; packed
 * rows (cu_seqlens) against each row alone and against finite differences. */
#include <omp.h>
#include "check.h"

typedef struct {
  int64_t B, Tq, Tk, H, KV, D;
} shape;

/* Mask kinds: none (NULL), right padding, left padding, mixed (random holes, one row all padding). */
enum { MASK_NONE, MASK_RIGHT, MASK_LEFT, MASK_MIXED, MASK_KINDS };
static const char *mask_names[MASK_KINDS] = {"none", "right", "left", "mixed"};

static uint32_t lcg_state = 12345;
static uint32_t lcg(void) { return lcg_state = lcg_state * 1664525u + 1013904223u; }

/* mask [B,Tk]: row b keeps a length of Tk - b*Tk/4 tokens (at least one when Tk > 0). */
static void fill_mask(int32_t *m, int kind, int64_t B, int64_t Tk) {
  for (int64_t b = 0; b < B; b++) {
    int64_t len = Tk - b * Tk / 4;
    for (int64_t s = 0; s < Tk; s++) {
      int32_t keep = 1;
      if (kind == MASK_RIGHT) keep = s < len;
      if (kind == MASK_LEFT) keep = s >= Tk - len;
      if (kind == MASK_MIXED) keep = (b == B - 1 && B > 1) ? 0 : (lcg() >> 16) % 4 != 0;
      m[b * Tk + s] = keep;
    }
  }
}

/* The reference, in double: q [B,Tq,H,D], k/v compact [B,Tk,KV,D], out like q, lse [B,H,Tq]. */
static void reference_forward(double *out, double *lse, const double *q, const double *k, const double *v,
                              const int32_t *mask, shape s, double scale) {
  double *score = malloc((size_t)s.Tk * sizeof(double));
  int64_t group = s.H / s.KV, off = s.Tk - s.Tq;
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t h = 0; h < s.H; h++)
      for (int64_t i = 0; i < s.Tq; i++) {
        double *o = out + ((b * s.Tq + i) * s.H + h) * s.D;
        const double *qi = q + ((b * s.Tq + i) * s.H + h) * s.D;
        int64_t pos = off + i, g = h / group;
        double mx = -INFINITY;
        for (int64_t t = 0; t < s.Tk; t++) {
          int visible = t <= pos && (!mask || (mask[b * s.Tk + t] && mask[b * s.Tk + pos]));
          score[t] = -INFINITY;
          if (!visible) continue;
          double dot = 0;
          for (int64_t d = 0; d < s.D; d++) dot += qi[d] * k[((b * s.Tk + t) * s.KV + g) * s.D + d];
          score[t] = scale * dot;
          mx = fmax(mx, score[t]);
        }
        for (int64_t d = 0; d < s.D; d++) o[d] = 0;
        lse[(b * s.H + h) * s.Tq + i] = 0;
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (int64_t t = 0; t < s.Tk; t++) sum += exp(score[t] - mx);
        for (int64_t t = 0; t < s.Tk; t++) {
          double p = exp(score[t] - mx) / sum;
          for (int64_t d = 0; d < s.D; d++) o[d] += p * v[((b * s.Tk + t) * s.KV + g) * s.D + d];
        }
        lse[(b * s.H + h) * s.Tq + i] = mx + log(sum);
      }
  free(score);
}

/* Inputs of one case. k and v are views [B,Tk,KV,D] of caches [B,cache_T,KV,D] (batch-strided
 * whenever cache_T > Tk). Outputs are sentinel-guarded and start as garbage. */
typedef struct {
  shape s;
  int32_t dtype;
  rx_tensor *q, *k_cache, *v_cache, *k, *v, *mask;
  guarded out, lse;
  double *qd, *kd, *vd;          /* double copies (k, v compact) */
  int32_t *md;                   /* NULL when no mask */
} fixture;

static fixture make_fixture(shape s, int32_t dtype, int mask_kind, int64_t cache_T, uint64_t seed) {
  fixture f = {.s = s, .dtype = dtype};
  int64_t qs[4] = {s.B, s.Tq, s.H, s.D}, cs[4] = {s.B, cache_T, s.KV, s.D}, ls[3] = {s.B, s.H, s.Tq}, ms[2] = {s.B, s.Tk};
  CHECK_OK(rx_tensor_new(&f.q, dtype, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_new(&f.k_cache, dtype, RX_CPU, 4, cs));
  CHECK_OK(rx_tensor_new(&f.v_cache, dtype, RX_CPU, 4, cs));
  CHECK_OK(rx_tensor_normal(f.q, seed, 0, 0, 1));
  CHECK_OK(rx_tensor_normal(f.k_cache, seed, 1u << 20, 0, 1));
  CHECK_OK(rx_tensor_normal(f.v_cache, seed, 2u << 20, 0, 1));
  CHECK_OK(rx_tensor_narrow(&f.k, f.k_cache, 1, 0, s.Tk));
  CHECK_OK(rx_tensor_narrow(&f.v, f.v_cache, 1, 0, s.Tk));
  f.out = guarded_new(dtype, 4, qs);
  f.lse = guarded_new(dtype, 3, ls);
  rx_tensor_fill(f.out.t, 7);
  rx_tensor_fill(f.lse.t, 7);
  f.qd = malloc((size_t)f.q->numel * sizeof(double));
  f.kd = malloc((size_t)f.k->numel * sizeof(double));
  f.vd = malloc((size_t)f.v->numel * sizeof(double));
  rx_tensor_read_f64(f.q, f.qd);
  rx_tensor_read_f64(f.k, f.kd);
  rx_tensor_read_f64(f.v, f.vd);
  if (mask_kind != MASK_NONE) {
    CHECK_OK(rx_tensor_new(&f.mask, RX_I32, RX_CPU, 2, ms));
    f.md = f.mask->data;
    fill_mask(f.md, mask_kind, s.B, s.Tk);
  }
  return f;
}

static void free_fixture(fixture *f) {
  CHECK(guarded_free(f->out), "out sentinels overwritten");
  CHECK(guarded_free(f->lse), "lse sentinels overwritten");
  rx_tensor_free(f->q); rx_tensor_free(f->k_cache); rx_tensor_free(f->v_cache);
  rx_tensor_free(f->k); rx_tensor_free(f->v); rx_tensor_free(f->mask);
  free(f->qd); free(f->kd); free(f->vd);
}

/* Runs the forward of one case and compares out and lse with the reference. */
static void check_forward_case(shape s, int32_t dtype, int mask_kind, int64_t cache_T) {
  fixture f = make_fixture(s, dtype, mask_kind, cache_T, 1000 + (uint64_t)(s.B * 7 + s.Tq * 13 + s.KV * 3 + s.D));
  double scale = (s.D == 8) ? 0.0 : 0.3;      /* 0 = the default 1/sqrt(D) */
  CHECK_OK(rx_attention_forward(f.out.t, f.lse.t, f.q, f.k, f.v, f.mask, scale));
  int64_t n = f.q->numel, nl = s.B * s.H * s.Tq;
  double *ref = malloc((size_t)n * sizeof(double)), *ref_lse = malloc((size_t)nl * sizeof(double));
  double *got = malloc((size_t)n * sizeof(double)), *got_lse = malloc((size_t)nl * sizeof(double));
  reference_forward(ref, ref_lse, f.qd, f.kd, f.vd, f.md, s, scale ? scale : 1 / sqrt((double)s.D));
  rx_tensor_read_f64(f.out.t, got);
  rx_tensor_read_f64(f.lse.t, got_lse);
  double tol = dtype == RX_F32 ? 2e-6 : 1e-13;
  double err = check_nrmse(got, ref, n), lerr = check_nrmse(got_lse, ref_lse, nl);
  CHECK(err < tol && lerr < tol, "%s B=%lld Tq=%lld Tk=%lld H=%lld KV=%lld D=%lld mask=%s: out error %.3g, lse error %.3g",
        rx_dtype_name(dtype), (long long)s.B, (long long)s.Tq, (long long)s.Tk, (long long)s.H, (long long)s.KV,
        (long long)s.D, mask_names[mask_kind], err, lerr);
  /* padded query rows are exactly zero, whatever the garbage there before */
  int64_t off = s.Tk - s.Tq, bad = 0;
  for (int64_t b = 0; b < s.B && f.md; b++)
    for (int64_t i = 0; i < s.Tq; i++)
      if (!f.md[b * s.Tk + off + i])
        for (int64_t hd = 0; hd < s.H * s.D; hd++) bad += got[(b * s.Tq + i) * s.H * s.D + hd] != 0;
  CHECK(bad == 0, "%lld padded outputs are not zero", (long long)bad);
  free(ref); free(ref_lse); free(got); free(got_lse);
  free_fixture(&f);
}

static void forward_matches_reference(void) {
  const int64_t Bs[] = {1, 3}, Ts[] = {1, 7, 33}, KVs[] = {4, 2, 1}, Ds[] = {8, 16};
  const int32_t dtypes[] = {RX_F32, RX_F64};
  for (int di = 0; di < 2; di++)
    for (int bi = 0; bi < 2; bi++)
      for (int ti = 0; ti < 3; ti++)
        for (int ki = 0; ki < 3; ki++)
          for (int dd = 0; dd < 2; dd++)
            for (int mk = 0; mk < MASK_KINDS; mk++) {
              shape s = {Bs[bi], Ts[ti], Ts[ti], 4, KVs[ki], Ds[dd]};
              check_forward_case(s, dtypes[di], mk, s.Tk);
            }
}

/* Decoding: Tq < Tk against k/v narrowed out of a longer cache (batch stride > Tk*KV*D). */
static void forward_decodes_against_cache_view(void) {
  const int64_t Tks[] = {1, 5, 40, 70}, Tqs[] = {1, 3};
  const int32_t dtypes[] = {RX_F32, RX_F64};
  for (int di = 0; di < 2; di++)
    for (int a = 0; a < 4; a++)
      for (int c = 0; c < 2; c++)
        for (int mk = 0; mk < MASK_KINDS; mk++) {
          if (Tqs[c] > Tks[a]) continue;
          shape s = {3, Tqs[c], Tks[a], 4, 2, 16};
          check_forward_case(s, dtypes[di], mk, 80);
        }
  /* rows as the heads of a group (H/KV = 4 >= Tq) with Tq > 1: queries at different positions */
  for (int di = 0; di < 2; di++)
    for (int mk = 0; mk < MASK_KINDS; mk++) check_forward_case((shape){3, 3, 40, 4, 1, 16}, dtypes[di], mk, 80);
  /* the view really is batch-strided */
  fixture f = make_fixture((shape){2, 1, 5, 4, 2, 8}, RX_F32, MASK_NONE, 80, 5);
  CHECK(f.k->stride[0] == 80 * 2 * 8 && !rx_tensor_is_contiguous(f.k), "k view stride %lld", (long long)f.k->stride[0]);
  free_fixture(&f);
}

/* The kernel works on tiles of 64 queries (and 64 keys in the backward): T not a multiple of the
 * tile, Tq < Tk across several tiles (the first tile's queries sit deep in the keys), GQA. */
static void forward_tiles_match_reference(void) {
  const shape shapes[] = {{2, 150, 150, 4, 2, 16}, {2, 64, 64, 4, 1, 8}, {2, 65, 65, 2, 2, 8}, {3, 70, 130, 4, 2, 16}};
  const int32_t dtypes[] = {RX_F32, RX_F64};
  for (int di = 0; di < 2; di++)
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
      for (int mk = 0; mk < MASK_KINDS; mk++) check_forward_case(shapes[si], dtypes[di], mk, shapes[si].Tk + 7);
}

/* L = sum(out * R) for the inputs in f (double). */
static double loss(fixture *f, const rx_tensor *R, double *buf_out, double *buf_r) {
  CHECK_OK(rx_attention_forward(f->out.t, f->lse.t, f->q, f->k, f->v, f->mask, 0));
  rx_tensor_read_f64(f->out.t, buf_out);
  rx_tensor_read_f64(R, buf_r);
  double l = 0;
  for (int64_t j = 0; j < R->numel; j++) l += buf_out[j] * buf_r[j];
  return l;
}

/* Central differences of L for every element of t (strided views are fine: rx_tensor_get/set). */
static void check_grad(fixture *f, rx_tensor *t, const rx_tensor *grad, const rx_tensor *R, const char *name, const char *label) {
  double *bo = malloc((size_t)R->numel * sizeof(double)), *br = malloc((size_t)R->numel * sizeof(double));
  double h = 1e-5, worst = 0;
  int64_t worst_at = -1;
  for (int64_t j = 0; j < t->numel; j++) {
    double x, g;
    rx_tensor_get(t, j, &x);
    rx_tensor_set(t, j, x + h);
    double lp = loss(f, R, bo, br);
    rx_tensor_set(t, j, x - h);
    double lm = loss(f, R, bo, br);
    rx_tensor_set(t, j, x);
    rx_tensor_get(grad, j, &g);
    double fd = (lp - lm) / (2 * h), e = fabs(fd - g) / fmax(1, fabs(fd));
    if (e > worst) { worst = e; worst_at = j; }
  }
  CHECK(worst < 1e-7, "%s: d%s[%lld] differs from finite differences by %.3g", label, name, (long long)worst_at, worst);
  free(bo); free(br);
}

/* Backward of one f64 case against central differences; padded rows get exactly zero grads. */
static void check_backward_case(shape s, int mask_kind, int64_t cache_T, const char *label) {
  fixture f = make_fixture(s, RX_F64, mask_kind, cache_T, 77 + (uint64_t)mask_kind);
  int64_t qs[4] = {s.B, s.Tq, s.H, s.D}, ks[4] = {s.B, s.Tk, s.KV, s.D};
  rx_tensor *R;
  CHECK_OK(rx_tensor_new(&R, RX_F64, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_normal(R, 99, 0, 0, 1));
  guarded dq = guarded_new(RX_F64, 4, qs), dk = guarded_new(RX_F64, 4, ks), dv = guarded_new(RX_F64, 4, ks);
  rx_tensor_fill(dq.t, 7); rx_tensor_fill(dk.t, 7); rx_tensor_fill(dv.t, 7);   /* overwritten, not added to */
  CHECK_OK(rx_attention_forward(f.out.t, f.lse.t, f.q, f.k, f.v, f.mask, 0));
  CHECK_OK(rx_attention_backward(dq.t, dk.t, dv.t, R, f.q, f.k, f.v, f.out.t, f.lse.t, f.mask, 0));
  check_grad(&f, f.q, dq.t, R, "q", label);
  check_grad(&f, f.k, dk.t, R, "k", label);
  check_grad(&f, f.v, dv.t, R, "v", label);
  /* exact zeros: dq of padded queries, dk/dv of padded keys */
  int64_t off = s.Tk - s.Tq, bad = 0;
  const double *gq = dq.t->data, *gk = dk.t->data, *gv = dv.t->data;
  for (int64_t b = 0; b < s.B && f.md; b++) {
    for (int64_t i = 0; i < s.Tq; i++)
      if (!f.md[b * s.Tk + off + i])
        for (int64_t hd = 0; hd < s.H * s.D; hd++) bad += gq[(b * s.Tq + i) * s.H * s.D + hd] != 0;
    for (int64_t t = 0; t < s.Tk; t++)
      if (!f.md[b * s.Tk + t])
        for (int64_t gd = 0; gd < s.KV * s.D; gd++)
          bad += gk[(b * s.Tk + t) * s.KV * s.D + gd] != 0 || gv[(b * s.Tk + t) * s.KV * s.D + gd] != 0;
  }
  CHECK(bad == 0, "%s: %lld gradients of padded rows are not exactly zero", label, (long long)bad);
  CHECK(guarded_free(dq) && guarded_free(dk) && guarded_free(dv), "%s: dq/dk/dv sentinels overwritten", label);
  rx_tensor_free(R);
  free_fixture(&f);
}

static void backward_matches_finite_differences(void) {
  check_backward_case((shape){2, 6, 6, 4, 2, 4}, MASK_NONE, 6, "GQA 4/2, no mask");
  check_backward_case((shape){2, 6, 6, 4, 1, 4}, MASK_RIGHT, 6, "GQA 4/1, right padding");
  check_backward_case((shape){2, 6, 6, 4, 2, 4}, MASK_LEFT, 6, "GQA 4/2, left padding");
  check_backward_case((shape){3, 5, 5, 2, 2, 4}, MASK_MIXED, 5, "MHA, mixed mask");
  check_backward_case((shape){2, 3, 7, 4, 2, 4}, MASK_LEFT, 9, "decode Tq<Tk, strided cache view");
  check_backward_case((shape){1, 19, 19, 2, 1, 4}, MASK_RIGHT, 19, "T=19 over key blocks");
  check_backward_case((shape){2, 70, 70, 2, 1, 2}, MASK_MIXED, 70, "T=70 over two tiles, mixed mask, a fully padded row");
  check_backward_case((shape){1, 66, 131, 2, 1, 2}, MASK_LEFT, 140, "Tq=66 < Tk=131 over tiles, strided cache view");
}

/* The f32 backward against the f64 one on a larger case with every feature on. */
static void check_backward_f32_case(shape s, int64_t cache_T) {
  fixture f64 = make_fixture(s, RX_F64, MASK_MIXED, cache_T, 3), f32 = make_fixture(s, RX_F32, MASK_NONE, cache_T, 3);
  rx_tensor *m32 = f32.mask;
  f32.mask = f64.mask;                      /* same mask for both */
  int64_t qs[4] = {s.B, s.Tq, s.H, s.D}, ks[4] = {s.B, s.Tk, s.KV, s.D};
  rx_tensor *R64, *R32;
  CHECK_OK(rx_tensor_new(&R64, RX_F64, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_new(&R32, RX_F32, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_normal(R64, 5, 0, 0, 1));
  CHECK_OK(rx_tensor_copy(R32, R64));
  CHECK_OK(rx_tensor_copy(f64.q, f32.q));  /* f32-representable inputs for both */
  CHECK_OK(rx_tensor_copy(f64.k_cache, f32.k_cache));
  CHECK_OK(rx_tensor_copy(f64.v_cache, f32.v_cache));
  CHECK_OK(rx_tensor_copy(R64, R32));
  guarded g64[3], g32[3];
  for (int j = 0; j < 3; j++) {
    g64[j] = guarded_new(RX_F64, 4, j ? ks : qs);
    g32[j] = guarded_new(RX_F32, 4, j ? ks : qs);
  }
  CHECK_OK(rx_attention_forward(f64.out.t, f64.lse.t, f64.q, f64.k, f64.v, f64.mask, 0));
  CHECK_OK(rx_attention_forward(f32.out.t, f32.lse.t, f32.q, f32.k, f32.v, f32.mask, 0));
  CHECK_OK(rx_attention_backward(g64[0].t, g64[1].t, g64[2].t, R64, f64.q, f64.k, f64.v, f64.out.t, f64.lse.t, f64.mask, 0));
  CHECK_OK(rx_attention_backward(g32[0].t, g32[1].t, g32[2].t, R32, f32.q, f32.k, f32.v, f32.out.t, f32.lse.t, f32.mask, 0));
  const char *names[3] = {"dq", "dk", "dv"};
  for (int j = 0; j < 3; j++) {
    int64_t n = g64[j].t->numel;
    double *a = malloc((size_t)n * sizeof(double)), *b = malloc((size_t)n * sizeof(double));
    rx_tensor_read_f64(g32[j].t, a);
    rx_tensor_read_f64(g64[j].t, b);
    double err = check_nrmse(a, b, n);
    CHECK(err < 2e-6, "Tq=%lld Tk=%lld: f32 %s error %.3g against f64", (long long)s.Tq, (long long)s.Tk, names[j], err);
    free(a); free(b);
    CHECK(guarded_free(g64[j]) && guarded_free(g32[j]), "%s sentinels overwritten", names[j]);
  }
  f32.mask = m32;
  rx_tensor_free(R64); rx_tensor_free(R32);
  free_fixture(&f64); free_fixture(&f32);
}

static void backward_f32_matches_f64(void) {
  check_backward_f32_case((shape){3, 33, 33, 4, 2, 16}, 40);
  check_backward_f32_case((shape){2, 100, 150, 4, 2, 16}, 160);   /* tiles, Tq < Tk */
}

/* NULL gradients are skipped; the others are still right. */
static void backward_skips_null_gradients(void) {
  shape s = {2, 9, 9, 4, 2, 8};
  fixture f = make_fixture(s, RX_F64, MASK_LEFT, 9, 11);
  int64_t qs[4] = {s.B, s.Tq, s.H, s.D}, ks[4] = {s.B, s.Tk, s.KV, s.D};
  rx_tensor *R, *dq_all, *dk_all, *dv_all, *dk_only;
  CHECK_OK(rx_tensor_new(&R, RX_F64, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_normal(R, 8, 0, 0, 1));
  CHECK_OK(rx_tensor_new(&dq_all, RX_F64, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_new(&dk_all, RX_F64, RX_CPU, 4, ks));
  CHECK_OK(rx_tensor_new(&dv_all, RX_F64, RX_CPU, 4, ks));
  CHECK_OK(rx_tensor_new(&dk_only, RX_F64, RX_CPU, 4, ks));
  CHECK_OK(rx_attention_forward(f.out.t, f.lse.t, f.q, f.k, f.v, f.mask, 0));
  CHECK_OK(rx_attention_backward(dq_all, dk_all, dv_all, R, f.q, f.k, f.v, f.out.t, f.lse.t, f.mask, 0));
  CHECK_OK(rx_attention_backward(NULL, dk_only, NULL, R, f.q, f.k, f.v, f.out.t, f.lse.t, f.mask, 0));
  CHECK(memcmp(dk_only->data, dk_all->data, (size_t)dk_all->numel * sizeof(double)) == 0, "dk alone differs from dk with dq, dv");
  CHECK_OK(rx_attention_backward(NULL, NULL, NULL, R, f.q, f.k, f.v, f.out.t, f.lse.t, f.mask, 0));
  rx_tensor_free(R); rx_tensor_free(dq_all); rx_tensor_free(dk_all); rx_tensor_free(dv_all); rx_tensor_free(dk_only);
  free_fixture(&f);
}

/* Bitwise the same results with 1 and 3 threads. */
static void check_threads_case(shape s, int64_t cache_T) {
  fixture f = make_fixture(s, RX_F32, MASK_MIXED, cache_T, 21);
  int64_t qs[4] = {s.B, s.Tq, s.H, s.D}, ks[4] = {s.B, s.Tk, s.KV, s.D};
  rx_tensor *R, *o[2], *g[2][3];
  CHECK_OK(rx_tensor_new(&R, RX_F32, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_normal(R, 8, 0, 0, 1));
  int saved = omp_get_max_threads();
  for (int r = 0; r < 2; r++) {
    omp_set_num_threads(r ? 3 : 1);
    CHECK_OK(rx_tensor_new(&o[r], RX_F32, RX_CPU, 4, qs));
    for (int j = 0; j < 3; j++) CHECK_OK(rx_tensor_new(&g[r][j], RX_F32, RX_CPU, 4, j ? ks : qs));
    CHECK_OK(rx_attention_forward(o[r], f.lse.t, f.q, f.k, f.v, f.mask, 0));
    CHECK_OK(rx_attention_backward(g[r][0], g[r][1], g[r][2], R, f.q, f.k, f.v, o[r], f.lse.t, f.mask, 0));
  }
  omp_set_num_threads(saved);
  CHECK(memcmp(o[0]->data, o[1]->data, (size_t)o[0]->numel * 4) == 0, "Tq=%lld: out differs between 1 and 3 threads", (long long)s.Tq);
  for (int j = 0; j < 3; j++)
    CHECK(memcmp(g[0][j]->data, g[1][j]->data, (size_t)g[0][j]->numel * 4) == 0, "Tq=%lld: gradient %d differs between 1 and 3 threads",
          (long long)s.Tq, j);
  for (int r = 0; r < 2; r++) {
    rx_tensor_free(o[r]);
    for (int j = 0; j < 3; j++) rx_tensor_free(g[r][j]);
  }
  rx_tensor_free(R);
  free_fixture(&f);
}

static void results_do_not_depend_on_threads(void) {
  check_threads_case((shape){2, 40, 40, 4, 2, 16}, 48);
  check_threads_case((shape){3, 200, 200, 4, 2, 16}, 210);   /* several tiles per head, dynamic schedule */
  check_threads_case((shape){5, 1, 90, 4, 1, 16}, 100);      /* decode: rows are a group's heads */
}

static void bad_arguments_fail_with_names(void) {
  int64_t qs[4] = {2, 5, 4, 8}, ks[4] = {2, 5, 3, 8}, kd[4] = {2, 5, 2, 16}, kshort[4] = {2, 4, 2, 8},
          kok[4] = {2, 5, 2, 8}, ls[3] = {2, 4, 5}, lbad[3] = {2, 5, 4}, ms[2] = {2, 6}, mok[2] = {2, 5};
  rx_tensor *q, *out, *lse, *lse_bad, *k3, *kD, *kS, *k, *v, *k64, *mbad, *mf32, *mok_t, *dk_bad;
  rx_tensor_new(&q, RX_F32, RX_CPU, 4, qs);
  rx_tensor_new(&out, RX_F32, RX_CPU, 4, qs);
  rx_tensor_new(&lse, RX_F32, RX_CPU, 3, ls);
  rx_tensor_new(&lse_bad, RX_F32, RX_CPU, 3, lbad);
  rx_tensor_new(&k3, RX_F32, RX_CPU, 4, ks);
  rx_tensor_new(&kD, RX_F32, RX_CPU, 4, kd);
  rx_tensor_new(&kS, RX_F32, RX_CPU, 4, kshort);
  rx_tensor_new(&k, RX_F32, RX_CPU, 4, kok);
  rx_tensor_new(&v, RX_F32, RX_CPU, 4, kok);
  rx_tensor_new(&k64, RX_F64, RX_CPU, 4, kok);
  rx_tensor_new(&mbad, RX_I32, RX_CPU, 2, ms);
  rx_tensor_new(&mf32, RX_F32, RX_CPU, 2, mok);
  rx_tensor_new(&mok_t, RX_I32, RX_CPU, 2, mok);
  rx_tensor_new(&dk_bad, RX_F32, RX_CPU, 4, qs);
  CHECK_OK(rx_attention_forward(out, lse, q, k, v, mok_t, 0));
  CHECK_FAILS(rx_attention_forward(out, lse, q, k3, k3, NULL, 0), "k has shape [2,5,3,8] and q [2,5,4,8]: the 4 query heads are not a multiple of the 3 kv heads");
  CHECK_FAILS(rx_attention_forward(out, lse, q, kD, kD, NULL, 0), "k has shape [2,5,2,16] and q [2,5,4,8]: head dims D differ");
  CHECK_FAILS(rx_attention_forward(out, lse, q, kS, kS, NULL, 0), "q has shape [2,5,4,8] and k [2,4,2,8]: Tq = 5 exceeds Tk = 4");
  CHECK_FAILS(rx_attention_forward(out, lse, q, k, v, mbad, 0), "mask has shape [2,6], expected [B,Tk] = [2,5]");
  CHECK_FAILS(rx_attention_forward(out, lse, q, k, v, mf32, 0), "mask has dtype f32, expected i32");
  CHECK_FAILS(rx_attention_forward(out, lse, q, k64, v, NULL, 0), "k has dtype f64, expected f32");
  CHECK_FAILS(rx_attention_forward(out, lse, q, k, k64, NULL, 0), "v has dtype f64, expected f32");
  CHECK_FAILS(rx_attention_forward(out, lse, q, k, kD, NULL, 0), "v has shape [2,5,2,16], expected the shape of k [2,5,2,8]");
  CHECK_FAILS(rx_attention_forward(out, lse_bad, q, k, v, NULL, 0), "lse has shape [2,5,4], expected [B,H,Tq]");
  CHECK_FAILS(rx_attention_forward(lse, lse, q, k, v, NULL, 0), "out has shape [2,4,5], expected 4 dims");
  CHECK_FAILS(rx_attention_forward(out, lse, q, k, v, NULL, NAN), "scale nan is not finite");
  CHECK_FAILS(rx_attention_forward(out, lse, NULL, k, v, NULL, 0), "q is missing");
  CHECK_FAILS(rx_attention_backward(NULL, dk_bad, NULL, out, q, k, v, out, lse, NULL, 0), "dk has shape [2,5,4,8], expected the same shape (k [2,5,2,8])");
  CHECK_FAILS(rx_attention_backward(NULL, NULL, NULL, out, q, k, v, out, lse, mbad, 0), "attention_backward: mask has shape [2,6]");
  CHECK_FAILS(rx_attention_backward(NULL, NULL, NULL, k, q, k, v, out, lse, NULL, 0), "dout has shape [2,5,2,8], expected the same shape (q [2,5,4,8])");
  /* a k view strided inside a batch entry (narrowed along D) is refused */
  rx_tensor *k_inner;
  CHECK_OK(rx_tensor_narrow(&k_inner, kD, 3, 0, 8));
  CHECK_FAILS(rx_attention_forward(out, lse, q, k_inner, k_inner, NULL, 0), "k [2,5,2,8] must be contiguous in its last three dims");
  rx_tensor_free(k_inner);
  /* cuda tensors without a usable device (these are host memory labelled cuda, so only where no
   * GPU could run them; tests/gpu covers real device tensors) */
  rx_tensor qc = *q, kc = *k, vc = *v, oc = *out, lc = *lse;
  qc.device = kc.device = vc.device = oc.device = lc.device = RX_CUDA;
  if (!rx_has_cuda()) {
    int rc = rx_attention_forward(&oc, &lc, &qc, &kc, &vc, NULL, 0);
    CHECK(rc == RX_EDEVICE && strstr(rx_last_error(), "cuda: "), "device error: %d %s", rc, rx_last_error());
  }
  CHECK_FAILS(rx_attention_forward(out, lse, q, &kc, v, NULL, 0), "k is on device 1, expected 0");
  rx_tensor *all[] = {q, out, lse, lse_bad, k3, kD, kS, k, v, k64, mbad, mf32, mok_t, dk_bad};
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) rx_tensor_free(all[j]);
}

/* ---------------------------------------------------------------- packed rows (cu_seqlens) */

/* S rows of the given lengths end to end: q [1,N,H,D], k, v [1,N,KV,D], cu [S+1]. */
typedef struct {
  int64_t S, N, H, KV, D;
  int32_t dtype;
  const int64_t *len;
  rx_tensor *q, *k, *v, *cu, *R;
  guarded out, lse;
} packed;

static packed make_packed(const int64_t *len, int64_t S, int64_t H, int64_t KV, int64_t D, int32_t dtype, uint64_t seed) {
  packed p = {.S = S, .H = H, .KV = KV, .D = D, .dtype = dtype, .len = len};
  for (int64_t r = 0; r < S; r++) p.N += len[r];
  int64_t qs[4] = {1, p.N, H, D}, ks[4] = {1, p.N, KV, D}, ls[3] = {1, H, p.N}, cs[1] = {S + 1};
  CHECK_OK(rx_tensor_new(&p.q, dtype, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_new(&p.k, dtype, RX_CPU, 4, ks));
  CHECK_OK(rx_tensor_new(&p.v, dtype, RX_CPU, 4, ks));
  CHECK_OK(rx_tensor_new(&p.R, dtype, RX_CPU, 4, qs));
  CHECK_OK(rx_tensor_new(&p.cu, RX_I32, RX_CPU, 1, cs));
  CHECK_OK(rx_tensor_normal(p.q, seed, 0, 0, 1));
  CHECK_OK(rx_tensor_normal(p.k, seed, 1u << 20, 0, 1));
  CHECK_OK(rx_tensor_normal(p.v, seed, 2u << 20, 0, 1));
  CHECK_OK(rx_tensor_normal(p.R, seed, 3u << 20, 0, 1));
  int32_t *cu = p.cu->data;
  cu[0] = 0;
  for (int64_t r = 0; r < S; r++) cu[r + 1] = cu[r] + (int32_t)len[r];
  p.out = guarded_new(dtype, 4, qs);
  p.lse = guarded_new(dtype, 3, ls);
  rx_tensor_fill(p.out.t, 7);
  rx_tensor_fill(p.lse.t, 7);
  return p;
}

static void free_packed(packed *p) {
  CHECK(guarded_free(p->out) && guarded_free(p->lse), "packed out / lse sentinels overwritten");
  rx_tensor_free(p->q); rx_tensor_free(p->k); rx_tensor_free(p->v); rx_tensor_free(p->cu); rx_tensor_free(p->R);
}

static double packed_loss(packed *p, double *buf_out, double *buf_r) {
  CHECK_OK(rx_attention_forward_seq(p->out.t, p->lse.t, p->q, p->k, p->v, NULL, p->cu, 0));
  rx_tensor_read_f64(p->out.t, buf_out);
  rx_tensor_read_f64(p->R, buf_r);
  double l = 0;
  for (int64_t j = 0; j < p->R->numel; j++) l += buf_out[j] * buf_r[j];
  return l;
}

/* Packed rows against each row alone: forward against the double reference of that row; the
 * backward against the backward of that row run as a [1,len] batch (itself checked against
 * finite differences above). Rows cross tile boundaries (64) and include one-token rows. */
static void check_packed_case(const int64_t *len, int64_t S, int64_t H, int64_t KV, int64_t D, int32_t dtype,
                              const char *label) {
  packed p = make_packed(len, S, H, KV, D, dtype, 500 + (uint64_t)S);
  const int64_t N = p.N, qs[4] = {1, N, H, D}, ks[4] = {1, N, KV, D};
  guarded dq = guarded_new(dtype, 4, qs), dk = guarded_new(dtype, 4, ks), dv = guarded_new(dtype, 4, ks);
  rx_tensor_fill(dq.t, 7); rx_tensor_fill(dk.t, 7); rx_tensor_fill(dv.t, 7);
  CHECK_OK(rx_attention_forward_seq(p.out.t, p.lse.t, p.q, p.k, p.v, NULL, p.cu, 0));
  CHECK_OK(rx_attention_backward_seq(dq.t, dk.t, dv.t, p.R, p.q, p.k, p.v, p.out.t, p.lse.t, NULL, p.cu, 0));
  double *all[10];
  const int64_t nq = N * H * D, nk = N * KV * D;
  const int64_t sizes[10] = {nq, nk, nk, nq, nq, N * H, nq, nk, nk, nq};
  for (int j = 0; j < 10; j++) all[j] = malloc((size_t)sizes[j] * sizeof(double));
  rx_tensor_read_f64(p.q, all[0]); rx_tensor_read_f64(p.k, all[1]); rx_tensor_read_f64(p.v, all[2]);
  rx_tensor_read_f64(p.out.t, all[3]); rx_tensor_read_f64(p.R, all[4]); rx_tensor_read_f64(p.lse.t, all[5]);
  rx_tensor_read_f64(dq.t, all[6]); rx_tensor_read_f64(dk.t, all[7]); rx_tensor_read_f64(dv.t, all[8]);
  const double tol = dtype == RX_F64 ? 1e-12 : 1e-5;
  int64_t a = 0;
  for (int64_t r = 0; r < S; r++) {
    const int64_t L = len[r];
    shape s = {1, L, L, H, KV, D};
    double *ro = malloc((size_t)(L * H * D) * sizeof(double)), *rl = malloc((size_t)(L * H) * sizeof(double));
    double *pl = malloc((size_t)(L * H) * sizeof(double));
    reference_forward(ro, rl, all[0] + a * H * D, all[1] + a * KV * D, all[2] + a * KV * D, NULL, s, 1.0 / sqrt((double)D));
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < L; i++) pl[h * L + i] = all[5][h * N + a + i];
    double eo = check_nrmse(all[3] + a * H * D, ro, L * H * D), el = check_nrmse(pl, rl, L * H);
    CHECK(eo < tol && el < tol, "%s: row %lld (length %lld): out nrmse %.3g, lse nrmse %.3g against the reference",
          label, (long long)r, (long long)L, eo, el);
    /* the row alone, as a batch of one */
    rx_tensor *qv, *kv, *vv, *Rv, *lo, *ll, *gq, *gk, *gv;
    const int64_t rq[4] = {1, L, H, D}, rk[4] = {1, L, KV, D}, rls[3] = {1, H, L};
    CHECK_OK(rx_tensor_narrow(&qv, p.q, 1, a, L));
    CHECK_OK(rx_tensor_narrow(&kv, p.k, 1, a, L));
    CHECK_OK(rx_tensor_narrow(&vv, p.v, 1, a, L));
    CHECK_OK(rx_tensor_narrow(&Rv, p.R, 1, a, L));
    CHECK_OK(rx_tensor_new(&lo, dtype, RX_CPU, 4, rq));
    CHECK_OK(rx_tensor_new(&ll, dtype, RX_CPU, 3, rls));
    CHECK_OK(rx_tensor_new(&gq, dtype, RX_CPU, 4, rq));
    CHECK_OK(rx_tensor_new(&gk, dtype, RX_CPU, 4, rk));
    CHECK_OK(rx_tensor_new(&gv, dtype, RX_CPU, 4, rk));
    CHECK_OK(rx_attention_forward(lo, ll, qv, kv, vv, NULL, 0));
    CHECK_OK(rx_attention_backward(gq, gk, gv, Rv, qv, kv, vv, lo, ll, NULL, 0));
    double *b1 = malloc((size_t)(L * H * D) * sizeof(double)), *b2 = malloc((size_t)(L * KV * D) * sizeof(double));
    double *b3 = malloc((size_t)(L * KV * D) * sizeof(double));
    rx_tensor_read_f64(gq, b1); rx_tensor_read_f64(gk, b2); rx_tensor_read_f64(gv, b3);
    double e1 = check_nrmse(all[6] + a * H * D, b1, L * H * D), e2 = check_nrmse(all[7] + a * KV * D, b2, L * KV * D);
    double e3 = check_nrmse(all[8] + a * KV * D, b3, L * KV * D);
    CHECK(e1 < tol && e2 < tol && e3 < tol, "%s: row %lld (length %lld): dq, dk, dv nrmse %.3g %.3g %.3g against the row alone",
          label, (long long)r, (long long)L, e1, e2, e3);
    rx_tensor *tf[] = {qv, kv, vv, Rv, lo, ll, gq, gk, gv};
    for (size_t j = 0; j < sizeof tf / sizeof tf[0]; j++) rx_tensor_free(tf[j]);
    free(ro); free(rl); free(pl); free(b1); free(b2); free(b3);
    a += L;
  }
  CHECK(guarded_free(dq) && guarded_free(dk) && guarded_free(dv), "%s: packed dq/dk/dv sentinels overwritten", label);
  for (int j = 0; j < 10; j++) free(all[j]);
  free_packed(&p);
}

static void packed_rows_match_each_row_alone(void) {
  const int64_t a[] = {5, 1, 70, 3, 130, 64}, b[] = {1}, c[] = {200, 2, 65};
  check_packed_case(a, 6, 4, 2, 8, RX_F64, "f64 GQA 4/2, rows 5 1 70 3 130 64");
  check_packed_case(a, 6, 4, 2, 8, RX_F32, "f32 GQA 4/2, rows 5 1 70 3 130 64");
  check_packed_case(b, 1, 2, 1, 4, RX_F64, "f64 one row of one token");
  check_packed_case(c, 3, 4, 1, 16, RX_F32, "f32 GQA 4/1, rows 200 2 65");
}

/* The packed backward against central differences of L = sum(out * R) in float64. */
static void packed_backward_matches_finite_differences(void) {
  const int64_t len[] = {3, 1, 6, 2};
  packed p = make_packed(len, 4, 4, 2, 4, RX_F64, 31);
  const int64_t qs[4] = {1, p.N, p.H, p.D}, ks[4] = {1, p.N, p.KV, p.D};
  guarded g[3] = {guarded_new(RX_F64, 4, qs), guarded_new(RX_F64, 4, ks), guarded_new(RX_F64, 4, ks)};
  CHECK_OK(rx_attention_forward_seq(p.out.t, p.lse.t, p.q, p.k, p.v, NULL, p.cu, 0));
  CHECK_OK(rx_attention_backward_seq(g[0].t, g[1].t, g[2].t, p.R, p.q, p.k, p.v, p.out.t, p.lse.t, NULL, p.cu, 0));
  rx_tensor *in[3] = {p.q, p.k, p.v};
  const char *names[3] = {"q", "k", "v"};
  double *bo = malloc((size_t)p.R->numel * sizeof(double)), *br = malloc((size_t)p.R->numel * sizeof(double));
  for (int w = 0; w < 3; w++) {
    double worst = 0, h = 1e-5;
    int64_t at = -1;
    for (int64_t j = 0; j < in[w]->numel; j++) {
      double x, gr;
      rx_tensor_get(in[w], j, &x);
      rx_tensor_set(in[w], j, x + h);
      const double lp = packed_loss(&p, bo, br);
      rx_tensor_set(in[w], j, x - h);
      const double lm = packed_loss(&p, bo, br);
      rx_tensor_set(in[w], j, x);
      rx_tensor_get(g[w].t, j, &gr);
      const double fd = (lp - lm) / (2 * h), e = fabs(fd - gr) / fmax(1, fabs(fd));
      if (e > worst) { worst = e; at = j; }
    }
    CHECK(worst < 1e-7, "packed: d%s[%lld] differs from finite differences by %.3g", names[w], (long long)at, worst);
    CHECK(guarded_free(g[w]), "packed d%s sentinels overwritten", names[w]);
  }
  free(bo); free(br);
  free_packed(&p);
}

static void packed_bad_boundaries_fail_with_names(void) {
  const int64_t len[] = {3, 4};
  packed p = make_packed(len, 2, 2, 1, 4, RX_F32, 3);
  int32_t *cu = p.cu->data;
  cu[2] = 6;
  CHECK_FAILS(rx_attention_forward_seq(p.out.t, p.lse.t, p.q, p.k, p.v, NULL, p.cu, 0),
              "cu_seqlens runs from 0 to 6, expected 0 to N = 7");
  cu[2] = 7; cu[1] = 8;
  CHECK_FAILS(rx_attention_forward_seq(p.out.t, p.lse.t, p.q, p.k, p.v, NULL, p.cu, 0),
              "cu_seqlens[2] = 7 is less than cu_seqlens[1] = 8");
  cu[1] = 3;
  rx_tensor *q2, *k2, *o2, *l2;
  const int64_t qs[4] = {7, 1, 2, 4}, ks[4] = {7, 1, 1, 4}, ls[3] = {7, 2, 1};
  rx_tensor_new(&q2, RX_F32, RX_CPU, 4, qs); rx_tensor_new(&k2, RX_F32, RX_CPU, 4, ks);
  rx_tensor_new(&o2, RX_F32, RX_CPU, 4, qs); rx_tensor_new(&l2, RX_F32, RX_CPU, 3, ls);
  CHECK_FAILS(rx_attention_forward_seq(o2, l2, q2, k2, k2, NULL, p.cu, 0), "packed rows (cu_seqlens) need q [1,N,H,D]");
  rx_tensor_free(q2); rx_tensor_free(k2); rx_tensor_free(o2); rx_tensor_free(l2);
  free_packed(&p);
}

int main(void) {
  RUN(forward_matches_reference);
  RUN(forward_decodes_against_cache_view);
  RUN(forward_tiles_match_reference);
  RUN(backward_matches_finite_differences);
  RUN(backward_f32_matches_f64);
  RUN(backward_skips_null_gradients);
  RUN(results_do_not_depend_on_threads);
  RUN(bad_arguments_fail_with_names);
  RUN(packed_rows_match_each_row_alone);
  RUN(packed_backward_matches_finite_differences);
  RUN(packed_bad_boundaries_fail_with_names);
  return check_summary("test_attention");
}
