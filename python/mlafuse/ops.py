"""The public Python API: one function per op, for numpy arrays (CPU backend) and torch
tensors (CPU or CUDA backend, through the torch.ops.mlafuse custom ops so that the same call
works eagerly, under torch.compile and inside CUDA-graph capture).

Every function takes the inputs first, then keyword-only parameters and optional outputs
(``out``-style: any output not given is allocated). No input is copied: strided views are
passed to the library as they are. A rejected call raises MlafError carrying the library's
message and writes nothing.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from . import _core
from . import _lib as L
from ._lib import MlafError

_torch = None
if not os.environ.get("MLAFUSE_DISABLE_TORCH"):
    try:
        import torch as _torch  # noqa: F811  (optional: the package works with numpy alone)
    except ImportError:
        _torch = None

if _torch is not None:
    from . import _torch_ops as _T
else:
    _T = None

# Which implementation serves torch tensors: "ext" (the compiled extension) or "ctypes"
# (see _torch_ops). numpy arrays always go through ctypes.
BINDING = _T.BINDING if _T is not None else "ctypes"


class _NoTorch:  # stands for torch.Tensor without torch: isinstance(x, _TT) is then False
    pass


_TT = _torch.Tensor if _torch is not None else _NoTorch
if _torch is not None:
    # The op packets, looked up once: the torch paths below call them directly.
    _op_split = _torch.ops.mlafuse.split_qk_norm
    _op_split_out = _torch.ops.mlafuse.split_qk_norm_out
    _op_split_inplace = _torch.ops.mlafuse.split_qk_norm_inplace
    _op_kv = _torch.ops.mlafuse.mla_kv_cache
    _op_kv_out = _torch.ops.mlafuse.mla_kv_cache_out
    _op_rope = _torch.ops.mlafuse.rope_q
    _op_gate = _torch.ops.mlafuse.moe_gate
    _op_gate_out = _torch.ops.mlafuse.moe_gate_out
    _op_gate_hash = _torch.ops.mlafuse.moe_gate_hash
    _op_gate_hash_out = _torch.ops.mlafuse.moe_gate_hash_out
    _is_compiling = _torch.compiler.is_compiling


def _is_torch(x) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def _torch_error(e: RuntimeError, **arrays) -> Exception:
    """What to raise for a RuntimeError out of a torch op: TypeError when numpy arrays were
    mixed into a torch call (the dispatcher rejected them), MlafError for the compiled
    binding's "MLAF_ERR_...: message" errors (the ctypes binding raises MlafError itself),
    else the error as it is. Only ever runs on the error path."""
    if isinstance(e, MlafError):
        return e
    _check_same_kind(True, **arrays)
    return _T.error_from_text(str(e)) or e


# ---- names for enum parameters (ints pass through so the library reports bad values) -----
_STYLES = {"interleaved": L.ROPE_INTERLEAVED, "gptj": L.ROPE_INTERLEAVED, "neox": L.ROPE_NEOX}
_SCORES = {"sigmoid": L.SCORE_SIGMOID, "softmax": L.SCORE_SOFTMAX,
           "sqrt_softplus": L.SCORE_SQRT_SOFTPLUS}
_GROUPS = {"top2_sum": L.GROUP_TOP2_SUM, "max": L.GROUP_MAX}


def _enum(value, table: dict, what: str) -> int:
    if isinstance(value, str):
        try:
            return table[value.lower()]
        except KeyError:
            raise ValueError(f"{what} = {value!r}, expected one of {sorted(table)}") from None
    return int(value)


def _name_of(code: int, table: dict) -> str:
    for k, v in table.items():
        if v == code:
            return k
    return str(code)


# ---- version, backends ---------------------------------------------------------------------
def version() -> str:
    """The library's version string, e.g. "0.1.0"."""
    return L.mlaf_version_string().decode()


def version_number() -> int:
    """MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library."""
    return int(L.mlaf_version_number())


_BACKENDS = {"cpu": L.BACKEND_CPU, "cuda": L.BACKEND_CUDA}
_OPS = {"split_qk_norm": L.OP_SPLIT_QK_NORM, "mla_kv_cache": L.OP_MLA_KV_CACHE,
        "rope_q": L.OP_ROPE_Q, "moe_gate": L.OP_MOE_GATE}


def backend_available(backend: str) -> bool:
    """True when the backend ("cpu" or "cuda") was built in and can run here (CUDA: a
    device is visible)."""
    return bool(L.mlaf_backend_available(_enum(backend, _BACKENDS, "backend")))


def backend_supports(backend: str, op: str) -> bool:
    """True when the backend implements the op ("split_qk_norm", "mla_kv_cache", "rope_q",
    "moe_gate")."""
    return bool(L.mlaf_backend_supports(_enum(backend, _BACKENDS, "backend"),
                                        _enum(op, _OPS, "op")))


set_num_threads = _core.set_num_threads
set_cuda_pdl = _core.set_cuda_pdl
get_num_threads = _core.get_num_threads


# ---- presets -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A model's numbers (SPEC §1), as the library's mlaf_model_config."""

    name: str
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    num_heads: int
    n_routed_experts: int
    top_k: int
    n_group: int
    topk_group: int
    score_func: str          # "sigmoid" | "softmax" | "sqrt_softplus" (DeepSeek-V4)
    group_score: str         # "top2_sum" | "max"
    has_score_bias: bool
    norm_topk_prob: bool
    routed_scaling_factor: float
    apply_routed_scaling: bool
    rms_norm_eps: float
    n_shared_experts: int
    rope_style: str          # "interleaved" | "neox"
    index_n_heads: int = 0   # DSA lightning indexer (GLM-5, DeepSeek-V3.2); 0: none
    index_head_dim: int = 0
    index_topk: int = 0
    index_rope_style: str = "interleaved"  # GLM-5 interleaved, DeepSeek-V3.2 "neox"
    kv_rope_tail: int = 0    # DeepSeek-V4: RoPE on the last 64 of the 512 kv values (R = 0)
    n_hash_layers: int = 0   # DeepSeek-V4: the first 3 MoE layers route by moe_gate_hash

    def moe_gate_kwargs(self) -> dict:
        """The router parameters of this model, as keyword arguments of moe_gate (the same
        mapping as the C mlaf_moe_gate_params_from_config; shared experts are not fused)."""
        return dict(top_k=self.top_k, n_group=self.n_group, topk_group=self.topk_group,
                    score_func=self.score_func, group_score=self.group_score,
                    renormalize=self.norm_topk_prob,
                    routed_scaling_factor=self.routed_scaling_factor,
                    apply_routed_scaling=self.apply_routed_scaling, eps=1e-20,
                    n_shared_experts=0)


