/*
 * bench_rms_norm_quant.c — `mlafuse bench --op rms_norm_quant --hidden N [--q-format F] [--q-scale S]`:
 * the residual add, RMSNorm and the GEMM-input output of one layer norm. Buffers x, residual (updated in
 * place: reset before the check, and carried over between the timed calls as in a model), weight, y
 * and the format's e4m3 data and scales. The unfused chain: with a format, the dense op (the library's
 * rms_norm_quant with y only, what engines' fused add + RMSNorm does) then a separate per-token-group
 * quantize pass reading y back (engines' per_token_group_quant); dense only, the residual add and the
 * RMSNorm as two passes. The check compares y and the residual value by value and the quantized bytes
 * exactly.
 */
#include "bench_op.h"

static int setup_rms_norm_quant(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T, K = o->hidden;
    size_t sbytes = 0;
    double scale_bytes = 0.0; /* the scales the op must write: the tensor's shape, not its padding */
    int64_t sh[2] = {0, 0};
    if (o->q_fmt != MLAF_GEMM_NONE) {
        mlaf_dtype sdt;
        if (mlaf_gemm_scales_shape(o->q_fmt, T, K, &sdt, sh, &o->q_ld) != MLAF_OK) {
            snprintf(err, cap, "--hidden %lld is not a multiple of %s's group %d", (long long)K,
                     mlaf_gemm_format_name(o->q_fmt), (int)mlaf_gemm_format_group(o->q_fmt));
            return -1;
        }
        sbytes = (size_t)(sh[0] * o->q_ld) * mlaf_dtype_size(sdt);
        scale_bytes = (double)sh[0] * (double)sh[1] * (double)mlaf_dtype_size(sdt);
    }
    const double qbytes = o->q_fmt ? (double)T * K + (double)sbytes : 0.0;
    /* one set: x, residual read and written, y, the quantized bytes */
    bench_rotation(o, llc, (double)T * K * es * 4.0 + qbytes);
    void *x = host_random(rng, dt, (size_t)(T * K), -2.0, 2.0), *r = host_random(rng, dt, (size_t)(T * K), -1.0, 1.0);
    void *w = host_random(rng, dt, (size_t)K, 0.5, 1.5);
    NEED(x);
    NEED(r);
    NEED(w);
    if (buf_alloc(o, B_RX, (size_t)(T * K) * es, 1, x, err, cap)) return -1;
    if (buf_alloc(o, B_RRES, (size_t)(T * K) * es, 1, r, err, cap)) return -1;
    o->b[B_RRES].mutable_input = 1;
    if (buf_alloc(o, B_RW, (size_t)K * es, 0, w, err, cap)) return -1;
    if (buf_alloc(o, B_RY, (size_t)(T * K) * es, 1, NULL, err, cap)) return -1;
    if (o->q_fmt != MLAF_GEMM_NONE) {
        if (buf_alloc(o, B_QD, (size_t)(T * K), 1, NULL, err, cap)) return -1;
        if (buf_alloc(o, B_QS, sbytes, 1, NULL, err, cap)) return -1;
    }
    /* the op's minimum: x and the residual read, the residual and y written, the weights, the bytes */
    o->bytes = 4.0 * (double)T * K * es + (double)K * es + (o->q_fmt ? (double)T * K + scale_bytes : 0.0);
    return 0;
}

static int fused_rms_norm_quant(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    const mlaf_rms_norm_quant_params p = {o->cfg.rms_norm_eps > 0.0f ? o->cfg.rms_norm_eps : 1e-6f};
    const mlaf_status st = mlaf_rms_norm_quant(o->ctx, &p, &v.rx, &v.rres, &v.rw, &v.ry, o->q_fmt ? &v.rq : NULL);
    return api_err(o, st, mlaf_op_name(o->op), err, cap);
}

static int unfused_rms_norm_quant(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    const mlaf_rms_norm_quant_params p = {o->cfg.rms_norm_eps > 0.0f ? o->cfg.rms_norm_eps : 1e-6f};
    mlaf_rms_norm_quant_job j;
    if (api_err(o, mlaf_check_rms_norm_quant(o->ctx, &p, &v.rx, &v.rres, &v.rw, &v.ry, o->q_fmt ? &v.rq : NULL, &j),
                "unfused rms_norm_quant", err, cap))
        return -1;
    if (j.T == 0) return 0;
    int r = 0;
    if (o->q_fmt != MLAF_GEMM_NONE) { /* the dense op, then the quantize pass over its y */
        if (api_err(o, mlaf_rms_norm_quant(o->ctx, &p, &v.rx, &v.rres, &v.rw, &v.ry, NULL), "unfused rms_norm_quant (dense)",
                    err, cap))
            return -1;
        if (o->be == MLAF_BACKEND_CPU)
            r = blc_gemm_quant(&j.q, j.y, j.dt, j.T, j.K, j.y_stride, o->threads, mlaf_cpu_norm_kern(o->ctx));
#ifdef MLAF_WITH_CUDA
        else
            r = blg_gemm_quant(&j.q, j.y, j.dt, j.T, j.K, j.y_stride, bench_stream(o));
#endif
    } else if (o->be == MLAF_BACKEND_CPU) {
        r = blc_add_rmsnorm(&j, o->threads);
    }
#ifdef MLAF_WITH_CUDA
    else {
        r = blg_add_rmsnorm(&j, bench_stream(o));
    }
#endif
    return baseline_err(r, "rms_norm_quant", err, cap);
}

static int outputs_rms_norm_quant(const bench_op *o, int *ids) {
    int n = 0;
    ids[n++] = B_RRES;
    ids[n++] = B_RY;
    if (o->q_fmt != MLAF_GEMM_NONE) ids[n++] = B_QD, ids[n++] = B_QS;
    return n;
}

/* the op's entry in the registry (bench_cmd.c walks it) */
const bench_op_def bench_rms_norm_quant_def = {
    .op = MLAF_OP_RMS_NORM_QUANT,
    .skip = NULL,
    .setup = setup_rms_norm_quant,
    .fused = fused_rms_norm_quant,
    .unfused = unfused_rms_norm_quant,
    .outputs = outputs_rms_norm_quant,
    .compare = NULL,
};
