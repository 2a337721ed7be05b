// mlafuse_torch.cpp — the kernels of the torch.ops.mlafuse.* custom ops in C++, calling
// libmlafuse directly.
//
// Built by python/setup.py as a torch C++ extension (torch.utils.cpp_extension, no nvcc: the
// CUDA kernels live in libmlafuse; this file only hands them torch's current CUDA stream,
// which it reads through c10's device-agnostic DeviceGuardImplInterface, so it needs neither
// the CUDA headers nor libtorch_cuda). It has no Python module of its own: python/mlafuse
// loads it with torch.ops.load_library, then calls mlafuse_torch_init() with the path of the
// libmlafuse it already loaded, and this file takes the C entry points from that library
// with dlopen / dlsym (so both bindings use one library, the one $MLAFUSE_LIBRARY or the
// package names).
//
// No schema is written here: this file registers implementations only (TORCH_LIBRARY_IMPL for
// CPU and CUDA); the schemas, defined from Python, and the fake (meta) implementations for
// torch.compile live in mlafuse/_schemas.py and mlafuse/_torch_ops.py, shared with the ctypes
// binding. Every kernel mirrors the ctypes binding: outputs allocated like new_empty, views
// passed without copies, the same checks with the same messages ("MLAF_ERR_DTYPE: latent.dtype
// = torch.float64, expected ..."), which mlafuse turns into MlafError.
//
// Contexts: one mlaf_context per (backend, device) per thread, created on first use and
// freed when the thread ends; a CUDA context is pointed at torch's current stream of the
// tensors' device on every call (so calls follow torch.cuda.stream(...) and graph capture).
//
// Files: mlafuse_torch.h (what they share), this file (the library's entry points, contexts,
// the kernel registration and the C entry points), mlafuse_torch_mla.cpp and
// mlafuse_torch_moe.cpp (the op kernels), mlafuse_torch_norm.cpp (rms_norm_quant's kernels and
// their registration), mlafuse_torch_rowq.cpp (the row ops' quantized forms and theirs).
#include "mlafuse_torch.h"

namespace mlafuse_torch {

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

at::Tensor alloc(const at::Tensor &like, int64_t rows, int64_t cols) {
    return at::empty({rows, cols}, like.options());
}
at::Tensor alloc(const at::Tensor &like, int64_t rows, int64_t cols, c10::ScalarType dt) {
    return at::empty({rows, cols}, like.options().dtype(dt));
}

}  // namespace mlafuse_torch

using namespace mlafuse_torch;  // the kernels and the entry points, for the registration below

// The kernels of the ops by name. The ops themselves (their schemas) are defined by
// python/mlafuse from its one table, mlafuse/_schemas.py, right after it loads this library: a
// kernel whose C++ signature disagrees with its schema there makes that definition fail (an
// ImportError naming the op), and test_setup.py checks that the names here are the table's
// (rms_norm_quant's kernels are registered in mlafuse_torch_norm.cpp).

// One kernel for both devices: the backend follows the tensors' device.
#define MLAFUSE_IMPLS(m)                                       \
    m.impl("split_qk_norm", &split_qk_norm);                   \
    m.impl("split_qk_norm_out", &split_qk_norm_out);           \
    m.impl("split_qk_norm_inplace", &split_qk_norm_inplace);   \
    m.impl("split_qk_norm_lean", &split_qk_norm_lean);         \
    m.impl("split_qk_norm_lean_out", &split_qk_norm_lean_out); \
    m.impl("mla_kv_cache", &mla_kv_cache);                     \
    m.impl("mla_kv_cache_out", &mla_kv_cache_out);             \
    m.impl("mla_kv_cache_lean", &mla_kv_cache_lean);           \
    m.impl("mla_kv_cache_lean_out", &mla_kv_cache_lean_out);   \
    m.impl("mla_kv_cache_dsa", &mla_kv_cache_dsa);             \
    m.impl("mla_kv_cache_dsa_out", &mla_kv_cache_dsa_out);     \
    m.impl("indexer_q", &indexer_q);                           \
    m.impl("indexer_q_out", &indexer_q_out);                   \
    m.impl("rope_q", &rope_q);                                 \
    m.impl("moe_gate", &moe_gate);                             \
    m.impl("moe_gate_out", &moe_gate_out);                     \
    m.impl("moe_gate_hash", &moe_gate_hash);                   \
    m.impl("moe_gate_hash_out", &moe_gate_hash_out);           \
    m.impl("gemm_quant", &gemm_quant);                         \
    m.impl("gemm_quant_out", &gemm_quant_out)

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
    MLAF_SYM(rms_norm_quant, mlaf_rms_norm_quant)
    MLAF_SYM(split_qk_norm_quant, mlaf_split_qk_norm_quant)
    MLAF_SYM(mla_kv_cache_quant, mlaf_mla_kv_cache_quant)
    MLAF_SYM(mla_kv_cache_dsa_quant, mlaf_mla_kv_cache_dsa_quant)
    MLAF_SYM(gemm_quant, mlaf_gemm_quant)
    MLAF_SYM(gemm_format_group, mlaf_gemm_format_group)
    MLAF_SYM(gemm_scales_shape, mlaf_gemm_scales_shape)
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
    cuda_pdl.store(on == 2 ? 2 : on ? 1 : 0, std::memory_order_relaxed);
}

// MLAF_VERSION_NUMBER of the header the extension was built with.
MLAFUSE_TORCH_EXPORT unsigned mlafuse_torch_abi_version(void) { return MLAF_VERSION_NUMBER; }