def _f32(x: float) -> float:
    """The shortest decimal that rounds to the same f32 (1.8, not 1.7999999523162842)."""
    want = struct.pack("f", x)
    for digits in range(1, 10):
        y = float(f"{x:.{digits}g}")
        if struct.pack("f", y) == want:
            return y
    return x


def _preset_from_c(cp) -> Preset:
    c = cp.contents
    return Preset(
        name=c.name.decode(), q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
        qk_rope_head_dim=c.qk_rope_head_dim, qk_nope_head_dim=c.qk_nope_head_dim,
        v_head_dim=c.v_head_dim, num_heads=c.num_heads, n_routed_experts=c.n_routed_experts,
        top_k=c.top_k, n_group=c.n_group, topk_group=c.topk_group,
        score_func=_name_of(c.score_func, _SCORES), group_score=_name_of(c.group_score, _GROUPS),
        has_score_bias=bool(c.has_score_bias), norm_topk_prob=bool(c.norm_topk_prob),
        routed_scaling_factor=_f32(c.routed_scaling_factor),
        apply_routed_scaling=bool(c.apply_routed_scaling), rms_norm_eps=_f32(c.rms_norm_eps),
        n_shared_experts=c.n_shared_experts, rope_style=_name_of(c.rope_style, _STYLES),
        index_n_heads=c.index_n_heads, index_head_dim=c.index_head_dim, index_topk=c.index_topk,
        index_rope_style=_name_of(c.index_rope_style, _STYLES), kv_rope_tail=c.kv_rope_tail,
        n_hash_layers=c.n_hash_layers)


_PRESETS = tuple(_preset_from_c(L.mlaf_preset_at(i)) for i in range(L.mlaf_preset_count()))
# Read once at import, so that resolving a preset by name is plain Python (traceable by
# torch.compile); the C lookup also knows aliases ("deepseek-r1").
_PRESET_BY_NAME = {p.name.lower(): p for p in _PRESETS}
_PRESET_BY_NAME["deepseek-r1"] = _preset_from_c(L.mlaf_preset_find(b"deepseek-r1"))


def presets() -> list[Preset]:
    """The built-in presets; the first is the default, glm-4.7-flash."""
    return list(_PRESETS)


def find_preset(name: str) -> Preset | None:
    """A preset by name, case-insensitive ("deepseek-r1" is "deepseek-v3"); None if unknown."""
    p = _PRESET_BY_NAME.get(name.lower())
    if p is not None:
        return p
    cp = L.mlaf_preset_find(name.encode())
    return _preset_from_c(cp) if cp else None


# ---- RoPE table ----------------------------------------------------------------------------
_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "attention_factor", "truncate")


