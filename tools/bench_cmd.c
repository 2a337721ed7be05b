/*
 * bench_cmd.c — `mlafuse bench`: fused op vs device copy bandwidth vs the unfused chain, all
 * measured in the same run.
 *
 * 1. Measure the copy reference once (CPU: memcpy by all threads on a buffer several times
 *    the last-level cache; CUDA: cudaMemcpyAsync device to device of 1 GB), read + write bytes.
 * 2. Per op and T: allocate inputs / outputs on the backend (CPU: several copies rotated so
 *    that consecutive calls do not hit in the LLC while one set is smaller than it), run the
 *    fused op once and the unfused chain once and compare their outputs (a warning on
 *    mismatch), then time both: CPU with clock_gettime over rotating sets; CUDA with events,
 *    L2 flushed before every sample, or (--graph, automatic for T <= 64) as replays of a
 *    CUDA graph of 100 calls, per-call time.
 * 3. Report median and p10 / p90, the op's minimal bytes (inputs read once + outputs written
 *    once), GB/s, % of the copy bandwidth, unfused time and speed-up; a table or --json.
 *    CUDA rows add a copy of the op's own bytes timed the same way (flush, events or graph):
 *    at mid T the 1 GB copy's bandwidth is out of reach even for the copy itself.
 * --hash: moe_gate rows run the hash-routed router (mlaf_moe_gate_hash: ids from a tid2eid table
 * of HASH_VOCAB token ids by random token ids) against the unfused chain score -> table lookup ->
 * gather -> normalize -> scale; its bytes are the token id, the k table entries and the k logits
 * it reads (the whole row for softmax) plus the outputs.
 * DeepSeek-V4 (--preset deepseek-v4-flash, kv_rope_tail 64): mla_kv_cache rotates the kv tail
 * (the unfused chain: the norms, RoPE on the dense k_nope's last 64 columns, the cache write) and
 * --cache fp8_v4 writes the 584-B page; rope_q runs head_norm (the chain: a norm pass, then the
 * gather / rotate / scatter).
 * --cache fp8 | fp8_ds_mla | fp8_v4: mla_kv_cache writes that cache format (fp8's scale lives in backend
 * memory, so graph replays read it like engines' k_scale); the unfused chain ends with a
 * separate quantize-and-write pass, and the check compares the two caches byte for byte.
 */
#define _POSIX_C_SOURCE 200809L /* strcasecmp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench.h"
#include "cli.h"
#include "cpu/norm_writers.h"
#include "half.h"
#include "ref/verify.h"

static void help(void) {
    printf(
        "usage: mlafuse bench [options]\n"
        "\n"
        "Times the fused ops against the copy bandwidth and the unfused chains engines run today,\n"
        "all measured in the same run.\n"
        "\n"
        "  --backend cpu|cuda   default: cuda when a GPU is visible, else cpu\n"
        "  --op NAME|all        split_qk_norm, mla_kv_cache, rope_q, moe_gate (default all of these),\n"
        "                       indexer_q (models with a DSA indexer; timed against the same-run\n"
        "                       copy only: no unfused chain)\n"
        "  --preset NAME        model preset (default glm-4.7-flash; 'all' for every preset)\n"
        "  --config FILE        the model of a Hugging Face config.json instead of a preset\n"
        "  --sweep              the row layouts of the family instead: q_lora_rank 0, 512, 768, 1024,\n"
        "                       1536, 2048, 3072 x kv_lora_rank 512 x rope 0, 64, from the model given\n"
        "  --dtype f32|f16|bf16 activation dtype (default bf16)\n"
        "  --tokens LIST        token counts (default cuda 1,8,64,512,4096,32768,131072;\n"
        "                       cpu 1,64,4096,65536)\n"
        "  --threads N          CPU threads for the op, the baselines and the copy (default all)\n"
        "  --reps N             timed samples per measurement (default cpu 10, cuda 100)\n"
        "  --graph              CUDA: time replays of a CUDA graph of 100 calls for every T\n"
        "                       (always done for T <= 64); per-call time\n"
        "  --pdl                CUDA: the ops launch as programmatic dependents\n"
        "                       (mlaf_context_set_cuda_pdl; sm_90+); a graph's calls then overlap\n"
        "  --json               print one JSON object with an array of rows instead of a table\n"
        "  --cache-order ORDER  mla_kv_cache's paged-cache blocks: shuffled (default: a random\n"
        "                       permutation of every block, as a long-running allocator hands\n"
        "                       them out), ordered (block i for tokens 64 i .. 64 i + 63),\n"
        "                       page-local (shuffled within each 2 MB of cache), page-groups\n"
        "                       (2 MB runs of blocks in order, the runs shuffled)\n"
        "  --cache FORMAT       mla_kv_cache's cache format: plain (default: the latent dtype),\n"
        "                       fp8 (per-tensor e4m3, e4m3(x / scale), one f32 scale in backend\n"
        "                       memory), fp8_ds_mla (FlashMLA's record: C e4m3 bytes, C/128 f32 tile\n"
        "                       scales, R bf16 rope values; --dtype bf16), fp8_v4 (DeepSeek-V4's\n"
        "                       584-B page; --preset deepseek-v4-flash --dtype bf16). The unfused chain ends\n"
        "                       with a separate quantize-and-write pass; its cache bytes are checked\n"
        "                       against the fused op's\n"
        "  --tile-scale MODE    fp8_ds_mla tile scales: amax (default: amax / 448), ue8m0,\n"
        "                       ue8m0_floor_scaled\n"
        "  --kv-scale X         fp8: the scale (default 1, what engines run without calibration)\n"
        "  --hash               moe_gate: the hash-routed router (mlaf_moe_gate_hash, DeepSeek-V4's\n"
        "                       first layers) instead of top-k: ids from a [129280, top_k] table\n"
        "  --indexer            mla_kv_cache with the DSA indexer key branch (SPEC 10; models with\n"
        "                       rope 64; the preset's indexer RoPE style, ue8m0, no Hadamard): the\n"
        "                       unfused chain adds LayerNorm, RoPE, quantize-and-write passes and\n"
        "                       the check compares the index caches byte for byte\n"
        "\n"
        "Bytes are the op's minimum: inputs read once + outputs written once (see docs/cli.md).\n"
        "CUDA rows also time a device-to-device copy of those same bytes the same way (copy_us;\n"
        "%%cpy= is copy_us / fused_us): the copy path's own time at that size. CUDA stream rows\n"
        "also time SM copy kernels moving those bytes (kcopy_us, the faster of two; %%kcpy= is\n"
        "kcopy_us / fused_us): what a kernel with no arithmetic reaches at that size; for rope_q,\n"
        "a copy of q's rope pieces at q's own strides (the op's access pattern).\n");
}

/* --hash: token ids of the tid2eid table (a DeepSeek-size vocabulary) */
#define HASH_VOCAB 129280

/* ---- buffers ----------------------------------------------------------------------------- */
enum {
    B_LATENT, B_WQ, B_WKV, B_Q, B_KNOPE, B_KPE, B_POS, B_COSSIN, B_SLOTS, B_CACHE, B_QH,
    B_LOGITS, B_BIAS, B_WEIGHTS, B_IDS, B_SCALE, B_TID2EID, B_TOKIDS,
    S_QD, S_KVD, S_KN, S_KP, S_GATHER, S_S, S_C, S_G, S_M, S_W,
    B_IK, B_IW, B_IB, B_ICACHE, S_IKD, /* --indexer: the DSA indexer key branch of mla_kv_cache */
    B_IQ, B_IQW, B_IQF, B_IQWO,        /* indexer_q: q_idx, head weights, q_fp8, w_out */
    B_COUNT
};

typedef struct bbuf {
    size_t bytes, stride; /* per set; stride rounded up to 256 bytes */
    int per_set;          /* replicated nsets times (inputs / outputs) or single (scratch) */
    int mutable_input;    /* modified in place by the op (rope_q's q) */
    unsigned char *dev;
    void *init;           /* host contents of one set, kept to reset mutable inputs */
} bbuf;

typedef struct bench_op {
    mlaf_op op;
    mlaf_backend be;
    mlaf_context *ctx;
    mlaf_model_config cfg;
    mlaf_dtype dt;
    int64_t T;
    int threads, nsets;
    int64_t Q, C, R, H, D, max_pos, block_size, num_blocks, E, K, G;
    int32_t tail;               /* kv_rope_tail (DeepSeek-V4): mla_kv_cache's tail, rope_q head_norm */
    int64_t RP;                 /* the rope width of positions / cos_sin / q heads: R, or the tail */
    mlaf_moe_gate_params moe;
    int has_bias;
    int hash; /* moe_gate: mlaf_moe_gate_hash (--hash) */
    int cache_order; /* cache_order_names */
    mlaf_kv_format kv_fmt;      /* mla_kv_cache's cache format (--cache) */
    mlaf_tile_scale tile_scale; /* fp8_ds_mla */
    float kv_scale;             /* fp8 */
    mlaf_dtype cache_dt;        /* the latent dtype (plain), fp8_e4m3 (fp8) or u8 (fp8_ds_mla) */
    int64_t rec_bytes;          /* bytes of one token's cache record */
    int indexer;                /* --indexer: mla_kv_cache with the DSA indexer key branch */
    mlaf_indexer_params ip;
    bbuf b[B_COUNT];
    double bytes;
} bench_op;

