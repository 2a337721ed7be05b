"""The Python API of moe_gate and moe_gate_hash: the router (top-k with groups, or the hash table
lookup). Re-exported by mlafuse.ops (see its docstring for the conventions every op follows)."""
from __future__ import annotations

from ._ops_common import (_core, L, _torch, _TT, _torch_error, _SCORES, _GROUPS, _enum, Preset,
                          _PRESETS, find_preset, _dim, _np_in, _np_out, _check_same_kind, _outs)

if _torch is not None:
    # The ops, looked up once: the torch paths below call them directly (see _op_pair).
    from ._ops_common import _is_compiling, _op_pair

    _op_gate, _gate_eager = _op_pair("moe_gate")
    _op_gate_out, _gate_out_eager = _op_pair("moe_gate_out")
    _op_gate_hash, _gate_hash_eager = _op_pair("moe_gate_hash")
    _op_gate_hash_out, _gate_hash_out_eager = _op_pair("moe_gate_hash_out")



def _gate_outputs(logits, args, weights, ids, scores, want_scores, weights_dtype):
    """The outputs of a call given some of them (out=): the missing ones allocated as the
    allocating form makes them (args[0] top_k, args[9] shared experts)."""
    T, E = _dim(logits, 0), _dim(logits, 1)
    K = max(int(args[0]) + int(args[9]), 0)
    if weights is None:
        weights = logits.new_empty((T, K), dtype=weights_dtype or _torch.float32)
    if ids is None:
        ids = logits.new_empty((T, K), dtype=_torch.int32)
    if scores is None and want_scores:
        scores = logits.new_empty((T, E), dtype=_torch.float32)
    return weights, ids, scores

def _gate_outs(out, weights, ids, scores, op: str):
    """out= as (weights, ids) or (weights, ids, scores), the tuples the call returns."""
    n = len(out) if isinstance(out, (tuple, list)) else 0
    got = _outs(out, ("weights", "ids", "scores")[:3 if n == 3 else 2], (weights, ids, scores),
                op)
    return got if len(got) == 3 else (*got, None)


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
             weights_dtype=None, weights=None, ids=None, scores=None, out=None):
    """MoE router top-k (docs/moe_gate.md).

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
    Given outputs (``weights=``, ``ids=``, ``scores=``, or ``out=(weights, ids)`` / ``(weights,
    ids, scores)`` with None for one not given) are mutated and returned; one of the wrong shape
    or dtype raises MlafError naming it, and nothing is written.
    """
    if out is not None:
        weights, ids, scores = _gate_outs(out, weights, ids, scores, "moe_gate")
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
                w, i, s = (_gate_eager if not compiling else _op_gate)(
                    logits, bias, *args, want_scores, weights_dtype)
                return (w, i, s) if want_scores else (w, i)
            weights, ids, scores = _gate_outputs(logits, args, weights, ids, scores, want_scores,
                                                 weights_dtype)
            (_gate_out_eager if not compiling else _op_gate_out)(logits, bias, weights, ids,
                                                                 scores, *args)
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
                  weights_dtype=None, weights=None, ids=None, scores=None, error_count=None,
                  out=None):
    """Hash-routed MoE layer (docs/moe_gate.md, hash routing: DeepSeek-V4's first n_hash_layers layers).

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
    given (weights [T, top_k + S], ids [T, top_k + S] int32, scores [T, E] f32). Given outputs
    (by name or as ``out=``) as moe_gate.
    """
    if out is not None:
        weights, ids, scores = _gate_outs(out, weights, ids, scores, "moe_gate_hash")
    if top_k is None and config is None:
        top_k = _dim(tid2eid, 1)
    want_scores = return_scores or scores is not None
    p = _gate_params(config, top_k, 1, 1, score_func, "top2_sum", renormalize,
                     routed_scaling_factor, apply_routed_scaling, eps, n_shared_experts)
    p["n_group"], p["topk_group"], p["group_score"] = 1, 1, L.GROUP_TOP2_SUM
    args = _gate_args(p)
    if isinstance(logits, _TT):
        eager = not _is_compiling()
        try:
            if weights is None and ids is None and scores is None:
                w, i, s = (_gate_hash_eager if eager else _op_gate_hash)(
                    logits, tid2eid, token_ids, error_count, *args, want_scores, weights_dtype)
                return (w, i, s) if want_scores else (w, i)
            weights, ids, scores = _gate_outputs(logits, args, weights, ids, scores, want_scores,
                                                 weights_dtype)
            (_gate_hash_out_eager if eager else _op_gate_hash_out)(
                logits, tid2eid, token_ids, weights, ids, scores, error_count, *args)
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
