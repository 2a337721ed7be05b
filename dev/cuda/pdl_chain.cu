/*
 * pdl_chain.cu — a decode step's chain of library ops in one CUDA graph, with and without
 * programmatic dependent launch (mlaf_context_set_cuda_pdl).
 *
 * One step = mla_kv_cache (the latent into q_norm and the paged cache) -> rope_q (the q heads,
 * in place) -> moe_gate (the router's logits), the order a layer runs them; for the models with a
 * DSA indexer (glm-5, deepseek-v3.2) the DSA layer's chain instead: mla_kv_cache_dsa (fp8_ds_mla
 * cache, the index key record and the top-k fill) -> rope_q -> indexer_q -> moe_gate. 50 steps are
 * captured in one graph; a sample is one replay (events around it), the figure the median of
 * --reps samples per step (graph_us, dev/cuda/common.cuh). The same graph is captured with the
 * setting off and on (then the launches are programmatic edges: each kernel's launch overlaps
 * the tail of the one before). Every buffer stays in L2 across steps, as in a decode loop. The
 * outputs that do not accumulate (cache, q_norm, router ids and weights) are checked equal
 * between the two graphs.
 *   pdl_chain [--reps N] [--tokens LIST] [--preset NAME|all] [--quick]   (all: glm-4.7-flash,
 *   deepseek-v3, kimi-k2, glm-5, deepseek-v3.2)
 */
#include "common.cuh"
#include "mlafuse.h"

