/*
 * hash_v1.cu — DeepSeek-V4 hash routing (mlaf_moe_gate_hash, SPEC §11) kernel versions.
 *
 * Per token t: ids = tid2eid[token_ids[t]] (k of E), w_j = s(logit[ids_j]) (0 for a non-finite
 * logit), renormalized (sum + eps) and scaled; a bad row (token id outside [0, vocab), an entry
 * outside [0, E) or repeated) gets ids 0..k-1, weight 0, and the error counter +1. A token
 * reads 8 + 6·4 + 6·4 bytes (V4-Flash, f32, int64 ids, int32 table) through a chain of three
 * dependent loads: the token id, then its table row, then k logits of its row.
 *
 *   v0  the warp kernel of moe_gate_hash.cuh (the library's for softmax, scores, k > 8): one
 *       warp per token, lanes j < k active, grid-stride, 4 warps per block, at most 16 blocks per SM. At most
 *       64 tokens in flight per SM (64 warps, each waiting on its own chain), plus a k-round
 *       shuffle loop for duplicates and 5-step warp sums per token.
 *   v1  one thread per token. Its k table entries are loaded back to back, then its k logits
 *       back to back; the duplicate test is k(k-1)/2 compares in registers; the sums are the
 *       library's butterfly written out in registers (hash_sum8). A block of 128 threads covers
 *       128 tokens; at 43-52 registers (ptxas, sm_90) 9-10 blocks fit per SM, ~1200 tokens in
 *       flight per SM against v0's 64, so T = 131072 (~990 tokens per SM on 132 SMs) is one
 *       wave and the call should cost about one chain of three DRAM latencies plus the
 *       traffic, instead of ~16 chains back to back.
 *       Flags F: 1 = an int32 table row read as 8-byte pairs (rows 8-byte aligned: 3 loads
 *       instead of 6 for k = 6); 2 = ids / f32 weights stored as 8-byte pairs; 4 = the warp's
 *       32 x k ids and weights staged in shared memory and stored as contiguous 16-byte
 *       vectors (contiguous [T, k] outputs, no shared experts), instead of 24-byte-strided
 *       4-byte stores that each touch 24 sectors per warp instruction.
 *   v2  8 lanes per token (4 tokens per warp): lane j < k loads entry j and its logit; the
 *       duplicate test is k width-8 shuffles ("shfl") or one __match_any_sync ("match"); the
 *       sums are team_sum<8> (xor 4, 2, 1). 4x v0's tokens in flight per warp (256 per SM),
 *       and fewer instructions per token (3-step instead of 5-step reductions, 32-bit instead
 *       of 64-bit shuffles, no 32-lane vote per token); still ~4 chains back to back at
 *       T = 131072, so expected between v0 and v1 there, and close to v1 at small T.
 *   The fast paths take top_k <= 8 with sigmoid or sqrt_softplus scores and no scores output;
 *   anything else (softmax, scores, k > 8) runs v0's kernel (moe_gate_hash.cuh, included).
 *   "library (API)" is mlaf_moe_gate_hash on a CUDA context: v2 shfl's kernel below 65536
 *   tokens, v1 F=4's from there (moe_gate_hash.cuh; F=1 and F=2 did not earn their code).
 *
 * Bit identity with v0: the same score function (hash_score: sqrt_softplus_f / the sigmoid of
 * moe_gate_hash.cuh), the same operations in the same order. The library's sum is
 * warp_sum(w0 + w1) over 32 lanes with w = +0 at lanes j >= k: for k <= 8 the xor-16 and xor-8
 * steps add +0, then lanes j and j^4, j^2, j^1 pair up, so every lane gets
 * ((w0+w4)+(w2+w6)) + ((w1+w5)+(w3+w7)) (IEEE addition commutes; "+ 0.0f" is the library's
 * w0 + w1 with w1 = +0). v1 computes exactly that expression, v2 the same tree by xor 4, 2, 1.
 * Then denom = sum + eps, w / denom when denom > 0, the shared-expert sum the same way, w *=
 * scaling, shared w = routed / scaling: as moe_gate_hash.cuh. The error counter gets one
 * saturating add of the warp's bad-row count instead of one per row (the same final value).
 *
 * Validation (before any timing; FAIL and exit 1 on a mismatch): every variant against v0 bit
 * for bit (ids, weight bytes, error counter, padding columns untouched) at T = 1, 33, 4099 on
 * a 1000-token table with bad rows (token ids -1, vocab, -2^40, 2^32 + 3; entries E, -1,
 * 2^32 + e; duplicates inside and beyond k) and non-finite / |x| >= 20 logits, padded
 * strides; five parameter sets (V4; + 2 shared experts with weights in the logits' dtype and
 * padded outputs; sigmoid k = 3 without renormalization or scaling, eps 0; k = 8 with one
 * shared expert, eps 0; k = 10, the fallback); f32 / bf16 logits x int32 / int64 token ids x
 * int32 / int64 table. v0 itself is checked against a float64 host reference there (ids and
 * error count exact, weights within 1e-5 relative, 8e-3 for bf16 weights). Then at every
 * timed T on the timing inputs, every variant against v0 bit for bit again.
 * Timing, as `mlafuse bench --op moe_gate --preset deepseek-v4-flash --hash`: logits uniform in
 * [-4, 4), a 129280 x 6 table of distinct experts, uniform token ids, f32 weights (no bad
 * rows); f32 / bf16 logits x {int64 ids + int32 table (the bench's), int32 + int32, int64 +
 * int64}; T = 1, 64 as 100 calls in a CUDA graph (us per call), T = 4096, 32768, 131072 as
 * the median of 21 event-timed calls, each after a 256 MB memset + read of the flush buffer;
 * "x memcpy" = time over a cudaMemcpyAsync of half the op's bytes (read + write = the op's
 * bytes: token id, k entries, k logits, K ids and weights per token) timed the same way.
 *   build/dev/moe_gate/hash_v1 [--quick] [--ts LIST]  (--quick: T = 131072 only; --ts: these
 *                                                     T, the bench's index dtypes only)
 */
#include "cuda/moe_gate_hash.cuh" /* GateArgs, hash_score, hash_index, team_sum; v0's kernel */

#include "common.cuh"

#include <cmath>
#include <functional>
#include <string>

