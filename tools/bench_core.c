/*
 * bench_core.c — the parts of `mlafuse bench` every op shares: buffers on the backend, the common
 * setup, the views of a set, errors, and the check of the unfused chain against the fused op.
 */
#include "bench_op.h"

/* --cache-order names; --cache and --tile-scale: the formats the bench runs and their names */
const char *const cache_order_names[CO_COUNT] = {"shuffled", "ordered", "page-local", "page-groups"};
const char *const tile_scale_names[3] = {"amax", "ue8m0", "ue8m0_floor_scaled"};

void *P(bench_op *o, int id, int set) {
    bbuf *b = &o->b[id];
    if (!b->dev) return NULL;
    return b->dev + (b->per_set ? (size_t)set * b->stride : 0);
}

/* Allocates on the backend and fills every set from init (zeros when NULL). Takes init. */
int buf_alloc(bench_op *o, int id, size_t bytes, int per_set, void *init, char *err,
                     size_t cap) {
    bbuf *b = &o->b[id];
    b->bytes = bytes;
    b->stride = (bytes + 255) / 256 * 256;
    if (b->stride == 0) b->stride = 256;
    b->per_set = per_set;
    b->init = init;
    int n = per_set ? o->nsets : 1;
    void *dev = NULL;
    mlaf_status st = mlaf_mem_alloc(o->be, &dev, b->stride * (size_t)n);
    if (st != MLAF_OK) {
        snprintf(err, cap, "cannot allocate %.1f MB of %s memory (%s)",
                 (double)b->stride * n / 1e6, mlaf_backend_name(o->be), mlaf_status_name(st));
        return -1;
    }
    b->dev = (unsigned char *)dev;
    void *src = init;
    if (!src && bytes) {
        src = calloc(1, bytes);
        if (!src) {
            snprintf(err, cap, "out of host memory");
            return -1;
        }
    }
    for (int s = 0; s < n && bytes; s++) {
        st = mlaf_mem_upload(o->be, b->dev + (size_t)s * b->stride, src, bytes);
        if (st != MLAF_OK) {
            if (src != init) free(src);
            snprintf(err, cap, "upload failed (%s)", mlaf_status_name(st));
            return -1;
        }
    }
    if (src != init) free(src);
    return 0;
}

void op_free(bench_op *o) {
    for (int i = 0; i < B_COUNT; i++) {
        mlaf_mem_free(o->be, o->b[i].dev);
        free(o->b[i].init);
        o->b[i].dev = NULL;
        o->b[i].init = NULL;
    }
}

/* Cheap reproducible values (N(0,1) would cost seconds at 10^8 elements): uniform in
 * [lo, hi) rounded to the dtype. */
void *host_random(mlaf_rng *r, mlaf_dtype dt, size_t n, double lo, double hi) {
    void *p = malloc(n * mlaf_dtype_size(dt) + 1);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(mlaf_rng_u64(r) >> 11) * 0x1.0p-53;
        mlaf_store_f32(p, dt, (int64_t)i, (float)(lo + (hi - lo) * u));
    }
    return p;
}

int setup(bench_op *o, size_t llc, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T;
    o->Q = o->cfg.q_lora_rank;
    o->C = o->cfg.kv_lora_rank;
    o->R = o->cfg.qk_rope_head_dim;
    o->H = o->cfg.num_heads;
    o->RP = o->R > 0 ? o->R : o->tail;
    o->D = o->cfg.qk_nope_head_dim + o->RP;
    o->E = o->cfg.n_routed_experts;
    o->moe = mlaf_moe_gate_params_from_config(&o->cfg);
    o->K = o->moe.top_k + o->moe.n_shared_experts;
    if (o->hash) /* hash routing has no group limit (and no bias) */
        o->moe.n_group = o->moe.topk_group = 1;
    o->G = o->moe.n_group;
    o->has_bias = o->cfg.has_score_bias && !o->hash;
    o->max_pos = T < 1 ? 1 : (T > 65536 ? 65536 : T);
    o->block_size = 64;
    o->num_blocks = (T + o->block_size - 1) / o->block_size;
    if (o->num_blocks < 1) o->num_blocks = 1;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 0x6d6c6166ull + (uint64_t)T);
    { /* the latent's dtype where the format stores values, else bytes: e4m3 where it takes them */
        const unsigned dts = mlaf_kv_formats[o->kv_fmt].cache_dtypes;
        o->cache_dt = dts & (1u << dt) ? dt : dts & (1u << MLAF_FP8_E4M3) && (mlaf_kv_formats[o->kv_fmt].flags & MLAF_KVF_SCALE) ? MLAF_FP8_E4M3 : MLAF_U8;
    }
    o->rec_bytes = (o->C + o->R) * (int64_t)es;
    return o->def->setup(o, llc, &rng, err, cap);
}