#define MK(x)                                                                                  \
    do {                                                                                       \
        mlaf_status s_ = (x);                                                                  \
        if (s_ != MLAF_OK) {                                                                   \
            fprintf(stderr, "mlafuse error %s at %s:%d: %s\n", mlaf_status_name(s_), __FILE__, \
                    __LINE__, mlaf_context_last_error(ctx));                                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

namespace {

constexpr int kSteps = 50, kBlock = 64, kMaxPos = 4096;

mlaf_tensor view(void *p, mlaf_dtype dt, int nd, const int64_t *shape) {
    mlaf_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p, t.dtype = dt, t.ndim = nd;
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) t.shape[i] = shape[i], t.stride[i] = s, s *= shape[i];
    return t;
}

void *dev_fill(size_t bytes, unsigned seed) { /* bf16 / f32 words of small values */
    std::vector<uint16_t> h(bytes / 2);
    for (size_t i = 0; i < h.size(); i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = (uint16_t)(0x3c00u + ((seed >> 16) & 0x3ffu)); /* bf16 in [0.0078, 0.0156) */
    }
    void *d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
    return d;
}

struct Step {
    const mlaf_model_config *m;
    int64_t T;
    mlaf_mla_kv_cache_params kp;
    mlaf_rope_params rp;
    mlaf_moe_gate_params gp;
    mlaf_tensor lat, wq, wkv, pos, cs, slot, cache, q, qh, logits, bias, w, ids;
    /* the DSA layer (index_n_heads > 0): index key, LayerNorm weight / bias, index cache, top-k
     * buffer; indexer_q's q_idx, head weights, q_fp8, w_out */
    bool dsa = false;
    mlaf_indexer_params ip;
    mlaf_tensor ik, iw, ib, icache, topk, qi, qw, qf, wo;
    std::vector<void *> bufs;

    Step(const mlaf_model_config *model, int64_t t) : m(model), T(t) {
        const int Q = m->q_lora_rank, C = m->kv_lora_rank, R = m->qk_rope_head_dim;
        const int H = m->num_heads, D = m->qk_nope_head_dim + R, E = m->n_routed_experts;
        gp = mlaf_moe_gate_params_from_config(m);
        const int K = gp.top_k + gp.n_shared_experts;
        const int64_t nb = (T + kBlock - 1) / kBlock;
        const int64_t s_lat[2] = {T, Q + C + R}, s_wq[1] = {Q}, s_wkv[1] = {C}, s_T[1] = {T};
        const int64_t s_cs[2] = {kMaxPos, R}, s_cache[3] = {nb, kBlock, C + R}, s_q[2] = {T, Q};
        const int64_t s_qh[3] = {T, H, D}, s_lg[2] = {T, E}, s_e[1] = {E}, s_k[2] = {T, K};
        lat = view(keep(dev_fill((size_t)T * (Q + C + R) * 2, 1)), MLAF_BF16, 2, s_lat);
        wq = view(keep(dev_fill((size_t)Q * 2, 2)), MLAF_BF16, 1, s_wq);
        wkv = view(keep(dev_fill((size_t)C * 2, 3)), MLAF_BF16, 1, s_wkv);
        std::vector<int64_t> p(T), sl(T);
        for (int64_t i = 0; i < T; i++) p[i] = (i * 37) % kMaxPos, sl[i] = i;
        pos = view(keep(upload(p.data(), T * 8)), MLAF_I64, 1, s_T);
        slot = view(keep(upload(sl.data(), T * 8)), MLAF_I64, 1, s_T);
        std::vector<float> table((size_t)kMaxPos * R);
        mlaf_rope_table_init(table.data(), kMaxPos, R, 10000.0);
        cs = view(keep(upload(table.data(), table.size() * 4)), MLAF_F32, 2, s_cs);
        cache = view(keep(dev_fill((size_t)nb * kBlock * (C + R) * 2, 4)), MLAF_BF16, 3, s_cache);
        q = view(keep(dev_fill((size_t)T * Q * 2, 5)), MLAF_BF16, 2, s_q);
        qh = view(keep(dev_fill((size_t)T * H * D * 2, 6)), MLAF_BF16, 3, s_qh);
        logits = view(keep(dev_fill((size_t)T * E * 4, 7)), MLAF_F32, 2, s_lg);
        bias = view(keep(dev_fill((size_t)E * 4, 8)), MLAF_F32, 1, s_e);
        w = view(keep(dev_fill((size_t)T * K * 4, 9)), MLAF_F32, 2, s_k);
        ids = view(keep(dev_fill((size_t)T * K * 4, 10)), MLAF_I32, 2, s_k);
        kp = {Q, C, R, m->rms_norm_eps, m->rms_norm_eps, m->rope_style, 0};
        rp = {R, m->rope_style, 0, 0.0f};
        dsa = m->index_n_heads > 0;
        if (dsa) { /* fp8_ds_mla cache (656 B a token for C 512, R 64) and the indexer's tensors */
            const int IH = m->index_n_heads, ID = 128, rec = C + C / 32 + 2 * R, TK = m->index_topk;
            const int64_t s_rec[3] = {nb, kBlock, rec}, s_ik[2] = {T, ID}, s_d[1] = {ID};
            const int64_t s_ic[2] = {nb, kBlock * (ID + 4)}, s_tk[2] = {T, TK}, s_qi[3] = {T, IH, ID},
                          s_qw[2] = {T, IH};
            cache = view(keep(dev_fill((size_t)nb * kBlock * rec, 4)), MLAF_U8, 3, s_rec);
            ik = view(keep(dev_fill((size_t)T * ID * 2, 11)), MLAF_BF16, 2, s_ik);
            iw = view(keep(dev_fill((size_t)ID * 2, 12)), MLAF_BF16, 1, s_d);
            ib = view(keep(dev_fill((size_t)ID * 2, 13)), MLAF_BF16, 1, s_d);
            icache = view(keep(dev_fill((size_t)nb * kBlock * (ID + 4), 14)), MLAF_U8, 2, s_ic);
            topk = view(keep(dev_fill((size_t)T * TK * 4, 15)), MLAF_I32, 2, s_tk);
            qi = view(keep(dev_fill((size_t)T * IH * ID * 2, 16)), MLAF_BF16, 3, s_qi);
            qw = view(keep(dev_fill((size_t)T * IH * 2, 17)), MLAF_BF16, 2, s_qw);
            qf = view(keep(dev_fill((size_t)T * IH * ID, 18)), MLAF_U8, 3, s_qi);
            wo = view(keep(dev_fill((size_t)T * IH * 4, 19)), MLAF_F32, 2, s_qw);
            ip = mlaf_indexer_params_from_config(m);
        }
    }
    ~Step() {
        for (void *b : bufs) cudaFree(b);
    }
    void *keep(void *p) {
        bufs.push_back(p);
        return p;
    }
    static void *upload(const void *h, size_t bytes) {
        void *d;
        CK(cudaMalloc(&d, bytes));
        CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
        return d;
    }
    void run(mlaf_context *ctx) const {
        if (dsa) {
            const mlaf_kv_cache_desc d = {MLAF_KV_FP8_DS_MLA, &cache, NULL, NULL, NULL, MLAF_FP8_DIV, MLAF_TILE_UE8M0};
            const mlaf_indexer_k k = {&ik, &iw, &ib, &icache, NULL, &topk, 0, 0};
            MK(mlaf_mla_kv_cache_dsa(ctx, &kp, &lat, &wq, &wkv, &pos, &cs, &slot, &d, &q, NULL, NULL, NULL, &ip, &k));
            MK(mlaf_rope_q(ctx, &rp, &qh, &pos, &cs, NULL));
            MK(mlaf_indexer_q(ctx, &ip, &qi, &pos, &cs, &qw, &qf, &wo, NULL, NULL, NULL));
        } else {
            MK(mlaf_mla_kv_cache(ctx, &kp, &lat, &wq, &wkv, &pos, &cs, &slot, &cache, &q, NULL, NULL, NULL));
            MK(mlaf_rope_q(ctx, &rp, &qh, &pos, &cs, NULL));
        }
        MK(mlaf_moe_gate(ctx, &gp, &logits, m->has_score_bias ? &bias : NULL, &w, &ids, NULL));
    }
    std::vector<unsigned char> outputs() const {
        std::vector<const mlaf_tensor *> o = {&cache, &q, &w, &ids}; /* q heads: rotated again every step */
        if (dsa) o.insert(o.end(), {&icache, &topk, &qf, &wo});
        std::vector<unsigned char> h;
        for (const mlaf_tensor *t : o) {
            size_t n = mlaf_dtype_size(t->dtype);
            for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
            const size_t at = h.size();
            h.resize(at + n);
            CK(cudaMemcpy(h.data() + at, t->data, n, cudaMemcpyDeviceToHost));
        }
        return h;
    }
};

/* Median microseconds per step: kSteps steps captured in one graph (common.cuh's graph_us). */
double time_steps(mlaf_context *ctx, const Step &st, int reps) {
    return graph_us(
        [&](cudaStream_t s, int) {
            MK(mlaf_context_set_cuda_stream(ctx, s));
            st.run(ctx);
        },
        kSteps, reps);
}

} // namespace

int main(int argc, char **argv) {
    int reps = 50;
    std::vector<int64_t> Ts = {1, 8, 64};
    const char *preset = "all";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            Ts.clear();
            for (char *tok = strtok(argv[++i], ","); tok; tok = strtok(NULL, ",")) Ts.push_back(atoll(tok));
        } else if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "--quick")) reps = 20;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--tokens LIST] [--preset NAME|all] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    mlaf_context *ctx = NULL;
    if (mlaf_context_create(&ctx, MLAF_BACKEND_CUDA) != MLAF_OK) {
        printf("pdl_chain: no CUDA device; nothing to time\n");
        return 0;
    }
    if (mlaf_context_set_cuda_pdl(ctx, 1) != MLAF_OK) {
        printf("pdl_chain: %s\n", mlaf_context_last_error(ctx));
        return 0;
    }
    MK(mlaf_context_set_cuda_pdl(ctx, 0));
    const char *names[] = {"glm-4.7-flash", "deepseek-v3", "kimi-k2", "glm-5", "deepseek-v3.2"};
    printf("decode step = mla_kv_cache -> rope_q -> moe_gate (DSA models: mla_kv_cache_dsa -> rope_q -> indexer_q "
           "-> moe_gate), %d steps per CUDA graph, median of %d replays, us per step\n", kSteps, reps);
    printf("%-15s %7s %10s %10s %10s %8s %8s  %s\n", "preset", "T", "PDL off", "PDL 1", "PDL 2", "ratio 1",
           "ratio 2", "outputs");
    int bad = 0;
    for (const char *n : names) {
        if (strcmp(preset, "all") && strcmp(preset, n)) continue;
        const mlaf_model_config *m = mlaf_preset_find(n);
        for (int64_t T : Ts) {
            Step st(m, T);
            MK(mlaf_context_set_cuda_pdl(ctx, 0));
            const double off = time_steps(ctx, st, reps);
            const std::vector<unsigned char> o_off = st.outputs();
            MK(mlaf_context_set_cuda_pdl(ctx, 1));
            const double on = time_steps(ctx, st, reps);
            bool same = o_off == st.outputs();
            MK(mlaf_context_set_cuda_pdl(ctx, 2)); /* early reads before the wait (docs) */
            const double on2 = time_steps(ctx, st, reps);
            same = same && o_off == st.outputs();
            bad += !same;
            printf("%-15s %7lld %10.2f %10.2f %10.2f %7.2fx %7.2fx  %s\n", n, (long long)T, off, on, on2, off / on,
                   off / on2, same ? "equal" : "DIFFER");
        }
    }
    mlaf_context_free(ctx);
    return bad ? 1 : 0;
}
