/*
 * test_pdl.cu — programmatic dependent launch (mlaf_context_set_cuda_pdl).
 *
 * The setting's checks (a CPU context refuses it; sm_90 takes it, older devices refuse it), then
 * a chain of ops where each reads what the one before wrote: split_qk_norm in place on the
 * latent -> mla_kv_cache from that latent (q and the paged cache) -> rope_q in place on its q
 * viewed as heads -> moe_gate on that q viewed as logits (512 experts; and 511 experts of the same
 * rows, which only the general kernel takes from T = 65). The chain runs three times back to
 * back with the setting off, then on (eagerly, and captured in a CUDA graph, where the launches
 * become programmatic edges), from the same inputs: every output byte must be equal. A kernel
 * that read its inputs before waiting on the kernel before it would see stale data and differ.
 * T covers the row kernel's block, warp and bulk shapes, the router's tiny, team and general
 * kernels and more than 65536 tokens; two T run on the legacy default stream too (eagerly).
 * Setting 2 (early reads: the row ops' weights, positions, slots and cos / sin before the wait) runs
 * the same chain at the block shapes' T: the kernel before each op writes only its activations, as
 * the setting requires. The API: 0, 1 and 2 taken on sm_90+, other values refused.
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "testlib.h"
}

namespace {

constexpr int kQ = 512, kC = 512, kR = 64, kW = kQ + kC + kR, kE = 512, kK = 8, kBlock = 64;
constexpr int kMaxPos = 8192, kReps = 3;

uint64_t g_rng = 0x243f6a8885a308d3ull;
uint32_t rnd() {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)g_rng;
}
uint16_t bf16_of(float f) { /* round to nearest even; finite inputs only */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float rnd_unit() { return ((int32_t)(rnd() >> 8) - (1 << 23)) / (float)(1 << 23); }

mlaf_tensor view(void *p, mlaf_dtype dt, int nd, const int64_t *shape, const int64_t *stride) {
    mlaf_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p, t.dtype = dt, t.ndim = nd;
    for (int i = 0; i < nd; i++) t.shape[i] = shape[i], t.stride[i] = stride[i];
    return t;
}

bool ck(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    tl_case(0, what, "%s", cudaGetErrorString(e));
    return false;
}

/* Device buffers of one chain and its host inputs. */
struct Chain {
    int64_t T = 0, nblocks = 0;
    std::vector<uint16_t> latent_h, wq_h, wkv_h;
    std::vector<int64_t> pos_h, slot_h;
    std::vector<float> cs_h, bias_h;
    void *latent = nullptr, *wq = nullptr, *wkv = nullptr, *pos = nullptr, *cs = nullptr,
         *slot = nullptr, *cache = nullptr, *q = nullptr, *bias = nullptr, *w = nullptr,
         *ids = nullptr, *w2 = nullptr, *ids2 = nullptr;

    size_t latent_b() const { return (size_t)T * kW * 2; }
    size_t cache_b() const { return (size_t)nblocks * kBlock * (kC + kR) * 2; }
    size_t q_b() const { return (size_t)T * kQ * 2; }
    size_t out_b() const { return (size_t)T * kK * 4; }

