// mlafuse_torch.cpp — the torch.ops.mlafuse.* custom ops in C++, calling libmlafuse directly.
//
// Built by python/setup.py as a torch C++ extension (torch.utils.cpp_extension, no nvcc: the
// CUDA kernels live in libmlafuse; this file only hands them torch's current CUDA stream,
// which it reads through c10's device-agnostic DeviceGuardImplInterface, so it needs neither
// the CUDA headers nor libtorch_cuda). It has no Python module of its own: python/mlafuse
// loads it with torch.ops.load_library, then calls mlafuse_torch_init() with the path of the
// libmlafuse it already loaded, and this file takes the C entry points from that library
// with dlopen / dlsym (so both bindings use one library, the one $MLAFUSE_LIBRARY or the
// package names). Fake (meta) implementations for torch.compile are registered in Python
// (mlafuse/_torch_ops.py, shared with the ctypes binding).
//
// The schemas below must read exactly like SCHEMAS in mlafuse/_torch_ops.py (a test compares
// them). Every kernel mirrors the ctypes binding: outputs allocated like new_empty, views
// passed without copies, the same checks with the same messages ("MLAF_ERR_DTYPE: latent.dtype
// = torch.float64, expected ..."), which mlafuse turns into MlafError.
//
// Contexts: one mlaf_context per (backend, device) per thread, created on first use and
// freed when the thread ends; a CUDA context is pointed at torch's current stream of the
// tensors' device on every call (so calls follow torch.cuda.stream(...) and graph capture).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mlafuse.h"

#define MLAFUSE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// ---- the library's entry points, taken from the already-loaded libmlafuse --------------
struct Api {
    decltype(&mlaf_version_number) version_number;
    decltype(&mlaf_status_name) status_name;
    decltype(&mlaf_status_message) status_message;
    decltype(&mlaf_backend_name) backend_name;
    decltype(&mlaf_context_create) context_create;
    decltype(&mlaf_context_free) context_free;
    decltype(&mlaf_context_set_threads) context_set_threads;
    decltype(&mlaf_context_set_cuda_device) context_set_cuda_device;
    decltype(&mlaf_context_set_cuda_stream) context_set_cuda_stream;
    decltype(&mlaf_context_set_cuda_pdl) context_set_cuda_pdl;
    decltype(&mlaf_context_last_error) context_last_error;
    decltype(&mlaf_split_qk_norm) split_qk_norm;
    decltype(&mlaf_mla_kv_cache_fmt) mla_kv_cache_fmt;
    decltype(&mlaf_mla_kv_cache_dsa) mla_kv_cache_dsa;
    decltype(&mlaf_indexer_q) indexer_q;
    decltype(&mlaf_rope_q) rope_q;
    decltype(&mlaf_rope_q_out) rope_q_out;
    decltype(&mlaf_moe_gate) moe_gate;
    decltype(&mlaf_moe_gate_hash) moe_gate_hash;
};

Api api;
std::atomic<bool> api_ready{false};
std::mutex init_mutex;
std::atomic<int> cpu_threads{0};  // 0 = all cores, as the library's default
std::atomic<int> cuda_pdl{0};     // programmatic dependent launch (mlafuse.set_cuda_pdl)

[[noreturn]] void fail(mlaf_status st, const std::string &msg) {
    const char *name = api_ready.load(std::memory_order_relaxed) ? api.status_name(st)
                                                                   : "MLAF_ERR_INVALID_ARGUMENT";
    TORCH_CHECK(false, name, ": ", msg);
}

inline void need_api() {
    if (!api_ready.load(std::memory_order_acquire))
        TORCH_CHECK(false, "MLAF_ERR_BACKEND_UNAVAILABLE: the mlafuse torch extension was "
                           "loaded but not initialized (import mlafuse, which does both)");
}

// ---- contexts ----------------------------------------------------------------------------
struct ThreadContexts {
    mlaf_context *cpu = nullptr;
    int cpu_threads_set = 0;
    std::vector<mlaf_context *> cuda;  // by device index
    std::vector<int> cuda_pdl_set;     // the setting each one has
    ~ThreadContexts() {
        if (!api_ready.load(std::memory_order_relaxed)) return;
        api.context_free(cpu);
        for (mlaf_context *c : cuda) api.context_free(c);
    }
};
thread_local ThreadContexts tls;

