/*
 * bench_indexer_q.c — `mlafuse bench --op indexer_q` (models with a DSA indexer): its buffers and the
 * fused call; no unfused chain here, so its rows are timed against the same-run copy only.
 */
#include "bench_op.h"

static const char *skip_indexer_q(const mlaf_model_config *m, int32_t tail) {
    (void)tail;
    return m->index_n_heads <= 0 ? "has no DSA indexer" : NULL;
}

static int setup_indexer_q(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T;
    /* Bytes of one input/output set, for the rotation count. */
    bench_rotation(o, llc, (double)T * o->cfg.index_n_heads * (128.0 * es + 132.0 + es));
    /* the indexer's own 64-wide table */
    o->R = MLAF_INDEX_ROPE_DIM;
    o->H = o->cfg.index_n_heads;
    o->ip = mlaf_indexer_params_from_config(&o->cfg);
    o->RP = o->R;
    if (bench_setup_rope(o, err, cap)) return -1;
    const size_t n = (size_t)(T * o->H * MLAF_INDEX_HEAD_DIM);
    void *q = host_random(rng, dt, n, -2.0, 2.0);
    NEED(q);
    if (buf_alloc(o, B_IQ, n * es, 1, q, err, cap)) return -1;
    void *w = host_random(rng, dt, (size_t)(T * o->H), -1.0, 1.0);
    NEED(w);
    if (buf_alloc(o, B_IQW, (size_t)(T * o->H) * es, 1, w, err, cap)) return -1;
    if (buf_alloc(o, B_IQF, n, 1, NULL, err, cap)) return -1;
    if (buf_alloc(o, B_IQWO, sizeof(float) * (size_t)(T * o->H), 1, NULL, err, cap)) return -1;
    /* read q_idx, w, positions, a cos_sin row per token; write q_fp8 and w_out */
    o->bytes = (double)n * es + (double)T * o->H * es + T * 8.0 + T * 256.0 + (double)n + (double)T * o->H * 4.0;
    return 0;
}

static int fused_indexer_q(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    mlaf_status st = MLAF_OK;
    st = mlaf_indexer_q(o->ctx, &o->ip, &v.iq, &v.pos, &v.cos_sin, &v.iqw, &v.iqf, &v.iqwo, NULL, NULL, NULL);
    return api_err(o, st, mlaf_op_name(o->op), err, cap);
}

static int outputs_indexer_q(const bench_op *o, int *ids) {
    int n = 0;
    (void)o;
    ids[n++] = B_IQF;
    ids[n++] = B_IQWO;
    return n;
}

/* the op's entry in the registry (bench_cmd.c walks it) */
const bench_op_def bench_indexer_q_def = {
    .op = MLAF_OP_INDEXER_Q,
    .skip = skip_indexer_q,
    .skip_note = 1,
    .setup = setup_indexer_q,
    .fused = fused_indexer_q,
    .unfused = NULL,
    .outputs = outputs_indexer_q,
    .compare = NULL,
};