void bench_rotation(bench_op *o, size_t llc, double set_bytes) {
    o->nsets = 1;
    if (o->be == MLAF_BACKEND_CPU && set_bytes > 0) {
        double n = ceil(2.0 * (double)llc / set_bytes);
        o->nsets = n < 1 ? 1 : (n > 8 ? 8 : (int)n);
    }
}

int bench_setup_latent(bench_op *o, mlaf_rng *rng, char *err, size_t cap) {
    const mlaf_dtype dt = o->dt;
    const size_t es = mlaf_dtype_size(dt);
    const int64_t T = o->T, W = o->Q + o->C + o->R;
    void *lat = host_random(rng, dt, (size_t)(T * W), -2.0, 2.0);
    NEED(lat);
    if (buf_alloc(o, B_LATENT, (size_t)(T * W) * es, 1, lat, err, cap)) return -1;
    if (o->Q > 0) {
        void *wq = host_random(rng, dt, (size_t)o->Q, 0.5, 1.5);
        NEED(wq);
        if (buf_alloc(o, B_WQ, (size_t)o->Q * es, 0, wq, err, cap)) return -1;
        if (buf_alloc(o, B_Q, (size_t)(T * o->Q) * es, 1, NULL, err, cap)) return -1;
    }
    void *wkv = host_random(rng, dt, (size_t)o->C, 0.5, 1.5);
    NEED(wkv);
    if (buf_alloc(o, B_WKV, (size_t)o->C * es, 0, wkv, err, cap)) return -1;
    return 0;
}

int bench_setup_row_quant(bench_op *o, int64_t K, double *bytes, char *err, size_t cap) {
    mlaf_dtype sdt;
    int64_t sh[2];
    if (K <= 0 || mlaf_gemm_scales_shape(o->q_fmt, o->T, K, &sdt, sh, &o->q_ld) != MLAF_OK) {
        snprintf(err, cap, "q_lora_rank %lld is not a multiple of %s's group %d", (long long)K,
                 mlaf_gemm_format_name(o->q_fmt), (int)mlaf_gemm_format_group(o->q_fmt));
        return -1;
    }
    o->hidden = K; /* the views' K */
    const size_t sbytes = (size_t)(sh[0] * o->q_ld) * mlaf_dtype_size(sdt);
    if (buf_alloc(o, B_QD, (size_t)(o->T * K), 1, NULL, err, cap)) return -1;
    if (buf_alloc(o, B_QS, sbytes, 1, NULL, err, cap)) return -1;
    *bytes = (double)o->T * K + (double)sh[0] * (double)sh[1] * (double)mlaf_dtype_size(sdt);
    return 0;
}

