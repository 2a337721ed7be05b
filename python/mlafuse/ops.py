"""The public Python API: one function per op, for numpy arrays (CPU backend) and torch
tensors (CPU or CUDA backend, through the torch.ops.mlafuse custom ops so that the same call
works eagerly, under torch.compile and inside CUDA-graph capture).

Every function takes the inputs first, then keyword-only parameters and optional outputs: by
name (q=, k_nope=, weights=, ...) or all at once as ``out=``, a tuple in the order the function
returns them (rope_q works in place; its out= is q_out=). Any output not given is allocated.
No input is copied: strided views are passed to the library as they are. A rejected call
raises MlafError carrying the library's message and writes nothing. A KV cache and its format
travel as one KVCache (or as the tensor and the format keywords).

The ops live in one module each (_ops_split_qk_norm, _ops_mla_kv_cache, _ops_rope_q, _ops_moe_gate,
_ops_rms_norm_quant, _ops_gemm_quant;
indexer_q and mla_kv_cache_dsa in indexer), what they share in _ops_common (and what the row
ops' quantized outputs share in _ops_row_quant); every name is re-exported here, so mlafuse.ops.X
is what it was.
"""
# flake8: noqa: F401  (re-exports)
from __future__ import annotations

from ._ops_common import (os, struct, dataclass, _core, L, MlafError, _torch, _T, BINDING,
                          _NoTorch, _TT, _is_torch, _torch_error, _STYLES, _SCORES, _GROUPS, _enum,
                          _name_of, version, version_number, _BACKENDS, _OPS, backend_available,
                          backend_supports, set_num_threads, set_cuda_pdl, get_num_threads, Preset,
                          _f32, _preset_from_c, _PRESETS, _PRESET_BY_NAME, presets, find_preset,
                          _YARN_KEYS, _rope_scaling, rope_table, _dim, _np_in, _np_out, _ranks,
                          _check_same_kind, _outs)
from ._ops_split_qk_norm import split_qk_norm
from ._ops_mla_kv_cache import (_KV_FORMATS, _KV_FORMATS_NOT_SUPPORTED, _TILE_SCALES,
                                _kv_format_code, _scalar_arg, _kv_format_args, KvFormatArgs,
                                KVCache, _cache_args, mla_kv_cache)
from ._ops_rope_q import rope_q
from ._ops_rms_norm_quant import GEMM_FORMATS, GEMM_SCALES, gemm_scales_shape, rms_norm_quant
from ._ops_gemm_quant import gemm_quant
from ._ops_moe_gate import (_gate_params, _gate_args, _GATE_ARGS, _gate_args_cached, _gate_args_store,
                            moe_gate, moe_gate_hash)

if _torch is not None:  # the ops (overloads: torch.ops.mlafuse.<op>.default)
    from ._ops_split_qk_norm import (_op_split, _op_split_out, _op_split_inplace)
    from ._ops_mla_kv_cache import (_op_kv, _op_kv_out)
    from ._ops_rope_q import _op_rope
    from ._ops_moe_gate import (_op_gate, _op_gate_out, _op_gate_hash, _op_gate_hash_out,
                                _is_compiling)
