"""``out=`` on every op: the outputs an engine preallocates, given as one tuple in the order the
op returns them (rope_q, which works in place, takes its q_out there). For numpy arrays and torch
tensors (CPU, CUDA when present; test_bindings reruns this file under the other binding): the
results are written into the given arrays and returned as they are, equal bit for bit to the
allocating call's; an output of the wrong shape or dtype raises MlafError naming it and nothing
is written (not the other outputs, not the caches); a tuple of the wrong length, or out= beside
the outputs by name, is a ValueError."""
import numpy as np
import pytest

import mlafuse

try:
    import torch
except ImportError:
    torch = None

HAS_CUDA = torch is not None and torch.cuda.is_available() and mlafuse.backend_available("cuda")
KINDS = ["numpy",
         pytest.param("cpu", marks=pytest.mark.skipif(torch is None,
                                                      reason="torch is not installed")),
         pytest.param("cuda", marks=pytest.mark.skipif(
             not HAS_CUDA, reason="no CUDA device visible to torch (or a CPU-only library)"))]
POISON = {np.float32: -3584.0, np.float16: -3584.0, np.int32: -7, np.uint8: 0xA5}


class Arrays:
    """Makes the arrays of one call as numpy arrays ("numpy") or torch tensors on a device."""

    def __init__(self, kind):
        self.kind = kind
        self.rng = np.random.default_rng(7)

    def of(self, a):
        a = np.ascontiguousarray(a)
        return a if self.kind == "numpy" else torch.from_numpy(a).to(self.kind)

    def randn(self, *shape, scale=1.0):
        return self.of((scale * self.rng.standard_normal(shape)).astype(np.float32))

    def poison(self, shape, dtype=np.float32):
        return self.of(np.full(shape, POISON[dtype], dtype))


def host(x):
    """The bytes of an array or tensor (fp8 as uint8), as a numpy array."""
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x
        x = x.numpy()
    return np.ascontiguousarray(x).view(np.uint8)


def copy(x):
    return x.copy() if isinstance(x, np.ndarray) else x.clone()


# ---- one case per op: the call, its outputs, what it mutates, wrong outputs ----------------
T, Q, C, R = 5, 32, 128, 64  # R = 64: the DSA indexer's RoPE


def case_split_qk_norm(A):
    latent, w_q, w_kv = A.randn(T, Q + C + R), A.randn(Q) + 1, A.randn(C) + 1

    def call(**kw):
        return mlafuse.split_qk_norm(latent, w_q, w_kv, **kw)

    outs = lambda: (A.poison((T, Q)), A.poison((T, C)), A.poison((T, R)))  # noqa: E731
    bad = [(0, A.poison((T, Q - 1)), "MLAF_ERR_SHAPE", "q.shape[1] = 31"),
           (1, A.poison((T, C), np.float16), "MLAF_ERR_DTYPE", "k_nope.dtype"),
           (2, A.poison((T - 1, R)), "MLAF_ERR_SHAPE", "k_pe.shape[0] = 4")]
    return call, {}, outs, [], bad


def _kv_inputs(A):
    nb, bs = 4, 4
    slots = A.of(np.array([3, 0, 9, 14, 6], np.int32))
    return dict(latent=A.randn(T, Q + C + R), w_q=A.randn(Q) + 1, w_kv=A.randn(C) + 1,
                positions=A.of(np.array([1, 5, 0, 17, 30], np.int64)),
                cos_sin=A.of(mlafuse.rope_table(32, R)), slot_mapping=slots,
                kv_cache=A.poison((nb, bs, C + R)))