    bool alloc(int64_t t) {
        T = t;
        nblocks = (T + kBlock - 1) / kBlock + 1;
        latent_h.resize((size_t)T * kW);
        for (auto &v : latent_h) v = bf16_of(2.0f * rnd_unit());
        wq_h.resize(kQ), wkv_h.resize(kC);
        for (auto &v : wq_h) v = bf16_of(1.0f + 0.25f * rnd_unit());
        for (auto &v : wkv_h) v = bf16_of(1.0f + 0.25f * rnd_unit());
        pos_h.resize(T), slot_h.resize(T);
        std::vector<int64_t> perm((size_t)nblocks * kBlock);
        for (size_t i = 0; i < perm.size(); i++) perm[i] = (int64_t)i;
        for (size_t i = perm.size() - 1; i > 0; i--) std::swap(perm[i], perm[rnd() % (i + 1)]);
        for (int64_t i = 0; i < T; i++) pos_h[i] = rnd() % kMaxPos, slot_h[i] = perm[i];
        cs_h.resize((size_t)kMaxPos * kR);
        if (mlaf_rope_table_init(cs_h.data(), kMaxPos, kR, 10000.0) != MLAF_OK) return false;
        bias_h.resize(kE);
        for (auto &v : bias_h) v = 0.05f * rnd_unit();
        return ck(cudaMalloc(&latent, latent_b()), "cudaMalloc") &&
               ck(cudaMalloc(&wq, kQ * 2), "cudaMalloc") && ck(cudaMalloc(&wkv, kC * 2), "cudaMalloc") &&
               ck(cudaMalloc(&pos, T * 8), "cudaMalloc") &&
               ck(cudaMalloc(&cs, cs_h.size() * 4), "cudaMalloc") &&
               ck(cudaMalloc(&slot, T * 8), "cudaMalloc") && ck(cudaMalloc(&cache, cache_b()), "cudaMalloc") &&
               ck(cudaMalloc(&q, q_b()), "cudaMalloc") && ck(cudaMalloc(&bias, kE * 4), "cudaMalloc") &&
               ck(cudaMalloc(&w, out_b()), "cudaMalloc") && ck(cudaMalloc(&ids, out_b()), "cudaMalloc") &&
               ck(cudaMalloc(&w2, out_b()), "cudaMalloc") && ck(cudaMalloc(&ids2, out_b()), "cudaMalloc");
    }
    /* The same starting state for every run: inputs uploaded, outputs and cache zeroed. */
    bool reset() {
        return ck(cudaMemcpy(latent, latent_h.data(), latent_b(), cudaMemcpyHostToDevice), "upload") &&
               ck(cudaMemcpy(wq, wq_h.data(), kQ * 2, cudaMemcpyHostToDevice), "upload") &&
               ck(cudaMemcpy(wkv, wkv_h.data(), kC * 2, cudaMemcpyHostToDevice), "upload") &&
               ck(cudaMemcpy(pos, pos_h.data(), T * 8, cudaMemcpyHostToDevice), "upload") &&
               ck(cudaMemcpy(cs, cs_h.data(), cs_h.size() * 4, cudaMemcpyHostToDevice), "upload") &&
               ck(cudaMemcpy(slot, slot_h.data(), T * 8, cudaMemcpyHostToDevice), "upload") &&
               ck(cudaMemcpy(bias, bias_h.data(), kE * 4, cudaMemcpyHostToDevice), "upload") &&
               ck(cudaMemset(cache, 0, cache_b()), "memset") && ck(cudaMemset(q, 0, q_b()), "memset") &&
               ck(cudaMemset(w, 0, out_b()), "memset") && ck(cudaMemset(ids, 0, out_b()), "memset") &&
               ck(cudaMemset(w2, 0, out_b()), "memset") && ck(cudaMemset(ids2, 0, out_b()), "memset") &&
               ck(cudaDeviceSynchronize(), "sync");
    }
    /* Every output, in one host buffer. */
    std::vector<unsigned char> state() const {
        std::vector<unsigned char> s(latent_b() + cache_b() + q_b() + 4 * out_b());
        size_t o = 0;
        const void *src[7] = {latent, cache, q, w, ids, w2, ids2};
        const size_t n[7] = {latent_b(), cache_b(), q_b(), out_b(), out_b(), out_b(), out_b()};
        for (int i = 0; i < 7; i++) {
            if (cudaMemcpy(s.data() + o, src[i], n[i], cudaMemcpyDeviceToHost) != cudaSuccess) s.clear();
            if (s.empty()) break;
            o += n[i];
        }
        return s;
    }
    void release() {
        void *p[] = {latent, wq, wkv, pos, cs, slot, cache, q, bias, w, ids, w2, ids2};
        for (void *x : p) cudaFree(x);
    }