/* --cache-order: how the paged cache's blocks are handed to the tokens (mla_kv_cache) */
enum { CO_SHUFFLED, CO_ORDERED, CO_PAGE_LOCAL, CO_PAGE_GROUPS, CO_COUNT };
static const char *const cache_order_names[CO_COUNT] = {"shuffled", "ordered", "page-local", "page-groups"};

/* --cache and --tile-scale: the formats the bench runs and their names */
static const mlaf_kv_format bench_formats[4] = {MLAF_KV_PLAIN, MLAF_KV_FP8, MLAF_KV_FP8_DS_MLA, MLAF_KV_FP8_V4};
static const char *const tile_scale_names[3] = {"amax", "ue8m0", "ue8m0_floor_scaled"};

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

static void *P(bench_op *o, int id, int set) {
    bbuf *b = &o->b[id];
    if (!b->dev) return NULL;
    return b->dev + (b->per_set ? (size_t)set * b->stride : 0);
}

/* Allocates on the backend and fills every set from init (zeros when NULL). Takes init. */
static int buf_alloc(bench_op *o, int id, size_t bytes, int per_set, void *init, char *err,
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

static void op_free(bench_op *o) {
    for (int i = 0; i < B_COUNT; i++) {
        mlaf_mem_free(o->be, o->b[i].dev);
        free(o->b[i].init);
        o->b[i].dev = NULL;
        o->b[i].init = NULL;
    }
}

/* Cheap reproducible values (N(0,1) would cost seconds at 10^8 elements): uniform in
 * [lo, hi) rounded to the dtype. */
static void *host_random(mlaf_rng *r, mlaf_dtype dt, size_t n, double lo, double hi) {
    void *p = malloc(n * mlaf_dtype_size(dt) + 1);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(mlaf_rng_u64(r) >> 11) * 0x1.0p-53;
        mlaf_store_f32(p, dt, (int64_t)i, (float)(lo + (hi - lo) * u));
    }
    return p;
}

#define NEED(ptr)                                                   \
    do {                                                            \
        if (!(ptr)) {                                               \
            snprintf(err, cap, "out of host memory at T = %lld", (long long)o->T); \
            return -1;                                              \
        }                                                           \
    } while (0)

