/*
 * bench_rope_q.c — `mlafuse bench --op rope_q` (head_norm on DeepSeek-V4): its buffers, the fused
 * call, the unfused chain (a head_norm pass, then gather / rotate / scatter) and the output checked.
 */
#include "bench_op.h"

/* nothing to rotate without rope columns or a rope tail (a NoPE model, GLM-5.3-Flash) or with the
 * slot unrotated (Kimi-K3): one note line under --op all, a usage error when named */
static const char *skip_rope_q(const mlaf_model_config *m, int32_t tail) {
    if (tail > 0) return NULL;
    return m->qk_rope_head_dim <= 0              ? "has no rope part (qk_rope_head_dim = 0, NoPE): nothing to rotate"
           : m->rope_style == MLAF_ROPE_NONE ? "keeps its rope slot unrotated (rope style none): nothing to rotate"
                                             : NULL;
}

static int setup_rope_q(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T;
    /* Bytes of one input/output set, for the rotation count. */
    bench_rotation(o, llc, (double)T * o->H * o->D * es);
    if (bench_setup_rope(o, err, cap)) return -1;
    size_t n = (size_t)(T * o->H * o->D);
    void *q = host_random(rng, dt, n, -2.0, 2.0);
    NEED(q);
    if (buf_alloc(o, B_QH, n * es, 1, q, err, cap)) return -1;
    o->b[B_QH].mutable_input = 1;
    if (buf_alloc(o, S_GATHER, (size_t)(T * o->H * o->RP) * es, 0, NULL, err, cap)) return -1;
    /* head_norm (V4) reads and writes whole heads; plain RoPE only the rope columns */
    o->bytes = 2.0 * (double)T * o->H * (o->tail > 0 ? o->D : o->RP) * es + T * 8.0 + (double)T * o->RP * 4.0;
    return 0;
}

static int fused_rope_q(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    mlaf_status st = MLAF_OK;
    mlaf_rope_params p = {(int32_t)o->RP, o->cfg.rope_style, o->tail > 0, o->cfg.rms_norm_eps};
    st = mlaf_rope_q(o->ctx, &p, &v.qh, &v.pos, &v.cos_sin, NULL);
    return api_err(o, st, mlaf_op_name(o->op), err, cap);
}

static int unfused_rope_q(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    const int cpu = o->be == MLAF_BACKEND_CPU;
    void *stream = bench_stream(o);
    (void)stream;
    int r = 0;
    mlaf_rope_params p = {(int32_t)o->RP, o->cfg.rope_style, o->tail > 0, o->cfg.rms_norm_eps};
    mlaf_rope_q_job j;
    if (api_err(o, mlaf_check_rope_q(o->ctx, &p, &v.qh, &v.pos, &v.cos_sin, NULL, &j),
                "unfused rope_q", err, cap))
        return -1;
    if (j.T == 0) return 0;
    if (cpu) {
        if (j.head_norm) r = blc_head_norm(&j, o->threads, mlaf_cpu_norm_kern(o->ctx));
        if (!r) r = blc_rope_q(&j, P(o, S_GATHER, set), o->threads);
    }
#ifdef MLAF_WITH_CUDA
    else {
        if (j.head_norm) r = blg_head_norm(&j, stream);
        if (!r) r = blg_rope_q(&j, P(o, S_GATHER, set), stream);
    }
#endif
    return baseline_err(r, "rope_q", err, cap);
}

static int outputs_rope_q(const bench_op *o, int *ids) {
    int n = 0;
    (void)o;
    ids[n++] = B_QH;
    return n;
}

/* the op's entry in the registry (bench_cmd.c walks it) */
const bench_op_def bench_rope_q_def = {
    .op = MLAF_OP_ROPE_Q,
    .skip = skip_rope_q,
    .skip_note = 1,
    .setup = setup_rope_q,
    .fused = fused_rope_q,
    .unfused = unfused_rope_q,
    .outputs = outputs_rope_q,
    .compare = NULL,
};
