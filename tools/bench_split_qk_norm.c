/*
 * bench_split_qk_norm.c — `mlafuse bench --op split_qk_norm [--q-format F]`: its buffers, the fused
 * call, the unfused chain (split into dense tensors, then one RMSNorm pass each for q and kv) and the
 * outputs checked. With --q-format the fused call writes q_norm quantized only (what an fp8
 * q_b_proj reads), and the unfused chain is the dense op followed by a separate per-token-group
 * quantize pass over its q.
 */
#include "bench_op.h"

static int setup_split_qk_norm(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T;
    const int64_t W = o->Q + o->C + o->R;
    /* Bytes of one input/output set, for the rotation count. */
    bench_rotation(o, llc, 2.0 * (double)T * W * es);
    if (bench_setup_latent(o, rng, err, cap)) return -1;
    if (buf_alloc(o, B_KNOPE, (size_t)(T * o->C) * es, 1, NULL, err, cap)) return -1;
    if (o->R > 0 && buf_alloc(o, B_KPE, (size_t)(T * o->R) * es, 1, NULL, err, cap)) return -1;
    if (o->Q > 0 && buf_alloc(o, S_QD, (size_t)(T * o->Q) * es, 0, NULL, err, cap)) return -1;
    if (buf_alloc(o, S_KVD, (size_t)(T * o->C) * es, 0, NULL, err, cap)) return -1;
    o->bytes = 2.0 * (double)T * W * es + (double)(o->Q + o->C) * es;
    if (o->q_fmt != MLAF_GEMM_NONE) { /* q written as e4m3 bytes and scales instead of the dense q */
        double qbytes;
        if (bench_setup_row_quant(o, o->Q, &qbytes, err, cap)) return -1;
        o->bytes += qbytes - (double)T * o->Q * es;
    }
    return 0;
}

static int fused_split_qk_norm(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    mlaf_status st = MLAF_OK;
    const int hasq = o->Q > 0, hasr = o->RP > 0;
    mlaf_split_qk_norm_params p = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                   o->cfg.rms_norm_eps, o->cfg.rms_norm_eps};
    if (o->q_fmt != MLAF_GEMM_NONE) {
        const mlaf_row_quant rq = {v.rq, {MLAF_GEMM_NONE}};
        st = mlaf_split_qk_norm_quant(o->ctx, &p, &v.latent, &v.w_q, &v.w_kv, NULL, &v.k_nope, hasr ? &v.k_pe : NULL,
                                      &rq);
    } else {
        st = mlaf_split_qk_norm(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv, hasq ? &v.q : NULL, &v.k_nope,
                                hasr ? &v.k_pe : NULL);
    }
    return api_err(o, st, mlaf_op_name(o->op), err, cap);
}

static int unfused_split_qk_norm(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    const int hasq = o->Q > 0, hasr = o->R > 0;
    const int cpu = o->be == MLAF_BACKEND_CPU;
    void *stream = bench_stream(o);
    (void)stream;
    int r = 0;
    mlaf_split_qk_norm_params p = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                   o->cfg.rms_norm_eps, o->cfg.rms_norm_eps};
    mlaf_norm_job j;
    if (api_err(o, mlaf_check_split_qk_norm(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL,
                                            &v.w_kv, hasq ? &v.q : NULL, &v.k_nope,
                                            hasr ? &v.k_pe : NULL, &j),
                "unfused split_qk_norm", err, cap))
        return -1;
    if (j.T == 0) return 0;
    if (o->q_fmt != MLAF_GEMM_NONE) { /* the dense op, then the quantize pass over its q */
        if (api_err(o, mlaf_split_qk_norm(o->ctx, &p, &v.latent, &v.w_q, &v.w_kv, &v.q, &v.k_nope, hasr ? &v.k_pe : NULL),
                    "unfused split_qk_norm (dense)", err, cap))
            return -1;
        return bench_row_quant_pass(o, &v, set, err, cap);
    }
    if (cpu)
        r = blc_split_qk_norm(&j, P(o, S_QD, set), P(o, S_KVD, set), o->threads);
#ifdef MLAF_WITH_CUDA
    else
        r = blg_split_qk_norm(&j, P(o, S_QD, set), P(o, S_KVD, set), stream);
#endif
    return baseline_err(r, "split_qk_norm", err, cap);
}

static int outputs_split_qk_norm(const bench_op *o, int *ids) {
    int n = 0;
    if (o->q_fmt != MLAF_GEMM_NONE) ids[n++] = B_QD, ids[n++] = B_QS;
    else if (o->Q > 0) ids[n++] = B_Q;
    ids[n++] = B_KNOPE;
    if (o->R > 0) ids[n++] = B_KPE;
    return n;
}

/* the op's entry in the registry (bench_cmd.c walks it) */
const bench_op_def bench_split_qk_norm_def = {
    .op = MLAF_OP_SPLIT_QK_NORM,
    .skip = NULL,
    .setup = setup_split_qk_norm,
    .fused = fused_split_qk_norm,
    .unfused = unfused_split_qk_norm,
    .outputs = outputs_split_qk_norm,
    .compare = NULL,
};
