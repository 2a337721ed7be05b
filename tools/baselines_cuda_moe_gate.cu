/* baselines_cuda_moe_gate.cu — moe_gate's unfused CUDA chains, top-k and hash routing (see baselines_cuda.cuh). */
#include "baselines_cuda.cuh"

namespace {

/* ---- moe_gate ------------------------------------------------------------------------------- */
template <typename T>
__global__ void sigmoid_kernel(const T *x, int64_t xs, int32_t E, float *s, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / E;
        const int32_t e = (int32_t)(idx % E);
        s[idx] = 1.0f / (1.0f + expf(-io<T>::ld(x + t * xs + e)));
    }
}

template <typename T>
__global__ void sqrt_softplus_kernel(const T *x, int64_t xs, int32_t E, float *s, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / E;
        const int32_t e = (int32_t)(idx % E);
        const float v = io<T>::ld(x + t * xs + e); /* torch: F.softplus(x).sqrt() */
        s[idx] = sqrtf(fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v))));
    }
}

/* ids = tid2eid[token_ids] (torch indexing); a bad row takes 0 .. k-1, as the fused op. */
__global__ void hash_ids_kernel(const void *tab, bool tab_i64, int64_t tab_stride, int64_t vocab,
                                const void *tok, bool tok_i64, int32_t E, int32_t k, int32_t *ids,
                                int64_t ids_stride, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / k;
        const int32_t r = (int32_t)(idx % k);
        const int64_t id = tok_i64 ? static_cast<const int64_t *>(tok)[t] : static_cast<const int32_t *>(tok)[t];
        int64_t e = r;
        if (id >= 0 && id < vocab) {
            const int64_t at = id * tab_stride + r;
            e = tab_i64 ? static_cast<const int64_t *>(tab)[at] : static_cast<const int32_t *>(tab)[at];
            if (e < 0 || e >= E) e = r;
        }
        ids[t * ids_stride + r] = (int32_t)e;
    }
}

template <typename T>
__global__ void softmax_kernel(const T *x, int64_t xs, int32_t E, float *s, int64_t rows) {
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x / 32);
    const int lane = threadIdx.x & 31;
    if (t >= rows) return;
    const T *xr = x + t * xs;
    float mx = -INFINITY;
    for (int32_t e = lane; e < E; e += 32) mx = fmaxf(mx, io<T>::ld(xr + e));
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int32_t e = lane; e < E; e += 32) sum += expf(io<T>::ld(xr + e) - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int32_t e = lane; e < E; e += 32) s[t * E + e] = expf(io<T>::ld(xr + e) - mx) / sum;
}

__global__ void bias_kernel(const float *s, const float *bias, int32_t E, float *c, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x)
        c[idx] = s[idx] + (bias ? bias[idx % E] : 0.0f);
}

__global__ void group_score_kernel(const float *c, int32_t E, int32_t G, bool use_max, float *g,
                                   int64_t n) {
    const int32_t per = E / G;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / G;
        const int32_t gi = (int32_t)(idx % G);
        const float *cg = c + t * E + (int64_t)gi * per;
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int32_t e = 0; e < per; e++) {
            float v = isnan(cg[e]) ? -INFINITY : cg[e];
            if (v > b1) {
                b2 = b1;
                b1 = v;
            } else if (v > b2) {
                b2 = v;
            }
        }
        g[idx] = use_max ? b1 : b1 + b2;
    }
}

/* Turns the row's group scores into a 1 / 0 keep mask (topk_group best, ties to the lower
 * group), in place. */
__global__ void group_mask_kernel(float *g, int32_t G, int32_t topk_group, int64_t rows) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows;
         t += (int64_t)gridDim.x * blockDim.x) {
        float *gr = g + t * G;
        uint64_t keep = 0;
        for (int32_t r = 0; r < topk_group; r++) {
            int32_t best = -1;
            for (int32_t gi = 0; gi < G; gi++) {
                if (keep >> gi & 1) continue;
                if (best < 0 || gr[gi] > gr[best]) best = gi;
            }
            if (best >= 0) keep |= (uint64_t)1 << best;
        }
        for (int32_t gi = 0; gi < G; gi++) gr[gi] = (keep >> gi & 1) ? 1.0f : 0.0f;
    }
}

/* m = c in kept groups (non-finite ranks lowest: NaN -> -inf), NaN (never chosen) elsewhere. */
__global__ void masked_fill_kernel(const float *c, const float *g, int32_t E, int32_t G, float *m,
                                   int64_t n) {
    const int32_t per = E / G;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / E;
        const int32_t e = (int32_t)(idx % E);
        const float v = c[idx];
        m[idx] = g[t * G + e / per] != 0.0f ? (isnan(v) ? -INFINITY : v) : NAN;
    }
}

/* A warp per row: k rounds of argmax over the not-yet-taken, kept experts. Lane l owns
 * experts l, l + 32, ... (at most 64 of them for E <= 2048), remembered in a bit mask. */
__global__ void topk_kernel(const float *m, int32_t E, int32_t k, int32_t *ids, int64_t ids_stride,
                            int64_t rows) {
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x / 32);
    const int lane = threadIdx.x & 31;
    if (t >= rows) return;
    const float *mr = m + t * E;
    uint64_t taken = 0;
    for (int32_t r = 0; r < k; r++) {
        float bv = 0.0f;
        int32_t bi = -1;
        for (int32_t e = lane, slot = 0; e < E; e += 32, slot++) {
            const float v = mr[e];
            if ((taken >> slot & 1) || isnan(v)) continue;
            if (bi < 0 || v > bv) { /* ascending e: ties keep the lower index */
                bv = v;
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi < 0) bi = 0; /* unreachable for valid parameters: kept groups hold >= k experts */
        if ((bi & 31) == lane) taken |= (uint64_t)1 << (bi >> 5);
        if (lane == 0) ids[t * ids_stride + r] = bi;
    }
}