def case_mla_kv_cache(A):
    a = _kv_inputs(A)
    err = A.of(np.zeros(1, np.int32))

    def call(**kw):
        return mlafuse.mla_kv_cache(**a, error_count=err, **kw)

    outs = lambda: (A.poison((T, Q)), A.poison((T, C)), A.poison((T, R)))  # noqa: E731
    bad = [(1, A.poison((T, C + 1)), "MLAF_ERR_SHAPE", "k_nope.shape[1] = 129"),
           (0, A.poison((T, Q), np.float16), "MLAF_ERR_DTYPE", "q.dtype"),
           (2, A.poison((T + 1, R)), "MLAF_ERR_SHAPE", "k_pe.shape[0] = 6")]
    return call, dict(return_k_nope=True, return_k_pe=True), outs, [a["kv_cache"], err], bad


def case_mla_kv_cache_dsa(A):
    a = _kv_inputs(A)
    index_cache = A.of(np.full((4, 132 * 4), 0xA5, np.uint8))
    rest = (A.randn(T, 128), A.randn(128) + 1, A.randn(128, scale=0.1), index_cache)

    def call(**kw):
        return mlafuse.mla_kv_cache_dsa(*a.values(), *rest, **kw)

    outs = lambda: (A.poison((T, Q)), A.poison((T, C)), A.poison((T, R)),  # noqa: E731
                    A.poison((T, 128)))
    bad = [(3, A.poison((T, 127)), "MLAF_ERR_SHAPE", "index_out.shape[1] = 127"),
           (0, A.poison((T, Q), np.int32), "MLAF_ERR_DTYPE", "q.dtype"),
           (1, A.poison((T, C - 1)), "MLAF_ERR_SHAPE", "k_nope.shape[1] = 127")]
    alloc = dict(return_k_nope=True, return_k_pe=True, return_index_out=True)
    return call, alloc, outs, [a["kv_cache"], index_cache], bad


def case_indexer_q(A):
    H = 4
    q_idx, pos = A.randn(T, H, 128), A.of(np.array([1, 5, 0, 17, 30], np.int64))
    cos_sin, weights = A.of(mlafuse.rope_table(32, 64)), A.randn(T, H)

    def call(**kw):
        return mlafuse.indexer_q(q_idx, pos, cos_sin, weights, **kw)

    outs = lambda: (A.poison((T, H, 128), np.uint8), A.poison((T, H)))  # noqa: E731
    bad = [(1, A.poison((T, H), np.float16), "MLAF_ERR_DTYPE", "w_out.dtype"),
           (0, A.poison((T, H, 127), np.uint8), "MLAF_ERR_SHAPE", "q_fp8.shape[2] = 127")]
    return call, {}, outs, [], bad


def case_moe_gate(A):
    logits, bias = A.randn(T, 64), A.randn(64, scale=0.01)

    def call(**kw):
        return mlafuse.moe_gate(logits, bias, config="glm-4.7-flash", **kw)

    outs = lambda: (A.poison((T, 4)), A.poison((T, 4), np.int32),  # noqa: E731
                    A.poison((T, 64)))
    bad = [(1, A.poison((T, 4)), "MLAF_ERR_DTYPE", "ids.dtype"),
           (2, A.poison((T, 63)), "MLAF_ERR_SHAPE", "scores.shape[1] = 63"),
           (0, A.poison((T, 5)), "MLAF_ERR_SHAPE", "weights.shape[1] = 5")]
    return call, dict(return_scores=True), outs, [], bad


def case_moe_gate_hash(A):
    logits = A.randn(T, 64)
    tid2eid = A.of(np.argsort(A.rng.random((50, 64)), axis=1)[:, :6].astype(np.int32))
    token_ids, err = A.of(np.array([3, 49, 0, 7, 3], np.int32)), A.of(np.zeros(1, np.int32))

    def call(**kw):
        return mlafuse.moe_gate_hash(logits, tid2eid, token_ids, score_func="sqrt_softplus",
                                     error_count=err, **kw)

    outs = lambda: (A.poison((T, 6)), A.poison((T, 6), np.int32),  # noqa: E731
                    A.poison((T, 64)))
    bad = [(0, A.poison((T, 7)), "MLAF_ERR_SHAPE", "weights.shape[1] = 7"),
           (1, A.poison((T, 6), np.uint8), "MLAF_ERR_DTYPE", "ids.dtype")]
    return call, dict(return_scores=True), outs, [err], bad


