/*
 * bench_mla_kv_cache.c — `mlafuse bench --op mla_kv_cache` (with --cache FORMAT, --cache-order and
 * --indexer, --q-format): the paged cache's block order, its buffers, the fused call, the unfused
 * chain (the library's split_qk_norm, RoPE, the cache write or quantize-and-write pass, the indexer
 * key passes, and with --q-format the quantize pass over q: the fused call then writes q quantized
 * only) and the outputs checked.
 */
#include "bench_op.h"

/* Fisher-Yates over p[0 .. n-1]. */
static void shuffle_i64(int64_t *p, int64_t n, mlaf_rng *rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t k = (int64_t)(mlaf_rng_u64(rng) % (uint64_t)(i + 1));
        int64_t tmp = p[i];
        p[i] = p[k];
        p[k] = tmp;
    }
}

/* The block of each 64-token run: perm[0 .. nb-1], a permutation of the cache's blocks in the
 * order --cache-order asks for; g = blocks per 2 MB of cache (>= 1). */
static int cache_block_order(int64_t *perm, int64_t nb, int64_t g, int order, mlaf_rng *rng) {
    for (int64_t i = 0; i < nb; i++) perm[i] = i;
    if (order == CO_SHUFFLED) {
        shuffle_i64(perm, nb, rng);
    } else if (order == CO_PAGE_LOCAL) {
        for (int64_t g0 = 0; g0 < nb; g0 += g) shuffle_i64(perm + g0, nb - g0 < g ? nb - g0 : g, rng);
    } else if (order == CO_PAGE_GROUPS) {
        const int64_t ng = nb / g; /* whole runs; a short last run stays last */
        int64_t *runs = (int64_t *)malloc(sizeof(int64_t) * (size_t)(ng > 0 ? ng : 1));
        if (!runs) return -1;
        for (int64_t i = 0; i < ng; i++) runs[i] = i;
        shuffle_i64(runs, ng, rng);
        for (int64_t r = 0; r < ng; r++)
            for (int64_t b = 0; b < g; b++) perm[r * g + b] = runs[r] * g + b;
        free(runs);
    }
    /* every block exactly once (the slots must not collide) */
    unsigned char *seen = (unsigned char *)calloc((size_t)(nb > 0 ? nb : 1), 1);
    if (!seen) return -1;
    int ok = 1;
    for (int64_t i = 0; i < nb && ok; i++) {
        ok = perm[i] >= 0 && perm[i] < nb && !seen[perm[i]];
        if (ok) seen[perm[i]] = 1;
    }
    free(seen);
    return ok ? 0 : -2;
}