int bench_row_quant_pass(bench_op *o, const views *v, int set, char *err, size_t cap) {
    (void)set;
    mlaf_norm_job j;
    memset(&j, 0, sizeof j);
    j.T = o->T, j.Q = (int32_t)o->hidden, j.C = 1;
    if (api_err(o, mlaf_check_row_quant(o->ctx, &(const mlaf_row_quant){v->rq, {MLAF_GEMM_NONE}}, 0, NULL, NULL, 0, &j),
                "unfused quantize pass", err, cap))
        return -1;
    int r = 0;
    if (o->be == MLAF_BACKEND_CPU)
        r = blc_gemm_quant(&j.qq, v->q.data, o->dt, o->T, o->hidden, v->q.stride[0], o->threads, mlaf_cpu_norm_kern(o->ctx));
#ifdef MLAF_WITH_CUDA
    else
        r = blg_gemm_quant(&j.qq, v->q.data, o->dt, o->T, o->hidden, v->q.stride[0], bench_stream(o));
#endif
    return baseline_err(r, "quantize pass", err, cap);
}

int bench_setup_rope(bench_op *o, char *err, size_t cap) {
    const int64_t T = o->T;
    if (o->RP <= 0) return 0;
    int64_t *pos = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
    float *cs = (float *)malloc(sizeof(float) * (size_t)(o->max_pos * o->RP));
    NEED(pos);
    NEED(cs);
    for (int64_t t = 0; t < T; t++) pos[t] = t % o->max_pos;
    if (mlaf_rope_table_init(cs, o->max_pos, (int32_t)o->RP, 10000.0) != MLAF_OK) {
        snprintf(err, cap, "rope table init failed");
        return -1;
    }
    if (buf_alloc(o, B_POS, sizeof(int64_t) * (size_t)T, 1, pos, err, cap)) return -1;
    if (buf_alloc(o, B_COSSIN, sizeof(float) * (size_t)(o->max_pos * o->RP), 0, cs, err, cap))
        return -1;
    return 0;
}

