"""The schemas of the torch.ops.mlafuse.* custom ops: the one place they are written.

Both torch bindings use this table (see _torch_ops): mlafuse defines the library from it with
torch.library before it loads either implementation, the compiled extension's C++ kernels
(python/csrc, TORCH_LIBRARY_IMPL only) or the Python ones over ctypes. A new op is a row here,
its implementations and its fake (meta) implementation in _torch_ops, and its kernel in csrc.

Int enums: style 0 interleaved / 1 neox / 2 none; score_func 0 sigmoid / 1 softmax / 2 sqrt_softplus;
group_score 0 top-2 sum / 1 max; cache_format 0 plain / 1 fp8 / 2 fp8_ds_mla / 3 fp8_v4;
fp8_conv 0 divide / 1 multiply; tile_scale 0 amax / 1 ue8m0 / 2 ue8m0_floor_scaled; the
indexer's index_style as style, index_scale 0 ue8m0 / 1 f32.

The dispatcher leaves out trailing arguments equal to their defaults, so every implementation
repeats the defaults written here. Not-requested outputs of the functional forms are empty
[T, 0] tensors (a schema cannot return None).

This module imports nothing, so tests read it without torch (test_bindings.py checks that
python/csrc names exactly these ops and writes no schema of its own).
"""

# ---- shared fragments ------------------------------------------------------------------------
# mla_kv_cache's inputs and parameters; the cache-format arguments (docs/kv_formats.md) come
# last with the plain call's defaults: scale [1] f32 (fp8; read on the device by the kernel),
# amax_out [1] f32 (fp8, optional, max-accumulated), kpe_cache the separate rope array.
_KV_IN = ("Tensor latent, Tensor? w_q, Tensor w_kv, Tensor? positions, Tensor? cos_sin, "
          "Tensor slot_mapping, Tensor(a!) kv_cache, Tensor(b!)? error_count")
_KV_P = "int q_lora_rank, int kv_lora_rank, int rope_dim, float eps_q, float eps_kv, int style"
_KV_LEAN_P = "float eps_q, float eps_kv, int style"  # the _lean forms: ranks from the shapes


def _kv_fmt(amax: str, kpe: str, tail: bool) -> str:
    s = (f"int cache_format=0, Tensor? scale=None, int fp8_conv=0, Tensor({amax}!)? "
         f"amax_out=None, int tile_scale=0, Tensor({kpe}!)? kpe_cache=None")
    return s + ", int kv_rope_tail=0" if tail else s


# The DSA indexer's settings (mlafuse.indexer_params) as plain arguments. mla_kv_cache_dsa's
# index_copies > 1 (docs/mla.md) also writes the same records at index_cache's address + k *
# index_copy_stride bytes (peers' caches), which a schema cannot name.
_IDX_P = "int index_style, bool hadamard, float ln_eps, float amax_eps, int index_scale"
_KV_DSA_IDX = ("Tensor index_k, Tensor index_weight, Tensor index_bias, Tensor(c!) index_cache, "
               "Tensor(d!)? topk_fill")
_GATE_P = ("int top_k, int n_group, int topk_group, int score_func, int group_score, "
           "bool renormalize, float routed_scaling_factor, bool apply_routed_scaling, "
           "float eps, int n_shared_experts")

# The row ops' quantized outputs (q_norm, k_nope): their settings, and their tensors under the
# alias letters given (one letter each).
_RQ_P = ("int q_format, int q_scale, float q_eps, int k_nope_format, int k_nope_scale, "
         "float k_nope_eps")


def _rq_outs(letters: str) -> str:
    return ", ".join(f"Tensor({a}!)? {n}" for a, n in
                     zip(letters, ("q_data", "q_scales", "k_nope_data", "k_nope_scales")))


def _tensors(n: int) -> str:
    return ", ".join(["Tensor"] * n)