mlaf_context *create_context(mlaf_backend b) {
    mlaf_context *ctx = nullptr;
    mlaf_status st = api.context_create(&ctx, b);
    if (st != MLAF_OK)
        fail(st, std::string("cannot create a ") + api.backend_name(b) +
                     " context: " + api.status_message(st));
    return ctx;
}

void check(mlaf_context *ctx, mlaf_status st) {
    if (st == MLAF_OK) return;
    const char *msg = api.context_last_error(ctx);
    fail(st, (msg && *msg) ? msg : api.status_message(st));
}

mlaf_context *cpu_context() {
    ThreadContexts &t = tls;
    if (!t.cpu) {
        t.cpu = create_context(MLAF_BACKEND_CPU);
        t.cpu_threads_set = 0;
    }
    const int want = cpu_threads.load(std::memory_order_relaxed);
    if (t.cpu_threads_set != want) {
        check(t.cpu, api.context_set_threads(t.cpu, want));
        t.cpu_threads_set = want;
    }
    return t.cpu;
}

mlaf_context *cuda_context(c10::Device device) {
    ThreadContexts &t = tls;
    const int idx = device.has_index() ? device.index() : 0;
    if (idx >= (int)t.cuda.size()) {
        t.cuda.resize(idx + 1, nullptr);
        t.cuda_pdl_set.resize(idx + 1, 0);
    }
    mlaf_context *&ctx = t.cuda[idx];
    if (!ctx) {
        mlaf_context *c = create_context(MLAF_BACKEND_CUDA);
        mlaf_status st = api.context_set_cuda_device(c, idx);
        if (st != MLAF_OK) {
            std::string msg = api.context_last_error(c);
            api.context_free(c);
            fail(st, msg.empty() ? api.status_message(st) : msg);
        }
        ctx = c;
        t.cuda_pdl_set[idx] = 0;
    }
    const int pdl = cuda_pdl.load(std::memory_order_relaxed);
    if (t.cuda_pdl_set[idx] != pdl) {
        check(ctx, api.context_set_cuda_pdl(ctx, pdl));
        t.cuda_pdl_set[idx] = pdl;
    }
    // The stream is read on every call: under graph capture it is the capture stream.
    const c10::impl::DeviceGuardImplInterface *impl =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    void *stream = impl->getStreamNativeHandle(impl->getStream(c10::Device(c10::DeviceType::CUDA, idx)));
    check(ctx, api.context_set_cuda_stream(ctx, stream));
    return ctx;
}

mlaf_context *context_for(const c10::Device &d) {
    if (d.is_cpu()) return cpu_context();
    if (d.is_cuda()) return cuda_context(d);
    fail(MLAF_ERR_BACKEND_UNAVAILABLE,
         "tensors on " + d.str() + " are not supported; mlafuse runs on cpu and cuda");
}

// ---- views -------------------------------------------------------------------------------
const char *torch_dtype_name(c10::ScalarType s) {
    switch (s) {
    case c10::ScalarType::Float: return "torch.float32";
    case c10::ScalarType::Double: return "torch.float64";
    case c10::ScalarType::Half: return "torch.float16";
    case c10::ScalarType::BFloat16: return "torch.bfloat16";
    case c10::ScalarType::Int: return "torch.int32";
    case c10::ScalarType::Long: return "torch.int64";
    case c10::ScalarType::Short: return "torch.int16";
    case c10::ScalarType::Char: return "torch.int8";
    case c10::ScalarType::Byte: return "torch.uint8";
    case c10::ScalarType::Bool: return "torch.bool";
    case c10::ScalarType::Float8_e4m3fn: return "torch.float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "torch.float8_e5m2";
    default: return c10::toString(s);
    }
}