static int setup(bench_op *o, size_t llc, char *err, size_t cap) {
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
    const int64_t W = o->Q + o->C + o->R;
    mlaf_rng rng;
    mlaf_rng_seed(&rng, 0x6d6c6166ull + (uint64_t)T);
    o->cache_dt = o->kv_fmt == MLAF_KV_PLAIN ? dt : o->kv_fmt == MLAF_KV_FP8 ? MLAF_FP8_E4M3 : MLAF_U8;
    o->rec_bytes = (o->C + o->R) * (int64_t)es;
    if (o->op == MLAF_OP_MLA_KV_CACHE && o->kv_fmt != MLAF_KV_PLAIN) {
        o->rec_bytes = mlaf_kv_record_bytes(o->kv_fmt, o->cache_dt, (int32_t)o->C, (int32_t)o->R);
        if (o->rec_bytes <= 0) {
            snprintf(err, cap, "cache format %s does not take kv_lora_rank = %lld, rope_dim = %lld%s",
                     mlaf_kv_format_name(o->kv_fmt), (long long)o->C, (long long)o->R,
                     o->kv_fmt == MLAF_KV_FP8_DS_MLA ? " (needs kv_lora_rank % 128 == 0, rope_dim even)"
                     : o->kv_fmt == MLAF_KV_FP8_V4   ? " (needs DeepSeek-V4's 512 with the rope tail: --preset deepseek-v4-flash)"
                                                     : " (needs rope_dim even)");
            return -1;
        }
    }

    /* Bytes of one input/output set, for the rotation count. */
    double set_bytes = 0;
    switch (o->op) {
    case MLAF_OP_SPLIT_QK_NORM: set_bytes = 2.0 * (double)T * W * es; break;
    case MLAF_OP_MLA_KV_CACHE: set_bytes = (double)T * (W + o->Q) * es + (double)T * o->rec_bytes + T * 16.0; break;
    case MLAF_OP_ROPE_Q: set_bytes = (double)T * o->H * o->D * es; break;
    case MLAF_OP_INDEXER_Q: set_bytes = (double)T * o->cfg.index_n_heads * (128.0 * es + 132.0 + es); break;
    default: set_bytes = (double)T * o->E * es + T * o->K * 8.0; break;
    }
    o->nsets = 1;
    if (o->be == MLAF_BACKEND_CPU && set_bytes > 0) {
        double n = ceil(2.0 * (double)llc / set_bytes);
        o->nsets = n < 1 ? 1 : (n > 8 ? 8 : (int)n);
    }

    if (o->op == MLAF_OP_SPLIT_QK_NORM || o->op == MLAF_OP_MLA_KV_CACHE) {
        void *lat = host_random(&rng, dt, (size_t)(T * W), -2.0, 2.0);
        NEED(lat);
        if (buf_alloc(o, B_LATENT, (size_t)(T * W) * es, 1, lat, err, cap)) return -1;
        if (o->Q > 0) {
            void *wq = host_random(&rng, dt, (size_t)o->Q, 0.5, 1.5);
            NEED(wq);
            if (buf_alloc(o, B_WQ, (size_t)o->Q * es, 0, wq, err, cap)) return -1;
            if (buf_alloc(o, B_Q, (size_t)(T * o->Q) * es, 1, NULL, err, cap)) return -1;
        }
        void *wkv = host_random(&rng, dt, (size_t)o->C, 0.5, 1.5);
        NEED(wkv);
        if (buf_alloc(o, B_WKV, (size_t)o->C * es, 0, wkv, err, cap)) return -1;
    }
    if (o->op == MLAF_OP_SPLIT_QK_NORM) {
        if (buf_alloc(o, B_KNOPE, (size_t)(T * o->C) * es, 1, NULL, err, cap)) return -1;
        if (o->R > 0 && buf_alloc(o, B_KPE, (size_t)(T * o->R) * es, 1, NULL, err, cap)) return -1;
        if (o->Q > 0 && buf_alloc(o, S_QD, (size_t)(T * o->Q) * es, 0, NULL, err, cap)) return -1;
        if (buf_alloc(o, S_KVD, (size_t)(T * o->C) * es, 0, NULL, err, cap)) return -1;
        o->bytes = 2.0 * (double)T * W * es + (double)(o->Q + o->C) * es;
    }
    if (o->op == MLAF_OP_INDEXER_Q) { /* the indexer's own 64-wide table */
        o->R = MLAF_INDEX_ROPE_DIM;
        o->H = o->cfg.index_n_heads;
        o->ip = mlaf_indexer_params_from_config(&o->cfg);
        o->RP = o->R;
    }
    if ((o->op == MLAF_OP_MLA_KV_CACHE || o->op == MLAF_OP_ROPE_Q || o->op == MLAF_OP_INDEXER_Q) && o->RP > 0) {
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
    }
    if (o->op == MLAF_OP_MLA_KV_CACHE) {
        /* Whole blocks in the --cache-order order (default shuffled, as a paged allocator
         * hands them out after a while). */
        int64_t *perm = (int64_t *)malloc(sizeof(int64_t) * (size_t)o->num_blocks);
        int64_t *slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
        NEED(perm);
        NEED(slots);
        const int64_t page_blocks = (int64_t)(((size_t)2 << 20) / ((size_t)o->block_size * (size_t)o->rec_bytes));
        const int co = cache_block_order(perm, o->num_blocks, page_blocks > 0 ? page_blocks : 1, o->cache_order, &rng);
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
        o->bytes = (double)T * W * es + (double)(o->Q + o->C) * es + (o->RP > 0 ? T * 8.0 : 0) +
                   T * 8.0 + (double)T * o->RP * 4.0 + (double)T * o->Q * es +
                   (double)T * (double)o->rec_bytes + (o->kv_fmt == MLAF_KV_FP8 ? 4.0 : 0.0);
        if (o->indexer) { /* index_k [T, 128], LayerNorm weight and bias; the 132-byte records */
            if (o->R != MLAF_INDEX_ROPE_DIM) {
                snprintf(err, cap, "--indexer needs qk_rope_head_dim = 64 (model has %lld)", (long long)o->R);
                return -1;
            }
            o->ip = mlaf_indexer_params_from_config(&o->cfg);
            void *ik = host_random(&rng, dt, (size_t)(T * MLAF_INDEX_HEAD_DIM), -2.0, 2.0);
            NEED(ik);
            if (buf_alloc(o, B_IK, (size_t)(T * MLAF_INDEX_HEAD_DIM) * es, 1, ik, err, cap)) return -1;
            void *iw = host_random(&rng, dt, MLAF_INDEX_HEAD_DIM, 0.5, 1.5);
            NEED(iw);
            if (buf_alloc(o, B_IW, MLAF_INDEX_HEAD_DIM * es, 0, iw, err, cap)) return -1;
            void *ib = host_random(&rng, dt, MLAF_INDEX_HEAD_DIM, -0.5, 0.5);
            NEED(ib);
            if (buf_alloc(o, B_IB, MLAF_INDEX_HEAD_DIM * es, 0, ib, err, cap)) return -1;
            if (buf_alloc(o, B_ICACHE, (size_t)(o->num_blocks * o->block_size * (MLAF_INDEX_HEAD_DIM + 4)), 1, NULL,
                          err, cap))
                return -1;
            if (buf_alloc(o, S_IKD, (size_t)(T * MLAF_INDEX_HEAD_DIM) * es, 0, NULL, err, cap)) return -1;
            o->bytes += (double)T * MLAF_INDEX_HEAD_DIM * es + 2.0 * MLAF_INDEX_HEAD_DIM * es +
                        (double)T * (MLAF_INDEX_HEAD_DIM + 4);
        }
    }
    if (o->op == MLAF_OP_ROPE_Q) {
        size_t n = (size_t)(T * o->H * o->D);
        void *q = host_random(&rng, dt, n, -2.0, 2.0);
        NEED(q);
        if (buf_alloc(o, B_QH, n * es, 1, q, err, cap)) return -1;
        o->b[B_QH].mutable_input = 1;
        if (buf_alloc(o, S_GATHER, (size_t)(T * o->H * o->RP) * es, 0, NULL, err, cap)) return -1;
        /* head_norm (V4) reads and writes whole heads; plain RoPE only the rope columns */
        o->bytes = 2.0 * (double)T * o->H * (o->tail > 0 ? o->D : o->RP) * es + T * 8.0 + (double)T * o->RP * 4.0;
    }
    if (o->op == MLAF_OP_INDEXER_Q) {
        const size_t n = (size_t)(T * o->H * MLAF_INDEX_HEAD_DIM);
        void *q = host_random(&rng, dt, n, -2.0, 2.0);
        NEED(q);
        if (buf_alloc(o, B_IQ, n * es, 1, q, err, cap)) return -1;
        void *w = host_random(&rng, dt, (size_t)(T * o->H), -1.0, 1.0);
        NEED(w);
        if (buf_alloc(o, B_IQW, (size_t)(T * o->H) * es, 1, w, err, cap)) return -1;
        if (buf_alloc(o, B_IQF, n, 1, NULL, err, cap)) return -1;
        if (buf_alloc(o, B_IQWO, sizeof(float) * (size_t)(T * o->H), 1, NULL, err, cap)) return -1;
        /* read q_idx, w, positions, a cos_sin row per token; write q_fp8 and w_out */
        o->bytes = (double)n * es + (double)T * o->H * es + T * 8.0 + T * 256.0 + (double)n + (double)T * o->H * 4.0;
    }
    if (o->op == MLAF_OP_MOE_GATE) {
        void *lg = host_random(&rng, dt, (size_t)(T * o->E), -4.0, 4.0);
        NEED(lg);
        if (buf_alloc(o, B_LOGITS, (size_t)(T * o->E) * es, 1, lg, err, cap)) return -1;
        if (o->has_bias) {
            void *bias = host_random(&rng, MLAF_F32, (size_t)o->E, -0.05, 0.05);
            NEED(bias);
            if (buf_alloc(o, B_BIAS, sizeof(float) * (size_t)o->E, 0, bias, err, cap)) return -1;
        }
        if (buf_alloc(o, B_WEIGHTS, sizeof(float) * (size_t)(T * o->K), 1, NULL, err, cap)) return -1;
        if (buf_alloc(o, B_IDS, sizeof(int32_t) * (size_t)(T * o->K), 1, NULL, err, cap)) return -1;
        size_t te = sizeof(float) * (size_t)(T * o->E);
        if (buf_alloc(o, S_S, te, 0, NULL, err, cap) || buf_alloc(o, S_C, te, 0, NULL, err, cap) ||
            buf_alloc(o, S_M, te, 0, NULL, err, cap) ||
            buf_alloc(o, S_G, sizeof(float) * (size_t)(T * o->G), 0, NULL, err, cap) ||
            buf_alloc(o, S_W, sizeof(float) * (size_t)(T * o->moe.top_k), 0, NULL, err, cap))
            return -1;
        o->bytes = (double)T * o->E * es + (o->has_bias ? o->E * 4.0 : 0.0) + (double)T * o->K * 8.0;
        if (o->hash) {
            const int64_t k = o->moe.top_k;
            int32_t *tab = (int32_t *)malloc(sizeof(int32_t) * (size_t)(HASH_VOCAB * k));
            int64_t *tok = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T > 0 ? T : 1));
            int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * (size_t)o->E);
            if (!tab || !tok || !perm) {
                free(tab), free(tok), free(perm);
                snprintf(err, cap, "out of host memory");
                return -1;
            }
            for (int64_t e = 0; e < o->E; e++) perm[e] = (int32_t)e;
            for (int64_t v = 0; v < HASH_VOCAB; v++) /* k distinct experts per token id */
                for (int64_t j = 0; j < k; j++) {
                    const int64_t r = j + (int64_t)(mlaf_rng_u64(&rng) % (uint64_t)(o->E - j));
                    const int32_t x = perm[j];
                    perm[j] = perm[r], perm[r] = x;
                    tab[v * k + j] = perm[j];
                }
            for (int64_t t = 0; t < T; t++) tok[t] = (int64_t)(mlaf_rng_u64(&rng) % HASH_VOCAB);
            free(perm);
            /* buf_alloc keeps init (freed with the op) */
            if (buf_alloc(o, B_TID2EID, sizeof(int32_t) * (size_t)(HASH_VOCAB * k), 0, tab, err, cap) ||
                buf_alloc(o, B_TOKIDS, sizeof(int64_t) * (size_t)T, 1, tok, err, cap))
                return -1;
            o->bytes = (double)T * (8.0 + 4.0 * k + (o->moe.score_func == MLAF_SCORE_SOFTMAX ? o->E : k) * es) +
                       (double)T * o->K * 8.0;
        }
    }
    return 0;
}

/* ---- the calls ----------------------------------------------------------------------------- */
typedef struct views {
    mlaf_tensor latent, w_q, w_kv, q, k_nope, k_pe, pos, cos_sin, slots, cache, qh, logits, bias,
        weights, ids, kn_s, kp_s, scale, tid2eid, tok, ik, iw, ib, icache, ikd_s, iq, iqw, iqf, iqwo;
    mlaf_kv_cache_desc cd; /* the cache in its format (mla_kv_cache) */
    mlaf_indexer_k ix;     /* --indexer */
} views;

static void make_views(bench_op *o, int set, views *v) {
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
    v->cd.scale = o->kv_fmt == MLAF_KV_FP8 ? &v->scale : NULL;
    v->cd.conv = MLAF_FP8_DIV;
    v->cd.tile_scale = o->kv_fmt == MLAF_KV_FP8_DS_MLA ? o->tile_scale : MLAF_TILE_AMAX;
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
}

static int api_err(bench_op *o, mlaf_status st, const char *what, char *err, size_t cap) {
    if (st == MLAF_OK) return 0;
    const char *why = mlaf_context_last_error(o->ctx);
    snprintf(err, cap, "%s: %s: %s", what, mlaf_status_name(st),
             why && why[0] ? why : mlaf_status_message(st));
    return -1;
}