void make_views(bench_op *o, int set, views *v) {
    const mlaf_dtype dt = o->dt;
    const int64_t T = o->T, W = o->Q + o->C + o->R;
    memset(v, 0, sizeof *v);
    v->latent = mlaf_tensor_2d(P(o, B_LATENT, set), dt, T, W, W);
    v->w_q = mlaf_tensor_1d(P(o, B_WQ, set), dt, o->Q);
    v->w_kv = mlaf_tensor_1d(P(o, B_WKV, set), dt, o->C);
    v->q = mlaf_tensor_2d(P(o, B_Q, set), dt, T, o->Q, o->Q);
    v->k_nope = mlaf_tensor_2d(P(o, B_KNOPE, set), dt, T, o->C, o->C);
    v->k_pe = mlaf_tensor_2d(P(o, B_KPE, set), dt, T, o->R, o->R);
    v->pos = mlaf_tensor_1d(P(o, B_POS, set), MLAF_I64, T);
    v->cos_sin = mlaf_tensor_2d(P(o, B_COSSIN, set), MLAF_F32, o->max_pos, o->RP, o->RP);
    v->slots = mlaf_tensor_1d(P(o, B_SLOTS, set), MLAF_I64, T);
    const int64_t rec = o->rec_bytes / (int64_t)mlaf_dtype_size(o->cache_dt); /* record, in elements */
    v->cache = mlaf_tensor_3d(P(o, B_CACHE, set), o->cache_dt, o->num_blocks, o->block_size, rec,
                              o->block_size * rec, rec);
    v->scale = mlaf_tensor_1d(P(o, B_SCALE, set), MLAF_F32, 1);
    v->cd = mlaf_kv_desc_plain(&v->cache);
    v->cd.format = o->kv_fmt;
    v->cd.scale = mlaf_kv_formats[o->kv_fmt].flags & MLAF_KVF_SCALE ? &v->scale : NULL;
    v->cd.conv = MLAF_FP8_DIV;
    v->cd.tile_scale = mlaf_kv_formats[o->kv_fmt].flags & MLAF_KVF_TILE_SCALE ? o->tile_scale : MLAF_TILE_AMAX;
    v->qh = mlaf_tensor_3d(P(o, B_QH, set), dt, T, o->H, o->D, o->H * o->D, o->D);
    v->logits = mlaf_tensor_2d(P(o, B_LOGITS, set), dt, T, o->E, o->E);
    v->bias = mlaf_tensor_1d(P(o, B_BIAS, set), MLAF_F32, o->E);
    v->weights = mlaf_tensor_2d(P(o, B_WEIGHTS, set), MLAF_F32, T, o->K, o->K);
    v->ids = mlaf_tensor_2d(P(o, B_IDS, set), MLAF_I32, T, o->K, o->K);
    v->tid2eid = mlaf_tensor_2d(P(o, B_TID2EID, set), MLAF_I32, HASH_VOCAB, o->moe.top_k, o->moe.top_k);
    v->tok = mlaf_tensor_1d(P(o, B_TOKIDS, set), MLAF_I64, T);
    v->kn_s = mlaf_tensor_2d(P(o, S_KN, set), dt, T, o->C, o->C);
    v->kp_s = mlaf_tensor_2d(P(o, S_KP, set), dt, T, o->R, o->R);
    v->ik = mlaf_tensor_2d(P(o, B_IK, set), dt, T, MLAF_INDEX_HEAD_DIM, MLAF_INDEX_HEAD_DIM);
    v->iw = mlaf_tensor_1d(P(o, B_IW, set), dt, MLAF_INDEX_HEAD_DIM);
    v->ib = mlaf_tensor_1d(P(o, B_IB, set), dt, MLAF_INDEX_HEAD_DIM);
    const int64_t ib = o->block_size * (MLAF_INDEX_HEAD_DIM + 4);
    v->icache = mlaf_tensor_2d(P(o, B_ICACHE, set), MLAF_U8, o->num_blocks, ib, ib);
    v->ikd_s = mlaf_tensor_2d(P(o, S_IKD, set), dt, T, MLAF_INDEX_HEAD_DIM, MLAF_INDEX_HEAD_DIM);
    v->ix.index_k = &v->ik, v->ix.weight = &v->iw, v->ix.bias = &v->ib, v->ix.cache = &v->icache;
    v->iq = mlaf_tensor_3d(P(o, B_IQ, set), dt, T, o->H, MLAF_INDEX_HEAD_DIM, o->H * MLAF_INDEX_HEAD_DIM,
                           MLAF_INDEX_HEAD_DIM);
    v->iqw = mlaf_tensor_2d(P(o, B_IQW, set), dt, T, o->H, o->H);
    v->iqf = mlaf_tensor_3d(P(o, B_IQF, set), MLAF_FP8_E4M3, T, o->H, MLAF_INDEX_HEAD_DIM, o->H * MLAF_INDEX_HEAD_DIM,
                            MLAF_INDEX_HEAD_DIM);
    v->iqwo = mlaf_tensor_2d(P(o, B_IQWO, set), MLAF_F32, T, o->H, o->H);
    const int64_t K = o->hidden;
    v->rx = mlaf_tensor_2d(P(o, B_RX, set), dt, T, K, K);
    v->rres = mlaf_tensor_2d(P(o, B_RRES, set), dt, T, K, K);
    v->rw = mlaf_tensor_1d(P(o, B_RW, set), dt, K);
    v->ry = mlaf_tensor_2d(P(o, B_RY, set), dt, T, K, K);
    memset(&v->rq, 0, sizeof v->rq);
    if (o->q_fmt != MLAF_GEMM_NONE) {
        mlaf_dtype sdt;
        int64_t sh[2], ld;
        mlaf_gemm_scales_shape(o->q_fmt, T, K, &sdt, sh, &ld);
        v->qd = mlaf_tensor_2d(P(o, B_QD, set), MLAF_FP8_E4M3, T, K, K);
        v->qs = mlaf_tensor_2d(P(o, B_QS, set), sdt, sh[0], sh[1], o->q_ld);
        v->rq = (mlaf_gemm_out){o->q_fmt, o->q_scale, &v->qd, &v->qs, 0.0f};
    }
}

