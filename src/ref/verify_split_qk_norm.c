/*
 * verify_split_qk_norm.c — mlaf_verify_split_qk_norm: a case on the context's backend, the op,
 * and every output value against the float64 oracle (ref_norm.c); the k_pe copy bit for bit.
 * How buffers are judged: verify_case.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify_case.h"

typedef struct split_arg {
    const norm_bufs *b;
    const mlaf_verify_case *c;
    int32_t Q, C, R;
    int give_pe;
} split_arg;

/* Tokens [t0, t0 + n): the oracle's q and k_nope, the k_pe copy bit for bit. */
static void split_chunk(const void *arg, void *scratch, int64_t t0, int64_t n, judge *j,
                        int64_t *errors) {
    const split_arg *a = (const split_arg *)arg;
    const norm_bufs *b = a->b;
    const int32_t Q = a->Q, C = a->C, R = a->R;
    const size_t es = mlaf_dtype_size(a->c->dtype);
    double *rq = (double *)scratch, *rk = rq + CHUNK_TOKENS * (Q > 0 ? Q : 1);
    (void)errors;
    mlaf_norm_job hj = host_norm_job(b, a->c, t0, n);
    mlaf_ref_split_qk_norm(&hj, Q > 0 ? rq : NULL, rk, NULL);
    for (int64_t u = 0; u < n; u++) {
        int64_t t = t0 + u;
        for (int32_t i = 0; i < Q; i++) judge_value(j, &b->vq, "q", t, i, rq[u * Q + i], 0);
        for (int32_t i = 0; i < C; i++) judge_value(j, &b->vk, "k_nope", t, i, rk[u * C + i], 0);
        if (a->give_pe && R > 0) {
            /* bit-exact copy of the latent's rope columns */
            const unsigned char *src = b->latent.init + (size_t)((t * b->LS + Q + C) * (int64_t)es);
            size_t at = vv_byte(&b->vp, t, 0);
            if (memcmp((const unsigned char *)b->vp.b->g.body + at, src, (size_t)R * es) != 0)
                judge_fail(j, "k_pe[t=%lld]: not a bit-exact copy of the latent's rope part",
                           (long long)t);
            if (!a->c->in_place) memset(b->vp.b->claimed + at, 1, (size_t)R * es);
        }
    }
}

mlaf_status mlaf_verify_split_qk_norm(mlaf_context *ctx, const mlaf_verify_case *c,
                                      mlaf_verify_result *r) {
    mlaf_status s = check_case_common(c, r);
    if (s != MLAF_OK) return s;
    const int32_t Q = c->cfg.q_lora_rank, C = c->cfg.kv_lora_rank, R = c->cfg.qk_rope_head_dim;
    const int64_t T = c->T;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, c->seed);
    norm_bufs b;
    s = norm_bufs_make(&b, mlaf_context_backend(ctx), c, &rng, 1, !c->no_k_pe);
    if (s != MLAF_OK) goto done;

    mlaf_split_qk_norm_params p = {Q, C, R, c->cfg.rms_norm_eps, c->cfg.rms_norm_eps};
    mlaf_tensor lt = mlaf_tensor_2d(b.latent.g.ptr, c->dtype, T, (int64_t)Q + C + R, b.LS);
    mlaf_tensor wq = mlaf_tensor_1d(b.w_q.g.ptr, c->weight_dtype, Q);
    mlaf_tensor wkv = mlaf_tensor_1d(b.w_kv.g.ptr, c->weight_dtype, C);
    mlaf_tensor tq = tensor_of(&b.vq, T, Q), tk = tensor_of(&b.vk, T, C), tp = tensor_of(&b.vp, T, R);
    int give_pe = !c->no_k_pe;
    s = mlaf_split_qk_norm(ctx, &p, &lt, Q > 0 ? &wq : NULL, &wkv, Q > 0 ? &tq : NULL, &tk,
                           give_pe ? &tp : NULL);
    if (s != MLAF_OK) {
        snprintf(r->detail, sizeof r->detail, "mlaf_split_qk_norm: %s: %s", mlaf_status_name(s),
                 mlaf_context_last_error(ctx));
        goto done;
    }
    if ((s = mlaf_context_sync(ctx)) != MLAF_OK) goto done;
    vbuf *all[6] = {&b.latent, &b.w_q, &b.w_kv, &b.q, &b.k_nope, &b.k_pe};
    if ((s = fetch_all(all, 6)) != MLAF_OK) goto done;
    corrupt_outputs(c, Q > 0 ? &b.vq : &b.vk);

    judge j = {r, 0, 0.0, 0};
    const split_arg sa = {&b, c, Q, C, R, !c->no_k_pe};
    int64_t errors = 0;
    const size_t scratch = sizeof(double) * CHUNK_TOKENS * ((size_t)(Q > 0 ? Q : 1) + (size_t)C);
    if ((s = run_chunks(T, CHUNK_TOKENS, scratch, split_chunk, &sa, &j, &errors)) != MLAF_OK) goto done;
    int64_t untouched = 0;
    for (int i = 0; i < 6; i++) untouched += judge_untouched(&j, all[i]);
    judge_finish(&j, "split_qk_norm", c, untouched);
done:
    norm_bufs_free(&b);
    return s;
}