namespace {

constexpr int kV1Threads = 128;
constexpr int kV2Warps = 4;   /* v2: 128-thread blocks, 16 tokens per block */

/* What the host works out once per call for the fast paths (warp-uniform in the kernels). */
struct HashFast {
    int tab_vec;   /* int32 table with 8-byte aligned rows: entries read in pairs */
    int out_vec;   /* f32 weights; ids and weights rows 8-byte aligned: stored in pairs */
    int out_stage; /* f32 weights; contiguous [T, K] ids and weights, K == top_k, 16-byte bases */
};

bool hash_fast_ok(const GateArgs &a) { return a.top_k <= kHashKMax && !a.softmax && !a.scores; }

HashFast hash_fast_of(const GateArgs &a) {
    HashFast f{};
    f.tab_vec = !a.tid2eid_i64 && reinterpret_cast<uintptr_t>(a.tid2eid) % 8 == 0 && a.tid2eid_stride % 2 == 0;
    const bool wf = a.weights_f32 != 0;
    f.out_vec = wf && reinterpret_cast<uintptr_t>(a.ids) % 8 == 0 && reinterpret_cast<uintptr_t>(a.weights) % 8 == 0 &&
                a.ids_stride % 2 == 0 && a.weights_stride % 2 == 0;
    f.out_stage = wf && a.K == a.top_k && a.ids_stride == a.K && a.weights_stride == a.K &&
                  reinterpret_cast<uintptr_t>(a.ids) % 16 == 0 && reinterpret_cast<uintptr_t>(a.weights) % 16 == 0;
    return f;
}

/* ---- v1: one thread per token ------------------------------------------------------------ */
template <typename T, int F>
__global__ void __launch_bounds__(kV1Threads) hash_v1_kernel(const GateArgs a, const HashFast f) {
    constexpr int KM = kHashKMax;
    /* F & 4: per warp 32 x KM ids, then 32 x KM weights */
    __shared__ __align__(16) uint32_t stage[(F & 4) ? (kV1Threads / 32) * 2 * 32 * KM : 4];
    const int lane = threadIdx.x & 31;
    const int32_t E = a.E, k = a.top_k;
    const T *__restrict__ logits = static_cast<const T *>(a.logits);
    const int64_t step = (int64_t)gridDim.x * kV1Threads;
    /* warp-uniform loop: base is the warp's first token (a multiple of 32) */
    for (int64_t base = (int64_t)blockIdx.x * kV1Threads + (threadIdx.x & ~31); base < a.T; base += step) {
        const int64_t t = base + lane;
        const bool live = t < a.T;
        /* 1. the token id, then its k table entries, all loads issued before any test */
        int64_t tok = 0;
        if (live) tok = hash_index(a.token_ids, a.token_ids_i64, t);
        bool bad = live && (tok < 0 || tok >= a.vocab);
        const bool go = live && !bad;
        const int64_t trow = (go ? tok : 0) * a.tid2eid_stride;
        int32_t e[KM];
        bool range_bad = false;
        if (a.tid2eid_i64) {
            const int64_t *row = static_cast<const int64_t *>(a.tid2eid) + trow;
            int64_t v[KM];
#pragma unroll
            for (int j = 0; j < KM; j++) v[j] = (go && j < k) ? row[j] : 0;
#pragma unroll
            for (int j = 0; j < KM; j++) {
                range_bad = range_bad || (go && j < k && (v[j] < 0 || v[j] >= E));
                e[j] = (int32_t)v[j]; /* exact for entries in range; a row with one out of range is bad */
            }
        } else {
            const int32_t *row = static_cast<const int32_t *>(a.tid2eid) + trow;
            if ((F & 1) && f.tab_vec) {
#pragma unroll
                for (int j = 0; j < KM; j += 2) {
                    if (go && j + 1 < k) {
                        const int2 p = *reinterpret_cast<const int2 *>(row + j);
                        e[j] = p.x, e[j + 1] = p.y;
                    } else {
                        e[j] = (go && j < k) ? row[j] : 0;
                        e[j + 1] = 0;
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < KM; j++) e[j] = (go && j < k) ? row[j] : 0;
            }
#pragma unroll
            for (int j = 0; j < KM; j++) range_bad = range_bad || (go && j < k && (e[j] < 0 || e[j] >= E));
        }
        bool dup = false;
#pragma unroll
        for (int i = 1; i < KM; i++)
#pragma unroll
            for (int m = 0; m < i; m++) dup = dup || (i < k && e[i] == e[m]);
        bad = bad || (go && (range_bad || dup));
        const unsigned bad_lanes = __ballot_sync(kFull, bad);
        if (lane == 0 && bad_lanes && a.error_count) mlaf_cuda_error_count_add(a.error_count, __popc(bad_lanes));

        /* 2. the k logits back to back, then the scores */
        const bool ok = live && !bad;
        const T *row = logits + (ok ? t : 0) * a.logits_stride;
        float x[KM], w[KM];
#pragma unroll
        for (int j = 0; j < KM; j++) x[j] = (ok && j < k) ? mlaf_ld(row + e[j]) : 0.0f;
#pragma unroll
        for (int j = 0; j < KM; j++) w[j] = (ok && j < k) ? (!isfinite(x[j]) ? 0.0f : hash_score(a, x[j])) : 0.0f;

        /* 3. weights: moe_gate_hash.cuh's operations in its order */
        const float sum = hash_sum8(w);
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            if (denom > 0.0f) {
#pragma unroll
                for (int j = 0; j < KM; j++) w[j] = w[j] / denom;
            }
            if (a.n_shared > 0) routed = hash_sum8(w);
        }
        if (a.apply_scaling) {
#pragma unroll
            for (int j = 0; j < KM; j++) w[j] *= a.scaling;
        }
        const float shared_w = routed / a.scaling;

        /* 4. stores */
        if ((F & 4) && f.out_stage && base + 32 <= a.T) {
            uint32_t *sid = stage + (threadIdx.x >> 5) * (2 * 32 * KM);
            uint32_t *sw = sid + 32 * k; /* 128 k bytes in: 16-byte aligned */
#pragma unroll
            for (int j = 0; j < KM; j++)
                if (j < k) {
                    sid[lane * k + j] = (uint32_t)(bad ? j : e[j]);
                    sw[lane * k + j] = __float_as_uint(w[j]);
                }
            __syncwarp();
            /* the warp's rows are 32 k contiguous words of each output, at base * k words: a
             * multiple of 128 bytes from 16-byte aligned bases */
            uint4 *gid = reinterpret_cast<uint4 *>(a.ids + base * a.K);
            uint4 *gw = reinterpret_cast<uint4 *>(static_cast<float *>(a.weights) + base * a.K);
            const uint4 *s_id = reinterpret_cast<const uint4 *>(sid);
            const uint4 *s_w = reinterpret_cast<const uint4 *>(sw);
            for (int v = lane; v < 8 * k; v += 32) {
                gid[v] = s_id[v];
                gw[v] = s_w[v];
            }
            __syncwarp(); /* the stage is rewritten by the next round */
        } else if (live) {
            int32_t *ids = a.ids + t * a.ids_stride;
            if ((F & 2) && f.out_vec) {
                float *wr = static_cast<float *>(a.weights) + t * a.weights_stride;
#pragma unroll
                for (int j = 0; j < KM; j += 2) {
                    const int32_t i0 = bad ? j : e[j], i1 = bad ? j + 1 : e[j + 1];
                    if (j + 1 < k) {
                        *reinterpret_cast<int2 *>(ids + j) = make_int2(i0, i1);
                        *reinterpret_cast<float2 *>(wr + j) = make_float2(w[j], w[j + 1]);
                    } else if (j < k) {
                        ids[j] = i0;
                        wr[j] = w[j];
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < KM; j++)
                    if (j < k) {
                        ids[j] = bad ? j : e[j];
                        gate_put_weight<T>(a, t, j, w[j]);
                    }
            }
            for (int j = k; j < a.K; j++) {
                ids[j] = E + (j - k);
                gate_put_weight<T>(a, t, j, shared_w);
            }
        }
    }
}

/* ---- v2: 8 lanes per token ----------------------------------------------------------------- */
template <typename T, bool MATCH>
__global__ void __launch_bounds__(kV2Warps * 32) hash_v2_kernel(const GateArgs a) {
    const int lane = threadIdx.x & 31, g = lane >> 3, tl = lane & 7;
    const unsigned team = 0xffu << (8 * g);
    const int32_t E = a.E, k = a.top_k;
    const T *__restrict__ logits = static_cast<const T *>(a.logits);
    const int64_t step = (int64_t)gridDim.x * kV2Warps * 4;
    /* warp-uniform loop over the warp's 4 tokens base .. base + 3 */
    for (int64_t base = ((int64_t)blockIdx.x * kV2Warps + (threadIdx.x >> 5)) * 4; base < a.T; base += step) {
        const int64_t t = base + g;
        const bool live = t < a.T;
        int64_t tok = 0;
        if (live) tok = hash_index(a.token_ids, a.token_ids_i64, t); /* one address per team */
        const bool tok_bad = live && (tok < 0 || tok >= a.vocab);
        const bool mine = live && !tok_bad && tl < k;
        int64_t v = 0;
        if (mine) v = hash_index(a.tid2eid, a.tid2eid_i64, tok * a.tid2eid_stride + tl);
        const int32_t e = (int32_t)v; /* exact in range; out of range makes the row bad anyway */
        bool mine_bad = mine && (v < 0 || v >= E);
        if constexpr (MATCH) {
            /* lanes without an entry get distinct negative keys; a real entry equal to one is
             * negative or >= 2^31 as int64, so already out of range. Every lane executes the
             * match (full mask): it must not sit behind the || / && short circuit. */
            const int32_t key = mine ? e : (int32_t)(0x80000000u | (unsigned)lane);
            const unsigned peers = __match_any_sync(kFull, key);
            mine_bad = mine_bad || (mine && __popc(peers & team) > 1);
        } else {
#pragma unroll
            for (int m = 0; m < kHashKMax; m++) {
                const int32_t o = __shfl_sync(kFull, e, m, 8);
                mine_bad = mine_bad || (mine && m < k && m != tl && o == e);
            }
        }
        const bool bad = (__ballot_sync(kFull, mine_bad || tok_bad) & team) != 0u;
        const unsigned bad_teams = __ballot_sync(kFull, bad && tl == 0);
        if (lane == 0 && bad_teams && a.error_count) mlaf_cuda_error_count_add(a.error_count, __popc(bad_teams));

        float w = 0.0f;
        if (mine && !bad) {
            const float x = mlaf_ld(logits + t * a.logits_stride + e);
            w = !isfinite(x) ? 0.0f : hash_score(a, x);
        }
        const float sum = team_sum<8>(w + 0.0f);
        float routed = sum;
        if (a.renormalize) {
            const float denom = sum + a.eps;
            if (denom > 0.0f) w = w / denom;
            if (a.n_shared > 0) routed = team_sum<8>(w + 0.0f);
        }
        if (a.apply_scaling) w *= a.scaling;
        const float shared_w = routed / a.scaling;
        if (live) {
            int32_t *ids = a.ids + t * a.ids_stride;
            for (int j = tl; j < a.K; j += 8) { /* j < k only at j = tl (k <= 8) */
                const bool routed_slot = j < k;
                ids[j] = routed_slot ? (bad ? j : e) : E + (j - k);
                gate_put_weight<T>(a, t, j, routed_slot ? w : shared_w);
            }
        }
    }
}

int g_sm = 0;

/* Blocks that fit on one SM, asked once per kernel (before any graph capture: the first call
 * of every variant is a validation call). */
template <typename K> int resident_blocks(K kernel, int threads, int &cache) {
    if (cache == 0) {
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cache, kernel, threads, 0));
        if (cache < 1) cache = 1;
    }
    return cache;
}