int api_err(bench_op *o, mlaf_status st, const char *what, char *err, size_t cap) {
    if (st == MLAF_OK) return 0;
    const char *why = mlaf_context_last_error(o->ctx);
    snprintf(err, cap, "%s: %s: %s", what, mlaf_status_name(st),
             why && why[0] ? why : mlaf_status_message(st));
    return -1;
}

int baseline_err(int r, const char *what, char *err, size_t cap) {
    if (r == 0) return 0;
#ifdef MLAF_WITH_CUDA
    snprintf(err, cap, "unfused %s: %s", what, blg_error_string(r));
#else
    snprintf(err, cap, "unfused %s failed (%d)", what, r);
#endif
    return -1;
}

void *bench_stream(const bench_op *o) {
#ifdef MLAF_WITH_CUDA
    if (o->be != MLAF_BACKEND_CPU) return bcu_stream();
#endif
    (void)o;
    return NULL;
}

/* ---- the check of the baseline against the fused op ----------------------------------------- */
static int sync_backend(bench_op *o, char *err, size_t cap) {
    mlaf_status st = mlaf_context_sync(o->ctx);
    if (st != MLAF_OK) return api_err(o, st, "synchronize", err, cap);
#ifdef MLAF_WITH_CUDA
    if (o->be == MLAF_BACKEND_CUDA) return bcu_sync(err, cap);
#endif
    return 0;
}

static void *download(bench_op *o, int id) {
    bbuf *b = &o->b[id];
    void *h = malloc(b->bytes + 1);
    if (!h) return NULL;
    if (b->bytes && mlaf_mem_download(o->be, h, b->dev, b->bytes) != MLAF_OK) {
        free(h);
        return NULL;
    }
    return h;
}

/* Fills the outputs of set 0 with one byte pattern, so that the check sees only what a call wrote
 * (the fused and the unfused call then start from the same bytes: rows neither names stay
 * equal). Mutable inputs are reset by reset_inputs instead. */
static int poison_outputs(bench_op *o, const int *ids, int n) {
    for (int i = 0; i < n; i++) {
        bbuf *b = &o->b[ids[i]];
        if (!b->dev || !b->bytes || b->mutable_input) continue;
        void *h = malloc(b->bytes);
        if (!h) return -1;
        memset(h, 0xA5, b->bytes);
        const mlaf_status st = mlaf_mem_upload(o->be, b->dev, h, b->bytes);
        free(h);
        if (st != MLAF_OK) return -1;
    }
    return 0;
}

static int reset_inputs(bench_op *o) {
    for (int i = 0; i < B_COUNT; i++)
        if (o->b[i].mutable_input && o->b[i].dev && o->b[i].bytes &&
            mlaf_mem_upload(o->be, o->b[i].dev, o->b[i].init, o->b[i].bytes) != MLAF_OK)
            return -1;
    return 0;
}

