/* test_optim.c: AdamW against the textbook formulas, gradient norm and clipping. */
#include "check.h"

static rx_tensor *vec(int32_t dtype, int64_t n, uint64_t seed) {
  rx_tensor *t;
  int64_t shape[1] = {n};
  rx_tensor_new(&t, dtype, RX_CPU, 1, shape);
  if (seed) rx_tensor_normal(t, seed, 0, 0, 1);
  return t;
}

/* Reference AdamW in double, written from the paper's algorithm. */
static void adamw_reference(double *p, const double *g, double *m, double *v, int64_t n, double lr, double b1,
                            double b2, double eps, double wd, int64_t t, int decay) {
  for (int64_t i = 0; i < n; i++) {
    if (decay) p[i] -= lr * wd * p[i];
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
    p[i] -= lr * mhat / (sqrt(vhat) + eps);
  }
}

static void adamw_matches_reference(void) {
  enum { N = 101 };
  for (int dt = 0; dt < 2; dt++) {
    int32_t dtype = dt ? RX_F64 : RX_F32;
    for (int decay = 0; decay < 2; decay++) {
      rx_tensor *p = vec(dtype, N, 1), *g = vec(dtype, N, 0), *m = vec(dtype, N, 0), *v = vec(dtype, N, 0);
      double rp[N], rg[N], rm[N] = {0}, rv[N] = {0}, got[N];
      rx_tensor_read_f64(p, rp);
      rx_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
      for (int64_t t = 1; t <= 5; t++) {
        rx_tensor_normal(g, 100 + (uint64_t)t, 0, 0, 1);
        rx_tensor_read_f64(g, rg);
        cfg.step = t;
        CHECK_OK(rx_adamw_step(p, g, m, v, &cfg, decay));
        adamw_reference(rp, rg, rm, rv, N, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, t, decay);
      }
      rx_tensor_read_f64(p, got);
      double err = check_nrmse(got, rp, N);
      CHECK(err < (dt ? 1e-14 : 1e-6), "dtype %s decay %d: nrmse %g", rx_dtype_name(dtype), decay, err);
      rx_tensor_free(p); rx_tensor_free(g); rx_tensor_free(m); rx_tensor_free(v);
    }
  }
}

static void adamw_decay_flag_matters(void) {
  rx_tensor *p1 = vec(RX_F32, 8, 3), *p2 = vec(RX_F32, 8, 3), *g = vec(RX_F32, 8, 0);
  rx_tensor *m1 = vec(RX_F32, 8, 0), *v1 = vec(RX_F32, 8, 0), *m2 = vec(RX_F32, 8, 0), *v2 = vec(RX_F32, 8, 0);
  rx_adamw_config cfg = {0.1, 0.9, 0.999, 1e-8, 0.5, 1};
  CHECK_OK(rx_adamw_step(p1, g, m1, v1, &cfg, 1));   /* zero gradient: only decay moves p */
  CHECK_OK(rx_adamw_step(p2, g, m2, v2, &cfg, 0));
  double a, b, orig;
  rx_tensor *p0 = vec(RX_F32, 8, 3);
  rx_tensor_get(p1, 2, &a);
  rx_tensor_get(p2, 2, &b);
  rx_tensor_get(p0, 2, &orig);
  CHECK(fabs(a - orig * 0.95) < 1e-6 && b == orig, "decayed %g, undecayed %g, original %g", a, b, orig);
  rx_tensor *wrong = vec(RX_F32, 7, 0);
  CHECK_FAILS(rx_adamw_step(p1, wrong, m1, v1, &cfg, 1), "grad has shape [7], param has [8]");
  cfg.step = 0;
  CHECK_FAILS(rx_adamw_step(p1, g, m1, v1, &cfg, 1), "step 0 must be >= 1");
  rx_tensor_free(p0); rx_tensor_free(p1); rx_tensor_free(p2); rx_tensor_free(g); rx_tensor_free(wrong);
  rx_tensor_free(m1); rx_tensor_free(v1); rx_tensor_free(m2); rx_tensor_free(v2);
}

static void grad_norm_and_clipping(void) {
  rx_tensor *a = vec(RX_F32, 1000, 7), *b = vec(RX_F32, 33, 8);
  double xa[1000], xb[33], ref = 0, norm;
  rx_tensor_read_f64(a, xa);
  rx_tensor_read_f64(b, xb);
  for (int i = 0; i < 1000; i++) ref += xa[i] * xa[i];
  for (int i = 0; i < 33; i++) ref += xb[i] * xb[i];
  ref = sqrt(ref);
  const rx_tensor *list[2] = {a, b};
  CHECK_OK(rx_grad_norm(list, 2, &norm));
  CHECK(fabs(norm - ref) < 1e-5 * ref, "norm %g vs %g", norm, ref);
  rx_tensor *mut[2] = {a, b};
  CHECK_OK(rx_clip_grad_norm(mut, 2, ref * 2, &norm));   /* under the limit: unchanged */
  double after;
  CHECK_OK(rx_grad_norm(list, 2, &after));
  CHECK(fabs(after - ref) < 1e-5 * ref, "unclipped norm changed to %g", after);
  CHECK_OK(rx_clip_grad_norm(mut, 2, 1.0, &norm));
  CHECK(fabs(norm - ref) < 1e-5 * ref, "reported pre-clip norm %g vs %g", norm, ref);
  CHECK_OK(rx_grad_norm(list, 2, &after));
  CHECK(fabs(after - 1.0) < 1e-4, "clipped norm %g", after);
  rx_tensor_set(b, 3, NAN);
  CHECK_OK(rx_clip_grad_norm(mut, 2, 1.0, &norm));
  CHECK(isnan(norm), "NaN gradient gives NaN norm (%g) so the caller can skip the step", norm);
  CHECK_FAILS(rx_clip_grad_norm(mut, 2, 0.0, &norm), "max_norm 0 must be > 0");
  rx_tensor_free(a);
  rx_tensor_free(b);
}

int main(void) {
  RUN(adamw_matches_reference);
  RUN(adamw_decay_flag_matters);
  RUN(grad_norm_and_clipping);
  return check_summary("test_optim");
}