template <typename T, int F> void launch_v1(const GateArgs &a, cudaStream_t s) {
    if (a.T == 0) return; /* as the API: nothing read or written */
    if (!hash_fast_ok(a)) {
        launch_hash_warp<T>(a, g_sm, s);
        return;
    }
    static int resident = 0;
    const int64_t cap = (int64_t)g_sm * resident_blocks(hash_v1_kernel<T, F>, kV1Threads, resident);
    const int64_t want = (a.T + kV1Threads - 1) / kV1Threads;
    hash_v1_kernel<T, F><<<(int)std::min(want, cap), kV1Threads, 0, s>>>(a, hash_fast_of(a));
}

template <typename T, bool MATCH> void launch_v2(const GateArgs &a, cudaStream_t s) {
    if (a.T == 0) return; /* as the API: nothing read or written */
    if (!hash_fast_ok(a)) {
        launch_hash_warp<T>(a, g_sm, s);
        return;
    }
    static int resident = 0;
    const int64_t cap = (int64_t)g_sm * resident_blocks(hash_v2_kernel<T, MATCH>, kV2Warps * 32, resident);
    const int64_t want = (a.T + kV2Warps * 4 - 1) / (kV2Warps * 4);
    hash_v2_kernel<T, MATCH><<<(int)std::min(want, cap), kV2Warps * 32, 0, s>>>(a);
}

} // namespace