    /* kReps rounds of the four ops on ctx's stream; returns the first failure's status. */
    mlaf_status run(mlaf_context *ctx) const {
        const int64_t sl[2] = {T, kW}, ls[2] = {kW, 1};
        mlaf_tensor lat = view(latent, MLAF_BF16, 2, sl, ls);
        const int64_t sq[2] = {T, kQ}, sc[2] = {T, kC}, sr[2] = {T, kR};
        mlaf_tensor lq = view(latent, MLAF_BF16, 2, sq, ls);
        mlaf_tensor lk = view((char *)latent + kQ * 2, MLAF_BF16, 2, sc, ls);
        mlaf_tensor lp = view((char *)latent + (kQ + kC) * 2, MLAF_BF16, 2, sr, ls);
        const int64_t s1[1] = {1}, sw[1] = {kQ}, skv[1] = {kC}, sT[1] = {T};
        mlaf_tensor twq = view(wq, MLAF_BF16, 1, sw, s1), twkv = view(wkv, MLAF_BF16, 1, skv, s1);
        mlaf_tensor tpos = view(pos, MLAF_I64, 1, sT, s1), tslot = view(slot, MLAF_I64, 1, sT, s1);
        const int64_t scs[2] = {kMaxPos, kR}, scs_s[2] = {kR, 1};
        mlaf_tensor tcs = view(cs, MLAF_F32, 2, scs, scs_s);
        const int64_t sch[3] = {nblocks, kBlock, kC + kR}, sch_s[3] = {kBlock * (kC + kR), kC + kR, 1};
        mlaf_tensor tcache = view(cache, MLAF_BF16, 3, sch, sch_s);
        const int64_t sqs[2] = {kQ, 1};
        mlaf_tensor tq = view(q, MLAF_BF16, 2, sq, sqs);
        const int64_t sh[3] = {T, 2, kQ / 2}, sh_s[3] = {kQ, kQ / 2, 1};
        mlaf_tensor theads = view(q, MLAF_BF16, 3, sh, sh_s);
        const int64_t se[1] = {kE}, sk[2] = {T, kK}, sk_s[2] = {kK, 1};
        mlaf_tensor tbias = view(bias, MLAF_F32, 1, se, s1);
        mlaf_tensor tw = view(w, MLAF_F32, 2, sk, sk_s), tids = view(ids, MLAF_I32, 2, sk, sk_s);
        /* the general kernel's router: 511 experts, rows of 1022 bytes (not 4-byte units) */
        const int64_t se2[1] = {kE - 1}, sg2[2] = {T, kE - 1};
        mlaf_tensor tq2 = view(q, MLAF_BF16, 2, sg2, sqs), tbias2 = view(bias, MLAF_F32, 1, se2, s1);
        mlaf_tensor tw2 = view(w2, MLAF_F32, 2, sk, sk_s), tids2 = view(ids2, MLAF_I32, 2, sk, sk_s);

        const mlaf_split_qk_norm_params sp = {kQ, kC, kR, 1e-6f, 1e-6f, 0};
        const mlaf_mla_kv_cache_params kp = {kQ, kC, kR, 1e-6f, 1e-6f, MLAF_ROPE_INTERLEAVED, 0};
        const mlaf_rope_params rp = {kR, MLAF_ROPE_NEOX, 0, 0.0f};
        mlaf_moe_gate_params gp;
        memset(&gp, 0, sizeof gp);
        gp.top_k = kK, gp.n_group = 1, gp.topk_group = 1, gp.score_func = MLAF_SCORE_SIGMOID;
        gp.group_score = MLAF_GROUP_TOP2_SUM, gp.renormalize = 1, gp.routed_scaling_factor = 2.5f;
        gp.apply_routed_scaling = 1, gp.eps = 1e-20f, gp.n_shared_experts = 0;
        for (int r = 0; r < kReps; r++) {
            mlaf_status st = mlaf_split_qk_norm(ctx, &sp, &lat, &twq, &twkv, &lq, &lk, &lp);
            if (st == MLAF_OK)
                st = mlaf_mla_kv_cache(ctx, &kp, &lat, &twq, &twkv, &tpos, &tcs, &tslot, &tcache, &tq,
                                       NULL, NULL, NULL);
            if (st == MLAF_OK) st = mlaf_rope_q(ctx, &rp, &theads, &tpos, &tcs, NULL);
            if (st == MLAF_OK) st = mlaf_moe_gate(ctx, &gp, &tq, &tbias, &tw, &tids, NULL);
            if (st == MLAF_OK) st = mlaf_moe_gate(ctx, &gp, &tq2, &tbias2, &tw2, &tids2, NULL);
            if (st != MLAF_OK) return st;
        }
        return MLAF_OK;
    }
};

void test_api(int cuda) {
    mlaf_context *cpu = tl_context(MLAF_BACKEND_CPU);
    if (cpu) {
        tl_case(mlaf_context_set_cuda_pdl(cpu, 1) == MLAF_ERR_INVALID_ARGUMENT && mlaf_context_cuda_pdl(cpu) == 0,
                "PDL(api,backend=cpu)", "a CPU context must refuse the setting");
        tl_case(mlaf_context_set_cuda_pdl(NULL, 1) == MLAF_ERR_NULL_POINTER && mlaf_context_cuda_pdl(NULL) == 0,
                "PDL(api,ctx=NULL)", "NULL must be refused");
        mlaf_context_free(cpu);
    }
    if (!cuda) return;
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CUDA);
    if (!ctx) return;
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    const mlaf_status on = mlaf_context_set_cuda_pdl(ctx, 1);
    if (major >= 9)
        tl_case(on == MLAF_OK && mlaf_context_cuda_pdl(ctx) == 1 && mlaf_context_set_cuda_pdl(ctx, 2) == MLAF_OK &&
                    mlaf_context_cuda_pdl(ctx) == 2 && mlaf_context_set_cuda_pdl(ctx, 3) == MLAF_ERR_INVALID_ARGUMENT &&
                    mlaf_context_cuda_pdl(ctx) == 2 && mlaf_context_set_cuda_pdl(ctx, 0) == MLAF_OK &&
                    mlaf_context_cuda_pdl(ctx) == 0,
                "PDL(api,backend=cuda)", "sm_90+: 0, 1 and 2 must be taken, 3 refused (1: %s)", mlaf_status_name(on));
    else
        tl_case(on == MLAF_ERR_UNSUPPORTED && mlaf_context_cuda_pdl(ctx) == 0 &&
                    mlaf_context_set_cuda_pdl(ctx, 0) == MLAF_OK,
                "PDL(api,backend=cuda)", "below sm_90: on must be refused, off taken (on: %s)",
                mlaf_status_name(on));
    mlaf_context_free(ctx);
}