inline mlaf_dtype dtype_of(const at::Tensor &t, const char *name) {
    switch (t.scalar_type()) {
    case c10::ScalarType::Float: return MLAF_F32;
    case c10::ScalarType::Half: return MLAF_F16;
    case c10::ScalarType::BFloat16: return MLAF_BF16;
    case c10::ScalarType::Int: return MLAF_I32;
    case c10::ScalarType::Long: return MLAF_I64;
    case c10::ScalarType::Byte: return MLAF_U8;
    case c10::ScalarType::Float8_e4m3fn: return MLAF_FP8_E4M3;
    default:
        fail(MLAF_ERR_DTYPE, std::string(name) + ".dtype = " + torch_dtype_name(t.scalar_type()) +
                                 ", expected float32, float16, bfloat16, int32, int64, uint8 or "
                                 "float8_e4m3fn");
    }
}

// Fills v from raw parts. A stride that never moves the address (extent 1, or no elements
// at all) is arbitrary in torch (0, or that of a wider parent); the dense one is reported,
// as the ctypes binding does.
inline void fill(mlaf_tensor &v, void *data, mlaf_dtype dt, int ndim, const int64_t *shape,
                 const int64_t *stride) {
    v.data = data;
    v.dtype = dt;
    v.ndim = ndim;
    bool empty = false;
    for (int i = 0; i < ndim; i++) empty |= shape[i] == 0;
    int64_t dense = 1;
    for (int i = MLAF_MAX_DIMS - 1; i >= 0; i--) {
        if (i >= ndim) {
            v.shape[i] = 0;
            v.stride[i] = 0;
            continue;
        }
        const int64_t n = shape[i];
        v.shape[i] = n;
        v.stride[i] = (n <= 1 || empty) ? dense : stride[i];
        dense *= n > 1 ? n : 1;
    }
}

// A view of t, or nullptr for an absent tensor. Checks the device and the dtype.
struct View {
    mlaf_tensor v;
    const mlaf_tensor *p = nullptr;
    View() = default;
    View(const at::Tensor &t, const char *name, const c10::Device &d, bool writable) {
        if (!t.defined()) return;
        if (t.device() != d)
            fail(MLAF_ERR_INVALID_ARGUMENT,
                 std::string(name) + " is on " + t.device().str() + ", expected " + d.str() +
                     " (every tensor of a call lives on one device)");
        const mlaf_dtype dt = dtype_of(t, name);
        const int64_t ndim = t.dim();
        if (ndim > MLAF_MAX_DIMS)
            fail(MLAF_ERR_SHAPE, std::string(name) + ".ndim = " + std::to_string(ndim) +
                                     ", expected <= " + std::to_string(MLAF_MAX_DIMS));
        void *data = writable ? t.mutable_data_ptr() : const_cast<void *>(t.const_data_ptr());
        fill(v, data, dt, (int)ndim, t.sizes().data(), t.strides().data());
        p = &v;
    }
    View(const std::optional<at::Tensor> &t, const char *name, const c10::Device &d,
         bool writable)
        : View(t.has_value() ? *t : at::Tensor(), name, d, writable) {}
};

inline int64_t rows_of(const at::Tensor &t) { return t.dim() >= 1 ? t.size(0) : 0; }
inline int64_t nonneg(int64_t x) { return x > 0 ? x : 0; }

at::Tensor alloc(const at::Tensor &like, int64_t rows, int64_t cols) {
    return at::empty({rows, cols}, like.options());
}
at::Tensor alloc(const at::Tensor &like, int64_t rows, int64_t cols, c10::ScalarType dt) {
    return at::empty({rows, cols}, like.options().dtype(dt));
}

