"""The Python API of rope_q: RoPE of the rope columns of every q head in place (or into q_out),
head_norm. Re-exported by mlafuse.ops (see its docstring for the conventions every op follows)."""
from __future__ import annotations

from ._ops_common import (_torch, _core, L, _TT, _torch_error, _STYLES, _enum, _dim, _np_in, _np_out,
                          _check_same_kind)

if _torch is not None:
    # The op, looked up once: the torch path below calls it directly (see _op_pair).
    from ._ops_common import _is_compiling, _op_pair

    _op_rope, _rope_eager = _op_pair("rope_q")


# ---- rope_q --------------------------------------------------------------------------------
def rope_q(q, positions, cos_sin, *, style="interleaved", rope_dim: int | None = None,
           error_count=None, head_norm: bool = False, head_norm_eps: float = 1e-6, q_out=None,
           out=None):
    """RoPE in place on the last R columns of every head of q (docs/mla.md).

    q            [T, H, D]     f32 | f16 | bf16, strides (s0, s1, 1); D = nope + R.  MUTATED
    positions    [T]           int32 | int64
    cos_sin      [max_pos, R]  f32; R defaults to cos_sin.shape[1]
    error_count  [1] int32, optional.  MUTATED: +1 per token whose position is outside
                 [0, max_pos) (that token is left unrotated)

    Bit-identical to what mla_kv_cache writes for the key at the same position. Returns q.
    style "none" (Kimi-K3's unrotated slot): nothing rotates and positions / cos_sin are not read;
    in place without head_norm q is left as it is.

    DeepSeek-V4's q (docs/mla.md, head_norm): ``head_norm=True`` first normalizes every head without weight
    (rstd = 1 / sqrt(mean(x^2) + head_norm_eps) in fp32), rotates the last R values of the fp32
    result and rounds once. ``q_out`` [T, Hpad, D] (Hpad >= H, q's dtype), optional, MUTATED:
    the result goes there instead (q is only read) and heads H .. Hpad-1 are written as +0.0
    (FlashMLA takes 64 or 128 heads); returns q_out. A token with a bad position writes nothing.

    The op works in place, so it allocates nothing: ``out=`` is another name for ``q_out``
    (one tensor), there for the same keyword on every op.
    """
    if out is not None:
        if q_out is not None:
            raise ValueError("rope_q: out= is q_out=; give one of them")
        q_out = out
    style = _enum(style, _STYLES, "style")
    R = int(rope_dim) if rope_dim is not None else _dim(cos_sin, 1)
    hn, heps = bool(head_norm), float(head_norm_eps)
    if isinstance(q, _TT):
        try:
            op = _rope_eager if not _is_compiling() else _op_rope
            if hn or q_out is not None:
                op(q, positions, cos_sin, R, style, error_count, hn, heps, q_out)
            else:
                op(q, positions, cos_sin, R, style, error_count)
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