/* legacy: on the context's default stream (the legacy one), eagerly only (no capture there); level:
 * the PDL setting (1, or 2: early reads). */
void test_chain(int64_t T, bool legacy = false, int level = 1) {
    char name[128];
    snprintf(name, sizeof name, "PDL(chain=split,mla_kv_cache,rope_q,moe_gate,x%d,T=%lld,%s%sbackend=cuda)", kReps,
             (long long)T, legacy ? "legacy stream," : "", level == 2 ? "setting=2," : "");
    mlaf_context *ctx = tl_context(MLAF_BACKEND_CUDA);
    if (!ctx) return;
    cudaStream_t s = nullptr;
    Chain c;
    if ((!legacy && !ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate")) ||
        !c.alloc(T) || mlaf_context_set_cuda_stream(ctx, s) != MLAF_OK) {
        tl_case(0, name, "setup failed");
    } else {
        std::vector<unsigned char> off, on, graph;
        mlaf_status st = MLAF_OK;
        if (c.reset() && (st = c.run(ctx)) == MLAF_OK && ck(cudaStreamSynchronize(s), "sync")) off = c.state();
        if (st == MLAF_OK && mlaf_context_set_cuda_pdl(ctx, level) == MLAF_OK && c.reset() &&
            (st = c.run(ctx)) == MLAF_OK && ck(cudaStreamSynchronize(s), "sync"))
            on = c.state();
        if (legacy) {
            graph = on; /* no capture on the legacy stream */
        } else if (st == MLAF_OK && c.reset()) {
            cudaGraph_t g = nullptr;
            cudaGraphExec_t ge = nullptr;
            if (ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture")) {
                st = c.run(ctx);
                const bool ended = ck(cudaStreamEndCapture(s, &g), "end capture");
                if (st == MLAF_OK && ended && ck(cudaGraphInstantiate(&ge, g, 0), "instantiate") &&
                    ck(cudaGraphLaunch(ge, s), "graph launch") && ck(cudaStreamSynchronize(s), "sync"))
                    graph = c.state();
                if (ge) cudaGraphExecDestroy(ge);
                if (g) cudaGraphDestroy(g);
            }
        }
        if (st != MLAF_OK)
            tl_case(0, name, "an op failed: %s (%s)", mlaf_status_name(st), mlaf_context_last_error(ctx));
        else if (off.empty() || on.empty() || graph.empty())
            tl_case(0, name, "a run did not complete");
        else {
            size_t d_on = 0, d_graph = 0;
            for (size_t i = 0; i < off.size(); i++) d_on += off[i] != on[i], d_graph += off[i] != graph[i];
            tl_case(d_on == 0 && d_graph == 0, name,
                    "%zu bytes differ with PDL, %zu in the PDL graph, of %zu", d_on, d_graph, off.size());
        }
    }
    c.release();
    if (s) cudaStreamDestroy(s);
    mlaf_context_free(ctx);
}

} // namespace

int main(void) {
    const int cuda = tl_cuda();
    test_api(cuda);
    int major = 0;
    if (cuda && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
        major >= 9) {
        const int64_t Ts[] = {1, 7, 64, 1000, 4096, 70000};
        const int n = tl_quick() ? 5 : 6;
        for (int i = 0; i < n; i++) test_chain(Ts[i]);
        test_chain(64, true);
        test_chain(4096, true);
        for (int64_t T : {1, 7, 64, 300}) test_chain(T, false, 2);
    } else if (cuda) {
        tl_skip("PDL(chain,backend=cuda)", "the device is below sm_90");
    }
    return tl_finish();
}