CASES = [case_split_qk_norm, case_mla_kv_cache, case_mla_kv_cache_dsa, case_indexer_q,
         case_moe_gate, case_moe_gate_hash]
CASE_IDS = [c.__name__[5:] for c in CASES]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_out_writes_the_given_outputs(kind, case):
    """out= writes into the given arrays and returns them; the values are the allocating
    call's, bit for bit; what the op mutates besides (caches, counters) is the same too."""
    call, alloc_kw, outs, state, _ = case(Arrays(kind))
    before = [copy(s) for s in state]
    want = call(**alloc_kw)
    after_alloc = [host(s) for s in state]
    for s, b in zip(state, before):
        s[...] = b
    given = outs()
    got = call(out=given)
    assert len(got) == len(given) and all(g is o for g, o in zip(got, given))
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(host(g), host(w)), f"output {i}"
    for s, w in zip(state, after_alloc):
        assert np.array_equal(host(s), w)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_out_wrong_shape_or_dtype_writes_nothing(kind, case):
    """A given output of the wrong shape or dtype: MlafError naming it (the library's check,
    both bindings alike), and no output, cache or counter written."""
    call, _, outs, state, bad = case(Arrays(kind))
    for i, wrong, status, text in bad:
        given = list(outs())
        given[i] = wrong
        before = [host(x) for x in list(given) + state]
        with pytest.raises(mlafuse.MlafError) as ei:
            call(out=tuple(given))
        assert ei.value.status_name == status and text in ei.value.message, str(ei.value)
        for x, b in zip(list(given) + state, before):
            assert np.array_equal(host(x), b), "written although the call was rejected"


@pytest.mark.parametrize("kind", KINDS)
def test_out_misuse(kind):
    call, _, outs, _, _ = case_split_qk_norm(Arrays(kind))
    q, k, p = outs()
    with pytest.raises(ValueError, match=r"out= takes a tuple of 3 \(q, k_nope, k_pe\), got 2"):
        call(out=(q, k))
    with pytest.raises(ValueError, match="not both"):
        call(out=(None, k, p), q=q)
    with pytest.raises(ValueError, match="out= takes a tuple"):
        call(out=q)
    got = call(out=[None, k, None])  # a list is taken too; None entries are allocated
    assert got[1] is k and got[0] is not None and got[2] is not None
    gcall, _, gouts, _, _ = case_moe_gate(Arrays(kind))
    w, ids, _ = gouts()
    assert len(gcall(out=(w, ids))) == 2  # (weights, ids), as the call returns without scores


@pytest.mark.parametrize("kind", KINDS)
def test_rope_q_out_is_q_out(kind):
    """rope_q works in place; out= is its q_out: the rotated heads written there (heads past
    q's zeroed), q only read, equal to the in-place call's q."""
    A = Arrays(kind)
    q, pos = A.randn(T, 3, 48), A.of(np.array([1, 5, 0, 17, 30], np.int64))
    cos_sin = A.of(mlafuse.rope_table(32, 16))
    q0 = copy(q)
    q_out = A.poison((T, 4, 48))
    assert mlafuse.rope_q(q, pos, cos_sin, out=q_out) is q_out
    assert np.array_equal(host(q), host(q0))
    assert mlafuse.rope_q(q, pos, cos_sin) is q
    assert np.array_equal(host(q_out[:, :3]), host(q))
    assert not host(q_out[:, 3:]).any()
    with pytest.raises(ValueError, match="q_out"):
        mlafuse.rope_q(q, pos, cos_sin, out=q_out, q_out=q_out)
    wrong = A.poison((T, 4, 48), np.float16)
    with pytest.raises(mlafuse.MlafError, match="q_out.dtype"):
        mlafuse.rope_q(q0, pos, cos_sin, out=wrong)
    assert np.array_equal(host(wrong), host(A.poison((T, 4, 48), np.float16)))
