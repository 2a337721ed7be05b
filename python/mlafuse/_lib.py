"""ctypes face of libmlafuse: finding and loading the shared library, the C structs mirrored
field for field, the function prototypes, and MlafError.

Nothing here knows about numpy or torch; the layouts below must match include/mlafuse.h
byte for byte (tests/test_layout.py pins sizeof and offsets taken from a C program).
"""
from __future__ import annotations

import ctypes
import glob
import os

# ---- enums of include/mlafuse.h (append-only there, so the numbers are stable) ----------
F32, F16, BF16, I32, I64, U8, FP8_E4M3 = 0, 1, 2, 3, 4, 5, 6
BACKEND_CPU, BACKEND_CUDA = 0, 1
SCORE_SIGMOID, SCORE_SOFTMAX, SCORE_SQRT_SOFTPLUS = 0, 1, 2
OP_SPLIT_QK_NORM, OP_MLA_KV_CACHE, OP_ROPE_Q, OP_MOE_GATE, OP_INDEXER_Q, OP_RMS_NORM_QUANT = 0, 1, 2, 3, 4, 5
OP_GEMM_QUANT = 6
INDEX_SCALE_UE8M0, INDEX_SCALE_F32 = 0, 1       # mlaf_index_scale
GROUP_TOP2_SUM, GROUP_MAX = 0, 1
ROPE_INTERLEAVED, ROPE_NEOX, ROPE_NONE = 0, 1, 2
KV_PLAIN, KV_FP8, KV_FP8_DS_MLA, KV_FP8_V4 = 0, 1, 2, 3  # mlaf_kv_format
FP8_DIV, FP8_MUL = 0, 1                         # mlaf_fp8_conv
TILE_AMAX, TILE_UE8M0, TILE_UE8M0_FLOOR_SCALED = 0, 1, 2  # mlaf_tile_scale
MAX_DIMS = 4

OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_NULL_POINTER = 2
ERR_SHAPE = 3
ERR_STRIDE = 4
ERR_DTYPE = 5
ERR_OVERLAP = 6
ERR_LIMIT = 7
ERR_BACKEND_UNAVAILABLE = 8
ERR_UNSUPPORTED = 9
ERR_DEVICE = 10
ERR_OUT_OF_MEMORY = 11


class Tensor(ctypes.Structure):
    """mlaf_tensor: a non-owning strided view, strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("stride", ctypes.c_int64 * MAX_DIMS),
    ]


class ModelConfig(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 64),
        ("q_lora_rank", ctypes.c_int32),
        ("kv_lora_rank", ctypes.c_int32),
        ("qk_rope_head_dim", ctypes.c_int32),
        ("qk_nope_head_dim", ctypes.c_int32),
        ("v_head_dim", ctypes.c_int32),
        ("num_heads", ctypes.c_int32),
        ("n_routed_experts", ctypes.c_int32),
        ("top_k", ctypes.c_int32),
        ("n_group", ctypes.c_int32),
        ("topk_group", ctypes.c_int32),
        ("score_func", ctypes.c_int),
        ("group_score", ctypes.c_int),
        ("has_score_bias", ctypes.c_int32),
        ("norm_topk_prob", ctypes.c_int32),
        ("routed_scaling_factor", ctypes.c_float),
        ("apply_routed_scaling", ctypes.c_int32),
        ("rms_norm_eps", ctypes.c_float),
        ("n_shared_experts", ctypes.c_int32),
        ("rope_style", ctypes.c_int),
        ("index_n_heads", ctypes.c_int32),
        ("index_head_dim", ctypes.c_int32),
        ("index_topk", ctypes.c_int32),
        ("index_rope_style", ctypes.c_int),
        ("kv_rope_tail", ctypes.c_int32),
        ("n_hash_layers", ctypes.c_int32),
    ]


class SplitQkNormParams(ctypes.Structure):
    _fields_ = [
        ("q_lora_rank", ctypes.c_int32),
        ("kv_lora_rank", ctypes.c_int32),
        ("rope_dim", ctypes.c_int32),
        ("eps_q", ctypes.c_float),
        ("eps_kv", ctypes.c_float),
        ("kv_rope_tail", ctypes.c_int32),
    ]


class RopeParams(ctypes.Structure):
    _fields_ = [("rope_dim", ctypes.c_int32), ("style", ctypes.c_int), ("head_norm", ctypes.c_int32),
                ("head_norm_eps", ctypes.c_float)]


class RopeScaling(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int), ("factor", ctypes.c_double),
        ("original_max_position_embeddings", ctypes.c_int64), ("beta_fast", ctypes.c_double),
        ("beta_slow", ctypes.c_double), ("mscale", ctypes.c_double),
        ("mscale_all_dim", ctypes.c_double), ("attention_factor", ctypes.c_double),
        ("truncate", ctypes.c_int32),
    ]


ROPE_SCALING_NONE, ROPE_SCALING_YARN = 0, 1


class MlaKvCacheParams(ctypes.Structure):
    _fields_ = [
        ("q_lora_rank", ctypes.c_int32),
        ("kv_lora_rank", ctypes.c_int32),
        ("rope_dim", ctypes.c_int32),
        ("eps_q", ctypes.c_float),
        ("eps_kv", ctypes.c_float),
        ("style", ctypes.c_int),
        ("kv_rope_tail", ctypes.c_int32),
    ]


class KvCacheDesc(ctypes.Structure):
    """mlaf_kv_cache_desc: the cache of mla_kv_cache in one of its formats (docs/kv_formats.md)."""

    _fields_ = [
        ("format", ctypes.c_int),
        ("cache", ctypes.POINTER(Tensor)),
        ("kpe", ctypes.POINTER(Tensor)),
        ("scale", ctypes.POINTER(Tensor)),
        ("amax_out", ctypes.POINTER(Tensor)),
        ("conv", ctypes.c_int),
        ("tile_scale", ctypes.c_int),
    ]


class IndexerParams(ctypes.Structure):
    """mlaf_indexer_params: one DSA indexer's settings, shared by its key and query sides."""

    _fields_ = [
        ("style", ctypes.c_int),
        ("hadamard", ctypes.c_int32),
        ("ln_eps", ctypes.c_float),
        ("amax_eps", ctypes.c_float),
        ("scale", ctypes.c_int),
    ]


