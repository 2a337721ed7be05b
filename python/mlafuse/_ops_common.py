"""What the op modules of the Python API share (mlafuse.ops re-exports all of it): the optional
torch import and the binding in use, enum names, version and backends, presets, RoPE tables, and
the argument helpers.

The conventions every op follows: the docstring of mlafuse.ops.
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


if _torch is not None:
    _is_compiling = _torch.compiler.is_compiling

    def _op_pair(name: str):
        """torch.ops.mlafuse.<name>.default, and what an eager call of it calls: the
        dispatcher entry behind the overload (OpOverload.__call__ only forwards to it, one
        Python frame fewer per call), which torch.compile cannot trace: a call made while
        compiling takes the overload, ``(eager if not _is_compiling() else op)(...)``."""
        op = getattr(_torch.ops.mlafuse, name).default
        return op, getattr(op, "_op", op)


_TT = _torch.Tensor if _torch is not None else _NoTorch


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
_STYLES = {"interleaved": L.ROPE_INTERLEAVED, "gptj": L.ROPE_INTERLEAVED, "neox": L.ROPE_NEOX,
           "none": L.ROPE_NONE}
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
        "rope_q": L.OP_ROPE_Q, "moe_gate": L.OP_MOE_GATE, "rms_norm_quant": L.OP_RMS_NORM_QUANT}
_OPS["gemm_quant"] = L.OP_GEMM_QUANT


def backend_available(backend: str) -> bool:
    """True when the backend ("cpu" or "cuda") was built in and can run here (CUDA: a
    device is visible)."""
    return bool(L.mlaf_backend_available(_enum(backend, _BACKENDS, "backend")))


def backend_supports(backend: str, op: str) -> bool:
    """True when the backend implements the op ("split_qk_norm", "mla_kv_cache", "rope_q",
    "moe_gate", "rms_norm_quant", "gemm_quant")."""
    return bool(L.mlaf_backend_supports(_enum(backend, _BACKENDS, "backend"),
                                        _enum(op, _OPS, "op")))


set_num_threads = _core.set_num_threads
set_cuda_pdl = _core.set_cuda_pdl
get_num_threads = _core.get_num_threads


# ---- presets -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A model's numbers (docs/models.md), as the library's mlaf_model_config."""

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
    rope_style: str          # "interleaved" | "neox" | "none" (the slot kept unrotated: Kimi-K3)
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


def _outs(out, names: tuple, given: tuple, op: str) -> tuple:
    """``out=`` as the op's outputs: a tuple (or list) with one entry per name, in the order
    the op returns them; an entry may be None (that output is then treated as not given).
    The outputs by name (q=, k_nope=, ...) are the same thing: not both."""
    if any(g is not None for g in given):
        raise ValueError(f"{op}: give the outputs as out= or by name ({', '.join(names)}), "
                         "not both")
    if not isinstance(out, (tuple, list)) or len(out) != len(names):
        got = f"{len(out)} entries" if isinstance(out, (tuple, list)) else type(out).__name__
        raise ValueError(f"{op}: out= takes a tuple of {len(names)} ({', '.join(names)}), "
                         f"got {got}")
    return tuple(out)


def _check_same_kind(torch_path: bool, **arrays):
    for name, a in arrays.items():
        if a is not None and _is_torch(a) != torch_path:
            raise TypeError(f"{name} is a {type(a).__name__}, but the first argument is a "
                            f"{'torch.Tensor' if torch_path else 'numpy.ndarray'}: do not mix")