// ---- split_qk_norm -----------------------------------------------------------------------
void split_out_impl(const at::Tensor &latent, const std::optional<at::Tensor> &w_q,
                    const at::Tensor &w_kv, const std::optional<at::Tensor> &q,
                    const at::Tensor &k_nope, const std::optional<at::Tensor> &k_pe, int64_t Q,
                    int64_t C, int64_t R, double eps_q, double eps_kv) {
    need_api();
    const c10::Device d = latent.device();
    mlaf_context *ctx = context_for(d);
    View vl(latent, "latent", d, false), vwq(w_q, "w_q", d, false), vwkv(w_kv, "w_kv", d, false),
        vq(q, "q", d, true), vk(k_nope, "k_nope", d, true), vp(k_pe, "k_pe", d, true);
    const mlaf_split_qk_norm_params p = {(int32_t)Q, (int32_t)C, (int32_t)R, (float)eps_q,
                                         (float)eps_kv};
    check(ctx, api.split_qk_norm(ctx, &p, vl.p, vwq.p, vwkv.p, vq.p, vk.p, vp.p));
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
// The cache-format arguments (SPEC §9) come last with the plain call's defaults: cache_format
// an mlaf_kv_format, scale [1] f32 (fp8; the kernel reads it, on CUDA from the device),
// fp8_conv an mlaf_fp8_conv, amax_out [1] f32 (fp8, optional), tile_scale an mlaf_tile_scale
// (fp8_ds_mla), kpe_cache the separate rope array (plain and fp8). The library checks them all.
struct KvFormat {
    int64_t format = MLAF_KV_PLAIN;
    std::optional<at::Tensor> scale;
    int64_t conv = MLAF_FP8_DIV;
    std::optional<at::Tensor> amax_out;
    int64_t tile_scale = MLAF_TILE_AMAX;
    std::optional<at::Tensor> kpe;
    int64_t kv_rope_tail = 0;  // SPEC §11: the rope tail inside the kv part (R = 0 then)
};

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
                 double eps_q, double eps_kv, int64_t style, const KvFormat &f) {
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
    check(ctx, api.mla_kv_cache_fmt(ctx, &p, vl.p, vwq.p, vwkv.p, vpos.p, vcs.p, vslot.p, &desc,
                                    vq.p, vk.p, vp.p, verr.p));
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

// ---- the DSA indexer (SPEC §10) ------------------------------------------------------------
// The indexer's settings as plain arguments (index_style an mlaf_rope_style, hadamard, ln_eps,
// amax_eps, index_scale an mlaf_index_scale). index_copies > 1 (SPEC §12) also writes the same
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
        vtop(topk_fill, "topk_fill", d, true), vscale(scale, "scale", d, false),
        vamax(amax_out, "amax_out", d, true), vkpe(kpe_cache, "kpe_cache", d, true);
    const mlaf_mla_kv_cache_params p = {(int32_t)Q,   (int32_t)C,    (int32_t)R,
                                        (float)eps_q, (float)eps_kv, (mlaf_rope_style)style, 0};
    mlaf_kv_cache_desc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.format = (mlaf_kv_format)enum_arg(cache_format, "cache_format");
    desc.cache = vcache.p;
    desc.kpe = vkpe.p;
    desc.scale = vscale.p;
    desc.amax_out = vamax.p;
    desc.conv = (mlaf_fp8_conv)enum_arg(fp8_conv, "fp8_conv");
    desc.tile_scale = (mlaf_tile_scale)enum_arg(tile_scale, "tile_scale");
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
    check(ctx, api.mla_kv_cache_dsa(ctx, &p, vl.p, vwq.p, vwkv.p, vpos.p, vcs.p, vslot.p, &desc,
                                    vq.p, vk.p, vp.p, verr.p, &ip, &ik));
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
// head_norm (SPEC §11): the weightless per-head RMSNorm first (head_norm_eps 0: 1e-6); q_out:
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

// ---- moe_gate ----------------------------------------------------------------------------
void gate_out_impl(const at::Tensor &logits, const std::optional<at::Tensor> &bias,
                   const at::Tensor &weights, const at::Tensor &ids,
                   const std::optional<at::Tensor> &scores, int64_t top_k, int64_t n_group,
                   int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
                   double routed_scaling_factor, bool apply_routed_scaling, double eps,
                   int64_t n_shared_experts) {
    need_api();
    const c10::Device d = logits.device();
    mlaf_context *ctx = context_for(d);
    View vl(logits, "logits", d, false), vb(bias, "bias", d, false),
        vw(weights, "weights", d, true), vi(ids, "ids", d, true), vs(scores, "scores", d, true);
    mlaf_moe_gate_params p;
    p.top_k = (int32_t)top_k;
    p.n_group = (int32_t)n_group;
    p.topk_group = (int32_t)topk_group;
    p.score_func = (mlaf_score_func)score_func;
    p.group_score = (mlaf_group_score)group_score;
    p.renormalize = renormalize ? 1 : 0;
    p.routed_scaling_factor = (float)routed_scaling_factor;
    p.apply_routed_scaling = apply_routed_scaling ? 1 : 0;
    p.eps = (float)eps;
    p.n_shared_experts = (int32_t)n_shared_experts;
    check(ctx, api.moe_gate(ctx, &p, vl.p, vb.p, vw.p, vi.p, vs.p));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gate(
    const at::Tensor &logits, const std::optional<at::Tensor> &bias, int64_t top_k,
    int64_t n_group, int64_t topk_group, int64_t score_func, int64_t group_score,
    bool renormalize, double routed_scaling_factor, bool apply_routed_scaling, double eps,
    int64_t n_shared_experts, bool return_scores, std::optional<c10::ScalarType> weights_dtype) {
    const int64_t T = rows_of(logits), E = logits.dim() >= 2 ? logits.size(1) : 0;
    const int64_t K = nonneg(top_k + n_shared_experts);
    at::Tensor w = alloc(logits, T, K, weights_dtype.value_or(c10::ScalarType::Float)),
               i = alloc(logits, T, K, c10::ScalarType::Int),
               s = alloc(logits, T, return_scores ? E : 0, c10::ScalarType::Float);
    gate_out_impl(logits, bias, w, i, return_scores ? std::optional<at::Tensor>(s) : std::nullopt,
                  top_k, n_group, topk_group, score_func, group_score, renormalize,
                  routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts);
    return {w, i, s};
}

void moe_gate_out(const at::Tensor &logits, const std::optional<at::Tensor> &bias,
                  const at::Tensor &weights, const at::Tensor &ids,
                  const std::optional<at::Tensor> &scores, int64_t top_k, int64_t n_group,
                  int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
                  double routed_scaling_factor, bool apply_routed_scaling, double eps,
                  int64_t n_shared_experts) {
    gate_out_impl(logits, bias, weights, ids, scores, top_k, n_group, topk_group, score_func,
                  group_score, renormalize, routed_scaling_factor, apply_routed_scaling, eps,
                  n_shared_experts);
}

// ---- moe_gate_hash -----------------------------------------------------------------------
mlaf_moe_gate_params gate_params(int64_t top_k, int64_t n_group, int64_t topk_group,
                                 int64_t score_func, int64_t group_score, bool renormalize,
                                 double routed_scaling_factor, bool apply_routed_scaling,
                                 double eps, int64_t n_shared_experts) {
    mlaf_moe_gate_params p;
    p.top_k = (int32_t)top_k;
    p.n_group = (int32_t)n_group;
    p.topk_group = (int32_t)topk_group;
    p.score_func = (mlaf_score_func)score_func;
    p.group_score = (mlaf_group_score)group_score;
    p.renormalize = renormalize ? 1 : 0;
    p.routed_scaling_factor = (float)routed_scaling_factor;
    p.apply_routed_scaling = apply_routed_scaling ? 1 : 0;
    p.eps = (float)eps;
    p.n_shared_experts = (int32_t)n_shared_experts;
    return p;
}

void moe_gate_hash_out(const at::Tensor &logits, const at::Tensor &tid2eid,
                       const at::Tensor &token_ids, const at::Tensor &weights,
                       const at::Tensor &ids, const std::optional<at::Tensor> &scores,
                       const std::optional<at::Tensor> &error_count, int64_t top_k,
                       int64_t n_group, int64_t topk_group, int64_t score_func,
                       int64_t group_score, bool renormalize, double routed_scaling_factor,
                       bool apply_routed_scaling, double eps, int64_t n_shared_experts) {
    need_api();
    const c10::Device d = logits.device();
    mlaf_context *ctx = context_for(d);
    View vl(logits, "logits", d, false), vt(tid2eid, "tid2eid", d, false),
        vk(token_ids, "token_ids", d, false), vw(weights, "weights", d, true),
        vi(ids, "ids", d, true), vs(scores, "scores", d, true),
        verr(error_count, "error_count", d, true);
    const mlaf_moe_gate_params p =
        gate_params(top_k, n_group, topk_group, score_func, group_score, renormalize,
                    routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts);
    check(ctx, api.moe_gate_hash(ctx, &p, vl.p, vt.p, vk.p, vw.p, vi.p, vs.p, verr.p));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gate_hash(
    const at::Tensor &logits, const at::Tensor &tid2eid, const at::Tensor &token_ids,
    const std::optional<at::Tensor> &error_count, int64_t top_k, int64_t n_group,
    int64_t topk_group, int64_t score_func, int64_t group_score, bool renormalize,
    double routed_scaling_factor, bool apply_routed_scaling, double eps,
    int64_t n_shared_experts, bool return_scores, std::optional<c10::ScalarType> weights_dtype) {
    const int64_t T = rows_of(logits), E = logits.dim() >= 2 ? logits.size(1) : 0;
    const int64_t K = nonneg(top_k + n_shared_experts);
    at::Tensor w = alloc(logits, T, K, weights_dtype.value_or(c10::ScalarType::Float)),
               i = alloc(logits, T, K, c10::ScalarType::Int),
               s = alloc(logits, T, return_scores ? E : 0, c10::ScalarType::Float);
    moe_gate_hash_out(logits, tid2eid, token_ids, w, i,
                      return_scores ? std::optional<at::Tensor>(s) : std::nullopt, error_count,
                      top_k, n_group, topk_group, score_func, group_score, renormalize,
                      routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts);
    return {w, i, s};
}

#define KV_IN                                                                                \
    "Tensor latent, Tensor? w_q, Tensor w_kv, Tensor? positions, Tensor? cos_sin, "         \
    "Tensor slot_mapping, Tensor(a!) kv_cache, Tensor(b!)? error_count"
#define KV_P "int q_lora_rank, int kv_lora_rank, int rope_dim, float eps_q, float eps_kv, int style"
#define KV_FMT(amax, kpe)                                                                    \
    "int cache_format=0, Tensor? scale=None, int fp8_conv=0, Tensor(" amax "!)? "            \
    "amax_out=None, int tile_scale=0, Tensor(" kpe "!)? kpe_cache=None, int kv_rope_tail=0"
#define IDX_P "int index_style, bool hadamard, float ln_eps, float amax_eps, int index_scale"
#define KV_DSA_IDX(c, d)                                                                     \
    "Tensor index_k, Tensor index_weight, Tensor index_bias, Tensor(" c "!) index_cache, "    \
    "Tensor(" d "!)? topk_fill"
#define KV_DSA_FMT(amax, kpe)                                                                \
    "int cache_format=0, Tensor? scale=None, int fp8_conv=0, Tensor(" amax "!)? "            \
    "amax_out=None, int tile_scale=0, Tensor(" kpe "!)? kpe_cache=None"
#define GATE_P                                                                               \
    "int top_k, int n_group, int topk_group, int score_func, int group_score, "              \
    "bool renormalize, float routed_scaling_factor, bool apply_routed_scaling, "             \
    "float eps, int n_shared_experts"

}  // namespace

TORCH_LIBRARY(mlafuse, m) {
    m.def("split_qk_norm(Tensor latent, Tensor? w_q, Tensor w_kv, int q_lora_rank, "
          "int kv_lora_rank, int rope_dim, float eps_q, float eps_kv, bool return_k_pe=True) "
          "-> (Tensor, Tensor, Tensor)");
    m.def("split_qk_norm_out(Tensor latent, Tensor? w_q, Tensor w_kv, Tensor(a!)? q, "
          "Tensor(b!) k_nope, Tensor(c!)? k_pe, int q_lora_rank, int kv_lora_rank, "
          "int rope_dim, float eps_q, float eps_kv) -> ()");
    m.def("split_qk_norm_inplace(Tensor(a!) latent, Tensor? w_q, Tensor w_kv, "
          "int q_lora_rank, int kv_lora_rank, int rope_dim, float eps_q, float eps_kv) -> ()");
    m.def("mla_kv_cache(" KV_IN ", " KV_P ", bool return_k_nope=False, "
          "bool return_k_pe=False, " KV_FMT("c", "d") ") -> (Tensor, Tensor, Tensor)");
    m.def("mla_kv_cache_out(" KV_IN ", Tensor(c!)? q, Tensor(d!)? k_nope, Tensor(e!)? k_pe, " KV_P
          ", " KV_FMT("f", "g") ") -> ()");
    m.def("mla_kv_cache_dsa(" KV_IN ", " KV_DSA_IDX("c", "d") ", " KV_P ", " IDX_P ", "
          "bool return_k_nope=False, bool return_k_pe=False, bool return_index_out=False, "
          "int index_copies=1, int index_copy_stride=0, " KV_DSA_FMT("e", "f")
          ") -> (Tensor, Tensor, Tensor, Tensor)");
    m.def("mla_kv_cache_dsa_out(" KV_IN ", " KV_DSA_IDX("c", "d") ", Tensor(e!)? q, "
          "Tensor(f!)? k_nope, Tensor(g!)? k_pe, Tensor(h!)? index_out, " KV_P ", " IDX_P ", "
          "int index_copies=1, int index_copy_stride=0, " KV_DSA_FMT("i", "j") ") -> ()");
    m.def("indexer_q(Tensor q_idx, Tensor positions, Tensor cos_sin, Tensor weights, " IDX_P
          ", Tensor(a!)? q_pe=None, int q_pe_style=0, Tensor(b!)? error_count=None) "
          "-> (Tensor, Tensor)");
    m.def("indexer_q_out(Tensor q_idx, Tensor positions, Tensor cos_sin, Tensor weights, "
          "Tensor(a!) q_fp8, Tensor(b!) w_out, " IDX_P ", Tensor(c!)? q_pe=None, "
          "int q_pe_style=0, Tensor(d!)? error_count=None) -> ()");
    m.def("rope_q(Tensor(a!) q, Tensor positions, Tensor cos_sin, int rope_dim, int style, "
          "Tensor(b!)? error_count=None, bool head_norm=False, float head_norm_eps=0.0, "
          "Tensor(c!)? q_out=None) -> ()");
    m.def("moe_gate(Tensor logits, Tensor? bias, " GATE_P ", bool return_scores=False, "
          "ScalarType? weights_dtype=None) -> (Tensor, Tensor, Tensor)");
    m.def("moe_gate_out(Tensor logits, Tensor? bias, Tensor(a!) weights, Tensor(b!) ids, "
          "Tensor(c!)? scores, " GATE_P ") -> ()");
    m.def("moe_gate_hash(Tensor logits, Tensor tid2eid, Tensor token_ids, "
          "Tensor(a!)? error_count, " GATE_P ", bool return_scores=False, "
          "ScalarType? weights_dtype=None) -> (Tensor, Tensor, Tensor)");
    m.def("moe_gate_hash_out(Tensor logits, Tensor tid2eid, Tensor token_ids, "
          "Tensor(a!) weights, Tensor(b!) ids, Tensor(c!)? scores, Tensor(d!)? error_count, "
          GATE_P ") -> ()");
}

// One kernel for both devices: the backend follows the tensors' device.
#define MLAFUSE_IMPLS(m)                                       \
    m.impl("split_qk_norm", &split_qk_norm);                   \
    m.impl("split_qk_norm_out", &split_qk_norm_out);           \
    m.impl("split_qk_norm_inplace", &split_qk_norm_inplace);   \
    m.impl("mla_kv_cache", &mla_kv_cache);                     \
    m.impl("mla_kv_cache_out", &mla_kv_cache_out);             \
    m.impl("mla_kv_cache_dsa", &mla_kv_cache_dsa);             \
    m.impl("mla_kv_cache_dsa_out", &mla_kv_cache_dsa_out);     \
    m.impl("indexer_q", &indexer_q);                           \
    m.impl("indexer_q_out", &indexer_q_out);                   \
    m.impl("rope_q", &rope_q);                                 \
    m.impl("moe_gate", &moe_gate);                             \
    m.impl("moe_gate_out", &moe_gate_out);                     \
    m.impl("moe_gate_hash", &moe_gate_hash);                   \
    m.impl("moe_gate_hash_out", &moe_gate_hash_out)

TORCH_LIBRARY_IMPL(mlafuse, CPU, m) { MLAFUSE_IMPLS(m); }
TORCH_LIBRARY_IMPL(mlafuse, CUDA, m) { MLAFUSE_IMPLS(m); }

// ---- C entry points for python/mlafuse (ctypes) ------------------------------------------

// Takes the entry points from the libmlafuse at `path` (the one the ctypes binding loaded:
// dlopen returns that same instance). Returns 0, or 1 with a message in err.
MLAFUSE_TORCH_EXPORT int mlafuse_torch_init(const char *path, char *err, size_t err_cap) {
    std::lock_guard<std::mutex> lock(init_mutex);
    auto say = [&](const std::string &s) {
        if (err && err_cap) std::snprintf(err, err_cap, "%s", s.c_str());
        return 1;
    };
    if (api_ready.load()) return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return say(std::string("dlopen: ") + dlerror());
    Api a;
    const char *missing = nullptr;
#define MLAF_SYM(field, name)                                             \
    a.field = reinterpret_cast<decltype(a.field)>(dlsym(h, #name));       \
    if (!a.field && !missing) missing = #name;
    MLAF_SYM(version_number, mlaf_version_number)
    MLAF_SYM(status_name, mlaf_status_name)
    MLAF_SYM(status_message, mlaf_status_message)
    MLAF_SYM(backend_name, mlaf_backend_name)
    MLAF_SYM(context_create, mlaf_context_create)
    MLAF_SYM(context_free, mlaf_context_free)
    MLAF_SYM(context_set_threads, mlaf_context_set_threads)
    MLAF_SYM(context_set_cuda_device, mlaf_context_set_cuda_device)
    MLAF_SYM(context_set_cuda_stream, mlaf_context_set_cuda_stream)
    MLAF_SYM(context_set_cuda_pdl, mlaf_context_set_cuda_pdl)
    MLAF_SYM(context_last_error, mlaf_context_last_error)
    MLAF_SYM(split_qk_norm, mlaf_split_qk_norm)
    MLAF_SYM(mla_kv_cache_fmt, mlaf_mla_kv_cache_fmt)
    MLAF_SYM(mla_kv_cache_dsa, mlaf_mla_kv_cache_dsa)
    MLAF_SYM(indexer_q, mlaf_indexer_q)
    MLAF_SYM(rope_q, mlaf_rope_q)
    MLAF_SYM(rope_q_out, mlaf_rope_q_out)
    MLAF_SYM(moe_gate, mlaf_moe_gate)
    MLAF_SYM(moe_gate_hash, mlaf_moe_gate_hash)
#undef MLAF_SYM
    if (missing) return say(std::string(path) + " has no symbol " + missing);
    if (a.version_number() != MLAF_VERSION_NUMBER)
        return say(std::string(path) + " is version " + std::to_string(a.version_number()) +
                   ", the torch extension was built for " + std::to_string(MLAF_VERSION_NUMBER));
    api = a;
    api_ready.store(true, std::memory_order_release);
    return 0;
}

// CPU threads for every later CPU call of every thread (0 = all cores); < 0 is ignored
// (mlafuse.set_num_threads rejects it first).
MLAFUSE_TORCH_EXPORT void mlafuse_torch_set_cpu_threads(int n) {
    if (n >= 0) cpu_threads.store(n, std::memory_order_relaxed);
}

// Programmatic dependent launch for every later CUDA call of every thread (0 off, 1 on).
MLAFUSE_TORCH_EXPORT void mlafuse_torch_set_cuda_pdl(int on) {
    cuda_pdl.store(on ? 1 : 0, std::memory_order_relaxed);
}

// MLAF_VERSION_NUMBER of the header the extension was built with.
MLAFUSE_TORCH_EXPORT unsigned mlafuse_torch_abi_version(void) { return MLAF_VERSION_NUMBER; }