/* ---- host side ----------------------------------------------------------------------------- */

static mlaf_context *g_ctx = nullptr;

#define API(x)                                                                                     \
    do {                                                                                           \
        const mlaf_status st_ = (x);                                                               \
        if (st_ != MLAF_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #x, mlaf_status_name(st_),   \
                    mlaf_context_last_error(g_ctx));                                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One input set on the device. */
struct Inputs {
    int64_t T;
    int E;
    void *logits;
    mlaf_dtype ldt;
    int64_t lstride;
    void *tab;
    mlaf_dtype tdt;
    int64_t vocab, tcols, tstride;
    void *tok;
    mlaf_dtype kdt;
};

/* One output set on the device (capacity kOutCap elements each). */
struct Outs {
    int32_t *ids;
    void *w;
    int32_t *ec;
};
static const size_t kOutCap = (size_t)131072 * 8;

struct Params {
    const char *name;
    int k, S;
    mlaf_score_func sf;
    int renorm, apply;
    float scale, eps;
    bool w_in_ldt; /* weights in the logits' dtype (else f32) */
    int pad;       /* output row stride K + pad */
};

/* One call: the API's tensors, and the same call as GateArgs for the variants. */
struct Call {
    mlaf_moe_gate_params p;
    mlaf_tensor logits, tab, tok, weights, ids, ec;
    GateArgs a;
    int64_t T;
    int K;
    int64_t ostride;
    size_t wsz;
    Outs o;
};

static Call make_call(const Inputs &in, int64_t T, const Params &ps, const Outs &o) {
    Call c;
    memset(&c, 0, sizeof c);
    c.p = mlaf_moe_gate_params_from_config(mlaf_preset_find("deepseek-v4-flash"));
    c.p.top_k = ps.k;
    c.p.n_group = c.p.topk_group = 1;
    c.p.score_func = ps.sf;
    c.p.renormalize = ps.renorm;
    c.p.apply_routed_scaling = ps.apply;
    c.p.routed_scaling_factor = ps.scale;
    c.p.eps = ps.eps;
    c.p.n_shared_experts = ps.S;
    c.T = T;
    c.K = ps.k + ps.S;
    c.ostride = c.K + ps.pad;
    const mlaf_dtype wdt = ps.w_in_ldt ? in.ldt : MLAF_F32;
    c.wsz = mlaf_dtype_size(wdt);
    c.o = o;
    c.logits = mlaf_tensor_2d(in.logits, in.ldt, T, in.E, in.lstride);
    c.tab = mlaf_tensor_2d(in.tab, in.tdt, in.vocab, ps.k, in.tstride);
    c.tok = mlaf_tensor_1d(in.tok, in.kdt, T);
    c.weights = mlaf_tensor_2d(o.w, wdt, T, c.K, c.ostride);
    c.ids = mlaf_tensor_2d(o.ids, MLAF_I32, T, c.K, c.ostride);
    c.ec = mlaf_tensor_1d(o.ec, MLAF_I32, 1);
    if ((size_t)(T * c.ostride) > kOutCap) {
        fprintf(stderr, "output capacity exceeded\n");
        exit(1);
    }
    mlaf_moe_gate_job job;
    API(mlaf_check_moe_gate_hash(g_ctx, &c.p, &c.logits, &c.tab, &c.tok, &c.weights, &c.ids, NULL, &c.ec, &job));
    c.a = gate_args_of(job);
    return c;
}

struct Variant {
    std::string name;
    std::function<void(const Call &, cudaStream_t)> fn;
};

template <typename T> static std::vector<Variant> variants() {
    std::vector<Variant> v;
    v.push_back({"v0 warp per token", [](const Call &c, cudaStream_t s) {
                     if (c.a.T > 0) launch_hash_warp<T>(c.a, g_sm, s);
                 }});
    v.push_back({"library (API)", [](const Call &c, cudaStream_t s) {
                     API(mlaf_context_set_cuda_stream(g_ctx, (void *)s));
                     API(mlaf_moe_gate_hash(g_ctx, &c.p, &c.logits, &c.tab, &c.tok, &c.weights, &c.ids, NULL, &c.ec));
                 }});
    v.push_back({"v1 thread/token F=0", [](const Call &c, cudaStream_t s) { launch_v1<T, 0>(c.a, s); }});
    v.push_back({"v1 thread/token F=1", [](const Call &c, cudaStream_t s) { launch_v1<T, 1>(c.a, s); }});
    v.push_back({"v1 thread/token F=3", [](const Call &c, cudaStream_t s) { launch_v1<T, 3>(c.a, s); }});
    v.push_back({"v1 thread/token F=4", [](const Call &c, cudaStream_t s) { launch_v1<T, 4>(c.a, s); }});
    v.push_back({"v1 thread/token F=5", [](const Call &c, cudaStream_t s) { launch_v1<T, 5>(c.a, s); }});
    v.push_back({"v2 8 lanes/token shfl", [](const Call &c, cudaStream_t s) { launch_v2<T, false>(c.a, s); }});
    v.push_back({"v2 8 lanes/token match", [](const Call &c, cudaStream_t s) { launch_v2<T, true>(c.a, s); }});
    return v;
}

/* Registers, local memory and resident blocks of the variants' kernels. */
template <typename T> static void print_kernels(const char *dtn) {
    auto one = [&](const char *name, const void *fn, int threads) {
        cudaFuncAttributes at;
        CK(cudaFuncGetAttributes(&at, fn));
        int res = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&res, fn, threads, 0));
        printf("  %-5s %-24s %3d registers, %3zu B local, %5zu B shared, %2d blocks of %d per SM\n", dtn, name,
               at.numRegs, at.localSizeBytes, at.sharedSizeBytes, res, threads);
    };
    one("v0 (moe_gate_hash)", (const void *)moe_gate_hash_kernel<T>, kHashWarps * 32);
    one("v1 F=0", (const void *)hash_v1_kernel<T, 0>, kV1Threads);
    one("v1 F=1", (const void *)hash_v1_kernel<T, 1>, kV1Threads);
    one("v1 F=3", (const void *)hash_v1_kernel<T, 3>, kV1Threads);
    one("v1 F=4", (const void *)hash_v1_kernel<T, 4>, kV1Threads);
    one("v1 F=5", (const void *)hash_v1_kernel<T, 5>, kV1Threads);
    one("v2 shfl", (const void *)hash_v2_kernel<T, false>, kV2Warps * 32);
    one("v2 match", (const void *)hash_v2_kernel<T, true>, kV2Warps * 32);
}

