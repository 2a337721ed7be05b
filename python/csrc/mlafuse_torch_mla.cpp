// mlafuse_torch_mla.cpp — the MLA-attention ops of the torch extension: split_qk_norm,
// mla_kv_cache, mla_kv_cache_dsa, indexer_q and rope_q (see mlafuse_torch.h;
// registered in mlafuse_torch.cpp).
#include "mlafuse_torch.h"

namespace mlafuse_torch {

// ---- split_qk_norm -----------------------------------------------------------------------
void split_out_impl(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                    const at::Tensor &w_kv, const std::optional<at::Tensor> &q,
                    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe,
                    int64_t Q, int64_t C, int64_t R, double eps_q, double eps_kv,
                    const mlaf_row_quant *rq) {
    need_api();
    const c10::Device d = latent.device();
    mlaf_context *ctx = context_for(d);
    View vl(latent, "latent", d, false), vwq(w_q, "w_q", d, false), vwkv(w_kv, "w_kv", d, false),
        vq(q, "q", d, true), vk(k_nope, "k_nope", d, true), vp(k_pe, "k_pe", d, true);
    const mlaf_split_qk_norm_params p = {(int32_t)Q, (int32_t)C, (int32_t)R, (float)eps_q,
                                         (float)eps_kv};
    if (rq) check(ctx, api.split_qk_norm_quant(ctx, &p, vl.p, vwq.p, vwkv.p, vq.p, vk.p, vp.p, rq));
    else check(ctx, api.split_qk_norm(ctx, &p, vl.p, vwq.p, vwkv.p, vq.p, vk.p, vp.p));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> split_qk_norm(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    int64_t Q, int64_t C, int64_t R, double eps_q, double eps_kv, bool return_k_pe) {
    const int64_t T = rows_of(latent);
    at::Tensor q = alloc(latent, T, nonneg(Q)), k = alloc(latent, T, nonneg(C)),
               pe = alloc(latent, T, return_k_pe ? nonneg(R) : 0);
    split_out_impl(latent, w_q, w_kv, Q > 0 ? std::optional<at::Tensor>(q) : std::nullopt, k,
                   return_k_pe ? std::optional<at::Tensor>(pe) : std::nullopt, Q, C, R, eps_q,
                   eps_kv);
    return {q, k, pe};
}

void split_qk_norm_out(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                       const at::Tensor &w_kv, const std::optional<at::Tensor> &q,
                       const at::Tensor &k_nope, const std::optional<at::Tensor> &k_pe,
                       int64_t Q, int64_t C, int64_t R, double eps_q, double eps_kv) {
    split_out_impl(latent, w_q, w_kv, q, k_nope, k_pe, Q, C, R, eps_q, eps_kv);
}

// The _lean forms: the ranks from the shapes, as mlafuse.split_qk_norm takes them when none is
// given (len(w_q) or 0, len(w_kv), the rest of the latent row; a missing dimension counts 0).
struct Ranks {
    int64_t Q, C, R;
};
Ranks ranks_of(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
               const at::Tensor &w_kv) {
    const int64_t Q = w_q.has_value() && w_q->dim() >= 1 ? w_q->size(0) : 0;
    const int64_t C = w_kv.dim() >= 1 ? w_kv.size(0) : 0;
    return {Q, C, (latent.dim() >= 2 ? latent.size(1) : 0) - Q - C};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> split_qk_norm_lean(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    double eps_q, double eps_kv, bool return_k_pe) {
    const Ranks r = ranks_of(latent, w_q, w_kv);
    return split_qk_norm(latent, w_q, w_kv, r.Q, r.C, r.R, eps_q, eps_kv, return_k_pe);
}

void split_qk_norm_lean_out(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                            const at::Tensor &w_kv, const std::optional<at::Tensor> &q,
                            const at::Tensor &k_nope, const std::optional<at::Tensor> &k_pe,
                            double eps_q, double eps_kv) {
    const Ranks r = ranks_of(latent, w_q, w_kv);
    split_out_impl(latent, w_q, w_kv, q, k_nope, k_pe, r.Q, r.C, r.R, eps_q, eps_kv);
}

// The in-place form the library accepts: outputs are exactly the latent's own columns
// (latent[:, :Q], latent[:, Q:Q+C], latent[:, Q+C:Q+C+R], sliced as Python slices clamp).
void split_qk_norm_inplace(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                           const at::Tensor &w_kv, int64_t Q, int64_t C, int64_t R,
                           double eps_q, double eps_kv) {
    need_api();
    const c10::Device d = latent.device();
    mlaf_context *ctx = context_for(d);
    View vl(latent, "latent", d, true), vwq(w_q, "w_q", d, false), vwkv(w_kv, "w_kv", d, false);
    mlaf_tensor cols[3];
    const mlaf_tensor *pq = nullptr, *pk = nullptr, *pp = nullptr;
    if (latent.dim() == 2) {
        const int64_t T = latent.size(0), W = latent.size(1);
        const int64_t lo[3] = {0, Q, Q + C}, hi[3] = {Q, Q + C, Q + C + R};
        char *base = static_cast<char *>(vl.v.data);
        const int64_t es = (int64_t)latent.element_size();
        const int64_t stride[2] = {latent.stride(0), 1};
        auto clamp = [W](int64_t x) { return x < 0 ? (x + W < 0 ? 0 : x + W) : (x > W ? W : x); };
        for (int i = 0; i < 3; i++) {
            const int64_t a = clamp(lo[i]), b = clamp(hi[i]);
            const int64_t shape[2] = {T, b > a ? b - a : 0};
            fill(cols[i], base ? base + a * es : nullptr, vl.v.dtype, 2, shape, stride);
        }
        pq = Q > 0 ? &cols[0] : nullptr;
        pk = &cols[1];
        pp = &cols[2];
    }
    const mlaf_split_qk_norm_params p = {(int32_t)Q, (int32_t)C, (int32_t)R, (float)eps_q,
                                         (float)eps_kv};
    check(ctx, api.split_qk_norm(ctx, &p, vl.p, vwq.p, vwkv.p, pq, pk, pp));
}

// ---- mla_kv_cache ------------------------------------------------------------------------
// The cache-format arguments: KvFormat (mlafuse_torch.h).

// An enum argument as the int the library takes; a value outside int32 is refused here (it
// would wrap into a valid one), others reach the library, which names a bad one.
int enum_arg(int64_t v, const char *name) {
    if (v < INT32_MIN || v > INT32_MAX)
        fail(MLAF_ERR_INVALID_ARGUMENT, std::string(name) + " = " + std::to_string(v) +
                                            ", expected a small non-negative number");
    return (int)v;
}

void kv_out_impl(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                 const at::Tensor &w_kv, const std::optional<at::Tensor> &positions,
                 const std::optional<at::Tensor> &cos_sin, const at::Tensor &slot_mapping,
                 const at::Tensor &kv_cache, const std::optional<at::Tensor> &error_count,
                 const std::optional<at::Tensor> &q, const std::optional<at::Tensor> &k_nope,
                 const std::optional<at::Tensor> &k_pe, int64_t Q, int64_t C, int64_t R,
                 double eps_q, double eps_kv, int64_t style, const KvFormat &f,
                 const mlaf_row_quant *rq) {
    need_api();
    const c10::Device d = latent.device();
    mlaf_context *ctx = context_for(d);
    View vl(latent, "latent", d, false), vwq(w_q, "w_q", d, false), vwkv(w_kv, "w_kv", d, false),
        vpos(positions, "positions", d, false), vcs(cos_sin, "cos_sin", d, false),
        vslot(slot_mapping, "slot_mapping", d, false), vcache(kv_cache, "kv_cache", d, true),
        vq(q, "q", d, true), vk(k_nope, "k_nope", d, true), vp(k_pe, "k_pe", d, true),
        verr(error_count, "error_count", d, true), vscale(f.scale, "scale", d, false),
        vamax(f.amax_out, "amax_out", d, true), vkpe(f.kpe, "kpe_cache", d, true);
    const mlaf_mla_kv_cache_params p = {(int32_t)Q,    (int32_t)C,      (int32_t)R,
                                        (float)eps_q,  (float)eps_kv,   (mlaf_rope_style)style,
                                        enum_arg(f.kv_rope_tail, "kv_rope_tail")};
    mlaf_kv_cache_desc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.format = (mlaf_kv_format)enum_arg(f.format, "cache_format");
    desc.cache = vcache.p;
    desc.kpe = vkpe.p;
    desc.scale = vscale.p;
    desc.amax_out = vamax.p;
    desc.conv = (mlaf_fp8_conv)enum_arg(f.conv, "fp8_conv");
    desc.tile_scale = (mlaf_tile_scale)enum_arg(f.tile_scale, "tile_scale");
    if (rq)
        check(ctx, api.mla_kv_cache_quant(ctx, &p, vl.p, vwq.p, vwkv.p, vpos.p, vcs.p, vslot.p,
                                          &desc, vq.p, vk.p, vp.p, verr.p, rq));
    else
        check(ctx, api.mla_kv_cache_fmt(ctx, &p, vl.p, vwq.p, vwkv.p, vpos.p, vcs.p, vslot.p,
                                        &desc, vq.p, vk.p, vp.p, verr.p));
}

KvFormat kv_format(int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
                   const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
                   const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail) {
    KvFormat f;
    f.kv_rope_tail = kv_rope_tail;
    f.format = cache_format;
    f.scale = scale;
    f.conv = fp8_conv;
    f.amax_out = amax_out;
    f.tile_scale = tile_scale;
    f.kpe = kpe_cache;
    return f;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mla_kv_cache(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, int64_t Q, int64_t C, int64_t R,
    double eps_q, double eps_kv, int64_t style, bool return_k_nope, bool return_k_pe,
    int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail) {
    const int64_t T = rows_of(latent);
    at::Tensor q = alloc(latent, T, nonneg(Q)), k = alloc(latent, T, return_k_nope ? nonneg(C) : 0),
               pe = alloc(latent, T, return_k_pe ? nonneg(R) : 0);
    kv_out_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                Q > 0 ? std::optional<at::Tensor>(q) : std::nullopt,
                return_k_nope ? std::optional<at::Tensor>(k) : std::nullopt,
                return_k_pe ? std::optional<at::Tensor>(pe) : std::nullopt, Q, C, R, eps_q,
                eps_kv, style, kv_format(cache_format, scale, fp8_conv, amax_out, tile_scale, kpe_cache, kv_rope_tail));
    return {q, k, pe};
}

void mla_kv_cache_out(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                      const at::Tensor &w_kv, const std::optional<at::Tensor> &positions,
                      const std::optional<at::Tensor> &cos_sin, const at::Tensor &slot_mapping,
                      const at::Tensor &kv_cache, const std::optional<at::Tensor> &error_count,
                      const std::optional<at::Tensor> &q, const std::optional<at::Tensor> &k_nope,
                      const std::optional<at::Tensor> &k_pe, int64_t Q, int64_t C, int64_t R,
                      double eps_q, double eps_kv, int64_t style, int64_t cache_format,
                      const std::optional<at::Tensor> &scale, int64_t fp8_conv,
                      const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
                      const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail) {
    kv_out_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, q,
                k_nope, k_pe, Q, C, R, eps_q, eps_kv, style,
                kv_format(cache_format, scale, fp8_conv, amax_out, tile_scale, kpe_cache, kv_rope_tail));
}

// The _lean forms: the ranks from the shapes (ranks_of, as split_qk_norm_lean).
std::tuple<at::Tensor, at::Tensor, at::Tensor> mla_kv_cache_lean(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, double eps_q, double eps_kv, int64_t style,
    bool return_k_nope, bool return_k_pe, int64_t cache_format,
    const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail) {
    const Ranks r = ranks_of(latent, w_q, w_kv);
    return mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache,
                        error_count, r.Q, r.C, r.R, eps_q, eps_kv, style, return_k_nope,
                        return_k_pe, cache_format, scale, fp8_conv, amax_out, tile_scale,
                        kpe_cache, kv_rope_tail);
}

void mla_kv_cache_lean_out(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const std::optional<at::Tensor> &q,
    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe, double eps_q,
    double eps_kv, int64_t style, int64_t cache_format, const std::optional<at::Tensor> &scale,
    int64_t fp8_conv, const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache, int64_t kv_rope_tail) {
    const Ranks r = ranks_of(latent, w_q, w_kv);
    kv_out_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count, q,
                k_nope, k_pe, r.Q, r.C, r.R, eps_q, eps_kv, style,
                kv_format(cache_format, scale, fp8_conv, amax_out, tile_scale, kpe_cache,
                          kv_rope_tail));
}

