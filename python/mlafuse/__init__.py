"""mlafuse — fused memory-bound kernels for MLA-attention + MoE language models.

Thin binding over the C library libmlafuse plus PyTorch custom ops (torch.ops.mlafuse.*) when
torch is installed. numpy arrays go through ctypes; the torch ops are served by the compiled
torch extension when it was built (BINDING == "ext"), else by Python implementations over
ctypes (BINDING == "ctypes"); MLAFUSE_BINDING=auto|ext|ctypes chooses.

    import mlafuse
    q, k_nope, k_pe = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=1e-5, eps_kv=1e-5)
    mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache)
    cache = mlafuse.KVCache(fp8_cache, "fp8_ds_mla")       # a cache and its format, once
    mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slot_mapping, cache)
    mlafuse.rope_q(q.view(T, H, D), positions, cos_sin)
    weights, ids = mlafuse.moe_gate(logits, bias, config="glm-4.7-flash")
    weights, ids = mlafuse.moe_gate_hash(logits, tid2eid, token_ids, config="deepseek-v4-flash")
    y, q, s = mlafuse.rms_norm_quant(x, w, residual=r, q_format="fp8_1x128_mn")  # numpy
    q, s = mlafuse.gemm_quant(attn_out, q_format="fp8_1x128")   # the quantize before o_proj

numpy arrays run on the CPU backend; torch tensors on the backend of their device (CUDA: the
tensor's device and torch's current stream there). The library is found at
$MLAFUSE_LIBRARY, else bundled in mlafuse/lib/, else in the repository's build/ directory.
Set MLAFUSE_DISABLE_TORCH=1 to keep the package from importing torch.
"""
from ._lib import MlafError, library_path
from .ops import (
    BINDING,
    KVCache,
    Preset,
    backend_available,
    backend_supports,
    find_preset,
    gemm_quant,
    get_num_threads,
    mla_kv_cache,
    moe_gate,
    moe_gate_hash,
    presets,
    rms_norm_quant,
    rope_q,
    rope_table,
    set_cuda_pdl,
    set_num_threads,
    split_qk_norm,
    version,
    version_number,
)

from .indexer import indexer_params, indexer_q, mla_kv_cache_dsa

__version__ = version()
HAS_TORCH = ops._torch is not None  # noqa: F821  (ops is bound by the import above)

__all__ = [
    "MlafError", "KVCache", "Preset", "backend_available", "backend_supports", "find_preset",
    "get_num_threads", "library_path", "mla_kv_cache", "moe_gate", "presets", "rms_norm_quant", "rope_q",
    "rope_table", "set_cuda_pdl", "set_num_threads", "split_qk_norm", "version", "version_number", "HAS_TORCH",
    "BINDING", "indexer_params", "indexer_q", "mla_kv_cache_dsa", "gemm_quant",
]