static int setup_mla_kv_cache(bench_op *o, size_t llc, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T;
    const int64_t W = o->Q + o->C + o->R;
    if (o->kv_fmt != MLAF_KV_PLAIN) {
        o->rec_bytes = mlaf_kv_record_bytes(o->kv_fmt, o->cache_dt, (int32_t)o->C, (int32_t)o->R);
        const mlaf_kv_format_info *row = &mlaf_kv_formats[o->kv_fmt];
        if (o->rec_bytes <= 0 || (row->check_dims && row->check_dims(o->ctx, (int32_t)o->C, (int32_t)o->R, o->tail))) {
            snprintf(err, cap, "cache format %s does not take kv_lora_rank = %lld, rope_dim = %lld, kv_rope_tail = %d: %s",
                     row->name, (long long)o->C, (long long)o->R, (int)o->tail,
                     o->rec_bytes <= 0 ? "no record of these dims" : mlaf_context_last_error(o->ctx));
            return -1;
        }
    }
    /* Bytes of one input/output set, for the rotation count. */
    bench_rotation(o, llc, (double)T * (W + o->Q) * es + (double)T * o->rec_bytes + T * 16.0);
    if (bench_setup_latent(o, rng, err, cap)) return -1;
    if (bench_setup_rope(o, err, cap)) return -1;
    /* Whole blocks in the --cache-order order (default shuffled, as a paged allocator
     * hands them out after a while). */
    int64_t *perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)o->num_blocks);
    int64_t *slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
    NEED(perm);
    NEED(slots);
    const int64_t page_blocks = (int64_t)(((size_t)2 << 20) / ((size_t)o->block_size * (size_t)o->rec_bytes));
    const int co = cache_block_order(perm, o->num_blocks, page_blocks > 0 ? page_blocks : 1, o->cache_order, rng);
    if (co) {
        free(perm);
        free(slots);
        if (co == -2) snprintf(err, cap, "internal: --cache-order %s is not a permutation of the blocks", cache_order_names[o->cache_order]);
        else snprintf(err, cap, "out of host memory at T = %lld", (long long)o->T);
        return -1;
    }
    for (int64_t t = 0; t < T; t++)
        slots[t] = perm[t / o->block_size] * o->block_size + t % o->block_size;
    free(perm);
    if (buf_alloc(o, B_SLOTS, sizeof(int64_t) * (size_t)T, 1, slots, err, cap)) return -1;
    size_t cache_bytes = (size_t)(o->num_blocks * o->block_size * o->rec_bytes);
    if (buf_alloc(o, B_CACHE, cache_bytes, 1, NULL, err, cap)) return -1;
    if (o->kv_fmt == MLAF_KV_FP8) { /* the scale in backend memory, as engines keep k_scale */
        float *sc = (float *)malloc(sizeof(float));
        NEED(sc);
        *sc = o->kv_scale;
        if (buf_alloc(o, B_SCALE, sizeof(float), 0, sc, err, cap)) return -1;
    }
    if (buf_alloc(o, S_KN, (size_t)(T * o->C) * es, 0, NULL, err, cap)) return -1;
    if (o->R > 0 && buf_alloc(o, S_KP, (size_t)(T * o->R) * es, 0, NULL, err, cap)) return -1;
    const double rot = o->RP > 0 && o->cfg.rope_style != MLAF_ROPE_NONE; /* positions and cos_sin read */
    o->bytes = (double)T * W * es + (double)(o->Q + o->C) * es + rot * T * 8.0 +
               T * 8.0 + rot * T * o->RP * 4.0 + (double)T * o->Q * es +
               (double)T * (double)o->rec_bytes + (o->kv_fmt == MLAF_KV_FP8 ? 4.0 : 0.0);
    if (o->indexer) { /* index_k [T, 128], LayerNorm weight and bias; the 132-byte records */
        if (o->R != MLAF_INDEX_ROPE_DIM) {
            snprintf(err, cap, "--indexer needs qk_rope_head_dim = 64 (model has %lld)", (long long)o->R);
            return -1;
        }
        o->ip = mlaf_indexer_params_from_config(&o->cfg);
        void *ik = host_random(rng, dt, (size_t)(T * MLAF_INDEX_HEAD_DIM), -2.0, 2.0);
        NEED(ik);
        if (buf_alloc(o, B_IK, (size_t)(T * MLAF_INDEX_HEAD_DIM) * es, 1, ik, err, cap)) return -1;
        void *iw = host_random(rng, dt, MLAF_INDEX_HEAD_DIM, 0.5, 1.5);
        NEED(iw);
        if (buf_alloc(o, B_IW, MLAF_INDEX_HEAD_DIM * es, 0, iw, err, cap)) return -1;
        void *ib = host_random(rng, dt, MLAF_INDEX_HEAD_DIM, -0.5, 0.5);
        NEED(ib);
        if (buf_alloc(o, B_IB, MLAF_INDEX_HEAD_DIM * es, 0, ib, err, cap)) return -1;
        if (buf_alloc(o, B_ICACHE, (size_t)(o->num_blocks * o->block_size * (MLAF_INDEX_HEAD_DIM + 4)), 1, NULL,
                      err, cap))
            return -1;
        if (buf_alloc(o, S_IKD, (size_t)(T * MLAF_INDEX_HEAD_DIM) * es, 0, NULL, err, cap)) return -1;
        o->bytes += (double)T * MLAF_INDEX_HEAD_DIM * es + 2.0 * MLAF_INDEX_HEAD_DIM * es +
                    (double)T * (MLAF_INDEX_HEAD_DIM + 4);
    }
    if (o->q_fmt != MLAF_GEMM_NONE) { /* q written as e4m3 bytes and scales instead of the dense q */
        double qbytes;
        if (bench_setup_row_quant(o, o->Q, &qbytes, err, cap)) return -1;
        o->bytes += qbytes - (double)T * o->Q * es;
    }
    return 0;
}

static int fused_mla_kv_cache(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    mlaf_status st = MLAF_OK;
    const int hasq = o->Q > 0, hasr = o->RP > 0 && o->cfg.rope_style != MLAF_ROPE_NONE; /* positions read */
    mlaf_mla_kv_cache_params p = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                  o->cfg.rms_norm_eps, o->cfg.rms_norm_eps, o->cfg.rope_style, o->tail};
    if (o->q_fmt != MLAF_GEMM_NONE) {
        const mlaf_row_quant rq = {v.rq, {MLAF_GEMM_NONE}};
        st = mlaf_mla_kv_cache_dsa_quant(o->ctx, &p, &v.latent, &v.w_q, &v.w_kv, hasr ? &v.pos : NULL,
                                         hasr ? &v.cos_sin : NULL, &v.slots, &v.cd, NULL, NULL, NULL, NULL, &o->ip,
                                         o->indexer ? &v.ix : NULL, &rq);
    } else if (o->indexer)
        st = mlaf_mla_kv_cache_dsa(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv, &v.pos, &v.cos_sin,
                                   &v.slots, &v.cd, hasq ? &v.q : NULL, NULL, NULL, NULL, &o->ip, &v.ix);
    else if (o->kv_fmt == MLAF_KV_PLAIN)
        st = mlaf_mla_kv_cache(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv,
                               hasr ? &v.pos : NULL, hasr ? &v.cos_sin : NULL, &v.slots, &v.cache,
                               hasq ? &v.q : NULL, NULL, NULL, NULL);
    else
        st = mlaf_mla_kv_cache_fmt(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv,
                                   hasr ? &v.pos : NULL, hasr ? &v.cos_sin : NULL, &v.slots, &v.cd,
                                   hasq ? &v.q : NULL, NULL, NULL, NULL);
    return api_err(o, st, mlaf_op_name(o->op), err, cap);
}