__global__ void gather_weights_kernel(const float *s, int32_t E, const int32_t *ids,
                                      int64_t ids_stride, int32_t k, float *w, int64_t n) {
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / k;
        const int32_t r = (int32_t)(idx % k);
        const float v = s[t * E + ids[t * ids_stride + r]];
        w[idx] = isfinite(v) ? v : 0.0f;
    }
}

__global__ void normalize_kernel(float *w, int32_t k, float eps, int64_t rows) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows;
         t += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int32_t r = 0; r < k; r++) sum += w[t * k + r];
        for (int32_t r = 0; r < k; r++) w[t * k + r] /= sum + eps;
    }
}

__global__ void scale_kernel(const float *w, int32_t k, int32_t n_shared, int32_t E, bool apply,
                             float scaling, void *out, mlaf_dtype out_dt, int64_t out_stride,
                             int32_t *ids, int64_t ids_stride, int64_t rows) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < rows;
         t += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int32_t r = 0; r < k; r++) {
            const float v = w[t * k + r];
            sum += v;
            st_any(out, out_dt, t * out_stride + r, apply ? v * scaling : v);
        }
        for (int32_t r = 0; r < n_shared; r++) {
            ids[t * ids_stride + k + r] = E + r;
            st_any(out, out_dt, t * out_stride + k + r, sum / scaling);
        }
    }
}

/* moe_gate's first step: s [T, E] */
template <typename T> void score_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T, TE = rows * j->E;
    const unsigned row_blocks = grid_for(rows, kThreads / 32);
    const T *x = static_cast<const T *>(j->logits);
    if (j->score_func == MLAF_SCORE_SIGMOID)
        sigmoid_kernel<T><<<grid_for(TE, kThreads), kThreads, 0, s>>>(x, j->logits_stride, j->E, sc->s, TE);
    else if (j->score_func == MLAF_SCORE_SQRT_SOFTPLUS)
        sqrt_softplus_kernel<T><<<grid_for(TE, kThreads), kThreads, 0, s>>>(x, j->logits_stride, j->E, sc->s, TE);
    else
        softmax_kernel<T><<<row_blocks, kThreads, 0, s>>>(x, j->logits_stride, j->E, sc->s, rows);
}

int weights_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s);

template <typename T> int moe_gate(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T, TE = rows * j->E;
    const int warps_per_block = kThreads / 32;
    const unsigned row_blocks = grid_for(rows, warps_per_block);
    score_pass<T>(j, sc, s);
    bias_kernel<<<grid_for(TE, kThreads), kThreads, 0, s>>>(sc->s, j->bias, j->E, sc->c, TE);
    group_score_kernel<<<grid_for(rows * j->n_group, kThreads), kThreads, 0, s>>>(
        sc->c, j->E, j->n_group, j->group_score == MLAF_GROUP_MAX, sc->g, rows * j->n_group);
    group_mask_kernel<<<grid_for(rows, kThreads), kThreads, 0, s>>>(sc->g, j->n_group, j->topk_group, rows);
    masked_fill_kernel<<<grid_for(TE, kThreads), kThreads, 0, s>>>(sc->c, sc->g, j->E, j->n_group, sc->m, TE);
    topk_kernel<<<row_blocks, kThreads, 0, s>>>(sc->m, j->E, j->top_k, j->ids, j->ids_stride, rows);
    return weights_pass(j, sc, s);
}

/* hash routing: score -> ids from the table -> gather -> normalize -> scale */
template <typename T> int moe_gate_hash(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T;
    score_pass<T>(j, sc, s);
    hash_ids_kernel<<<grid_for(rows * j->top_k, kThreads), kThreads, 0, s>>>(
        j->tid2eid, j->tid2eid_dt == MLAF_I64, j->tid2eid_stride, j->vocab, j->token_ids,
        j->token_ids_dt == MLAF_I64, j->E, j->top_k, j->ids, j->ids_stride, rows * j->top_k);
    return weights_pass(j, sc, s);
}

/* moe_gate's steps after the ids: gather, normalize, scale (and the shared slots). */
int weights_pass(const mlaf_moe_gate_job *j, const bench_moe_scratch *sc, cudaStream_t s) {
    const int64_t rows = j->T;
    gather_weights_kernel<<<grid_for(rows * j->top_k, kThreads), kThreads, 0, s>>>(
        sc->s, j->E, j->ids, j->ids_stride, j->top_k, sc->w, rows * j->top_k);
    if (j->renormalize)
        normalize_kernel<<<grid_for(rows, kThreads), kThreads, 0, s>>>(sc->w, j->top_k, j->eps, rows);
    scale_kernel<<<grid_for(rows, kThreads), kThreads, 0, s>>>(
        sc->w, j->top_k, j->n_shared, j->E, j->apply_scaling != 0, j->scaling, j->weights,
        j->weights_dt, j->weights_stride, j->ids, j->ids_stride, rows);
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int blg_moe_gate(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, void *stream) {
    if (job->T == 0) return 0;
    return BY_DTYPE(job->logits_dt, moe_gate, job, s, (cudaStream_t)stream);
}

extern "C" int blg_moe_gate_hash(const mlaf_moe_gate_job *job, const bench_moe_scratch *s, void *stream) {
    if (job->T == 0) return 0;
    return BY_DTYPE(job->logits_dt, moe_gate_hash, job, s, (cudaStream_t)stream);
}