// ---- the DSA indexer (docs/dsa.md) ------------------------------------------------------------
// The indexer's settings as plain arguments (index_style an mlaf_rope_style, hadamard, ln_eps,
// amax_eps, index_scale an mlaf_index_scale). index_copies > 1 (docs/mla.md, multi-destination store) also writes the same
// records at index_cache's address + k * index_copy_stride bytes, which the schema cannot name.
mlaf_indexer_params indexer_params(int64_t index_style, bool hadamard, double ln_eps,
                                   double amax_eps, int64_t index_scale) {
    mlaf_indexer_params ip;
    std::memset(&ip, 0, sizeof ip);
    ip.style = (mlaf_rope_style)enum_arg(index_style, "index_style");
    ip.hadamard = hadamard ? 1 : 0;
    ip.ln_eps = (float)ln_eps;
    ip.amax_eps = (float)amax_eps;
    ip.scale = (mlaf_index_scale)enum_arg(index_scale, "index_scale");
    return ip;
}

void dsa_out_impl(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const at::Tensor &index_k,
    const at::Tensor &index_weight, const at::Tensor &index_bias, const at::Tensor &index_cache,
    const std::optional<at::Tensor> &topk_fill, const std::optional<at::Tensor> &q,
    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe,
    const std::optional<at::Tensor> &index_out, int64_t Q, int64_t C, int64_t R, double eps_q,
    double eps_kv, int64_t style, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, int64_t index_copies, int64_t index_copy_stride,
    const KvFormat &f, const mlaf_row_quant *rq) {
    need_api();
    const c10::Device d = latent.device();
    mlaf_context *ctx = context_for(d);
    const mlaf_indexer_params ip =
        indexer_params(index_style, hadamard, ln_eps, amax_eps, index_scale);
    View vl(latent, "latent", d, false), vwq(w_q, "w_q", d, false), vwkv(w_kv, "w_kv", d, false),
        vpos(positions, "positions", d, false), vcs(cos_sin, "cos_sin", d, false),
        vslot(slot_mapping, "slot_mapping", d, false), vcache(kv_cache, "kv_cache", d, true),
        vq(q, "q", d, true), vk(k_nope, "k_nope", d, true), vp(k_pe, "k_pe", d, true),
        verr(error_count, "error_count", d, true), vik(index_k, "index_k", d, false),
        viw(index_weight, "index_weight", d, false), vib(index_bias, "index_bias", d, false),
        vic(index_cache, "index_cache", d, true), vio(index_out, "index_out", d, true),
        vtop(topk_fill, "topk_fill", d, true), vscale(f.scale, "scale", d, false),
        vamax(f.amax_out, "amax_out", d, true), vkpe(f.kpe, "kpe_cache", d, true);
    const mlaf_mla_kv_cache_params p = {(int32_t)Q,   (int32_t)C,    (int32_t)R,
                                        (float)eps_q, (float)eps_kv, (mlaf_rope_style)style, 0};
    mlaf_kv_cache_desc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.format = (mlaf_kv_format)enum_arg(f.format, "cache_format");
    desc.cache = vcache.p;
    desc.kpe = vkpe.p;
    desc.scale = vscale.p;
    desc.amax_out = vamax.p;
    desc.conv = (mlaf_fp8_conv)enum_arg(f.conv, "fp8_conv");
    desc.tile_scale = (mlaf_tile_scale)enum_arg(f.tile_scale, "tile_scale");
    mlaf_indexer_k ik;
    std::memset(&ik, 0, sizeof ik);
    ik.index_k = vik.p;
    ik.weight = viw.p;
    ik.bias = vib.p;
    ik.cache = vic.p;
    ik.out = vio.p;
    ik.topk_fill = vtop.p;
    ik.copies = enum_arg(index_copies, "index_copies");
    ik.copy_stride = index_copy_stride;
    if (rq)
        check(ctx, api.mla_kv_cache_dsa_quant(ctx, &p, vl.p, vwq.p, vwkv.p, vpos.p, vcs.p, vslot.p,
                                              &desc, vq.p, vk.p, vp.p, verr.p, &ip, &ik, rq));
    else
        check(ctx, api.mla_kv_cache_dsa(ctx, &p, vl.p, vwq.p, vwkv.p, vpos.p, vcs.p, vslot.p,
                                        &desc, vq.p, vk.p, vp.p, verr.p, &ip, &ik));
}