/* ---- comparison ------------------------------------------------------------------------------ */
static const unsigned char kFill0 = 0xff, kFill1 = 0xa5; /* v0's / the variant's output fill */
static const int32_t kEcStart = 5;

static void prefill(const Call &c, unsigned char fill) {
    CK(cudaMemset(c.o.ids, fill, (size_t)(c.T * c.ostride) * 4));
    CK(cudaMemset(c.o.w, fill, (size_t)(c.T * c.ostride) * c.wsz));
    CK(cudaMemcpy(c.o.ec, &kEcStart, 4, cudaMemcpyHostToDevice));
}

struct Got {
    std::vector<int32_t> ids;
    std::vector<unsigned char> w;
    int32_t ec;
};
static Got fetch(const Call &c) {
    Got g;
    g.ids.resize((size_t)(c.T * c.ostride));
    g.w.resize((size_t)(c.T * c.ostride) * c.wsz);
    CK(cudaMemcpy(g.ids.data(), c.o.ids, g.ids.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g.w.data(), c.o.w, g.w.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&g.ec, c.o.ec, 4, cudaMemcpyDeviceToHost));
    return g;
}

/* Runs v0 on c0 and v on c1 (same call, other outputs), compares bit for bit: "" when equal. */
static std::string compare(const Variant &v0, const Variant &v, const Call &c0, const Call &c1, Got *ref) {
    prefill(c0, kFill0);
    prefill(c1, kFill1);
    v0.fn(c0, 0);
    v.fn(c1, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    const Got a = fetch(c0), b = fetch(c1);
    char why[256] = "";
    for (int64_t t = 0; t < c0.T && !why[0]; t++)
        for (int64_t j = 0; j < c0.ostride && !why[0]; j++) {
            const size_t i = (size_t)(t * c0.ostride + j);
            const unsigned char *wa = &a.w[i * c0.wsz], *wb = &b.w[i * c0.wsz];
            if (j < c0.K) {
                if (a.ids[i] != b.ids[i])
                    snprintf(why, sizeof why, "token %lld slot %lld: id %d, v0 %d", (long long)t, (long long)j,
                             b.ids[i], a.ids[i]);
                else if (memcmp(wa, wb, c0.wsz)) {
                    uint32_t ua = 0, ub = 0;
                    memcpy(&ua, wa, c0.wsz), memcpy(&ub, wb, c0.wsz);
                    snprintf(why, sizeof why, "token %lld slot %lld: weight bits %08x, v0 %08x", (long long)t,
                             (long long)j, ub, ua);
                }
            } else { /* padding columns: untouched */
                int32_t fi;
                memset(&fi, kFill1, 4);
                bool clean = b.ids[i] == fi;
                for (size_t q = 0; q < c0.wsz; q++) clean = clean && wb[q] == kFill1;
                if (!clean) snprintf(why, sizeof why, "token %lld padding column %lld written", (long long)t, (long long)j);
            }
        }
    if (!why[0] && a.ec != b.ec) snprintf(why, sizeof why, "error count %d, v0 %d", b.ec, a.ec);
    if (ref) *ref = a;
    return why;
}

/* ---- validation inputs --------------------------------------------------------------------- */
static const int kE = 256;
static const int64_t kValT = 4099, kValVocab = 1000, kValCols = 10, kValTStride = 12, kValLStride = kE + 8;

struct HostVal {
    std::vector<int64_t> tab64, tok64; /* values as written into the int64 arrays */
    std::vector<int32_t> tab32, tok32;
    std::vector<float> lg;             /* [kValT][kValLStride], f32 */
};

static HostVal make_val_host() {
    HostVal h;
    dev_rng r(11);
    h.tab64.assign((size_t)(kValVocab * kValTStride), -7); /* padding: never read */
    std::vector<int64_t> perm(kE);
    for (int64_t v = 0; v < kValVocab; v++) {
        for (int e = 0; e < kE; e++) perm[e] = e;
        for (int64_t j = 0; j < kValCols; j++) {
            const int64_t s = j + (int64_t)(r.next() % (uint64_t)(kE - j));
            std::swap(perm[j], perm[s]);
            h.tab64[(size_t)(v * kValTStride + j)] = perm[j];
        }
    }
    auto at = [&](int64_t v, int64_t j) -> int64_t & { return h.tab64[(size_t)(v * kValTStride + j)]; };
    at(5, 2) = kE;                         /* out of range (k >= 3) */
    at(6, 0) = -1;                         /* out of range */
    at(7, 4) = at(7, 1);                   /* duplicate (k >= 5) */
    at(8, 5) = at(8, 0);                   /* duplicate (k >= 6) */
    at(9, 9) = at(9, 8);                   /* duplicate only for k = 10 */
    at(10, 3) = (1ll << 32) + at(10, 0);   /* int64: out of range; int32: a duplicate of entry 0 */
    at(11, 1) = (1ll << 32) + 7;           /* int64: out of range; int32: 7 */
    for (int j = 0; j < kValCols; j++) at(12, j) = j == 0 ? kE - 1 : j - 1; /* the range's ends */
    at(13, 7) = at(13, 6);                 /* duplicate for k >= 8 */
    h.tab32.resize(h.tab64.size());
    for (size_t i = 0; i < h.tab64.size(); i++) h.tab32[i] = (int32_t)h.tab64[i];

    h.tok64.resize(kValT);
    for (int64_t t = 0; t < kValT; t++) {
        int64_t v = (int64_t)(r.next() % (uint64_t)kValVocab);
        if (t % 17 == 0) v = 5 + (t / 17) % 10; /* the rows above, often (token 0: row 5) */
        if (t % 97 == 5) v = kValVocab;
        if (t % 101 == 7) v = -1;
        if (t % 103 == 9) v = -(1ll << 40); /* int32: 0 */
        if (t % 107 == 11) v = (1ll << 32) + 3; /* int32: 3 */
        h.tok64[t] = v;
    }
    h.tok32.resize(kValT);
    for (int64_t t = 0; t < kValT; t++) h.tok32[t] = (int32_t)h.tok64[t];

    const float qnan = nanf(""), inf = INFINITY;
    h.lg.resize((size_t)(kValT * kValLStride));
    for (int64_t t = 0; t < kValT; t++) {
        float *row = &h.lg[(size_t)(t * kValLStride)];
        for (int e = 0; e < kE; e++) row[e] = (float)(r.uniform() * 8.0 - 4.0);
        for (int64_t e = kE; e < kValLStride; e++) row[e] = qnan; /* padding: never read */
        const int64_t v = h.tok64[t];
        if (v < 0 || v >= kValVocab) continue;
        auto put = [&](int j, float x) {
            const int64_t e = at(v, j % kValCols);
            if (e >= 0 && e < kE) row[e] = x;
        };
        if (t % 9 == 1) put((int)(t % 6), qnan);
        if (t % 10 == 2) put((int)((t + 1) % 6), inf);
        if (t % 11 == 3) put((int)((t + 2) % 6), -inf);
        if (t % 12 == 4) put((int)(t % 8), 30.0f);   /* sqrt(x) branch */
        if (t % 13 == 6) put((int)(t % 8), -30.0f);  /* exp(x / 2) branch */
        if (t % 14 == 7) put((int)(t % 3), 20.0f);   /* the boundaries: log1p(exp(x)) */
        if (t % 15 == 8) put((int)(t % 3), -20.0f);
        if (t % 16 == 9) put((int)(t % 5), 20.5f);
        if (t % 19 == 10) { /* every routed logit of the row non-finite: sum 0 */
            for (int j = 0; j < kValCols; j++) put(j, j % 2 ? inf : qnan);
        }
    }
    return h;
}

/* float64 reference of one call on the validation inputs: ids and the error count exact,
 * weights within tol relative (absolute below 1e-30). Returns "" when v0 agrees. */
static std::string check_ref(const HostVal &h, const Call &c, bool i64_tok, bool i64_tab, bool bf16, const Got &g) {
    const int k = c.p.top_k, K = c.K;
    int32_t bad_rows = 0;
    double worst = 0;
    const double tol = c.wsz == 4 ? 1e-5 : 8e-3;
    for (int64_t t = 0; t < c.T; t++) {
        const int64_t v = i64_tok ? h.tok64[t] : (int64_t)h.tok32[t];
        bool bad = v < 0 || v >= kValVocab;
        std::vector<int64_t> e(k, -1);
        for (int j = 0; j < k && !bad; j++) {
            const size_t i = (size_t)(v * kValTStride + j);
            e[j] = i64_tab ? h.tab64[i] : (int64_t)h.tab32[i];
            bad = e[j] < 0 || e[j] >= kE;
            for (int m = 0; m < j && !bad; m++) bad = e[m] == e[j];
        }
        bad_rows += bad;
        std::vector<double> w(k, 0.0);
        double sum = 0;
        for (int j = 0; j < k && !bad; j++) {
            float xf = h.lg[(size_t)(t * kValLStride + e[j])];
            if (bf16) xf = bf2f(f2bf(xf));
            const double x = xf;
            if (!std::isfinite(x)) continue;
            w[j] = c.p.score_func == MLAF_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-x))
                   : x > 20.0                          ? sqrt(x)
                   : x < -20.0                         ? exp(0.5 * x)
                                                       : sqrt(log1p(exp(x)));
            sum += w[j];
        }
        double routed = sum;
        if (c.p.renormalize) {
            const double denom = sum + (double)c.p.eps;
            if (denom > 0)
                for (auto &x : w) x /= denom;
            routed = 0;
            for (double x : w) routed += x;
        }
        if (c.p.apply_routed_scaling)
            for (auto &x : w) x *= c.p.routed_scaling_factor;
        const double shared_w = routed / c.p.routed_scaling_factor;
        for (int j = 0; j < K; j++) {
            const size_t i = (size_t)(t * c.ostride + j);
            const int32_t want = j < k ? (bad ? j : (int32_t)e[j]) : kE + (j - k);
            char why[200];
            if (g.ids[i] != want) {
                snprintf(why, sizeof why, "token %lld slot %d: v0 id %d, reference %d", (long long)t, j, g.ids[i], want);
                return why;
            }
            float got;
            if (c.wsz == 4) memcpy(&got, &g.w[i * 4], 4);
            else {
                uint16_t u;
                memcpy(&u, &g.w[i * 2], 2);
                got = bf2f(u);
            }
            const double ref = j < k ? w[j] : shared_w;
            const double err = fabs(ref) < 1e-30 ? fabs(got - ref) : fabs(got - ref) / fabs(ref);
            if (!(err <= tol)) {
                snprintf(why, sizeof why, "token %lld slot %d: v0 weight %.9g, reference %.9g", (long long)t, j,
                         (double)got, ref);
                return why;
            }
            worst = std::max(worst, err);
        }
    }
    if (g.ec != kEcStart + bad_rows) {
        char why[120];
        snprintf(why, sizeof why, "v0 error count %d, reference %d", g.ec - kEcStart, bad_rows);
        return why;
    }
    return "";
}