static int call_fused(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    views v;
    make_views(o, set, &v);
    mlaf_status st = MLAF_OK;
    const int hasq = o->Q > 0, hasr = o->RP > 0;
    switch (o->op) {
    case MLAF_OP_SPLIT_QK_NORM: {
        mlaf_split_qk_norm_params p = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                       o->cfg.rms_norm_eps, o->cfg.rms_norm_eps};
        st = mlaf_split_qk_norm(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL, &v.w_kv,
                                hasq ? &v.q : NULL, &v.k_nope, hasr ? &v.k_pe : NULL);
        break;
    }
    case MLAF_OP_MLA_KV_CACHE: {
        mlaf_mla_kv_cache_params p = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                      o->cfg.rms_norm_eps, o->cfg.rms_norm_eps, o->cfg.rope_style, o->tail};
        if (o->indexer)
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
        break;
    }
    case MLAF_OP_ROPE_Q: {
        mlaf_rope_params p = {(int32_t)o->RP, o->cfg.rope_style, o->tail > 0, o->cfg.rms_norm_eps};
        st = mlaf_rope_q(o->ctx, &p, &v.qh, &v.pos, &v.cos_sin, NULL);
        break;
    }
    case MLAF_OP_INDEXER_Q:
        st = mlaf_indexer_q(o->ctx, &o->ip, &v.iq, &v.pos, &v.cos_sin, &v.iqw, &v.iqf, &v.iqwo, NULL, NULL, NULL);
        break;
    default:
        if (o->hash)
            st = mlaf_moe_gate_hash(o->ctx, &o->moe, &v.logits, &v.tid2eid, &v.tok, &v.weights, &v.ids, NULL,
                                    NULL);
        else
            st = mlaf_moe_gate(o->ctx, &o->moe, &v.logits, o->has_bias ? &v.bias : NULL, &v.weights,
                               &v.ids, NULL);
        break;
    }
    return api_err(o, st, mlaf_op_name(o->op), err, cap);
}

static int baseline_err(int r, const char *what, char *err, size_t cap) {
    if (r == 0) return 0;
#ifdef MLAF_WITH_CUDA
    snprintf(err, cap, "unfused %s: %s", what, blg_error_string(r));
#else
    snprintf(err, cap, "unfused %s failed (%d)", what, r);
#endif
    return -1;
}

static int call_unfused(void *arg, int set, char *err, size_t cap) {
    bench_op *o = (bench_op *)arg;
    if (o->op == MLAF_OP_INDEXER_Q) {
        snprintf(err, cap, "indexer_q has no unfused chain here");
        return -1;
    }
    views v;
    make_views(o, set, &v);
    const int hasq = o->Q > 0, hasr = o->R > 0, haspos = o->RP > 0;
    const int cpu = o->be == MLAF_BACKEND_CPU;
    void *stream = NULL;
#ifdef MLAF_WITH_CUDA
    if (!cpu) stream = bcu_stream();
#endif
    (void)stream;
    int r = 0;
    switch (o->op) {
    case MLAF_OP_SPLIT_QK_NORM: {
        mlaf_split_qk_norm_params p = {(int32_t)o->Q, (int32_t)o->C, (int32_t)o->R,
                                       o->cfg.rms_norm_eps, o->cfg.rms_norm_eps};
        mlaf_norm_job j;
        if (api_err(o, mlaf_check_split_qk_norm(o->ctx, &p, &v.latent, hasq ? &v.w_q : NULL,
                                                &v.w_kv, hasq ? &v.q : NULL, &v.k_nope,
                                                hasr ? &v.k_pe : NULL, &j),
                    "unfused split_qk_norm", err, cap))
            return -1;
        if (j.T == 0) return 0;
        if (cpu)
            r = blc_split_qk_norm(&j, P(o, S_QD, set), P(o, S_KVD, set), o->threads);
#ifdef MLAF_WITH_CUDA
        else
            r = blg_split_qk_norm(&j, P(o, S_QD, set), P(o, S_KVD, set), stream);
#endif
        return baseline_err(r, "split_qk_norm", err, cap);
    }
    case MLAF_OP_MLA_KV_CACHE: {
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
            if (hasr && !r) r = blc_rope_rows(v.kp_s.data, o->dt, o->T, o->R, &j.rope, o->threads);
            if (!r && o->tail > 0) r = blc_rope_rows(tail_x, o->dt, o->T, o->C, &j.rope, o->threads);
            if (!r) r = o->kv_fmt == MLAF_KV_PLAIN ? blc_cache_write(&j, v.kn_s.data, v.kp_s.data, o->threads)
                                                   : blc_cache_write_fp8(&j, v.kn_s.data, v.kp_s.data, o->threads,
                                                                         mlaf_cpu_norm_kern(o->ctx));
        }
#ifdef MLAF_WITH_CUDA
        else {
            if (o->indexer) r = blg_index_k(&j, &ix, v.ikd_s.data, stream);
            if (hasr && !r) r = blg_rope_rows(v.kp_s.data, o->dt, o->T, o->R, &j.rope, stream);
            if (!r && o->tail > 0) r = blg_rope_rows(tail_x, o->dt, o->T, o->C, &j.rope, stream);
            if (!r) r = o->kv_fmt == MLAF_KV_PLAIN ? blg_cache_write(&j, v.kn_s.data, v.kp_s.data, stream)
                                                   : blg_cache_write_fp8(&j, v.kn_s.data, v.kp_s.data, stream);
        }
#endif
        return baseline_err(r, "mla_kv_cache", err, cap);
    }
    case MLAF_OP_ROPE_Q: {
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
    default: {
        mlaf_moe_gate_job j;
        if (o->hash) {
            if (api_err(o, mlaf_check_moe_gate_hash(o->ctx, &o->moe, &v.logits, &v.tid2eid, &v.tok, &v.weights,
                                                    &v.ids, NULL, NULL, &j),
                        "unfused moe_gate_hash", err, cap))
                return -1;
        } else if (api_err(o, mlaf_check_moe_gate(o->ctx, &o->moe, &v.logits, o->has_bias ? &v.bias : NULL,
                                                  &v.weights, &v.ids, NULL, &j),
                           "unfused moe_gate", err, cap)) {
            return -1;
        }
        if (j.T == 0) return 0;
        bench_moe_scratch s = {(float *)P(o, S_S, set), (float *)P(o, S_C, set),
                               (float *)P(o, S_G, set), (float *)P(o, S_M, set),
                               (float *)P(o, S_W, set)};
        if (cpu)
            r = o->hash ? blc_moe_gate_hash(&j, &s, o->threads) : blc_moe_gate(&j, &s, o->threads);
#ifdef MLAF_WITH_CUDA
        else
            r = o->hash ? blg_moe_gate_hash(&j, &s, stream) : blg_moe_gate(&j, &s, stream);
#endif
        return baseline_err(r, "moe_gate", err, cap);
    }
    }
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

static int outputs_of(const bench_op *o, int *ids) {
    int n = 0;
    switch (o->op) {
    case MLAF_OP_SPLIT_QK_NORM:
        if (o->Q > 0) ids[n++] = B_Q;
        ids[n++] = B_KNOPE;
        if (o->R > 0) ids[n++] = B_KPE;
        break;
    case MLAF_OP_MLA_KV_CACHE:
        if (o->Q > 0) ids[n++] = B_Q;
        ids[n++] = B_CACHE;
        if (o->indexer) ids[n++] = B_ICACHE;
        break;
    case MLAF_OP_ROPE_Q: ids[n++] = B_QH; break;
    case MLAF_OP_INDEXER_Q:
        ids[n++] = B_IQF;
        ids[n++] = B_IQWO;
        break;
    default:
        ids[n++] = B_IDS;
        ids[n++] = B_WEIGHTS;
        break;
    }
    return n;
}

/* Selection value c of expert e for token t, from the logits (host, double). */
static double host_sel(const bench_op *o, const void *logits, const float *bias, int64_t t, int e) {
    const void *row = (const char *)logits + (size_t)(t * o->E) * mlaf_dtype_size(o->dt);
    double s;
    if (o->moe.score_func == MLAF_SCORE_SIGMOID) {
        s = 1.0 / (1.0 + exp(-(double)mlaf_load_f32(row, o->dt, e)));
    } else if (o->moe.score_func == MLAF_SCORE_SQRT_SOFTPLUS) {
        const double x = mlaf_load_f32(row, o->dt, e);
        s = sqrt(fmax(x, 0.0) + log1p(exp(-fabs(x))));
    } else {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t i = 0; i < o->E; i++) mx = fmax(mx, mlaf_load_f32(row, o->dt, i));
        for (int64_t i = 0; i < o->E; i++) sum += exp(mlaf_load_f32(row, o->dt, i) - mx);
        s = exp(mlaf_load_f32(row, o->dt, e) - mx) / sum;
    }
    return s + (bias ? bias[e] : 0.0);
}

