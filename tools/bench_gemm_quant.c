/*
 * bench_gemm_quant.c — `mlafuse bench --op gemm_quant --hidden N [--q-format F] [--q-scale S]`: an
 * activation x [T, K] quantized into a GEMM-input format, alone (what an engine runs before o_proj).
 * Buffers: x, the format's e4m3 data and scales. The unfused chain is the bench's own per-token-group
 * quantize pass (blc_gemm_quant / blg_gemm_quant: what rms_norm_quant's chain runs after its dense op,
 * SGLang's per_token_group_quant shape on the GPU) over the same x; the check compares the e4m3
 * bytes and scales byte for byte. CUDA rows also time the same-bytes copies, as every op's.
 */
#include "bench_op.h"

static int setup_gemm_quant(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T, K = o->hidden;
    mlaf_dtype sdt;
    int64_t sh[2];
    if (o->q_fmt == MLAF_GEMM_NONE || mlaf_gemm_scales_shape(o->q_fmt, T, K, &sdt, sh, &o->q_ld) != MLAF_OK) {
        snprintf(err, cap, "--hidden %lld is not a multiple of %s's group %d", (long long)K,
                 mlaf_gemm_format_name(o->q_fmt), (int)mlaf_gemm_format_group(o->q_fmt));
        return -1;
    }
    const size_t sbytes = (size_t)(sh[0] * o->q_ld) * mlaf_dtype_size(sdt);
    const double scale_bytes = (double)sh[0] * (double)sh[1] * (double)mlaf_dtype_size(sdt);
    bench_rotation(o, llc, (double)T * K * (double)(es + 1) + (double)sbytes); /* one set: x, data, scales */
    void *x = host_random(rng, dt, (size_t)(T * K), -2.0, 2.0);
    NEED(x);
    if (buf_alloc(o, B_RX, (size_t)(T * K) * es, 1, x, err, cap)) return -1;
    if (buf_alloc(o, B_QD, (size_t)(T * K), 1, NULL, err, cap)) return -1;
    if (buf_alloc(o, B_QS, sbytes, 1, NULL, err, cap)) return -1;
    /* the op's minimum: x read, the e4m3 bytes and the scales (the tensor's shape, not its padding) */
    o->bytes = (double)T * K * (double)(es + 1) + scale_bytes;
    return 0;
}

static int fused_gemm_quant(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    return api_err(o, mlaf_gemm_quant(o->ctx, &v.rx, &v.rq), mlaf_op_name(o->op), err, cap);
}

static int unfused_gemm_quant(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    mlaf_gemm_quant_job j;
    if (api_err(o, mlaf_check_gemm_quant(o->ctx, &v.rx, &v.rq, &j), "unfused gemm_quant", err, cap)) return -1;
    if (j.T == 0) return 0;
    int r;
    if (o->be == MLAF_BACKEND_CPU)
        r = blc_gemm_quant(&j.q, j.x, j.dt, j.T, j.K, j.x_stride, o->threads, mlaf_cpu_norm_kern(o->ctx));
#ifdef MLAF_WITH_CUDA
    else
        r = blg_gemm_quant(&j.q, j.x, j.dt, j.T, j.K, j.x_stride, bench_stream(o));
#else
    else
        r = -1;
#endif
    return baseline_err(r, "gemm_quant", err, cap);
}

static int outputs_gemm_quant(const bench_op *o, int *ids) {
    (void)o;
    ids[0] = B_QD, ids[1] = B_QS;
    return 2;
}

/* the op's entry in the registry (bench_cmd.c walks it) */
const bench_op_def bench_gemm_quant_def = {
    .op = MLAF_OP_GEMM_QUANT,
    .skip = NULL,
    .setup = setup_gemm_quant,
    .fused = fused_gemm_quant,
    .unfused = unfused_gemm_quant,
    .outputs = outputs_gemm_quant,
    .compare = NULL,
};