static const Params kValParams[] = {
    {"V4 (k 6)", 6, 0, MLAF_SCORE_SQRT_SOFTPLUS, 1, 1, 1.5f, 1e-20f, false, 0},
    {"V4 + 2 shared, weights in the logits' dtype, padded", 6, 2, MLAF_SCORE_SQRT_SOFTPLUS, 1, 1, 1.5f, 1e-20f, true,
     3},
    {"sigmoid k 3, no renormalization or scaling, eps 0", 3, 0, MLAF_SCORE_SIGMOID, 0, 0, 1.0f, 0.0f, false, 0},
    {"k 8 + 1 shared, eps 0, no scaling", 8, 1, MLAF_SCORE_SQRT_SOFTPLUS, 1, 0, 2.5f, 0.0f, false, 1},
    {"k 10 (the fallback)", 10, 1, MLAF_SCORE_SQRT_SOFTPLUS, 1, 1, 1.5f, 1e-20f, false, 0},
};

static const char *idx_name(mlaf_dtype d) { return d == MLAF_I64 ? "i64" : "i32"; }

template <typename T>
static void validate_dtype(const HostVal &h, const char *dtn, mlaf_dtype ldt, const Outs &o0, const Outs &o1) {
    const bool bf16 = sizeof(T) == 2;
    /* device copies of the validation inputs */
    void *lg, *tab32, *tab64, *tok32, *tok64;
    const size_t nl = h.lg.size();
    CK(cudaMalloc(&lg, nl * sizeof(T)));
    if (bf16) {
        std::vector<uint16_t> b(nl);
        for (size_t i = 0; i < nl; i++) b[i] = f2bf(h.lg[i]);
        CK(cudaMemcpy(lg, b.data(), nl * 2, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemcpy(lg, h.lg.data(), nl * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&tab32, h.tab32.size() * 4));
    CK(cudaMalloc(&tab64, h.tab64.size() * 8));
    CK(cudaMalloc(&tok32, h.tok32.size() * 4));
    CK(cudaMalloc(&tok64, h.tok64.size() * 8));
    CK(cudaMemcpy(tab32, h.tab32.data(), h.tab32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tab64, h.tab64.data(), h.tab64.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tok32, h.tok32.data(), h.tok32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tok64, h.tok64.data(), h.tok64.size() * 8, cudaMemcpyHostToDevice));
    const auto vs = variants<T>();
    const int64_t Ts[] = {1, 33, kValT};
    for (int ti = 0; ti < 2; ti++)
        for (int ki = 0; ki < 2; ki++) {
            const mlaf_dtype kdt = ki ? MLAF_I64 : MLAF_I32, tdt = ti ? MLAF_I64 : MLAF_I32;
            Inputs in{kValT, kE, lg, ldt, kValLStride, ti ? tab64 : tab32, tdt, kValVocab, kValCols, kValTStride,
                      ki ? tok64 : tok32, kdt};
            int checks = 0, fails = 0;
            for (const Params &ps : kValParams)
                for (int64_t nT : Ts) {
                    const Call c0 = make_call(in, nT, ps, o0), c1 = make_call(in, nT, ps, o1);
                    for (size_t vi = 1; vi < vs.size(); vi++) {
                        Got ref;
                        const std::string why = compare(vs[0], vs[vi], c0, c1, vi == 1 ? &ref : nullptr);
                        checks++;
                        if (!why.empty()) {
                            fails++;
                            printf("  validate %s, %s ids / %s table, %s, T = %lld: %-24s FAIL (%s)\n", dtn,
                                   idx_name(kdt), idx_name(tdt), ps.name, (long long)nT, vs[vi].name.c_str(),
                                   why.c_str());
                        }
                        if (vi == 1) {
                            const std::string rwhy = check_ref(h, c0, ki != 0, ti != 0, bf16, ref);
                            checks++;
                            if (!rwhy.empty()) {
                                fails++;
                                printf("  validate %s, %s ids / %s table, %s, T = %lld: v0 against float64 FAIL (%s)\n",
                                       dtn, idx_name(kdt), idx_name(tdt), ps.name, (long long)nT, rwhy.c_str());
                            }
                        }
                    }
                }
            printf("  validate %-4s logits, %s token ids / %s table: %d checks, %s\n", dtn, idx_name(kdt), idx_name(tdt),
                   checks, fails ? "FAIL" : "OK (every variant bit-identical to v0, v0 = float64 reference)");
            fflush(stdout);
            dev_failures += fails;
        }
    CK(cudaFree(lg));
    CK(cudaFree(tab32));
    CK(cudaFree(tab64));
    CK(cudaFree(tok32));
    CK(cudaFree(tok64));
}

/* ---- timing inputs (as mlafuse bench --hash) ------------------------------------------------ */
static const int64_t kVocab = 129280; /* tools/bench_cmd.c HASH_VOCAB */
static const int64_t kMaxT = 131072;
static const int kK = 6;

/* uniform in [-4, 4), as the bench's logits; the bf16 values are the f32 ones rounded */
template <typename T> __global__ void fill_logits(T *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
        mlaf_st(p + i, (float)(h >> 40) * (8.0f / 16777216.0f) - 4.0f);
    }
}

template <typename T>
static void bench_dtype(const char *dtn, mlaf_dtype ldt, bool quick, const std::vector<int64_t> &ts, const Outs &o0, const Outs &o1, void *tab32,
                        void *tab64, void *tok32, void *tok64, void *cpy_a, void *cpy_b, const flusher &fl) {
    T *lg;
    const size_t nl = (size_t)kMaxT * kE;
    CK(cudaMalloc(&lg, nl * sizeof(T)));
    fill_logits<T><<<1024, 256>>>(lg, nl, 0x6d6c6166ull);
    CK(cudaDeviceSynchronize());
    const auto vs = variants<T>();
    std::vector<int64_t> Ts = {1, 64, 4096, 32768, kMaxT};
    if (quick) Ts = {kMaxT};
    if (!ts.empty()) Ts = ts;
    const Params ps = kValParams[0];
    const mlaf_dtype idx[3][2] = {{MLAF_I64, MLAF_I32}, {MLAF_I32, MLAF_I32}, {MLAF_I64, MLAF_I64}};
    for (const auto &ix : idx) {
        const mlaf_dtype kdt = ix[0], tdt = ix[1];
        if (!ts.empty() && !(kdt == MLAF_I64 && tdt == MLAF_I32)) continue; /* --ts: the bench's ids only */
        Inputs in{kMaxT, kE, lg, ldt, kE, tdt == MLAF_I64 ? tab64 : tab32, tdt, kVocab, kK, kK,
                  kdt == MLAF_I64 ? tok64 : tok32, kdt};
        printf("\n%s logits, %s token ids, %s table (deepseek-v4-flash: E %d, k %d, sqrt_softplus, x1.5; f32 "
               "weights)%s\n",
               dtn, idx_name(kdt), idx_name(tdt), kE, kK, kdt == MLAF_I64 && tdt == MLAF_I32 ? ", as mlafuse bench" : "");
        for (int64_t nT : Ts) {
            const Call c0 = make_call(in, nT, ps, o0), c1 = make_call(in, nT, ps, o1);
            for (size_t vi = 1; vi < vs.size(); vi++) { /* bit for bit at this T first */
                const std::string why = compare(vs[0], vs[vi], c0, c1, nullptr);
                if (!why.empty()) {
                    printf("  validate T = %lld %-24s FAIL (%s)\n", (long long)nT, vs[vi].name.c_str(), why.c_str());
                    dev_failures++;
                }
            }
            const double bytes = (double)nT * ((double)mlaf_dtype_size(kdt) + kK * (double)mlaf_dtype_size(tdt) +
                                              kK * (double)sizeof(T)) +
                                 (double)nT * kK * 8.0;
            size_t n = (size_t)(bytes / 2.0);
            n = std::max<size_t>(16, (n + 15) / 16 * 16);
            const bool graph = nT <= 64;
            auto timed = [&](const std::function<void(cudaStream_t)> &fn) {
                if (graph) return graph_us([&](cudaStream_t s, int) { fn(s); });
                return flushed_us(fl, [&]() { fn(0); }, 21);
            };
            const double cpy = timed([&](cudaStream_t s) { CK(cudaMemcpyAsync(cpy_b, cpy_a, n, cudaMemcpyDeviceToDevice, s)); });
            printf("  T = %-7lld memcpy of the same bytes (%.0f B read + written) %8.2f us%s\n", (long long)nT, bytes,
                   cpy, graph ? "   (per call, 100 calls in a CUDA graph)" : "   (L2 flushed, median of 21)");
            for (const Variant &v : vs) {
                const double us = timed([&](cudaStream_t s) { v.fn(c0, s); });
                printf("    %-26s T = %-7lld %9.2f us %7.2fx memcpy\n", v.name.c_str(), (long long)nT, us, us / cpy);
            }
            API(mlaf_context_set_cuda_stream(g_ctx, NULL));
        }
    }
    CK(cudaFree(lg));
}

int main(int argc, char **argv) {
    bool quick = false;
    std::vector<int64_t> ts;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--ts") && i + 1 < argc) {
            for (char *p = argv[++i]; *p;) {
                const long long v = strtoll(p, &p, 10);
                if (v < 1 || v > kMaxT) {
                    fprintf(stderr, "--ts: token counts in 1 .. %lld\n", (long long)kMaxT);
                    return 2;
                }
                ts.push_back(v);
                if (*p == ',') p++;
            }
        } else {
            fprintf(stderr, "usage: %s [--quick] [--ts T1,T2,...]\n", argv[0]);
            return 2;
        }
    }
    print_device();
    g_sm = sm_count();
    API(mlaf_context_create(&g_ctx, MLAF_BACKEND_CUDA));
    print_kernels<float>("f32");
    print_kernels<__nv_bfloat16>("bf16");

    Outs o[2];
    for (auto &x : o) {
        CK(cudaMalloc(&x.ids, kOutCap * 4));
        CK(cudaMalloc(&x.w, kOutCap * 4));
        CK(cudaMalloc(&x.ec, 4));
    }

    printf("\nvalidation: T = 1, 33, %lld; %d parameter sets; bad rows, non-finite and |x| >= 20 logits\n",
           (long long)kValT, (int)(sizeof kValParams / sizeof kValParams[0]));
    fflush(stdout);
    const HostVal h = make_val_host();
    validate_dtype<float>(h, "f32", MLAF_F32, o[0], o[1]);
    validate_dtype<__nv_bfloat16>(h, "bf16", MLAF_BF16, o[0], o[1]);
    if (dev_failures) {
        printf("\nFAIL (%d)\n", dev_failures);
        return 1;
    }

    /* the bench's table: k distinct experts per token id; uniform token ids */
    dev_rng r(0x6d6c6166ull);
    std::vector<int64_t> tab64((size_t)(kVocab * kK)), tok64(kMaxT);
    std::vector<int32_t> tab32(tab64.size()), tok32(kMaxT);
    std::vector<int32_t> perm(kE);
    for (int e = 0; e < kE; e++) perm[e] = e;
    for (int64_t v = 0; v < kVocab; v++)
        for (int j = 0; j < kK; j++) {
            const int s = j + (int)(r.next() % (uint64_t)(kE - j));
            std::swap(perm[j], perm[s]);
            tab64[(size_t)(v * kK + j)] = perm[j];
            tab32[(size_t)(v * kK + j)] = perm[j];
        }
    for (int64_t t = 0; t < kMaxT; t++) {
        tok64[t] = (int64_t)(r.next() % (uint64_t)kVocab);
        tok32[t] = (int32_t)tok64[t];
    }
    void *d_tab32, *d_tab64, *d_tok32, *d_tok64, *cpy_a, *cpy_b;
    CK(cudaMalloc(&d_tab32, tab32.size() * 4));
    CK(cudaMalloc(&d_tab64, tab64.size() * 8));
    CK(cudaMalloc(&d_tok32, tok32.size() * 4));
    CK(cudaMalloc(&d_tok64, tok64.size() * 8));
    CK(cudaMemcpy(d_tab32, tab32.data(), tab32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tab64, tab64.data(), tab64.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tok32, tok32.data(), tok32.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tok64, tok64.data(), tok64.size() * 8, cudaMemcpyHostToDevice));
    const size_t cpy_cap = (size_t)kMaxT * 128; /* > half the op's bytes at kMaxT */
    CK(cudaMalloc(&cpy_a, cpy_cap));
    CK(cudaMalloc(&cpy_b, cpy_cap));
    CK(cudaMemset(cpy_a, 1, cpy_cap));
    flusher fl;
    bench_dtype<float>("f32", MLAF_F32, quick, ts, o[0], o[1], d_tab32, d_tab64, d_tok32, d_tok64, cpy_a, cpy_b, fl);
    bench_dtype<__nv_bfloat16>("bf16", MLAF_BF16, quick, ts, o[0], o[1], d_tab32, d_tab64, d_tok32, d_tok64, cpy_a, cpy_b,
                               fl);
    CK(cudaFree(d_tab32));
    CK(cudaFree(d_tab64));
    CK(cudaFree(d_tok32));
    CK(cudaFree(d_tok64));
    CK(cudaFree(cpy_a));
    CK(cudaFree(cpy_b));
    for (auto &x : o) {
        CK(cudaFree(x.ids));
        CK(cudaFree(x.w));
        CK(cudaFree(x.ec));
    }
    mlaf_context_free(g_ctx);
    printf(dev_failures ? "\nFAIL (%d)\n" : "\nall variants validated (%d failures)\n", dev_failures);
    return dev_failures ? 1 : 0;
}
