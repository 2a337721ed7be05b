/*
 * test_fuzz_context.c — random calls of the context, preset, name and RoPE-table helpers.
 * The driver, the harness and what every call must satisfy: fuzz_common.h.
 */
#include "fuzz_common.h"

/* ---- context, presets, names, RoPE tables --------------------------------------------------- */
static int yarn_ok(const mlaf_rope_scaling *s) {
    if (!s || s->type == MLAF_ROPE_SCALING_NONE) return 1;
    return s->type == MLAF_ROPE_SCALING_YARN && isfinite(s->factor) && s->factor >= 1 && s->original_max_position_embeddings >= 1 &&
           isfinite(s->beta_fast) && s->beta_fast > 0 && isfinite(s->beta_slow) && s->beta_slow > 0 && isfinite(s->mscale) &&
           s->mscale >= 0 && isfinite(s->mscale_all_dim) && s->mscale_all_dim >= 0 && isfinite(s->attention_factor) &&
           s->attention_factor >= 0;
}

static double pick_d(mlaf_rng *r, const double *v, int n) { return v[U(r, (uint64_t)n)]; }

static int fuzz_ctx(fz *f) {
    mlaf_rng *r = &f->r;
    mlaf_context *c = f->ctx;
    switch (U(r, 7)) {
    case 0: { /* threads: 0..MLAF_MAX_THREADS accepted, the rest rejected and the count kept */
        static const int v[12] = {-5, -1, 0, 1, 2, 3, 7, 64, MLAF_MAX_THREADS, MLAF_MAX_THREADS + 1, 100000, INT_MAX};
        int n = CHANCE(r, 0.1) ? INT_MIN : v[U(r, 12)], before = mlaf_context_threads(c);
        mlaf_status st = mlaf_context_set_threads(c, n), want = n < 0 ? MLAF_ERR_INVALID_ARGUMENT : n > MLAF_MAX_THREADS ? MLAF_ERR_LIMIT : MLAF_OK;
        int now = mlaf_context_threads(c);
        note(f, " set_threads(%d)", n);
        if (st != want) fail(f, "set_threads(%d) = %s, expected %s", n, mlaf_status_name(st), mlaf_status_name(want));
        else if (st != MLAF_OK && (now != before || !mlaf_context_last_error(c)[0])) fail(f, "a rejected set_threads(%d) changed the count or left no message", n);
        else if (now < 1 || now > MLAF_MAX_THREADS || (n > 0 && st == MLAF_OK && now != n)) fail(f, "threads = %d after set_threads(%d)", now, n);
        mlaf_context_set_threads(c, 2); /* no team of 1024 threads for the op calls after */
        return 1;
    }
    case 1: {
        int isa = (int)RANGE(r, -2, 6);
        mlaf_cpu_isa before = mlaf_context_cpu_isa(c);
        mlaf_status st = mlaf_context_set_cpu_isa(c, (mlaf_cpu_isa)isa);
        note(f, " set_cpu_isa(%d)", isa);
        if (isa < 0 || isa >= MLAF_CPU_ISA_COUNT_) {
            if (st != MLAF_ERR_INVALID_ARGUMENT || mlaf_context_cpu_isa(c) != before) fail(f, "set_cpu_isa(%d) = %s", isa, mlaf_status_name(st));
        } else if (st == MLAF_OK) {
            if (mlaf_context_cpu_isa(c) == MLAF_CPU_ISA_AUTO || (isa != MLAF_CPU_ISA_AUTO && mlaf_context_cpu_isa(c) != (mlaf_cpu_isa)isa))
                fail(f, "set_cpu_isa(%d) resolved to %d", isa, (int)mlaf_context_cpu_isa(c));
        } else if (st != MLAF_ERR_UNSUPPORTED || mlaf_context_cpu_isa(c) != before || mlaf_cpu_isa_supported((mlaf_cpu_isa)isa)) {
            fail(f, "set_cpu_isa(%d) = %s", isa, mlaf_status_name(st));
        }
        return 1;
    }
    case 2: { /* CUDA setters: rejected on a CPU context; on CUDA, the device range */
        int dev = (int)RANGE(r, -2, 3);
        mlaf_status st = mlaf_context_set_cuda_device(c, dev);
        note(f, " set_cuda_device(%d)", dev);
        if (f->be == MLAF_BACKEND_CPU) {
            if (st == MLAF_OK || mlaf_context_set_cuda_stream(c, NULL) != MLAF_ERR_INVALID_ARGUMENT) fail(f, "CUDA setters accepted on a CPU context");
        } else if (dev < 0 && st == MLAF_OK) {
            fail(f, "set_cuda_device(%d) accepted", dev);
        }
        if (f->be == MLAF_BACKEND_CUDA) mlaf_context_set_cuda_device(c, 0);
        return 1;
    }
    case 3: { /* presets by index and by name */
        int i = (int)RANGE(r, -3, mlaf_preset_count() + 2);
        const mlaf_model_config *m = mlaf_preset_at(i);
        static const char *const names[9] = {"glm-4.7-flash", "GLM-4.7-FLASH", "deepseek-r1", "DeepSeek-V3", "kimi-k2", "", "deepseek", "glm-4.7-flash ", "x"};
        const char *nm = CHANCE(r, 0.1) ? NULL : names[U(r, 9)];
        const mlaf_model_config *byname = mlaf_preset_find(nm);
        note(f, " preset_at(%d) preset_find(%s)", i, nm ? nm : "NULL");
        if ((i >= 0 && i < mlaf_preset_count()) != (m != NULL)) fail(f, "preset_at(%d) = %p", i, (const void *)m);
        if (byname && !byname->name[0]) fail(f, "preset_find(%s) has no name", nm);
        if (m) {
            mlaf_moe_gate_params gp = mlaf_moe_gate_params_from_config(m);
            if (gp.top_k != m->top_k || gp.n_group != m->n_group) fail(f, "moe_gate_params_from_config(%s) differs", m->name);
        }
        mlaf_moe_gate_params d = mlaf_moe_gate_params_from_config(NULL);
        if (d.top_k != 1 || d.n_group != 1 || d.eps != 1e-20f) fail(f, "moe_gate_params_from_config(NULL) is not the default");
        return 1;
    }
    case 4: { /* names of any code: never NULL, never empty */
        int v = (int)RANGE(r, -3, 14);
        const char *s[6] = {mlaf_status_name((mlaf_status)v), mlaf_status_message((mlaf_status)v), mlaf_dtype_name((mlaf_dtype)v),
                            mlaf_backend_name((mlaf_backend)v), mlaf_op_name((mlaf_op)v), mlaf_cpu_isa_name((mlaf_cpu_isa)v)};
        for (int k = 0; k < 6; k++)
            if (!s[k] || !s[k][0]) fail(f, "name %d of code %d is NULL or empty", k, v);
        (void)mlaf_dtype_size((mlaf_dtype)v);
        return 1;
    }
    default: { /* RoPE tables, plain and scaled, valid and not, in a guarded host buffer */
        static const int64_t mp[6] = {-1, 0, 1, 3, 17, 40};
        static const int32_t rd[7] = {-4, 0, 1, 2, 7, 16, 64};
        static const double bases[7] = {10000.0, 500000.0, 1.0, 0.5, NAN, INFINITY, 1.0001};
        const int64_t max_pos = mp[U(r, 6)];
        const int32_t R = rd[U(r, 7)];
        const double base = bases[U(r, 7)];
        mlaf_rope_scaling s, *sp = NULL;
        if (CHANCE(r, 0.7)) {
            static const double fac[6] = {1.0, 4.0, 40.0, 0.5, NAN, 1e6}, beta[5] = {32, 1, 0, -1, 0.25}, ms[5] = {0, 1, 0.707, -0.1, INFINITY};
            s = mlaf_rope_scaling_yarn(pick_d(r, fac, 6), CHANCE(r, 0.1) ? 0 : RANGE(r, 1, 70000));
            if (CHANCE(r, 0.5)) s.beta_fast = pick_d(r, beta, 5);
            if (CHANCE(r, 0.5)) s.beta_slow = pick_d(r, beta, 5);
            if (CHANCE(r, 0.5)) s.mscale = pick_d(r, ms, 5);
            if (CHANCE(r, 0.5)) s.mscale_all_dim = pick_d(r, ms, 5);
            if (CHANCE(r, 0.3)) s.attention_factor = pick_d(r, ms, 5);
            s.truncate = (int32_t)U(r, 3);
            if (CHANCE(r, 0.1)) s.type = (mlaf_rope_scaling_type)RANGE(r, -1, 4);
            sp = &s;
        }
        const size_t n = (size_t)((max_pos > 0 ? max_pos : 1) * (R > 0 ? R : 1));
        int bi = fz_buffer(f, n * sizeof(float), 2, MLAF_F32, 0);
        if (mlaf_gbuf_alloc(&f->b[bi].g, MLAF_BACKEND_CPU, f->b[bi].bytes, f->b[bi].init, 0) != MLAF_OK) return -1;
        float *tab = (float *)f->b[bi].g.ptr;
        const int valid = max_pos >= 1 && R > 0 && R % 2 == 0 && isfinite(base) && base > 1.0 && yarn_ok(sp);
        mlaf_status st = sp && CHANCE(r, 0.5) ? mlaf_rope_table_init_scaled(tab, max_pos, R, base, sp)
                         : sp                 ? mlaf_rope_table_init_scaled(CHANCE(r, 0.1) ? NULL : tab, max_pos, R, base, sp)
                                              : mlaf_rope_table_init(tab, max_pos, R, base);
        note(f, " rope table max_pos=%lld R=%d base=%g scaling=%s", (long long)max_pos, (int)R, base, sp ? "yarn" : "none");
        mlaf_gbuf_download(&f->b[bi].g); /* CPU: mirrors the table */
        if (st == MLAF_ERR_NULL_POINTER) {
            check_untouched(f);
            return 1;
        }
        if (valid != (st == MLAF_OK)) {
            fail(f, "status %s, expected %s", mlaf_status_name(st), valid ? "MLAF_OK" : "an error");
            return 1;
        }
        if (st != MLAF_OK) {
            check_untouched(f);
            return 1;
        }
        memset(f->b[bi].claim, 1, n * sizeof(float));
        const double a = mlaf_rope_scaling_attention_factor(sp);
        for (int64_t p = 0; p < max_pos && !f->failed; p++)
            for (int32_t i = 0; i < R / 2; i++) {
                const float cv = tab[p * R + i], sv = tab[p * R + R / 2 + i];
                if (!sp || sp->type == MLAF_ROPE_SCALING_NONE) {
                    const double ang = (double)p * pow(base, -2.0 * i / R);
                    if (cv != (float)cos(ang) || sv != (float)sin(ang)) fail(f, "plain table [%lld, %d] = (%g, %g)", (long long)p, i, cv, sv);
                } else if (!(fabs(hypot(cv, sv) - a) <= 1e-6 * a + 1e-30)) {
                    fail(f, "yarn table [%lld, %d]: |(cos, sin)| = %.9g, expected the attention factor %.9g", (long long)p, i, hypot(cv, sv), a);
                }
            }
        check_untouched(f);
        return 1;
    }
    }
}

int main(void) {
    static const fuzz_entry ops[] = {{4, fuzz_ctx}};
    return fuzz_main(ops, (int)(sizeof ops / sizeof ops[0]));
}