static int unfused_mla_kv_cache(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    const int hasq = o->Q > 0, hasr = o->R > 0, haspos = o->RP > 0;
    const int rot = hasr && o->cfg.rope_style != MLAF_ROPE_NONE; /* style none: no RoPE step */
    const int cpu = o->be == MLAF_BACKEND_CPU;
    void *stream = bench_stream(o);
    (void)stream;
    int r = 0;
    /* The library's split + norms into dense tensors, then RoPE, then the cache write (plain)
     * or the separate quantize-and-write pass (fp8 formats). */
    mlaf_split_qk_norm_params sp = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                    o->cfg.rms_norm_eps, o->cfg.rms_norm_eps};
    if (api_err(o, mlaf_split_qk_norm(o->ctx, &sp, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv,
                                      hasq ? &v.q : NULL, &v.kn_s, hasr ? &v.kp_s : NULL),
                "unfused mla_kv_cache (split_qk_norm step)", err, cap))
        return -1;
    mlaf_mla_kv_cache_params p = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                  o->cfg.rms_norm_eps, o->cfg.rms_norm_eps, o->cfg.rope_style, o->tail};
    mlaf_kv_cache_job j;
    if (api_err(o, mlaf_check_mla_kv_cache(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv,
                                           haspos ? &v.pos : NULL, haspos ? &v.cos_sin : NULL,
                                           &v.slots, &v.cd, hasq ? &v.q : NULL, NULL, NULL,
                                           NULL, &j),
                "unfused mla_kv_cache", err, cap))
        return -1;
    if (j.norm.T == 0) return 0;
    /* kv_rope_tail: RoPE on the dense k_nope's last columns, in place */
    void *tail_x = (char *)v.kn_s.data + (size_t)(o->C - o->tail) * mlaf_dtype_size(o->dt);
    mlaf_index_job ix;
    if (o->indexer && api_err(o, mlaf_check_indexer_k(o->ctx, &o->ip, &v.ix, &p, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv, &v.pos, &v.cos_sin,
                                                      &v.slots, &v.cd, hasq ? &v.q : NULL, NULL, NULL, NULL, &j,
                                                      &ix),
                              "unfused indexer key", err, cap))
        return -1;
    if (cpu) {
        if (o->indexer) r = blc_index_k(&j, &ix, v.ikd_s.data, o->threads, mlaf_cpu_norm_kern(o->ctx));
        if (rot && !r) r = blc_rope_rows(v.kp_s.data, o->dt, o->T, o->R, &j.rope, o->threads);
        if (!r && o->tail > 0) r = blc_rope_rows(tail_x, o->dt, o->T, o->C, &j.rope, o->threads);
        if (!r) r = o->kv_fmt == MLAF_KV_PLAIN ? blc_cache_write(&j, v.kn_s.data, v.kp_s.data, o->threads)
                                               : blc_cache_write_fp8(&j, v.kn_s.data, v.kp_s.data, o->threads,
                                                                     mlaf_cpu_norm_kern(o->ctx));
    }
#ifdef MLAF_WITH_CUDA
    else {
        if (o->indexer) r = blg_index_k(&j, &ix, v.ikd_s.data, stream);
        if (rot && !r) r = blg_rope_rows(v.kp_s.data, o->dt, o->T, o->R, &j.rope, stream);
        if (!r && o->tail > 0) r = blg_rope_rows(tail_x, o->dt, o->T, o->C, &j.rope, stream);
        if (!r) r = o->kv_fmt == MLAF_KV_PLAIN ? blg_cache_write(&j, v.kn_s.data, v.kp_s.data, stream)
                                               : blg_cache_write_fp8(&j, v.kn_s.data, v.kp_s.data, stream);
    }
#endif
    if (!r && o->q_fmt != MLAF_GEMM_NONE) return bench_row_quant_pass(o, &v, set, err, cap);
    return baseline_err(r, "mla_kv_cache", err, cap);
}

static int has_unfused_mla_kv_cache(const bench_op *o) { return bl_cache_fmt_has_pass(o->kv_fmt); }

static int outputs_mla_kv_cache(const bench_op *o, int *ids) {
    int n = 0;
    if (o->q_fmt != MLAF_GEMM_NONE) ids[n++] = B_QD, ids[n++] = B_QS;
    else if (o->Q > 0) ids[n++] = B_Q;
    ids[n++] = B_CACHE;
    if (o->indexer) ids[n++] = B_ICACHE;
    return n;
}

/* the op's entry in the registry (bench_cmd.c walks it) */
const bench_op_def bench_mla_kv_cache_def = {
    .op = MLAF_OP_MLA_KV_CACHE,
    .has_unfused = has_unfused_mla_kv_cache,
    .skip = NULL,
    .setup = setup_mla_kv_cache,
    .fused = fused_mla_kv_cache,
    .unfused = unfused_mla_kv_cache,
    .outputs = outputs_mla_kv_cache,
    .compare = NULL,
};