/* Runs both once and compares; writes "ok" or what differs into check. */
static int check_baseline(bench_op *o, char *check, size_t ccap, char *err, size_t cap) {
    int outs[4], n = outputs_of(o, outs);
    void *a[4] = {0}, *b[4] = {0};
    int rc = -1;
    snprintf(check, ccap, "ok");
    if (poison_outputs(o, outs, n)) {
        snprintf(err, cap, "cannot fill the outputs before the check");
        goto done;
    }
    if (reset_inputs(o) || call_fused(o, 0, err, cap) || sync_backend(o, err, cap)) goto done;
    for (int i = 0; i < n; i++)
        if (!(a[i] = download(o, outs[i]))) {
            snprintf(err, cap, "download of the fused outputs failed");
            goto done;
        }
    if (poison_outputs(o, outs, n)) {
        snprintf(err, cap, "cannot fill the outputs before the check");
        goto done;
    }
    if (reset_inputs(o) || call_unfused(o, 0, err, cap) || sync_backend(o, err, cap)) {
        snprintf(check, ccap, "baseline failed");
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (!(b[i] = download(o, outs[i]))) {
            snprintf(err, cap, "download of the unfused outputs failed");
            goto done;
        }
    rc = 0;
    if (o->op == MLAF_OP_MOE_GATE) {
        const int32_t *ia = (const int32_t *)a[0], *ib = (const int32_t *)b[0];
        const float *wa = (const float *)a[1], *wb = (const float *)b[1];
        /* the oracle's view of the same rows (host copies of the inputs), for rows whose
         * ids differ beyond a near-tie of c: a near-tie of two groups' scores lets either side
         * keep either group (SPEC 7), and then whole runs of ids differ */
        mlaf_moe_gate_job hj;
        memset(&hj, 0, sizeof hj);
        hj.T = o->T;
        hj.E = (int32_t)o->E;
        hj.top_k = o->moe.top_k;
        hj.n_group = o->moe.n_group;
        hj.topk_group = o->moe.topk_group;
        hj.n_shared = o->moe.n_shared_experts;
        hj.K = (int32_t)o->K;
        hj.score_func = o->moe.score_func;
        hj.group_score = o->moe.group_score;
        hj.logits = o->b[B_LOGITS].init;
        hj.logits_dt = o->dt;
        hj.logits_stride = o->E;
        hj.bias = o->has_bias ? (const float *)o->b[B_BIAS].init : NULL;
        int64_t bad_rows = 0, near_rows = 0, group_rows = 0;
        double worst = 0.0;
        for (int64_t t = 0; t < o->T; t++) {
            int id_bad = 0, swapped = 0, bad = 0;
            double row_worst = 0.0;
            char why[200] = "";
            for (int64_t k = 0; k < o->K; k++) {
                int64_t i = t * o->K + k;
                if (ia[i] != ib[i]) {
                    /* hash routing: the ids come from the table, no near-tie to accept */
                    int ok = !o->hash && ia[i] >= 0 && ib[i] >= 0 && ia[i] < o->E && ib[i] < o->E;
                    if (ok) {
                        double ca = host_sel(o, o->b[B_LOGITS].init, (const float *)o->b[B_BIAS].init, t, ia[i]);
                        double cb = host_sel(o, o->b[B_LOGITS].init, (const float *)o->b[B_BIAS].init, t, ib[i]);
                        ok = fabs(ca - cb) <= 1e-6 * fmax(fabs(ca), fabs(cb)) + 1e-9;
                    }
                    if (!ok) id_bad = 1;
                    else swapped = 1;
                    continue;
                }
                double d = fabs((double)wa[i] - wb[i]) / fmax(fabs((double)wa[i]), 1e-12);
                if (d > row_worst) row_worst = d;
            }
            /* A near-tie (SPEC §7: either expert is right) swaps one expert for another of a
             * different weight, so renormalization moves every other weight of the row: those
             * are compared only in rows where the ids agree. */
            if (id_bad && o->hash) {
                bad = 1;
                snprintf(why, sizeof why, "hash ids differ");
            } else if (id_bad) {
                if (mlaf_ref_moe_gate_check_token(&hj, t, ia + t * o->K, why, sizeof why) == NULL)
                    group_rows++;
                else
                    bad = 1;
            } else if (swapped) {
                near_rows++;
            } else {
                if (row_worst > worst) worst = row_worst;
                if (row_worst > 1e-4) {
                    bad = 1;
                    snprintf(why, sizeof why, "weights differ by %.2g relative", row_worst);
                }
            }
            if (bad && bad_rows < 3) { /* what differs, with c = s + bias in double */
                fprintf(stderr, "mlafuse bench: moe_gate T=%lld row %lld: %s (id:weight:c)\n",
                        (long long)o->T, (long long)t, why);
                for (int side = 0; side < 2; side++) {
                    const int32_t *ids = side ? ib : ia;
                    const float *w = side ? wb : wa;
                    fprintf(stderr, "  %-8s", side ? "unfused" : "fused");
                    for (int64_t k = 0; k < o->K; k++) {
                        const int32_t e = ids[t * o->K + k];
                        const double c = e >= 0 && e < o->E
                                             ? host_sel(o, o->b[B_LOGITS].init,
                                                        (const float *)o->b[B_BIAS].init, t, e)
                                             : NAN;
                        fprintf(stderr, " %d:%.7g:%.9g", (int)e, (double)w[t * o->K + k], c);
                    }
                    fprintf(stderr, "\n");
                }
            }
            bad_rows += bad;
        }
        if (bad_rows)
            snprintf(check, ccap, "MISMATCH in %lld of %lld rows (worst weight rel %.2g)",
                     (long long)bad_rows, (long long)o->T, worst);
        else if (near_rows && group_rows)
            snprintf(check, ccap, "ok (%lld near-tie row%s, %lld group near-tie%s)", (long long)near_rows,
                     near_rows == 1 ? "" : "s", (long long)group_rows, group_rows == 1 ? "" : "s");
        else if (near_rows)
            snprintf(check, ccap, "ok (%lld near-tie row%s)", (long long)near_rows, near_rows == 1 ? "" : "s");
        else if (group_rows)
            snprintf(check, ccap, "ok (%lld group near-tie%s)", (long long)group_rows, group_rows == 1 ? "" : "s");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const bbuf *bb = &o->b[outs[i]];
        if (outs[i] == B_CACHE && o->kv_fmt != MLAF_KV_PLAIN) {
            /* an fp8 record is bytes (e4m3 values, f32 scales, bf16 rope values): the chain
             * must write exactly the fused op's bytes (SPEC §9's rounded-first rule) */
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
                                                 [B_CACHE] = "kv_cache", [B_QH] = "q"};
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

/* ---- rows and output ----------------------------------------------------------------------- */
typedef struct row {
    mlaf_op op;
    char model[64];
    int64_t T;
    const char *mode; /* "stream", "graph", "wall" */
    const char *cache; /* mla_kv_cache rows under --cache: the format's name; else NULL */
    int hash;          /* moe_gate rows under --hash */
    int have_fused, have_unfused, have_scopy, have_kcopy;
    bench_stats fused, unfused, scopy; /* scopy: CUDA, a copy of the op's bytes timed alike */
    bench_stats kcopy;                 /* kcopy: CUDA stream rows, SM copy kernels of those bytes */
    double bytes, gbps, pct, speedup, pct_scopy, pct_kcopy;
    char check[128];
    char error[512];
} row;

/* "moe_gate_hash" for --hash rows, else the op's name. */
static const char *row_op_name(const row *r) {
    return r->hash && r->op == MLAF_OP_MOE_GATE ? "moe_gate_hash" : mlaf_op_name(r->op);
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void json_num(const char *key, double v, int comma) {
    printf("\"%s\": ", key);
    if (isfinite(v))
        printf("%.6g", v);
    else
        printf("null");
    if (comma) printf(", ");
}

/* --cache as given (show == 0: absent, and the output is what it was before the option). */
typedef struct cache_opt {
    int show;
    mlaf_kv_format fmt;
    mlaf_tile_scale tile_scale;
    double kv_scale;
} cache_opt;

static void print_json(const char *backend, const char *device, int threads, const char *model,
                       mlaf_dtype dt, int cache_order, const cache_opt *co, double copy_gbps,
                       double copy_bytes, const row *rows, int nrows) {
    printf("{\"tool\": \"mlafuse bench\", \"version\": \"%s\", \"backend\": ", mlaf_version_string());
    json_str(backend);
    printf(", \"device\": ");
    json_str(device);
    printf(", \"threads\": %d, \"preset\": ", threads);
    json_str(model);
    printf(", \"dtype\": \"%s\", \"cache_order\": \"%s\", ", mlaf_dtype_name(dt), cache_order_names[cache_order]);
    json_num("copy_gbps", copy_gbps, 1);
    json_num("copy_bytes", copy_bytes, 0);
    printf(", \"rows\": [");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        double nan = NAN;
        printf("%s\n  {\"op\": \"%s\", \"preset\": ", i ? "," : "", row_op_name(r));
        json_str(r->model);
        printf(", \"T\": %lld, \"mode\": \"%s\", ", (long long)r->T, r->mode);
        if (co->show) { /* the cache format of mla_kv_cache rows; null on the other ops' rows */
            printf("\"cache\": ");
            if (r->cache) json_str(r->cache);
            else printf("null");
            printf(", \"tile_scale\": ");
            if (r->cache && co->fmt == MLAF_KV_FP8_DS_MLA) json_str(tile_scale_names[co->tile_scale]);
            else printf("null");
            printf(", ");
            json_num("kv_scale", r->cache && co->fmt == MLAF_KV_FP8 ? co->kv_scale : NAN, 1);
        }
        json_num("calls_per_sample", r->have_fused ? r->fused.calls_per_sample : nan, 1);
        json_num("samples", r->have_fused ? r->fused.samples : nan, 1);
        json_num("fused_us", r->have_fused ? r->fused.median_us : nan, 1);
        json_num("fused_p10_us", r->have_fused ? r->fused.p10_us : nan, 1);
        json_num("fused_p90_us", r->have_fused ? r->fused.p90_us : nan, 1);
        json_num("fused_min_us", r->have_fused ? r->fused.min_us : nan, 1);
        json_num("fused_max_us", r->have_fused ? r->fused.max_us : nan, 1);
        json_num("bytes", r->bytes, 1);
        json_num("gbps", r->gbps, 1);
        json_num("copy_gbps", copy_gbps, 1);
        json_num("pct_of_copy", r->pct, 1);
        json_num("same_bytes_copy_us", r->have_scopy ? r->scopy.median_us : nan, 1);
        json_num("pct_of_same_bytes_copy", r->pct_scopy, 1);
        json_num("kernel_copy_us", r->have_kcopy ? r->kcopy.median_us : nan, 1);
        json_num("pct_of_kernel_copy", r->pct_kcopy, 1);
        json_num("unfused_us", r->have_unfused ? r->unfused.median_us : nan, 1);
        json_num("unfused_p10_us", r->have_unfused ? r->unfused.p10_us : nan, 1);
        json_num("unfused_p90_us", r->have_unfused ? r->unfused.p90_us : nan, 1);
        json_num("speedup", r->speedup, 0);
        printf(", \"baseline_check\": ");
        json_str(r->check);
        printf(", \"error\": ");
        if (r->error[0])
            json_str(r->error);
        else
            printf("null");
        printf("}");
    }
    printf("\n]}\n");
}

static void print_header(int show_cache) {
    if (show_cache) printf("%-14s %-10s ", "op", "cache");
    else printf("%-14s ", "op");
    printf("%-18s %8s %-6s %10s %21s %9s %8s %6s %9s %6s %9s %6s %11s %8s  %s\n",
           "preset", "T", "mode", "fused_us", "(p10 .. p90)", "MB", "GB/s", "%copy", "copy_us",
           "%cpy=", "kcopy_us", "%kcpy=", "unfused_us", "speedup", "check");
}

static void print_row(const row *r, int show_cache) {
    char f[16] = "-", band[32] = "", mb[16], gb[16] = "-", pc[16] = "-", uf[16] = "-", sp[16] = "-";
    char cu[16] = "-", cp[16] = "-", ku[16] = "-", kp[16] = "-";
    if (r->have_scopy) snprintf(cu, sizeof cu, "%.2f", r->scopy.median_us);
    if (isfinite(r->pct_scopy)) snprintf(cp, sizeof cp, "%.0f%%", r->pct_scopy);
    if (r->have_kcopy) snprintf(ku, sizeof ku, "%.2f", r->kcopy.median_us);
    if (isfinite(r->pct_kcopy)) snprintf(kp, sizeof kp, "%.0f%%", r->pct_kcopy);
    if (r->have_fused) {
        snprintf(f, sizeof f, "%.2f", r->fused.median_us);
        snprintf(band, sizeof band, "(%.2f .. %.2f)", r->fused.p10_us, r->fused.p90_us);
    }
    snprintf(mb, sizeof mb, "%.3f", r->bytes / 1e6);
    if (isfinite(r->gbps)) snprintf(gb, sizeof gb, "%.1f", r->gbps);
    if (isfinite(r->pct)) snprintf(pc, sizeof pc, "%.0f%%", r->pct);
    if (r->have_unfused) snprintf(uf, sizeof uf, "%.2f", r->unfused.median_us);
    if (isfinite(r->speedup)) snprintf(sp, sizeof sp, "%.2fx", r->speedup);
    if (show_cache) printf("%-14s %-10s ", row_op_name(r), r->cache ? r->cache : "-");
    else printf("%-14s ", row_op_name(r));
    printf("%-18s %8lld %-6s %10s %21s %9s %8s %6s %9s %6s %9s %6s %11s %8s  %s%s%s\n",
           r->model, (long long)r->T, r->mode, f, band, mb, gb, pc, cu, cp, ku,
           kp, uf, sp, r->check,
           r->error[0] ? "  error: " : "", r->error);
    fflush(stdout);
}

/* ---- the command ----------------------------------------------------------------------------- */
int cmd_bench(int argc, char **argv) {
    int backend_set = 0;
    mlaf_backend be = MLAF_BACKEND_CPU;
    int want_op[MLAF_OP_COUNT_] = {1, 1, 1, 1};
    const char *preset = NULL, *config = NULL;
    mlaf_dtype dt = MLAF_BF16;
    int64_t tokens[CLI_MAX_LIST];
    int ntok = 0;
    long long threads = 0, reps = 0;
    int graph = 0, pdl = 0, json = 0, cache_order = CO_SHUFFLED, sweep = 0, hash = 0, indexer = 0;
    cache_opt co = {0, MLAF_KV_PLAIN, MLAF_TILE_AMAX, 1.0};
    int tile_set = 0, kv_scale_set = 0;

    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return CLI_EXIT_OK;
        }
        if (!strcmp(argv[i], "--graph")) {
            graph = 1;
        } else if (!strcmp(argv[i], "--pdl")) {
            pdl = 1;
        } else if (!strcmp(argv[i], "--hash")) {
            hash = 1;
        } else if (!strcmp(argv[i], "--indexer")) {
            indexer = 1;
        } else if (!strcmp(argv[i], "--sweep")) {
            sweep = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--backend", &v)) != 0) {
            if (r < 0 || cli_parse_backend("--backend", v, &be)) return CLI_EXIT_USAGE;
            backend_set = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--op", &v)) != 0) {
            if (r < 0 || cli_parse_op_set("--op", v, want_op)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--preset", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            if (cli_check_preset("bench", v)) return CLI_EXIT_USAGE;
            preset = v;
        } else if ((r = cli_take_value(argc, argv, &i, "--config", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            config = v;
        } else if ((r = cli_take_value(argc, argv, &i, "--dtype", &v)) != 0) {
            if (r < 0 || cli_parse_dtype("--dtype", v, &dt)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--tokens", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            ntok = cli_parse_int_list("--tokens", v, 0, tokens, CLI_MAX_LIST);
            if (ntok < 0) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--threads", &v)) != 0) {
            if (r < 0 || cli_parse_int("--threads", v, 1, 4096, &threads)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--reps", &v)) != 0) {
            if (r < 0 || cli_parse_int("--reps", v, 1, 100000, &reps)) return CLI_EXIT_USAGE;
        } else if ((r = cli_take_value(argc, argv, &i, "--cache-order", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            for (cache_order = 0; cache_order < CO_COUNT; cache_order++)
                if (!strcmp(v, cache_order_names[cache_order])) break;
            if (cache_order == CO_COUNT)
                return cli_usage_error("bench", "--cache-order '%s': expected shuffled, ordered, page-local or page-groups", v);
        } else if ((r = cli_take_value(argc, argv, &i, "--cache", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            int f = 0;
            while (f < 4 && strcmp(v, mlaf_kv_format_name(bench_formats[f]))) f++;
            if (f == 4) return cli_usage_error("bench", "--cache '%s': expected plain, fp8, fp8_ds_mla or fp8_v4", v);
            co.show = 1;
            co.fmt = bench_formats[f];
        } else if ((r = cli_take_value(argc, argv, &i, "--tile-scale", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            int m = 0;
            while (m < 3 && strcmp(v, tile_scale_names[m])) m++;
            if (m == 3)
                return cli_usage_error("bench", "--tile-scale '%s': expected amax, ue8m0 or ue8m0_floor_scaled", v);
            co.tile_scale = (mlaf_tile_scale)m;
            tile_set = 1;
        } else if ((r = cli_take_value(argc, argv, &i, "--kv-scale", &v)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            char *end = NULL;
            const double x = strtod(v, &end);
            if (end == v || *end || !(x > 0.0) || !isfinite((float)x))
                return cli_usage_error("bench", "--kv-scale '%s': expected a positive finite number", v);
            co.kv_scale = (float)x;
            kv_scale_set = 1;
        } else {
            return cli_usage_error("bench", "unknown option '%s' (see mlafuse bench --help)", argv[i]);
        }
    }
    if (preset && config)
        return cli_usage_error("bench", "--preset and --config are exclusive (pick one model source)");
    if ((co.fmt == MLAF_KV_FP8_DS_MLA || co.fmt == MLAF_KV_FP8_V4) && dt != MLAF_BF16 && want_op[MLAF_OP_MLA_KV_CACHE])
        return cli_usage_error("bench", "--cache %s needs --dtype bf16 (its rope values are bf16; got %s)",
                               mlaf_kv_format_name(co.fmt), mlaf_dtype_name(dt));
    if (co.show && !want_op[MLAF_OP_MLA_KV_CACHE])
        fprintf(stderr, "mlafuse bench: note: --cache applies to --op mla_kv_cache only; ignored\n");
    if (tile_set && co.fmt != MLAF_KV_FP8_DS_MLA)
        fprintf(stderr, "mlafuse bench: note: --tile-scale applies to --cache fp8_ds_mla only; ignored\n");
    if (kv_scale_set && co.fmt != MLAF_KV_FP8)
        fprintf(stderr, "mlafuse bench: note: --kv-scale applies to --cache fp8 only; ignored\n");

    if (!backend_set) be = mlaf_backend_available(MLAF_BACKEND_CUDA) ? MLAF_BACKEND_CUDA : MLAF_BACKEND_CPU;
    if (be == MLAF_BACKEND_CUDA && !mlaf_backend_available(MLAF_BACKEND_CUDA)) {
#ifdef MLAF_WITH_CUDA
        fprintf(stderr, "mlafuse bench: --backend cuda: no CUDA device is visible\n");
#else
        fprintf(stderr, "mlafuse bench: --backend cuda: this build has no CUDA backend "
                        "(configure with -DMLAF_CUDA=ON)\n");
#endif
        return CLI_EXIT_FAIL;
    }
    if (graph && be != MLAF_BACKEND_CUDA)
        fprintf(stderr, "mlafuse bench: note: --graph applies to the cuda backend only; ignored\n");
    if (ntok == 0) {
        static const int64_t cuda_t[] = {1, 8, 64, 512, 4096, 32768, 131072};
        static const int64_t cpu_t[] = {1, 64, 4096, 65536};
        const int64_t *d = be == MLAF_BACKEND_CUDA ? cuda_t : cpu_t;
        ntok = be == MLAF_BACKEND_CUDA ? 7 : 4;
        memcpy(tokens, d, sizeof(int64_t) * (size_t)ntok);
    }
    if (reps == 0) reps = be == MLAF_BACKEND_CUDA ? 100 : 10;

    mlaf_model_config models[16];
    int32_t tails[16] = {0}; /* kv_rope_tail of each model (DeepSeek-V4: 64) */
    int nmodels = 0;
    if (config) {
        if (cli_load_hf_config(config, &models[0]) != 0) return CLI_EXIT_FAIL;
        tails[0] = models[0].kv_rope_tail;
        nmodels = 1;
    } else if (preset && !strcasecmp(preset, "all")) {
        for (int i = 0; i < mlaf_preset_count() && i < 16; i++)
            tails[nmodels] = mlaf_preset_at(i)->kv_rope_tail, models[nmodels++] = *mlaf_preset_at(i);
    } else if (preset) {
        (void)cli_find_model(preset, &models[0], &tails[0]); /* known: cli_check_preset */
        nmodels = 1;
    } else {
        models[nmodels++] = *mlaf_preset_at(0);
    }
    if (sweep) {
        nmodels = cli_sweep_models(&models[0], models, 16);
        memset(tails, 0, sizeof tails);
    }

    mlaf_context *ctx = NULL;
    mlaf_status st = mlaf_context_create(&ctx, be);
    if (st != MLAF_OK) {
        fprintf(stderr, "mlafuse bench: cannot create a %s context: %s\n", mlaf_backend_name(be),
                mlaf_status_message(st));
        return CLI_EXIT_FAIL;
    }
    char err[512] = "";
    char device[256];
    double copy_gbps = 0.0, copy_bytes = 0.0;
    size_t llc = bench_cpu_llc_bytes();
    if (be == MLAF_BACKEND_CPU) {
        if (pdl) fprintf(stderr, "mlafuse bench: note: --pdl applies to the cuda backend only\n");
        if (threads > 0 && mlaf_context_set_threads(ctx, (int)threads) != MLAF_OK) {
            fprintf(stderr, "mlafuse bench: --threads: %s\n", mlaf_context_last_error(ctx));
            mlaf_context_free(ctx);
            return CLI_EXIT_USAGE;
        }
        threads = mlaf_context_threads(ctx);
        snprintf(device, sizeof device, "%s (%lld threads, isa %s)", bench_cpu_name(), threads,
                 mlaf_cpu_isa_name(mlaf_context_cpu_isa(ctx)));
        size_t cb = 4 * llc;
        if (cb < ((size_t)256 << 20)) cb = (size_t)256 << 20;
        if (cb > ((size_t)2 << 30)) cb = (size_t)2 << 30;
        copy_gbps = bench_cpu_copy_gbps((int)threads, cb, reps < 5 ? 5 : (int)reps);
        copy_bytes = 2.0 * (double)cb;
        if (copy_gbps <= 0.0) fprintf(stderr, "mlafuse bench: warning: the copy reference could not be measured\n");
    } else {
#ifdef MLAF_WITH_CUDA
        if (threads > 0) fprintf(stderr, "mlafuse bench: note: --threads applies to the cpu backend only\n");
        threads = 0;
        if (bcu_setup(err, sizeof err) ||
            mlaf_context_set_cuda_stream(ctx, bcu_stream()) != MLAF_OK) {
            fprintf(stderr, "mlafuse bench: cuda setup failed: %s\n", err[0] ? err : mlaf_context_last_error(ctx));
            bcu_teardown();
            mlaf_context_free(ctx);
            return CLI_EXIT_FAIL;
        }
        if (pdl && mlaf_context_set_cuda_pdl(ctx, 1) != MLAF_OK) {
            fprintf(stderr, "mlafuse bench: --pdl: %s\n", mlaf_context_last_error(ctx));
            bcu_teardown();
            mlaf_context_free(ctx);
            return CLI_EXIT_USAGE;
        }
        snprintf(device, sizeof device, "%s", bcu_device_name());
        size_t cb = (size_t)1 << 30;
        if (bcu_copy_gbps(cb, 20, &copy_gbps, err, sizeof err)) {
            fprintf(stderr, "mlafuse bench: warning: copy reference failed: %s\n", err);
            copy_gbps = 0.0;
        }
        copy_bytes = 2.0 * (double)cb;
#endif
    }

    char model_list[1200] = "";
    for (int m = 0; m < nmodels; m++) {
        size_t len = strlen(model_list);
        snprintf(model_list + len, sizeof model_list - len, "%s%.63s", m ? "," : "", models[m].name);
    }
    if (!json) {
        printf("# mlafuse bench %s: backend=%s device=%s dtype=%s model=%s\n", mlaf_version_string(),
               mlaf_backend_name(be), device, mlaf_dtype_name(dt), model_list);
        printf("# copy reference: %.1f GB/s (%s, %.0f MB read + written)\n", copy_gbps,
               be == MLAF_BACKEND_CUDA ? "cudaMemcpyAsync device to device" : "memcpy, all threads",
               copy_bytes / 1e6);
        if (co.show && co.fmt == MLAF_KV_FP8)
            printf("# cache: fp8 (per-tensor e4m3 bytes, C + R per token: e4m3(x / scale), scale %g in %s memory)\n",
                   co.kv_scale, mlaf_backend_name(be));
        else if (co.show && co.fmt == MLAF_KV_FP8_DS_MLA)
            printf("# cache: fp8_ds_mla (per token C e4m3 bytes + C/128 f32 tile scales (%s) + R bf16 rope values)\n",
                   tile_scale_names[co.tile_scale]);
        else if (co.show && co.fmt == MLAF_KV_FP8_V4)
            printf("# cache: fp8_v4 (DeepSeek-V4: planar pages of 576-B data rows [448 e4m3 | 64 bf16] and 8-B UE8M0 scale rows)\n");
        else if (co.show)
            printf("# cache: plain (%s, C + R values per token)\n", mlaf_dtype_name(dt));
        printf("# reproduce: mlafuse bench --backend %s --dtype %s --reps %lld", mlaf_backend_name(be),
               mlaf_dtype_name(dt), reps);
        if (config) printf(" --config %s", config);
        else printf(" --preset %s", preset ? preset : models[0].name);
        if (be == MLAF_BACKEND_CPU) printf(" --threads %lld", threads);
        if (graph) printf(" --graph");
        if (pdl) printf(" --pdl");
        if (hash) printf(" --hash");
        if (cache_order != CO_SHUFFLED) printf(" --cache-order %s", cache_order_names[cache_order]);
        if (co.show) printf(" --cache %s", mlaf_kv_format_name(co.fmt));
        if (co.show && co.fmt == MLAF_KV_FP8_DS_MLA && co.tile_scale != MLAF_TILE_AMAX)
            printf(" --tile-scale %s", tile_scale_names[co.tile_scale]);
        if (co.show && co.fmt == MLAF_KV_FP8 && co.kv_scale != 1.0) printf(" --kv-scale %g", co.kv_scale);
        if (indexer) printf(" --indexer");
        printf(" --tokens ");
        for (int t = 0; t < ntok; t++) printf("%s%lld", t ? "," : "", (long long)tokens[t]);
        int nops = 0;
        for (int o = 0; o < MLAF_OP_COUNT_; o++) nops += want_op[o];
        if (nops == 1)
            for (int o = 0; o < MLAF_OP_COUNT_; o++)
                if (want_op[o]) printf(" --op %s", mlaf_op_name((mlaf_op)o));
        printf("\n");
        print_header(co.show);
    }

    int cap_rows = MLAF_OP_COUNT_ * ntok * nmodels;
    row *rows = (row *)calloc((size_t)cap_rows, sizeof(row));
    int nrows = 0, any_error = 0;
    if (!rows) {
        fprintf(stderr, "mlafuse bench: out of host memory\n");
        mlaf_context_free(ctx);
        return CLI_EXIT_FAIL;
    }
    for (int m = 0; m < nmodels; m++)
        for (int oi = 0; oi < MLAF_OP_COUNT_; oi++) {
            if (!want_op[oi]) continue;
            for (int ti = 0; ti < ntok; ti++) {
                row *r = &rows[nrows++];
                memset(r, 0, sizeof *r);
                r->op = (mlaf_op)oi;
                snprintf(r->model, sizeof r->model, "%.55s%s", models[m].name,
                         indexer && r->op == MLAF_OP_MLA_KV_CACHE ? "+indexer" : "");
                r->T = tokens[ti];
                if (co.show && r->op == MLAF_OP_MLA_KV_CACHE) r->cache = mlaf_kv_format_name(co.fmt);
                r->hash = hash && r->op == MLAF_OP_MOE_GATE;
                r->gbps = r->pct = r->speedup = r->pct_scopy = r->pct_kcopy = NAN;
                snprintf(r->check, sizeof r->check, "-");
                int graph_calls = 0;
                r->mode = "wall";
                if (be == MLAF_BACKEND_CUDA) {
                    graph_calls = (graph || r->T <= 64) ? 100 : 0;
                    r->mode = graph_calls ? "graph" : "stream";
                }
                if (!mlaf_backend_supports(be, r->op)) {
                    snprintf(r->check, sizeof r->check, "skipped");
                    snprintf(r->error, sizeof r->error, "%s is not supported by the %s backend",
                             mlaf_op_name(r->op), mlaf_backend_name(be));
                    if (!json) print_row(r, co.show);
                    continue;
                }
                if (r->op == MLAF_OP_INDEXER_Q && models[m].index_n_heads <= 0) {
                    snprintf(r->check, sizeof r->check, "skipped");
                    snprintf(r->error, sizeof r->error, "the model has no DSA indexer");
                    if (!json) print_row(r, co.show);
                    continue;
                }
                if (r->op == MLAF_OP_ROPE_Q && models[m].qk_rope_head_dim <= 0 && tails[m] <= 0) {
                    snprintf(r->check, sizeof r->check, "skipped");
                    snprintf(r->error, sizeof r->error, "qk_rope_head_dim = 0: nothing to rotate");
                    if (!json) print_row(r, co.show);
                    continue;
                }
                bench_op o;
                memset(&o, 0, sizeof o);
                o.op = r->op;
                o.be = be;
                o.ctx = ctx;
                o.cfg = models[m];
                o.tail = tails[m];
                o.dt = dt;
                o.T = r->T;
                o.threads = (int)(threads > 0 ? threads : 1);
                o.cache_order = cache_order;
                o.hash = r->hash;
                o.kv_fmt = r->op == MLAF_OP_MLA_KV_CACHE ? co.fmt : MLAF_KV_PLAIN;
                o.indexer = indexer && r->op == MLAF_OP_MLA_KV_CACHE;
                o.tile_scale = co.tile_scale;
                o.kv_scale = (float)co.kv_scale;
                err[0] = '\0';
                if (setup(&o, llc, err, sizeof err)) {
                    snprintf(r->error, sizeof r->error, "setup: %s", err);
                    any_error = 1;
                    op_free(&o);
                    if (!json) print_row(r, co.show);
                    continue;
                }
                r->bytes = o.bytes;
                char cerr[512] = "";
                const int no_baseline = o.op == MLAF_OP_INDEXER_Q; /* compared with the same-run copy only */
                if (no_baseline) {
                    snprintf(r->check, sizeof r->check, "no baseline");
                } else if (check_baseline(&o, r->check, sizeof r->check, cerr, sizeof cerr)) {
                    if (!strcmp(r->check, "ok")) snprintf(r->check, sizeof r->check, "not checked");
                } else if (strncmp(r->check, "ok", 2)) { /* "ok (N near-tie rows)" is ok */
                    fprintf(stderr, "mlafuse bench: warning: the unfused baseline of %s (T=%lld) "
                                    "differs from the fused op: %s\n",
                            mlaf_op_name(o.op), (long long)o.T, r->check);
                }
                err[0] = '\0';
                int fr, ur;
#ifdef MLAF_WITH_CUDA
                if (be == MLAF_BACKEND_CUDA) {
                    fr = bcu_time(call_fused, &o, (int)reps, graph_calls, &r->fused, err, sizeof err);
                } else
#endif
                    fr = bench_cpu_time(call_fused, &o, o.nsets, (int)reps, &r->fused, err, sizeof err);
                if (fr) {
                    snprintf(r->error, sizeof r->error, "%s", err);
                    any_error = 1;
                } else {
                    r->have_fused = 1;
                }
                err[0] = '\0';
                ur = 0;
#ifdef MLAF_WITH_CUDA
                if (no_baseline) {
                } else if (be == MLAF_BACKEND_CUDA) {
                    ur = bcu_time(call_unfused, &o, (int)reps, graph_calls, &r->unfused, err, sizeof err);
                } else
#else
                if (!no_baseline)
#endif
                    ur = bench_cpu_time(call_unfused, &o, o.nsets, (int)reps, &r->unfused, err, sizeof err);
                if (no_baseline) {
                } else if (ur) {
                    size_t len = strlen(r->error);
                    snprintf(r->error + len, sizeof r->error - len, "%s%s", len ? "; " : "", err);
                    any_error = 1;
                } else {
                    r->have_unfused = 1;
                }
#ifdef MLAF_WITH_CUDA
                /* the same bytes through cudaMemcpyAsync, timed like the op (SPEC 8's copy
                 * at this size: what ramp-up and tail leave of the copy bandwidth) */
                if (be == MLAF_BACKEND_CUDA && r->bytes > 0) {
                    err[0] = '\0';
                    if (bcu_copy_time(r->bytes, (int)reps, graph_calls, &r->scopy, err, sizeof err) == 0)
                        r->have_scopy = 1;
                    else
                        fprintf(stderr, "mlafuse bench: warning: same-bytes copy failed: %s\n", err);
                }
                /* and through SM copy kernels (stream rows): the ceiling of a kernel at this size */
                if (be == MLAF_BACKEND_CUDA && r->bytes > 0 && graph_calls == 0) {
                    err[0] = '\0';
                    /* rope_q reads and writes the R rope values of each head row: its ceiling is a copy of
                     * those pieces at q's strides, not a contiguous run of the same bytes */
                    const int64_t es = (int64_t)mlaf_dtype_size(o.dt);
                    const int pieces = o.op == MLAF_OP_ROPE_Q && o.tail == 0;
                    if (pieces ? bcu_piece_copy_time(o.T * o.H, o.RP * es, o.D * es, (o.D - o.RP) * es, (int)reps,
                                                     &r->kcopy, err, sizeof err) == 0
                               : bcu_kcopy_time(r->bytes, (int)reps, &r->kcopy, err, sizeof err) == 0)
                        r->have_kcopy = 1;
                    else
                        fprintf(stderr, "mlafuse bench: warning: kernel copy failed: %s\n", err);
                }
#endif
                if (!r->have_fused && cerr[0] && !r->error[0]) snprintf(r->error, sizeof r->error, "%s", cerr);
                if (r->have_fused && r->fused.median_us > 0) {
                    r->gbps = r->bytes / (r->fused.median_us * 1e3);
                    if (copy_gbps > 0) r->pct = 100.0 * r->gbps / copy_gbps;
                    if (r->have_unfused) r->speedup = r->unfused.median_us / r->fused.median_us;
                    if (r->have_scopy) r->pct_scopy = 100.0 * r->scopy.median_us / r->fused.median_us;
                    if (r->have_kcopy) r->pct_kcopy = 100.0 * r->kcopy.median_us / r->fused.median_us;
                }
                op_free(&o);
                if (!json) print_row(r, co.show);
            }
        }
    if (json) print_json(mlaf_backend_name(be), device, (int)threads, model_list, dt, cache_order, &co, copy_gbps,
                         copy_bytes, rows, nrows);
    free(rows);
#ifdef MLAF_WITH_CUDA
    if (be == MLAF_BACKEND_CUDA) bcu_teardown();
#endif
    mlaf_context_free(ctx);
    return any_error ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