void mla_kv_cache_dsa_out(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const at::Tensor &index_k,
    const at::Tensor &index_weight, const at::Tensor &index_bias, const at::Tensor &index_cache,
    const std::optional<at::Tensor> &topk_fill, const std::optional<at::Tensor> &q,
    const std::optional<at::Tensor> &k_nope, const std::optional<at::Tensor> &k_pe,
    const std::optional<at::Tensor> &index_out, int64_t Q, int64_t C, int64_t R, double eps_q,
    double eps_kv, int64_t style, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, int64_t index_copies, int64_t index_copy_stride,
    int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache) {
    dsa_out_impl(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                 index_k, index_weight, index_bias, index_cache, topk_fill, q, k_nope, k_pe,
                 index_out, Q, C, R, eps_q, eps_kv, style, index_style, hadamard, ln_eps,
                 amax_eps, index_scale, index_copies, index_copy_stride,
                 kv_format(cache_format, scale, fp8_conv, amax_out, tile_scale, kpe_cache, 0));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_kv_cache_dsa(
    const at::Tensor &latent, const std::optional<at::Tensor> &w_q, const at::Tensor &w_kv,
    const std::optional<at::Tensor> &positions, const std::optional<at::Tensor> &cos_sin,
    const at::Tensor &slot_mapping, const at::Tensor &kv_cache,
    const std::optional<at::Tensor> &error_count, const at::Tensor &index_k,
    const at::Tensor &index_weight, const at::Tensor &index_bias, const at::Tensor &index_cache,
    const std::optional<at::Tensor> &topk_fill, int64_t Q, int64_t C, int64_t R, double eps_q,
    double eps_kv, int64_t style, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, bool return_k_nope, bool return_k_pe,
    bool return_index_out, int64_t index_copies, int64_t index_copy_stride,
    int64_t cache_format, const std::optional<at::Tensor> &scale, int64_t fp8_conv,
    const std::optional<at::Tensor> &amax_out, int64_t tile_scale,
    const std::optional<at::Tensor> &kpe_cache) {
    const int64_t T = rows_of(latent);
    at::Tensor q = alloc(latent, T, nonneg(Q)), k = alloc(latent, T, return_k_nope ? nonneg(C) : 0),
               pe = alloc(latent, T, return_k_pe ? nonneg(R) : 0),
               io = alloc(latent, T, return_index_out ? MLAF_INDEX_HEAD_DIM : 0);
    auto opt = [](bool want, const at::Tensor &t) {
        return want ? std::optional<at::Tensor>(t) : std::nullopt;
    };
    mla_kv_cache_dsa_out(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache,
                         error_count, index_k, index_weight, index_bias, index_cache, topk_fill,
                         opt(Q > 0, q), opt(return_k_nope, k), opt(return_k_pe, pe),
                         opt(return_index_out, io), Q, C, R, eps_q, eps_kv, style, index_style,
                         hadamard, ln_eps, amax_eps, index_scale, index_copies,
                         index_copy_stride, cache_format, scale, fp8_conv, amax_out, tile_scale,
                         kpe_cache);
    return {q, k, pe, io};
}

// indexer_q: q_pe (optional, the MLA query) roped in place on its last 64 columns in
// q_pe_style; q_fp8 [T, H, 128] float8_e4m3fn (the _out form takes uint8 too), w_out [T, H] f32.
void indexer_q_out(const at::Tensor &q_idx, const at::Tensor &positions,
                   const at::Tensor &cos_sin, const at::Tensor &weights, const at::Tensor &q_fp8,
                   const at::Tensor &w_out, int64_t index_style, bool hadamard, double ln_eps,
                   double amax_eps, int64_t index_scale, const std::optional<at::Tensor> &q_pe,
                   int64_t q_pe_style, const std::optional<at::Tensor> &error_count) {
    need_api();
    const c10::Device d = q_idx.device();
    mlaf_context *ctx = context_for(d);
    const mlaf_indexer_params ip =
        indexer_params(index_style, hadamard, ln_eps, amax_eps, index_scale);
    View vq(q_idx, "q_idx", d, false), vpos(positions, "positions", d, false),
        vcs(cos_sin, "cos_sin", d, false), vw(weights, "weights", d, false),
        vf(q_fp8, "q_fp8", d, true), vwo(w_out, "w_out", d, true), vpe(q_pe, "q_pe", d, true),
        verr(error_count, "error_count", d, true);
    mlaf_rope_params pr;
    std::memset(&pr, 0, sizeof pr);
    pr.rope_dim = MLAF_INDEX_ROPE_DIM;
    pr.style = (mlaf_rope_style)enum_arg(q_pe_style, "q_pe_style");
    check(ctx, api.indexer_q(ctx, &ip, vq.p, vpos.p, vcs.p, vw.p, vf.p, vwo.p, vpe.p, &pr, verr.p));
}

std::tuple<at::Tensor, at::Tensor> indexer_q(
    const at::Tensor &q_idx, const at::Tensor &positions, const at::Tensor &cos_sin,
    const at::Tensor &weights, int64_t index_style, bool hadamard, double ln_eps,
    double amax_eps, int64_t index_scale, const std::optional<at::Tensor> &q_pe,
    int64_t q_pe_style, const std::optional<at::Tensor> &error_count) {
    const int64_t T = rows_of(q_idx), H = q_idx.dim() >= 2 ? q_idx.size(1) : 0;
    at::Tensor q_fp8 = at::empty({T, H, MLAF_INDEX_HEAD_DIM},
                                 q_idx.options().dtype(c10::ScalarType::Float8_e4m3fn)),
               w_out = alloc(q_idx, T, H, c10::ScalarType::Float);
    indexer_q_out(q_idx, positions, cos_sin, weights, q_fp8, w_out, index_style, hadamard,
                  ln_eps, amax_eps, index_scale, q_pe, q_pe_style, error_count);
    return {q_fp8, w_out};
}

// ---- rope_q ------------------------------------------------------------------------------
// head_norm (docs/mla.md): the weightless per-head RMSNorm first (head_norm_eps 0: 1e-6); q_out:
// the result out of place into [T, Hpad, D], heads past q's as zeros (mlaf_rope_q_out).
void rope_q(const at::Tensor &q, const at::Tensor &positions, const at::Tensor &cos_sin,
            int64_t R, int64_t style, const std::optional<at::Tensor> &error_count, bool head_norm,
            double head_norm_eps, const std::optional<at::Tensor> &q_out) {
    need_api();
    const c10::Device d = q.device();
    mlaf_context *ctx = context_for(d);
    View vq(q, "q", d, !q_out.has_value()), vpos(positions, "positions", d, false),
        vcs(cos_sin, "cos_sin", d, false), verr(error_count, "error_count", d, true),
        vout(q_out, "q_out", d, true);
    const mlaf_rope_params p = {(int32_t)R, (mlaf_rope_style)style, head_norm ? 1 : 0, (float)head_norm_eps};
    if (q_out.has_value()) check(ctx, api.rope_q_out(ctx, &p, vq.p, vpos.p, vcs.p, vout.p, verr.p));
    else check(ctx, api.rope_q(ctx, &p, vq.p, vpos.p, vcs.p, verr.p));
}

}  // namespace mlafuse_torch