# ---- the table: op name -> schema (without the "mlafuse::" namespace), in definition order ----
SCHEMAS = {
    # split_qk_norm -> (q [T,Q], k_nope [T,C], k_pe [T,R] or [T,0]); _out writes the given
    # outputs; _inplace turns each latent row into [q_norm | k_nope_norm | k_pe].
    "split_qk_norm": (
        "split_qk_norm(Tensor latent, Tensor? w_q, Tensor w_kv, int q_lora_rank, "
        "int kv_lora_rank, int rope_dim, float eps_q, float eps_kv, bool return_k_pe=True) "
        "-> (Tensor, Tensor, Tensor)"),
    "split_qk_norm_out": (
        "split_qk_norm_out(Tensor latent, Tensor? w_q, Tensor w_kv, Tensor(a!)? q, "
        "Tensor(b!) k_nope, Tensor(c!)? k_pe, int q_lora_rank, int kv_lora_rank, "
        "int rope_dim, float eps_q, float eps_kv) -> ()"),
    "split_qk_norm_inplace": (
        "split_qk_norm_inplace(Tensor(a!) latent, Tensor? w_q, Tensor w_kv, "
        "int q_lora_rank, int kv_lora_rank, int rope_dim, float eps_q, float eps_kv) -> ()"),
    # The _lean forms take the ranks from the shapes, as mlafuse.split_qk_norm does when none is
    # given (q_lora_rank len(w_q), 0 without w_q; kv_lora_rank len(w_kv); rope_dim the rest of
    # the latent row): three arguments fewer per call, and each costs the dispatcher's entry
    # from Python about as much as a tensor.
    "split_qk_norm_lean": (
        "split_qk_norm_lean(Tensor latent, Tensor? w_q, Tensor w_kv, float eps_q, float eps_kv, "
        "bool return_k_pe=True) -> (Tensor, Tensor, Tensor)"),
    "split_qk_norm_lean_out": (
        "split_qk_norm_lean_out(Tensor latent, Tensor? w_q, Tensor w_kv, Tensor(a!)? q, "
        "Tensor(b!) k_nope, Tensor(c!)? k_pe, float eps_q, float eps_kv) -> ()"),
    # mla_kv_cache -> (q, k_nope or [T,0], k_pe or [T,0]); mutates kv_cache, error_count,
    # amax_out, kpe_cache (and the _out form its outputs)
    "mla_kv_cache": (
        f"mla_kv_cache({_KV_IN}, {_KV_P}, bool return_k_nope=False, bool return_k_pe=False, "
        f"{_kv_fmt('c', 'd', True)}) -> (Tensor, Tensor, Tensor)"),
    "mla_kv_cache_out": (
        f"mla_kv_cache_out({_KV_IN}, Tensor(c!)? q, Tensor(d!)? k_nope, Tensor(e!)? k_pe, "
        f"{_KV_P}, {_kv_fmt('f', 'g', True)}) -> ()"),
    # the same two with the ranks from the shapes, as split_qk_norm_lean(_out)
    "mla_kv_cache_lean": (
        f"mla_kv_cache_lean({_KV_IN}, {_KV_LEAN_P}, bool return_k_nope=False, "
        f"bool return_k_pe=False, {_kv_fmt('c', 'd', True)}) -> (Tensor, Tensor, Tensor)"),
    "mla_kv_cache_lean_out": (
        f"mla_kv_cache_lean_out({_KV_IN}, Tensor(c!)? q, Tensor(d!)? k_nope, Tensor(e!)? k_pe, "
        f"{_KV_LEAN_P}, {_kv_fmt('f', 'g', True)}) -> ()"),
    # mla_kv_cache_dsa -> (q, k_nope, k_pe, index_out, each or [T,0]); mutates what
    # mla_kv_cache does and index_cache, topk_fill (and the _out form its outputs)
    "mla_kv_cache_dsa": (
        f"mla_kv_cache_dsa({_KV_IN}, {_KV_DSA_IDX}, {_KV_P}, {_IDX_P}, "
        "bool return_k_nope=False, bool return_k_pe=False, bool return_index_out=False, "
        f"int index_copies=1, int index_copy_stride=0, {_kv_fmt('e', 'f', False)}) "
        "-> (Tensor, Tensor, Tensor, Tensor)"),
    "mla_kv_cache_dsa_out": (
        f"mla_kv_cache_dsa_out({_KV_IN}, {_KV_DSA_IDX}, Tensor(e!)? q, Tensor(f!)? k_nope, "
        f"Tensor(g!)? k_pe, Tensor(h!)? index_out, {_KV_P}, {_IDX_P}, int index_copies=1, "
        f"int index_copy_stride=0, {_kv_fmt('i', 'j', False)}) -> ()"),
    # indexer_q -> (q_fp8 [T,H,128] float8_e4m3fn, w_out [T,H] f32); q_pe (the MLA query,
    # optional) roped in place on its last 64 columns in q_pe_style; the _out form takes a
    # uint8 q_fp8 too
    "indexer_q": (
        f"indexer_q(Tensor q_idx, Tensor positions, Tensor cos_sin, Tensor weights, {_IDX_P}, "
        "Tensor(a!)? q_pe=None, int q_pe_style=0, Tensor(b!)? error_count=None) "
        "-> (Tensor, Tensor)"),
    "indexer_q_out": (
        "indexer_q_out(Tensor q_idx, Tensor positions, Tensor cos_sin, Tensor weights, "
        f"Tensor(a!) q_fp8, Tensor(b!) w_out, {_IDX_P}, Tensor(c!)? q_pe=None, "
        "int q_pe_style=0, Tensor(d!)? error_count=None) -> ()"),
    # rope_q rotates q in place, or writes q_out [T, Hpad, D] (q only read); head_norm
    # (docs/mla.md): the weightless per-head RMSNorm first (head_norm_eps 0: 1e-6)
    "rope_q": (
        "rope_q(Tensor(a!) q, Tensor positions, Tensor cos_sin, int rope_dim, int style, "
        "Tensor(b!)? error_count=None, bool head_norm=False, float head_norm_eps=0.0, "
        "Tensor(c!)? q_out=None) -> ()"),
    # moe_gate / moe_gate_hash -> (weights, ids, scores or [T,0]); the _out forms write the
    # given outputs; moe_gate_hash mutates error_count
    "moe_gate": (
        f"moe_gate(Tensor logits, Tensor? bias, {_GATE_P}, bool return_scores=False, "
        "ScalarType? weights_dtype=None) -> (Tensor, Tensor, Tensor)"),
    "moe_gate_out": (
        "moe_gate_out(Tensor logits, Tensor? bias, Tensor(a!) weights, Tensor(b!) ids, "
        f"Tensor(c!)? scores, {_GATE_P}) -> ()"),
    "moe_gate_hash": (
        "moe_gate_hash(Tensor logits, Tensor tid2eid, Tensor token_ids, "
        f"Tensor(a!)? error_count, {_GATE_P}, bool return_scores=False, "
        "ScalarType? weights_dtype=None) -> (Tensor, Tensor, Tensor)"),
    "moe_gate_hash_out": (
        "moe_gate_hash_out(Tensor logits, Tensor tid2eid, Tensor token_ids, "
        "Tensor(a!) weights, Tensor(b!) ids, Tensor(c!)? scores, Tensor(d!)? error_count, "
        f"{_GATE_P}) -> ()"),
    # ---- rms_norm_quant (docs/gemm_formats.md) ----
    # -> (y [T,K] or [T,0], q_data [T,K] float8_e4m3fn or [T,0], q_scales or [T,0]); mutates
    # residual (<- round(x + residual)). q_format an mlaf_gemm_format (0 none / 1 fp8_1x128 /
    # 2 fp8_1x128_mn / 3 fp8_1x128_ue8m0 / 4 mxfp8 / 5 fp8_1x128_cm), q_scale an mlaf_gemm_scale
    # (0 f32 / 1 ue8m0 / 2 mx_floor / 3 mx_ceil). q_scales in the orientation engines hold them,
    # [T, groups]: the three MN-major layouts with strides (1, ld). The _out form writes the
    # given outputs; the _inplace form writes y into x itself.
    "rms_norm_quant": (
        "rms_norm_quant(Tensor x, Tensor weight, float eps, Tensor(a!)? residual=None, "
        "bool return_y=True, int q_format=0, int q_scale=0, float q_eps=0.0) "
        "-> (Tensor, Tensor, Tensor)"),
    "rms_norm_quant_out": (
        "rms_norm_quant_out(Tensor x, Tensor weight, float eps, Tensor(a!)? residual, "
        "Tensor(b!)? y, Tensor(c!)? q_data, Tensor(d!)? q_scales, int q_format=0, int q_scale=0, "
        "float q_eps=0.0) -> ()"),
    "rms_norm_quant_inplace": (
        "rms_norm_quant_inplace(Tensor(a!) x, Tensor weight, float eps, Tensor(b!)? residual, "
        "Tensor(c!)? q_data, Tensor(d!)? q_scales, int q_format=0, int q_scale=0, "
        "float q_eps=0.0) -> ()"),
    # ---- the row ops' quantized outputs (docs/gemm_formats.md, the row ops) ----
    # q_norm [T,Q] and k_nope [T,C] also written in a GEMM-input format: per output an
    # mlaf_gemm_format, an mlaf_gemm_scale and the amax floor (as rms_norm_quant's q_format,
    # q_scale, q_eps); its e4m3 data [T,K] float8_e4m3fn and scales in the [T, groups]
    # orientation engines hold (the MN-major layouts with strides (1, ld)). The functional forms
    # return the op's outputs, then (q_data, q_scales, k_nope_data, k_nope_scales), [T,0] where
    # not written; return_q=False (return_k_nope=False) leaves out the dense copy. The _out forms
    # write the given outputs.
    "split_qk_norm_quant": (
        f"split_qk_norm_quant(Tensor latent, Tensor? w_q, Tensor w_kv, int q_lora_rank, "
        f"int kv_lora_rank, int rope_dim, float eps_q, float eps_kv, {_RQ_P}, "
        "bool return_q=True, bool return_k_nope=True, bool return_k_pe=True) -> "
        f"({_tensors(7)})"),
    "split_qk_norm_quant_out": (
        "split_qk_norm_quant_out(Tensor latent, Tensor? w_q, Tensor w_kv, Tensor(a!)? q, "
        f"Tensor(b!)? k_nope, Tensor(c!)? k_pe, {_rq_outs('defg')}, int q_lora_rank, "
        f"int kv_lora_rank, int rope_dim, float eps_q, float eps_kv, {_RQ_P}) -> ()"),
    "mla_kv_cache_quant": (
        f"mla_kv_cache_quant({_KV_IN}, {_KV_P}, {_RQ_P}, bool return_q=True, "
        f"bool return_k_nope=False, bool return_k_pe=False, {_kv_fmt('c', 'd', True)}) "
        f"-> ({_tensors(7)})"),
    "mla_kv_cache_quant_out": (
        f"mla_kv_cache_quant_out({_KV_IN}, Tensor(c!)? q, Tensor(d!)? k_nope, Tensor(e!)? k_pe, "
        f"{_rq_outs('fghi')}, {_KV_P}, {_RQ_P}, {_kv_fmt('j', 'k', True)}) -> ()"),
    "mla_kv_cache_dsa_quant": (
        f"mla_kv_cache_dsa_quant({_KV_IN}, {_KV_DSA_IDX}, {_KV_P}, {_IDX_P}, {_RQ_P}, "
        "bool return_q=True, bool return_k_nope=False, bool return_k_pe=False, "
        "bool return_index_out=False, int index_copies=1, int index_copy_stride=0, "
        f"{_kv_fmt('e', 'f', False)}) -> ({_tensors(8)})"),
    "mla_kv_cache_dsa_quant_out": (
        f"mla_kv_cache_dsa_quant_out({_KV_IN}, {_KV_DSA_IDX}, Tensor(e!)? q, Tensor(f!)? k_nope, "
        f"Tensor(g!)? k_pe, Tensor(h!)? index_out, {_rq_outs('ijkl')}, {_KV_P}, {_IDX_P}, "
        f"{_RQ_P}, int index_copies=1, int index_copy_stride=0, {_kv_fmt('m', 'n', False)}) "
        "-> ()"),
}

# gemm_quant (docs/gemm_formats.md) -> (q_data [T, K] float8_e4m3fn, q_scales as engines hold
# them: [T, cols], the MN-major formats with strides (1, ld)); q_format / q_scale are the codes of
# mlaf_gemm_format / mlaf_gemm_scale. The _out form writes the given q_data (uint8 too) and
# q_scales (the same layouts).
SCHEMAS.update({
    "gemm_quant": "gemm_quant(Tensor x, int q_format, int q_scale, float q_eps=0.0) -> (Tensor, Tensor)",
    "gemm_quant_out": (
        "gemm_quant_out(Tensor x, Tensor(a!) q_data, Tensor(b!) q_scales, int q_format, int q_scale, "
        "float q_eps=0.0) -> ()"),
})