/* Runs both once and compares; writes "ok" or what differs into check. */
int check_baseline(bench_op *o, char *check, size_t ccap, char *err, size_t cap) {
    int outs[4], n = o->def->outputs(o, outs);
    void *a[4] = {0}, *b[4] = {0};
    int rc = -1;
    snprintf(check, ccap, "ok");
    if (poison_outputs(o, outs, n)) {
        snprintf(err, cap, "cannot fill the outputs before the check");
        goto done;
    }
    if (reset_inputs(o) || o->def->fused(o, 0, err, cap) || sync_backend(o, err, cap)) goto done;
    for (int i = 0; i < n; i++)
        if (!(a[i] = download(o, outs[i]))) {
            snprintf(err, cap, "download of the fused outputs failed");
            goto done;
        }
    if (poison_outputs(o, outs, n)) {
        snprintf(err, cap, "cannot fill the outputs before the check");
        goto done;
    }
    if (reset_inputs(o) || o->def->unfused(o, 0, err, cap) || sync_backend(o, err, cap)) {
        snprintf(check, ccap, "baseline failed");
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (!(b[i] = download(o, outs[i]))) {
            snprintf(err, cap, "download of the unfused outputs failed");
            goto done;
        }
    rc = 0;
    if (o->def->compare) {
        o->def->compare(o, a, b, check, ccap);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const bbuf *bb = &o->b[outs[i]];
        if (outs[i] == B_QD || outs[i] == B_QS) {
            /* rms_norm_quant's quantized output: the chain's quantize pass must write the fused op's bytes */
            const unsigned char *ca = (const unsigned char *)a[i], *cb = (const unsigned char *)b[i];
            int64_t nbad = 0, first = -1;
            for (size_t k = 0; k < bb->bytes; k++)
                if (ca[k] != cb[k]) {
                    if (first < 0) first = (int64_t)k;
                    nbad++;
                }
            if (nbad) {
                snprintf(check, ccap, "MISMATCH in q.%s (%s): %lld bytes differ, first at byte %lld",
                         outs[i] == B_QD ? "data" : "scales", mlaf_gemm_format_name(o->q_fmt), (long long)nbad,
                         (long long)first);
                break;
            }
            continue;
        }
        if (outs[i] == B_CACHE && o->kv_fmt != MLAF_KV_PLAIN) {
            /* an fp8 record is bytes (e4m3 values, f32 scales, bf16 rope values): the chain
             * must write exactly the fused op's bytes (the rounded-first rule of docs/kv_formats.md) */
            const unsigned char *ca = (const unsigned char *)a[i], *cb = (const unsigned char *)b[i];
            int64_t nbad = 0, first = -1;
            for (size_t k = 0; k < bb->bytes; k++)
                if (ca[k] != cb[k]) {
                    if (first < 0) first = (int64_t)k;
                    nbad++;
                }
            if (nbad) {
                const int64_t slot = first / o->rec_bytes, at = first % o->rec_bytes;
                snprintf(check, ccap, "MISMATCH in kv_cache (%s): %lld bytes differ, first at slot %lld byte %lld",
                         mlaf_kv_format_name(o->kv_fmt), (long long)nbad, (long long)slot, (long long)at);
                break;
            }
            continue;
        }
        size_t count = bb->bytes / mlaf_dtype_size(o->dt);
        double worst = 0.0;
        int64_t nbad = 0;
        for (size_t k = 0; k < count; k++) {
            double ref = mlaf_load_f32(a[i], o->dt, (int64_t)k);
            double got = mlaf_load_f32(b[i], o->dt, (int64_t)k);
            double u = outs[i] == B_KPE ? (memcmp((char *)a[i] + k * mlaf_dtype_size(o->dt),
                                                 (char *)b[i] + k * mlaf_dtype_size(o->dt),
                                                 mlaf_dtype_size(o->dt)) ? INFINITY : 0.0)
                                        : mlaf_err_units(got, ref, o->dt, fabs(ref));
            /* head_norm: the chain rounds the normalized head before rotating (two roundings,
             * the fused op one), so rotated values that cancel differ by an ulp of the head's
             * O(1) values: units at magnitude 1 */
            if (outs[i] == B_QH && o->tail > 0 && fabs(ref) < 1.0)
                u = fabs(got - ref) / (o->dt == MLAF_BF16 ? 0x1p-7 : o->dt == MLAF_F16 ? 0x1p-10 : 1e-5);
            if (u > worst) worst = u;
            if (u > 2.0) nbad++;
        }
        if (nbad) {
            static const char *names[B_COUNT] = {[B_Q] = "q", [B_KNOPE] = "k_nope", [B_KPE] = "k_pe",
                                                 [B_CACHE] = "kv_cache", [B_QH] = "q", [B_RRES] = "residual",
                                                 [B_RY] = "y"};
            snprintf(check, ccap, "MISMATCH in %s: %lld values beyond 2 units (worst %.3g)",
                     names[outs[i]] ? names[outs[i]] : "output", (long long)nbad, worst);
            break;
        }
    }
done:
    for (int i = 0; i < 4; i++) {
        free(a[i]);
        free(b[i]);
    }
    return rc;
}