def _rope_scaling(scaling, base):
    """A Hugging Face ``rope_scaling`` dict (or transformers' newer ``rope_parameters``, whose
    rope_theta must then agree with ``base``) as the library's mlaf_rope_scaling, or None for
    plain RoPE. Unknown types and keys are errors, never ignored."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling is a {type(scaling).__name__}, expected a rope_scaling dict or None")
    if "rope_theta" in scaling:
        if float(scaling["rope_theta"]) != float(base):
            raise MlafError(L.ERR_INVALID_ARGUMENT,
                            f"scaling['rope_theta'] = {scaling['rope_theta']} but base = {base}: "
                            "pass base=rope_theta")
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        extra = sorted(k for k in scaling if k not in ("rope_type", "type"))
        if extra:
            raise MlafError(L.ERR_INVALID_ARGUMENT,
                            f"rope_scaling has no type (or 'default') but sets {extra}")
        return None
    if kind != "yarn":
        raise MlafError(L.ERR_INVALID_ARGUMENT,
                        f"rope_scaling type {kind!r} is not supported (expected 'yarn' or none)")
    unknown = sorted(k for k in scaling if k not in _YARN_KEYS + ("rope_type", "type"))
    if unknown:
        raise MlafError(L.ERR_INVALID_ARGUMENT,
                        f"rope_scaling (yarn): unknown key(s) {unknown}; expected some of "
                        f"{list(_YARN_KEYS)}")
    for key in ("factor", "original_max_position_embeddings"):
        if scaling.get(key) is None:
            raise MlafError(L.ERR_INVALID_ARGUMENT, f"rope_scaling (yarn): {key!r} is required")
    s = L.RopeScaling()
    s.type = L.ROPE_SCALING_YARN
    s.factor = float(scaling["factor"])
    orig = scaling["original_max_position_embeddings"]
    if isinstance(orig, bool) or int(orig) != orig:
        raise MlafError(L.ERR_INVALID_ARGUMENT,
                        f"rope_scaling (yarn): original_max_position_embeddings = {orig!r}, "
                        "expected a whole number")
    s.original_max_position_embeddings = int(orig)
    # As Hugging Face reads them: beta_fast / beta_slow fall back to 32 / 1 when absent or 0;
    # an absent mscale, mscale_all_dim or attention_factor is 0 to the library.
    s.beta_fast = float(scaling.get("beta_fast") or 32.0)
    s.beta_slow = float(scaling.get("beta_slow") or 1.0)
    s.mscale = float(scaling.get("mscale") or 0.0)
    s.mscale_all_dim = float(scaling.get("mscale_all_dim") or 0.0)
    s.attention_factor = float(scaling.get("attention_factor") or 0.0)
    s.truncate = 1 if scaling.get("truncate", True) else 0
    return s


def rope_table(max_pos: int, rope_dim: int, base: float = 10000.0, *, device=None, scaling=None):
    """The cos_sin table [max_pos, rope_dim] f32 used by mla_kv_cache and rope_q:
    row p = [cos(p*f_0) .. cos(p*f_{R/2-1}) | sin(...)], f_i = base^(-2i/R), computed in double
    and rounded once. Returns a numpy array, or a torch tensor on ``device`` when given.

    ``scaling``: None (plain RoPE) or a Hugging Face ``rope_scaling`` dict, e.g. DeepSeek-V3's
    ``{"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
    "beta_slow": 1, "mscale": 1, "mscale_all_dim": 1}`` (the config's own dict can be passed as
    it is, with ``base=config["rope_theta"]``). YaRN blends interpolated and extrapolated
    frequencies and multiplies cos and sin by the attention factor (mlaf_rope_table_init_scaled
    in include/mlafuse/mla.h has the formulas). A type other than "yarn" / "default", or an
    unknown key, raises MlafError."""
    np = _core._numpy()
    max_pos, rope_dim = int(max_pos), int(rope_dim)
    what = f"rope_table(max_pos={max_pos}, rope_dim={rope_dim}, base={base}"
    what += f", scaling={scaling!r})" if scaling is not None else ")"
    if max_pos < 1 or rope_dim <= 0 or rope_dim % 2 or not (base > 1.0):
        raise MlafError(L.ERR_INVALID_ARGUMENT,
                        f"{what}: expected max_pos >= 1, rope_dim > 0 and even, finite base > 1")
    sc = _rope_scaling(scaling, base)
    table = np.empty((max_pos, rope_dim), np.float32)
    if sc is None:
        st = L.mlaf_rope_table_init(table.ctypes.data, max_pos, rope_dim, float(base))
    else:
        st = L.mlaf_rope_table_init_scaled(table.ctypes.data, max_pos, rope_dim, float(base), sc)
    if st != L.OK:
        hint = ("; yarn expects factor >= 1, original_max_position_embeddings >= 1, beta_fast "
                "and beta_slow > 0, mscale / mscale_all_dim / attention_factor >= 0, all finite"
                if sc is not None else "")
        raise MlafError(st, what + hint)
    if device is not None:
        if _torch is None:
            raise ImportError("rope_table(device=...) needs torch")
        return _torch.from_numpy(table).to(device)
    return table


# ---- helpers for the numpy path ------------------------------------------------------------
def _dim(a, i: int) -> int:
    shape = getattr(a, "shape", None)  # not an array: the view step names the argument
    return int(shape[i]) if shape is not None and len(shape) > i else 0


def _np_in(a, name):
    return None if a is None else _core.view_numpy(a, name)


def _np_out(a, name):
    return None if a is None else _core.view_numpy(a, name, writable=True)


def _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim):
    if q_lora_rank is None and kv_lora_rank is None and rope_dim is None:
        try:  # the common call, on the host's per-call path: the shapes as they are
            Q = w_q.shape[0] if w_q is not None else 0
            C = w_kv.shape[0]
            return Q, C, latent.shape[1] - Q - C
        except (AttributeError, IndexError, TypeError):
            pass  # not arrays, or too few dimensions: the checked form below
    Q = int(q_lora_rank) if q_lora_rank is not None else (_dim(w_q, 0) if w_q is not None else 0)
    C = int(kv_lora_rank) if kv_lora_rank is not None else _dim(w_kv, 0)
    R = int(rope_dim) if rope_dim is not None else _dim(latent, 1) - Q - C
    return Q, C, R


def _check_same_kind(torch_path: bool, **arrays):
    for name, a in arrays.items():
        if a is not None and _is_torch(a) != torch_path:
            raise TypeError(f"{name} is a {type(a).__name__}, but the first argument is a "
                            f"{'torch.Tensor' if torch_path else 'numpy.ndarray'}: do not mix")


# ---- split_qk_norm -------------------------------------------------------------------------
def split_qk_norm(latent, w_q, w_kv, *, eps_q: float = 1e-5, eps_kv: float = 1e-5,
                  q_lora_rank: int | None = None, kv_lora_rank: int | None = None,
                  rope_dim: int | None = None, q=None, k_nope=None, k_pe=None,
                  return_k_pe: bool = True, inplace: bool = False):
    """Split the fused q-a / kv-a projection output and RMS-normalize both parts (SPEC §2).

    latent  [T, Q + C + R]  f32 | f16 | bf16; rows may be strided (a slice of a wider GEMM
                            output), elements inside a row contiguous. Not modified (unless
                            ``inplace``).
    w_q     [Q]             latent's dtype or f32; None when the model has no q LoRA (Q = 0)
    w_kv    [C]             latent's dtype or f32

    Q, C and R default to len(w_q), len(w_kv) and the rest of the latent row; pass
    q_lora_rank / kv_lora_rank / rope_dim to have them checked instead.

    Returns ``(q, k_nope, k_pe)``:
      q       [T, Q]  rmsnorm(latent[:, :Q]) * w_q, eps_q   (None when Q = 0)
      k_nope  [T, C]  rmsnorm(latent[:, Q:Q+C]) * w_kv, eps_kv
      k_pe    [T, R]  latent[:, Q+C:] copied bit-exactly (None when return_k_pe is False and
                      no k_pe is given)
    each in the latent's dtype. Outputs given as ``q=``, ``k_nope=``, ``k_pe=`` are written
    (mutated) and returned; missing ones are allocated.

    ``inplace=True`` is the context-parallel form: the latent itself is mutated so each row
    becomes [q_norm | k_nope_norm | k_pe]; the returned outputs are views of it.
    """
    Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
    outs_given = q is not None or k_nope is not None or k_pe is not None
    if inplace and outs_given:
        raise ValueError("split_qk_norm: inplace=True writes into the latent; do not also "
                         "pass q=, k_nope= or k_pe=")
    if isinstance(latent, _TT):
        try:
            if inplace:
                _op_split_inplace(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv)
                return (latent[:, :Q] if Q > 0 else None, latent[:, Q:Q + C],
                        latent[:, Q + C:Q + C + R])
            if not outs_given:
                q, k_nope, k_pe = _op_split(latent, w_q, w_kv, Q, C, R, eps_q, eps_kv,
                                            return_k_pe)
                return (q if Q > 0 else None, k_nope, k_pe if return_k_pe else None)
            T = _dim(latent, 0)
            if q is None and Q > 0:
                q = latent.new_empty((T, Q))
            if k_nope is None:
                k_nope = latent.new_empty((T, C))
            if k_pe is None and return_k_pe:
                k_pe = latent.new_empty((T, max(R, 0)))
            _op_split_out(latent, w_q, w_kv, q, k_nope, k_pe, Q, C, R, eps_q, eps_kv)
            return q, k_nope, k_pe
        except RuntimeError as e:
            raise _torch_error(e, w_q=w_q, w_kv=w_kv, q=q, k_nope=k_nope, k_pe=k_pe) from None
    _check_same_kind(False, w_q=w_q, w_kv=w_kv, q=q, k_nope=k_nope, k_pe=k_pe)

    np = _core._numpy()
    if inplace:
        lat = _core.view_numpy(latent, "latent", writable=True)
        q = latent[:, :Q] if Q > 0 else None
        k_nope, k_pe = latent[:, Q:Q + C], latent[:, Q + C:Q + C + R]
    else:
        lat = _np_in(latent, "latent")
        T = _dim(latent, 0)
        if q is None and Q > 0:
            q = np.empty((T, Q), latent.dtype)
        if k_nope is None:
            k_nope = np.empty((T, C), latent.dtype)
        if k_pe is None and return_k_pe:
            k_pe = np.empty((T, max(R, 0)), latent.dtype)
    _core.run_split_qk_norm(_core.context(L.BACKEND_CPU), Q, C, R, eps_q, eps_kv, lat,
                            _np_in(w_q, "w_q"), _np_in(w_kv, "w_kv"), _np_out(q, "q"),
                            _np_out(k_nope, "k_nope"), _np_out(k_pe, "k_pe"))
    return q, k_nope, k_pe


# ---- mla_kv_cache --------------------------------------------------------------------------
# Cache formats by name (SPEC §9; vLLM's kv_cache_dtype names): "auto" / "plain" is the
# bf16 / f16 / f32 cache, "fp8" and "fp8_e4m3" the same per-tensor e4m3 format.
_KV_FORMATS = {"auto": L.KV_PLAIN, "plain": L.KV_PLAIN, "fp8": L.KV_FP8, "fp8_e4m3": L.KV_FP8,
               "fp8_ds_mla": L.KV_FP8_DS_MLA, "fp8_v4": L.KV_FP8_V4}
# Formats engines name that this version does not write: rejected with their name.
_KV_FORMATS_NOT_SUPPORTED = {
    "fp8_e5m2": "e5m2 bytes",
    "nvfp4_ds_mla": "the 352-byte nvfp4 record",
}
_TILE_SCALES = {"amax": L.TILE_AMAX, "ue8m0": L.TILE_UE8M0,
                "ue8m0_floor_scaled": L.TILE_UE8M0_FLOOR_SCALED}


def _kv_format_code(cache_format) -> int:
    if isinstance(cache_format, str):
        name = cache_format.lower()
        code = _KV_FORMATS.get(name)
        if code is not None:
            return code
        if name in _KV_FORMATS_NOT_SUPPORTED:
            raise MlafError(L.ERR_UNSUPPORTED,
                            f"cache_format = {cache_format!r} ({_KV_FORMATS_NOT_SUPPORTED[name]}) "
                            f"is not supported by this mlafuse; supported: {sorted(_KV_FORMATS)}")
        raise ValueError(f"cache_format = {cache_format!r}, expected one of {sorted(_KV_FORMATS)}")
    return int(cache_format)  # the library's number; it reports a bad one


def _scalar_arg(x, name):
    """A [1] view of a one-value f32 array given as [1] or 0-d (vLLM keeps k_scale 0-d); a
    Python number is refused: the kernel reads the value from memory (on CUDA from the device,
    so a captured graph follows changes to it)."""
    if x is None:
        return None
    if not hasattr(x, "shape"):
        raise TypeError(f"{name} is a {type(x).__name__}, expected a 1-element float32 tensor "
                        "(numpy array for numpy calls) on the cache's device")
    return x.reshape(1) if len(x.shape) == 0 else x


def _kv_format_args(cache_format, k_scale, quant_scale, amax_out, tile_scale, kpe_cache):
    """The op's cache-format arguments (cache_format, scale, fp8_conv, amax_out, tile_scale,
    kpe_cache), or None for the plain call without them."""
    if (cache_format == "auto" and k_scale is None and quant_scale is None
            and amax_out is None and tile_scale is None and kpe_cache is None):
        return None
    fmt = _kv_format_code(cache_format)
    fname = cache_format if isinstance(cache_format, str) else L.mlaf_kv_format_name(fmt).decode()
    if fmt == L.KV_FP8:
        if k_scale is not None and quant_scale is not None:
            raise MlafError(L.ERR_INVALID_ARGUMENT,
                            "k_scale and quant_scale are both given; cache format fp8 takes one: "
                            "k_scale (stores e4m3(x / k_scale), vLLM) or quant_scale (stores "
                            "e4m3(x * quant_scale), FlashInfer / TRT-LLM)")
        if k_scale is None and quant_scale is None:
            raise MlafError(L.ERR_NULL_POINTER,
                            f"cache_format = {fname!r} needs a scale: k_scale= (stores "
                            "e4m3(x / k_scale), vLLM) or quant_scale= (e4m3(x * quant_scale), "
                            "FlashInfer / TRT-LLM), a 1-element float32 tensor")
    else:
        for name, x in (("k_scale", k_scale), ("quant_scale", quant_scale),
                        ("amax_out", amax_out)):
            if x is not None:
                raise MlafError(L.ERR_INVALID_ARGUMENT,
                                f"{name} is given, but cache_format = {fname!r} takes none "
                                "(only fp8 / fp8_e4m3 has a per-tensor scale)")
    if tile_scale is not None and fmt != L.KV_FP8_DS_MLA:
        raise MlafError(L.ERR_INVALID_ARGUMENT,
                        f"tile_scale is given, but cache_format = {fname!r} has no tile scales "
                        "(only fp8_ds_mla)")
    conv = L.FP8_MUL if quant_scale is not None else L.FP8_DIV
    scale = _scalar_arg(quant_scale if quant_scale is not None else k_scale,
                        "quant_scale" if quant_scale is not None else "k_scale")
    tile = _enum(tile_scale, _TILE_SCALES, "tile_scale") if tile_scale is not None else L.TILE_AMAX
    return fmt, scale, conv, _scalar_arg(amax_out, "amax_out"), tile, kpe_cache


def mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, *,
                 eps_q: float = 1e-5, eps_kv: float = 1e-5, style="interleaved",
                 q_lora_rank: int | None = None, kv_lora_rank: int | None = None,
                 rope_dim: int | None = None, q=None, k_nope=None, k_pe=None,
                 return_k_nope: bool = False, return_k_pe: bool = False, error_count=None,
                 cache_format="auto", k_scale=None, quant_scale=None, amax_out=None,
                 tile_scale=None, kpe_cache=None, kv_rope_tail: int = 0):
    """split_qk_norm + RoPE on k_pe + paged KV-cache write, in one pass (SPEC §3), the cache in
    any of the formats of SPEC §9.

    latent, w_q, w_kv  as split_qk_norm
    positions     [T]                 int32 | int64, each in [0, max_pos)
    cos_sin       [max_pos, R]        f32 (see rope_table); positions and cos_sin may be None
                                      when R = 0
    slot_mapping  [N]                 int32 | int64, N <= T (rows t >= N write no cache row);
                                      slot = block * block_size + offset; a negative slot
                                      skips the token (CUDA-graph padding)
    kv_cache      [num_blocks, block_size, W]   MUTATED: record slot_mapping[t] becomes the
                                      token's [k_nope_norm | rope(k_pe)] in the cache format;
                                      every other record stays bit-identical
    style         "interleaved" (pairs 2i, 2i+1; GLM / DeepSeek) or "neox" (pairs i, i+R/2)
    error_count   [1] int32, optional. MUTATED: incremented once per token whose slot is past
                  the cache or whose position is outside [0, max_pos) (that token writes no
                  cache row and no k_pe row). The caller zeroes it.

    Cache formats (``cache_format``):
      "auto"        kv_cache f32 | f16 | bf16, W = C + R, each value rounded to the cache dtype
      "fp8", "fp8_e4m3"   kv_cache uint8 | float8_e4m3fn, W = C + R, every value
                    e4m3(x / k_scale) (``k_scale``, vLLM) or e4m3(x * quant_scale)
                    (``quant_scale``, FlashInfer / TRT-LLM): exactly one of the two, a
                    1-element (or 0-d) float32 tensor on the cache's device, read by the kernel
                    (CUDA graphs follow changes to it). ``amax_out`` [1] float32, optional,
                    MUTATED: raised to the max |x| written (NaN ignored; the caller zeroes it)
      "fp8_ds_mla"  kv_cache uint8 | float8_e4m3fn, W = C + C/32 + 2R bytes (656 for C = 512,
                    R = 64): [C e4m3 | C/128 f32 tile scales | R bf16 rope(k_pe)]; bf16
                    latent, C % 128 == 0, cache strides multiples of 16 bytes. ``tile_scale``
                    "amax" (default; max(amax / 448, FLT_MIN), vLLM), "ue8m0"
                    (2^ceil(log2(max(amax, 1e-4) / 448)), DeepSeek) or "ue8m0_floor_scaled"
                    (FlashMLA's test quantizer)
    x is the value stored densely (rounded to the latent dtype first); e4m3 rounds to nearest
    even and saturates to +-448, NaN gives 0x7F. ``kpe_cache`` [num_blocks, block_size, R]
    (auto and fp8), optional: the rope part in a separate array of kv_cache's dtype
    (FlashInfer / TRT-LLM); kv_cache then holds C values. "fp8_e5m2" and "nvfp4_ds_mla" raise
    MlafError (MLAF_ERR_UNSUPPORTED).
      "fp8_v4"      DeepSeek-V4's SM90 FlashMLA page (SPEC §11): kv_cache uint8 | float8_e4m3fn
                    [num_blocks, block_size, 584] with stride(1) = 584 and stride(0) the page
                    stride in bytes (>= block_size * 584, a multiple of 16; a contiguous
                    [.., 64, 584] tensor is one). Planar: token o's data row [448 e4m3 | 64 bf16
                    roped] at page + 576 o, its scale row [7 UE8M0 bytes | 0] at page +
                    576 block_size + 8 o. bf16 latent, kv_lora_rank 512, rope_dim 0,
                    kv_rope_tail 64.

    kv_rope_tail  r > 0 (DeepSeek-V4; 0 for every other model): the latent is [Q | C] (R = 0)
                  and the last r values of the normalized kv part, rounded to the latent dtype,
                  are rotated (interleaved) with positions / cos_sin [max_pos, r] and rounded
                  again; k_nope holds all C values and the cache record is k_nope (plain: C
                  values). k_pe must not be asked for. In place: k_nope may be the latent's own
                  kv columns (the row ends as [q_norm | rope-tailed kv_norm]).

    Returns ``(q, k_nope, k_pe)``: q [T, Q] = q_norm (None when Q = 0); k_nope [T, C] normalized
    and k_pe [T, R] roped, only when requested with return_k_nope / return_k_pe or given as
    outputs (else None). Given outputs are mutated and returned.
    """
    Q, C, R = _ranks(latent, w_q, w_kv, q_lora_rank, kv_lora_rank, rope_dim)
    style = _enum(style, _STYLES, "style")
    tail = int(kv_rope_tail)
    if isinstance(latent, _TT):
        fmt = _kv_format_args(cache_format, k_scale, quant_scale, amax_out, tile_scale,
                              kpe_cache)
        if fmt is not None:
            _check_same_kind(True, k_scale=k_scale, quant_scale=quant_scale,
                             amax_out=amax_out, kpe_cache=kpe_cache)
        if tail != 0:  # the op's last argument, after the format's
            fmt = (*(fmt or (L.KV_PLAIN, None, L.FP8_DIV, None, L.TILE_AMAX, None)), tail)
        try:
            if q is None and k_nope is None and k_pe is None:
                args = (latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache,
                        error_count, Q, C, R, eps_q, eps_kv, style, return_k_nope, return_k_pe)
                q, k_nope, k_pe = _op_kv(*args) if fmt is None else _op_kv(*args, *fmt)
                return (q if Q > 0 else None, k_nope if return_k_nope else None,
                        k_pe if return_k_pe else None)
            T = _dim(latent, 0)
            if q is None and Q > 0:
                q = latent.new_empty((T, Q))
            if k_nope is None and return_k_nope:
                k_nope = latent.new_empty((T, C))
            if k_pe is None and return_k_pe:
                k_pe = latent.new_empty((T, max(R, 0)))
            args = (latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, error_count,
                    q, k_nope, k_pe, Q, C, R, eps_q, eps_kv, style)
            _op_kv_out(*args) if fmt is None else _op_kv_out(*args, *fmt)
            return q, k_nope, k_pe
        except RuntimeError as e:
            raise _torch_error(e, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                               slot_mapping=slot_mapping, kv_cache=kv_cache, q=q,
                               k_nope=k_nope, k_pe=k_pe, error_count=error_count) from None
    _check_same_kind(False, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                     slot_mapping=slot_mapping, kv_cache=kv_cache, q=q, k_nope=k_nope,
                     k_pe=k_pe, error_count=error_count, k_scale=k_scale,
                     quant_scale=quant_scale, amax_out=amax_out, kpe_cache=kpe_cache)
    fmt = _kv_format_args(cache_format, k_scale, quant_scale, amax_out, tile_scale, kpe_cache)
    T = _dim(latent, 0)

    np = _core._numpy()
    if q is None and Q > 0:
        q = np.empty((T, Q), latent.dtype)
    if k_nope is None and return_k_nope:
        k_nope = np.empty((T, C), latent.dtype)
    if k_pe is None and return_k_pe:
        k_pe = np.empty((T, max(R, 0)), latent.dtype)
    extra = ()
    if fmt is not None:
        f, scale, conv, amax, tile, kpe = fmt
        extra = (f, _np_in(scale, "scale"), conv, _np_out(amax, "amax_out"), tile,
                 _np_out(kpe, "kpe_cache"), tail)
    elif tail != 0:
        extra = (L.KV_PLAIN, None, L.FP8_DIV, None, L.TILE_AMAX, None, tail)
    _core.run_mla_kv_cache(
        _core.context(L.BACKEND_CPU), Q, C, R, eps_q, eps_kv, style, _np_in(latent, "latent"),
        _np_in(w_q, "w_q"), _np_in(w_kv, "w_kv"), _np_in(positions, "positions"),
        _np_in(cos_sin, "cos_sin"), _np_in(slot_mapping, "slot_mapping"),
        _np_out(kv_cache, "kv_cache"), _np_out(q, "q"), _np_out(k_nope, "k_nope"),
        _np_out(k_pe, "k_pe"), _np_out(error_count, "error_count"), *extra)
    return q, k_nope, k_pe


# ---- rope_q --------------------------------------------------------------------------------
def rope_q(q, positions, cos_sin, *, style="interleaved", rope_dim: int | None = None,
           error_count=None, head_norm: bool = False, head_norm_eps: float = 1e-6, q_out=None):
    """RoPE in place on the last R columns of every head of q (SPEC §3).

    q            [T, H, D]     f32 | f16 | bf16, strides (s0, s1, 1); D = nope + R.  MUTATED
    positions    [T]           int32 | int64
    cos_sin      [max_pos, R]  f32; R defaults to cos_sin.shape[1]
    error_count  [1] int32, optional.  MUTATED: +1 per token whose position is outside
                 [0, max_pos) (that token is left unrotated)

    Bit-identical to what mla_kv_cache writes for the key at the same position. Returns q.

    DeepSeek-V4's q (SPEC §11): ``head_norm=True`` first normalizes every head without weight
    (rstd = 1 / sqrt(mean(x^2) + head_norm_eps) in fp32), rotates the last R values of the fp32
    result and rounds once. ``q_out`` [T, Hpad, D] (Hpad >= H, q's dtype), optional, MUTATED:
    the result goes there instead (q is only read) and heads H .. Hpad-1 are written as +0.0
    (FlashMLA takes 64 or 128 heads); returns q_out. A token with a bad position writes nothing.
    """
    style = _enum(style, _STYLES, "style")
    R = int(rope_dim) if rope_dim is not None else _dim(cos_sin, 1)
    hn, heps = bool(head_norm), float(head_norm_eps)
    if isinstance(q, _TT):
        try:
            if hn or q_out is not None:
                _op_rope(q, positions, cos_sin, R, style, error_count, hn, heps, q_out)
            else:
                _op_rope(q, positions, cos_sin, R, style, error_count)
        except RuntimeError as e:
            raise _torch_error(e, positions=positions, cos_sin=cos_sin,
                               error_count=error_count, q_out=q_out) from None
        return q if q_out is None else q_out
    _check_same_kind(False, positions=positions, cos_sin=cos_sin, error_count=error_count,
                     q_out=q_out)
    _core.run_rope_q(_core.context(L.BACKEND_CPU), R, style,
                     _np_in(q, "q") if q_out is not None else _np_out(q, "q"),
                     _np_in(positions, "positions"), _np_in(cos_sin, "cos_sin"),
                     _np_out(error_count, "error_count"), hn, heps, _np_out(q_out, "q_out"))
    return q if q_out is None else q_out


# ---- moe_gate ------------------------------------------------------------------------------
def _gate_params(config, top_k, n_group, topk_group, score_func, group_score, renormalize,
                 routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts):
    base = dict(top_k=None, n_group=1, topk_group=1, score_func="sigmoid",
                group_score="top2_sum", renormalize=True, routed_scaling_factor=1.0,
                apply_routed_scaling=True, eps=1e-20, n_shared_experts=0)
    if config is not None:
        if isinstance(config, str):
            p = find_preset(config)
            if p is None:
                raise ValueError(f"config = {config!r} is not a preset; known: "
                                 f"{[x.name for x in _PRESETS]}")
            config = p
        base.update(config.moe_gate_kwargs())
    given = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, score_func=score_func,
                 group_score=group_score, renormalize=renormalize,
                 routed_scaling_factor=routed_scaling_factor,
                 apply_routed_scaling=apply_routed_scaling, eps=eps,
                 n_shared_experts=n_shared_experts)
    base.update({k: v for k, v in given.items() if v is not None})
    if base["top_k"] is None:
        raise ValueError("moe_gate: give top_k (or config=, a preset name or Preset)")
    base["score_func"] = _enum(base["score_func"], _SCORES, "score_func")
    base["group_score"] = _enum(base["group_score"], _GROUPS, "group_score")
    return base


def _gate_args(p: dict) -> tuple:
    """The op's parameter arguments, in schema order."""
    return (p["top_k"], p["n_group"], p["topk_group"], p["score_func"], p["group_score"],
            bool(p["renormalize"]), float(p["routed_scaling_factor"]),
            bool(p["apply_routed_scaling"]), float(p["eps"]), p["n_shared_experts"])


_GATE_ARGS: dict = {}


def _gate_args_cached(key):
    try:
        return _GATE_ARGS.get(key)
    except TypeError:  # an unhashable config: resolved every call
        return None


def _gate_args_store(key, args) -> None:
    if len(_GATE_ARGS) < 256:
        try:
            _GATE_ARGS[key] = args
        except TypeError:
            pass


def moe_gate(logits, bias=None, *, config=None, top_k: int | None = None,
             n_group: int | None = None, topk_group: int | None = None, score_func=None,
             group_score=None, renormalize: bool | None = None,
             routed_scaling_factor: float | None = None,
             apply_routed_scaling: bool | None = None, eps: float | None = None,
             n_shared_experts: int | None = None, return_scores: bool = False,
             weights_dtype=None, weights=None, ids=None, scores=None):
    """MoE router top-k (SPEC §4).

    logits   [T, E]   f32 | f16 | bf16, rows strided; not modified
    bias     [E]      f32, optional (e_score_correction_bias: chooses, never weighs)

    Parameters come from ``config`` (a preset name such as "deepseek-v3", or a Preset) and/or
    the keywords, which override it. Without a config: top_k is required; n_group = topk_group
    = 1, score_func "sigmoid" ("softmax"), group_score "top2_sum" ("max"), renormalize True,
    routed_scaling_factor 1.0, apply_routed_scaling True, eps 1e-20, n_shared_experts 0.

    Returns ``(weights, ids)``, or ``(weights, ids, scores)`` when return_scores or scores= is
    given:
      weights  [T, top_k + S]  f32 (or weights_dtype = the logits' dtype)
      ids      [T, top_k + S]  int32, ordered by biased score descending, ties to the lower
                               index; shared experts occupy the last S slots (ids E..E+S-1)
      scores   [T, E]          f32, the unbiased scores
    Given outputs are mutated and returned.
    """
    want_scores = return_scores or scores is not None
    if isinstance(logits, _TT):
        # The parameters resolved once per distinct set of keywords (not while torch.compile
        # traces: a lookup in a global dict that the trace then fills would be guarded on and
        # recompile the next call).
        compiling = _is_compiling()
        key = (config, top_k, n_group, topk_group, score_func, group_score, renormalize,
               routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts)
        args = None if compiling else _gate_args_cached(key)
        if args is None:
            args = _gate_args(_gate_params(config, top_k, n_group, topk_group, score_func,
                                           group_score, renormalize, routed_scaling_factor,
                                           apply_routed_scaling, eps, n_shared_experts))
            if not compiling:
                _gate_args_store(key, args)
        try:
            if weights is None and ids is None and scores is None:
                w, i, s = _op_gate(logits, bias, *args, want_scores, weights_dtype)
                return (w, i, s) if want_scores else (w, i)
            T, E = _dim(logits, 0), _dim(logits, 1)
            K = int(args[0]) + int(args[9])
            if weights is None:
                weights = logits.new_empty((T, max(K, 0)),
                                           dtype=weights_dtype or _torch.float32)
            if ids is None:
                ids = logits.new_empty((T, max(K, 0)), dtype=_torch.int32)
            if scores is None and want_scores:
                scores = logits.new_empty((T, E), dtype=_torch.float32)
            _op_gate_out(logits, bias, weights, ids, scores, *args)
        except RuntimeError as e:
            raise _torch_error(e, bias=bias, weights=weights, ids=ids, scores=scores) from None
        return (weights, ids, scores) if want_scores else (weights, ids)

    p = _gate_params(config, top_k, n_group, topk_group, score_func, group_score, renormalize,
                     routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts)
    _check_same_kind(False, bias=bias, weights=weights, ids=ids, scores=scores)
    T, E = _dim(logits, 0), _dim(logits, 1)
    K = int(p["top_k"]) + int(p["n_shared_experts"])
    args = _gate_args(p)
    np = _core._numpy()
    if weights is None:
        weights = np.empty((T, max(K, 0)), np.float32 if weights_dtype is None else weights_dtype)
    if ids is None:
        ids = np.empty((T, max(K, 0)), np.int32)
    if scores is None and want_scores:
        scores = np.empty((T, E), np.float32)
    _core.run_moe_gate(_core.context(L.BACKEND_CPU), _core.moe_params(*args),
                       _np_in(logits, "logits"), _np_in(bias, "bias"),
                       _np_out(weights, "weights"), _np_out(ids, "ids"),
                       _np_out(scores, "scores"))
    return (weights, ids, scores) if want_scores else (weights, ids)


# ---- moe_gate_hash -------------------------------------------------------------------------
def moe_gate_hash(logits, tid2eid, token_ids, *, config=None, top_k: int | None = None,
                  score_func=None, renormalize: bool | None = None,
                  routed_scaling_factor: float | None = None,
                  apply_routed_scaling: bool | None = None, eps: float | None = None,
                  n_shared_experts: int | None = None, return_scores: bool = False,
                  weights_dtype=None, weights=None, ids=None, scores=None, error_count=None):
    """Hash-routed MoE layer (SPEC §11: DeepSeek-V4's first n_hash_layers layers).

    logits     [T, E]         f32 | f16 | bf16, rows strided; not modified
    tid2eid    [vocab, top_k] int32 | int64, rows strided: the experts of each token id
    token_ids  [T]            int32 | int64

    ids = tid2eid[token_ids] in table order; weights = the scores (score_func: "sqrt_softplus"
    for V4, "sigmoid" or "softmax") at those ids, renormalized and scaled as moe_gate does.
    There is no bias (nothing is chosen) and no group limit. Parameters as moe_gate (config=
    a preset name or Preset, keywords override); top_k defaults to tid2eid.shape[1].
    A row whose token id is outside [0, vocab), or whose table entries are outside [0, E) or
    repeated, gets ids 0 .. top_k-1 with weight 0 and is counted in ``error_count`` (an int32
    [1] array / tensor, added to; optional).

    Returns ``(weights, ids)``, or ``(weights, ids, scores)`` when return_scores or scores= is
    given (weights [T, top_k + S], ids [T, top_k + S] int32, scores [T, E] f32).
    """
    if top_k is None and config is None:
        top_k = _dim(tid2eid, 1)
    want_scores = return_scores or scores is not None
    p = _gate_params(config, top_k, 1, 1, score_func, "top2_sum", renormalize,
                     routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts)
    p["n_group"], p["topk_group"], p["group_score"] = 1, 1, L.GROUP_TOP2_SUM
    args = _gate_args(p)
    if isinstance(logits, _TT):
        try:
            if weights is None and ids is None and scores is None:
                w, i, s = _op_gate_hash(logits, tid2eid, token_ids, error_count, *args,
                                        want_scores, weights_dtype)
                return (w, i, s) if want_scores else (w, i)
            T, E = _dim(logits, 0), _dim(logits, 1)
            K = int(args[0]) + int(args[9])
            if weights is None:
                weights = logits.new_empty((T, max(K, 0)),
                                           dtype=weights_dtype or _torch.float32)
            if ids is None:
                ids = logits.new_empty((T, max(K, 0)), dtype=_torch.int32)
            if scores is None and want_scores:
                scores = logits.new_empty((T, E), dtype=_torch.float32)
            _op_gate_hash_out(logits, tid2eid, token_ids, weights, ids, scores, error_count, *args)
        except RuntimeError as e:
            raise _torch_error(e, tid2eid=tid2eid, token_ids=token_ids, weights=weights, ids=ids,
                               scores=scores, error_count=error_count) from None
        return (weights, ids, scores) if want_scores else (weights, ids)

    _check_same_kind(False, tid2eid=tid2eid, token_ids=token_ids, weights=weights, ids=ids,
                     scores=scores, error_count=error_count)
    T, E = _dim(logits, 0), _dim(logits, 1)
    K = int(p["top_k"]) + int(p["n_shared_experts"])
    np = _core._numpy()
    if weights is None:
        weights = np.empty((T, max(K, 0)), np.float32 if weights_dtype is None else weights_dtype)
    if ids is None:
        ids = np.empty((T, max(K, 0)), np.int32)
    if scores is None and want_scores:
        scores = np.empty((T, E), np.float32)
    _core.run_moe_gate_hash(_core.context(L.BACKEND_CPU), _core.moe_params(*args),
                            _np_in(logits, "logits"), _np_in(tid2eid, "tid2eid"),
                            _np_in(token_ids, "token_ids"), _np_out(weights, "weights"),
                            _np_out(ids, "ids"), _np_out(scores, "scores"),
                            _np_out(error_count, "error_count"))
    return (weights, ids, scores) if want_scores else (weights, ids)