class IndexerK(ctypes.Structure):
    """mlaf_indexer_k: the key branch of mla_kv_cache."""

    _fields_ = [
        ("index_k", ctypes.POINTER(Tensor)),
        ("weight", ctypes.POINTER(Tensor)),
        ("bias", ctypes.POINTER(Tensor)),
        ("cache", ctypes.POINTER(Tensor)),
        ("out", ctypes.POINTER(Tensor)),
        ("topk_fill", ctypes.POINTER(Tensor)),
        ("copies", ctypes.c_int32),
        ("copy_stride", ctypes.c_int64),
    ]


class MoeGateParams(ctypes.Structure):
    _fields_ = [
        ("top_k", ctypes.c_int32),
        ("n_group", ctypes.c_int32),
        ("topk_group", ctypes.c_int32),
        ("score_func", ctypes.c_int),
        ("group_score", ctypes.c_int),
        ("renormalize", ctypes.c_int32),
        ("routed_scaling_factor", ctypes.c_float),
        ("apply_routed_scaling", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("n_shared_experts", ctypes.c_int32),
    ]


class GemmOut(ctypes.Structure):
    """mlaf_gemm_out: one quantized GEMM-input output (docs/gemm_formats.md); format 0 = none."""

    _fields_ = [
        ("format", ctypes.c_int),
        ("scale", ctypes.c_int),
        ("data", ctypes.POINTER(Tensor)),
        ("scales", ctypes.POINTER(Tensor)),
        ("eps", ctypes.c_float),
    ]


class RmsNormQuantParams(ctypes.Structure):
    _fields_ = [("eps", ctypes.c_float)]


class RowQuant(ctypes.Structure):
    """mlaf_row_quant: the quantized q_norm and k_nope of the MLA row ops (docs/gemm_formats.md)."""

    _fields_ = [("q", GemmOut), ("k_nope", GemmOut)]


class MlafError(RuntimeError):
    """A call rejected by mlafuse (or by the binding before it reached the library).

    Attributes: ``status`` (the integer mlaf_status), ``status_name`` ("MLAF_ERR_SHAPE") and
    ``message`` (the library's mlaf_context_last_error text, naming the argument and the
    expected value).
    """

    def __init__(self, status: int, message: str, status_name: str | None = None):
        self.status = int(status)
        self.status_name = status_name or _status_name(self.status)
        self.message = message
        super().__init__(f"{self.status_name}: {message}")


# ---- finding the library -------------------------------------------------------------------
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(os.path.dirname(_PKG_DIR))


def _candidates() -> list[str]:
    env = os.environ.get("MLAFUSE_LIBRARY")
    if env:
        # An explicit choice is never second-guessed: if it fails to load, the user hears so.
        return [env]
    out = []
    for d in (os.path.join(_PKG_DIR, "lib"), os.path.join(_REPO_ROOT, "build")):
        # Prefer the unversioned name, then the soname link, then the real file.
        names = sorted(glob.glob(os.path.join(d, "libmlafuse.so*")), key=len)
        names += sorted(glob.glob(os.path.join(d, "libmlafuse*.dylib")), key=len)
        names += sorted(glob.glob(os.path.join(d, "mlafuse.dll")), key=len)
        out.extend(names)
    return out


def _load() -> tuple[ctypes.CDLL, str]:
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    where = "; ".join(tried) if tried else (
        f"no libmlafuse.so in {os.path.join(_PKG_DIR, 'lib')} or {os.path.join(_REPO_ROOT, 'build')}")
    raise ImportError(
        "mlafuse: cannot load the shared library libmlafuse (" + where + "). Install the "
        "package with `pip install ./python` (which builds it), build the repository into "
        "build/, or point MLAFUSE_LIBRARY at libmlafuse.so.")


lib, library_path = _load()

_P = ctypes.POINTER
_T = _P(Tensor)
_ctx_p = ctypes.c_void_p


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


mlaf_version_number = _proto("mlaf_version_number", ctypes.c_uint)
mlaf_version_string = _proto("mlaf_version_string", ctypes.c_char_p)
mlaf_status_name = _proto("mlaf_status_name", ctypes.c_char_p, ctypes.c_int)
mlaf_status_message = _proto("mlaf_status_message", ctypes.c_char_p, ctypes.c_int)
mlaf_dtype_size = _proto("mlaf_dtype_size", ctypes.c_size_t, ctypes.c_int)
mlaf_dtype_name = _proto("mlaf_dtype_name", ctypes.c_char_p, ctypes.c_int)
mlaf_backend_name = _proto("mlaf_backend_name", ctypes.c_char_p, ctypes.c_int)
mlaf_op_name = _proto("mlaf_op_name", ctypes.c_char_p, ctypes.c_int)
mlaf_backend_available = _proto("mlaf_backend_available", ctypes.c_int, ctypes.c_int)
mlaf_backend_supports = _proto("mlaf_backend_supports", ctypes.c_int, ctypes.c_int, ctypes.c_int)
mlaf_context_create = _proto("mlaf_context_create", ctypes.c_int, _P(_ctx_p), ctypes.c_int)
mlaf_context_free = _proto("mlaf_context_free", None, _ctx_p)
mlaf_context_backend = _proto("mlaf_context_backend", ctypes.c_int, _ctx_p)
mlaf_context_set_threads = _proto("mlaf_context_set_threads", ctypes.c_int, _ctx_p, ctypes.c_int)
mlaf_context_threads = _proto("mlaf_context_threads", ctypes.c_int, _ctx_p)
mlaf_context_set_cpu_isa = _proto("mlaf_context_set_cpu_isa", ctypes.c_int, _ctx_p, ctypes.c_int)
mlaf_context_cpu_isa = _proto("mlaf_context_cpu_isa", ctypes.c_int, _ctx_p)
mlaf_cpu_isa_name = _proto("mlaf_cpu_isa_name", ctypes.c_char_p, ctypes.c_int)
mlaf_context_set_cuda_device = _proto("mlaf_context_set_cuda_device", ctypes.c_int, _ctx_p,
                                      ctypes.c_int)
mlaf_context_set_cuda_stream = _proto("mlaf_context_set_cuda_stream", ctypes.c_int, _ctx_p,
                                      ctypes.c_void_p)
mlaf_context_set_cuda_pdl = _proto("mlaf_context_set_cuda_pdl", ctypes.c_int, _ctx_p, ctypes.c_int)
mlaf_context_last_error = _proto("mlaf_context_last_error", ctypes.c_char_p, _ctx_p)
mlaf_preset_count = _proto("mlaf_preset_count", ctypes.c_int)
mlaf_preset_at = _proto("mlaf_preset_at", _P(ModelConfig), ctypes.c_int)
mlaf_preset_find = _proto("mlaf_preset_find", _P(ModelConfig), ctypes.c_char_p)
mlaf_rope_table_init = _proto("mlaf_rope_table_init", ctypes.c_int, ctypes.c_void_p,
                              ctypes.c_int64, ctypes.c_int32, ctypes.c_double)
mlaf_rope_table_init_scaled = _proto("mlaf_rope_table_init_scaled", ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int32, ctypes.c_double,
                                     _P(RopeScaling))
mlaf_rope_scaling_attention_factor = _proto("mlaf_rope_scaling_attention_factor", ctypes.c_double,
                                            _P(RopeScaling))
mlaf_moe_gate_params_from_config = _proto("mlaf_moe_gate_params_from_config", MoeGateParams,
                                          _P(ModelConfig))
mlaf_split_qk_norm = _proto("mlaf_split_qk_norm", ctypes.c_int, _ctx_p, _P(SplitQkNormParams),
                            _T, _T, _T, _T, _T, _T)
mlaf_mla_kv_cache = _proto("mlaf_mla_kv_cache", ctypes.c_int, _ctx_p, _P(MlaKvCacheParams),
                           _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T)
mlaf_mla_kv_cache_fmt = _proto("mlaf_mla_kv_cache_fmt", ctypes.c_int, _ctx_p, _P(MlaKvCacheParams),
                               _T, _T, _T, _T, _T, _T, _P(KvCacheDesc), _T, _T, _T, _T)
mlaf_mla_kv_cache_dsa = _proto("mlaf_mla_kv_cache_dsa", ctypes.c_int, _ctx_p, _P(MlaKvCacheParams),
                               _T, _T, _T, _T, _T, _T, _P(KvCacheDesc), _T, _T, _T, _T,
                               _P(IndexerParams), _P(IndexerK))
mlaf_indexer_q = _proto("mlaf_indexer_q", ctypes.c_int, _ctx_p, _P(IndexerParams), _T, _T, _T, _T, _T, _T,
                        _T, _P(RopeParams), _T)
mlaf_indexer_params_from_config = _proto("mlaf_indexer_params_from_config", IndexerParams, _P(ModelConfig))
mlaf_kv_format_name = _proto("mlaf_kv_format_name", ctypes.c_char_p, ctypes.c_int)
mlaf_kv_record_bytes = _proto("mlaf_kv_record_bytes", ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int32, ctypes.c_int32)
# Every KV-cache format of the loaded library by name, read from its format table (the enum values
# are consecutive from 0): a format the library gains is known here without a change to this file.
KV_FORMATS = {}
while mlaf_kv_format_name(len(KV_FORMATS)).decode() != "unknown":
    KV_FORMATS[mlaf_kv_format_name(len(KV_FORMATS)).decode()] = len(KV_FORMATS)
mlaf_gemm_format_name = _proto("mlaf_gemm_format_name", ctypes.c_char_p, ctypes.c_int)
mlaf_gemm_scale_name = _proto("mlaf_gemm_scale_name", ctypes.c_char_p, ctypes.c_int)
mlaf_gemm_format_group = _proto("mlaf_gemm_format_group", ctypes.c_int32, ctypes.c_int)
mlaf_gemm_scales_shape = _proto("mlaf_gemm_scales_shape", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                _P(ctypes.c_int), _P(ctypes.c_int64), _P(ctypes.c_int64))
mlaf_rms_norm_quant = _proto("mlaf_rms_norm_quant", ctypes.c_int, _ctx_p, _P(RmsNormQuantParams), _T, _T, _T, _T,
                             _P(GemmOut))
mlaf_split_qk_norm_quant = _proto("mlaf_split_qk_norm_quant", ctypes.c_int, _ctx_p, _P(SplitQkNormParams),
                                  _T, _T, _T, _T, _T, _T, _P(RowQuant))
mlaf_mla_kv_cache_quant = _proto("mlaf_mla_kv_cache_quant", ctypes.c_int, _ctx_p, _P(MlaKvCacheParams),
                                 _T, _T, _T, _T, _T, _T, _P(KvCacheDesc), _T, _T, _T, _T, _P(RowQuant))
mlaf_mla_kv_cache_dsa_quant = _proto("mlaf_mla_kv_cache_dsa_quant", ctypes.c_int, _ctx_p, _P(MlaKvCacheParams),
                                     _T, _T, _T, _T, _T, _T, _P(KvCacheDesc), _T, _T, _T, _T,
                                     _P(IndexerParams), _P(IndexerK), _P(RowQuant))
mlaf_gemm_quant = _proto("mlaf_gemm_quant", ctypes.c_int, _ctx_p, _T, _P(GemmOut))
# The GEMM-input formats and scale roundings by name, read from the library's table (format 0 is
# "none"; the values are consecutive).
GEMM_FORMATS = {}
while mlaf_gemm_format_name(len(GEMM_FORMATS)).decode() != "unknown":
    GEMM_FORMATS[mlaf_gemm_format_name(len(GEMM_FORMATS)).decode()] = len(GEMM_FORMATS)
GEMM_SCALES = {}
while mlaf_gemm_scale_name(len(GEMM_SCALES)).decode() != "unknown":
    GEMM_SCALES[mlaf_gemm_scale_name(len(GEMM_SCALES)).decode()] = len(GEMM_SCALES)
mlaf_rope_q = _proto("mlaf_rope_q", ctypes.c_int, _ctx_p, _P(RopeParams), _T, _T, _T, _T)
mlaf_rope_q_out = _proto("mlaf_rope_q_out", ctypes.c_int, _ctx_p, _P(RopeParams), _T, _T, _T, _T, _T)
mlaf_moe_gate = _proto("mlaf_moe_gate", ctypes.c_int, _ctx_p, _P(MoeGateParams),
                       _T, _T, _T, _T, _T)
mlaf_moe_gate_hash = _proto("mlaf_moe_gate_hash", ctypes.c_int, _ctx_p, _P(MoeGateParams),
                            _T, _T, _T, _T, _T, _T, _T)


def _status_name(status: int) -> str:
    return mlaf_status_name(int(status)).decode()


def status_message(status: int) -> str:
    return mlaf_status_message(int(status)).decode()
