"""mlafuse.KVCache: a paged KV cache and its format as one named value for mla_kv_cache and
mla_kv_cache_dsa. The same bytes as the call with the cache tensor and the format keywords, for
every format and both kinds of arrays (numpy, torch on CPU and CUDA when present); the format
checked when the object is made; the keywords refused beside it; its fields; and
torch.compile(fullgraph=True) with caches passed in or made inside the compiled function."""
import dataclasses

import numpy as np
import pytest

import mlafuse
from mlafuse.ops import KvFormatArgs

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
T, Q, C, R, NB, BS = 6, 32, 128, 64, 4, 4


def of(kind, a):
    a = np.ascontiguousarray(a)
    return a if kind == "numpy" else torch.from_numpy(a).to(kind)


def host(x):
    """The bytes of an array or tensor (bf16 and fp8 too), as a numpy array."""
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.view(torch.int16 if x.element_size() == 2 else torch.uint8) \
            if x.dtype in (torch.bfloat16, torch.float8_e4m3fn) else x
        x = x.numpy()
    return np.ascontiguousarray(x).view(np.uint8)


def inputs(kind, seed=0, C=C):
    rng = np.random.default_rng(seed)
    f = lambda *s: of(kind, rng.standard_normal(s).astype(np.float32))  # noqa: E731
    return dict(latent=f(T, Q + C + R), w_q=f(Q), w_kv=f(C),
                positions=of(kind, rng.integers(0, 32, T)),
                cos_sin=of(kind, mlafuse.rope_table(32, R)),
                slot_mapping=of(kind, rng.permutation(NB * BS)[:T].astype(np.int32)))


def scalar(kind, v):
    return of(kind, np.array([v], np.float32))


# Each format as (cache width, the keywords), the arrays made per kind.
FORMATS = {
    "auto": lambda k: (C + R, {}),
    "auto+kpe": lambda k: (C, dict(cache_format="auto", kpe_cache=of(k, np.zeros((NB, BS, R),
                                                                             np.float32)))),
    "fp8/k_scale": lambda k: (C + R, dict(cache_format="fp8", k_scale=scalar(k, 0.05),
                                          amax_out=scalar(k, 0.0))),
    "fp8_e4m3/quant_scale": lambda k: (C + R, dict(cache_format="fp8_e4m3",
                                                   quant_scale=scalar(k, 20.0))),
}


def cache_for(kind, name, width):
    dt = np.float32 if name.startswith("auto") else np.uint8
    return of(kind, np.zeros((NB, BS, width), dt))


def fresh(kind, name):
    """The cache and its format keywords, made anew (the mutated arrays start equal)."""
    width, kw = FORMATS[name](kind)
    return cache_for(kind, name, width), kw


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(FORMATS))
def test_kvcache_is_the_keywords(kind, name):
    a = inputs(kind)
    cache_a, kw_a = fresh(kind, name)
    cache_b, kw_b = fresh(kind, name)
    want = mlafuse.mla_kv_cache(**a, kv_cache=cache_a, return_k_nope=True, **kw_a)
    fields = {("format" if k == "cache_format" else k): v for k, v in kw_b.items()}
    obj = mlafuse.KVCache(cache_b, **fields)
    got = mlafuse.mla_kv_cache(**a, kv_cache=obj, return_k_nope=True)
    for x, y in zip(got, want):
        assert (x is None) == (y is None) and (x is None or np.array_equal(host(x), host(y)))
    assert np.array_equal(host(cache_b), host(cache_a))
    for k in kw_a:
        if k != "cache_format":
            assert np.array_equal(host(kw_b[k]), host(kw_a[k])), k


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8"])
def test_kvcache_through_dsa(kind, fmt):
    """mla_kv_cache_dsa takes a KVCache too: fp8_ds_mla (tile scales; bf16 latent, C = 512) and
    fp8 (a k_scale, f32 latent), the same bytes as with the keywords."""
    ds = fmt == "fp8_ds_mla"
    a = inputs(kind, seed=1, C=512 if ds else C)
    if ds and kind == "numpy":
        ml_dtypes = pytest.importorskip("ml_dtypes",
                                        reason="fp8_ds_mla takes a bf16 latent (ml_dtypes)")
        a["latent"] = a["latent"].astype(ml_dtypes.bfloat16)
    elif ds:
        a["latent"] = a["latent"].bfloat16()
    rng = np.random.default_rng(3)
    idx = (of(kind, rng.standard_normal((T, 128)).astype(np.float32)),
           of(kind, np.ones(128, np.float32)), of(kind, np.zeros(128, np.float32)))
    if ds and kind != "numpy":
        idx = (idx[0].bfloat16(),) + idx[1:]
    kw = dict(tile_scale="ue8m0") if ds else dict(k_scale=scalar(kind, 0.05))
    runs = []
    for form in ("keywords", "object"):
        kv = of(kind, np.zeros((NB, BS, 656 if ds else C + R), np.uint8))  # 656: ds_mla, C 512
        ic = of(kind, np.zeros((NB, 132 * BS), np.uint8))
        cache = (dict(kv_cache=kv, cache_format=fmt, **kw) if form == "keywords" else
                 dict(kv_cache=mlafuse.KVCache(kv, fmt, **kw)))
        out = mlafuse.mla_kv_cache_dsa(**a, **cache, index_k=idx[0], index_weight=idx[1],
                                       index_bias=idx[2], index_cache=ic)
        runs.append((out[0], kv, ic))
    for x, y in zip(*runs):
        assert np.array_equal(host(x), host(y))
    assert host(runs[0][1]).any() and host(runs[0][2]).any()


def test_kvcache_checks_its_format_when_made():
    kv = np.zeros((NB, BS, C + R), np.uint8)
    with pytest.raises(mlafuse.MlafError, match="needs a scale") as ei:
        mlafuse.KVCache(kv, "fp8")
    assert ei.value.status_name == "MLAF_ERR_NULL_POINTER"
    with pytest.raises(mlafuse.MlafError, match="tile_scale is given"):
        mlafuse.KVCache(kv, "fp8", k_scale=np.ones(1, np.float32), tile_scale="ue8m0")
    with pytest.raises(mlafuse.MlafError, match="MLAF_ERR_UNSUPPORTED"):
        mlafuse.KVCache(kv, "fp8_e5m2")
    with pytest.raises(ValueError, match="cache_format = 'fp9'"):
        mlafuse.KVCache(kv, "fp9")
    with pytest.raises(TypeError, match="k_scale is a float"):
        mlafuse.KVCache(kv, "fp8", k_scale=0.5)


def test_kvcache_fields_and_keywords_beside_it():
    kv = np.zeros((NB, BS, 656), np.uint8)
    c = mlafuse.KVCache(kv, "fp8_ds_mla", tile_scale="ue8m0_floor_scaled")
    assert (c.num_blocks, c.block_size, c.format) == (NB, BS, "fp8_ds_mla")
    assert isinstance(c.args, KvFormatArgs) and c.args.cache_format == 2
    assert c.args.tile_scale == 2 and c.args.scale is None and c.args.kpe_cache is None
    assert mlafuse.KVCache(np.zeros((NB, BS, C + R), np.float32)).args is None  # plain: no args
    assert "args" not in repr(c) and "fp8_ds_mla" in repr(c)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.format = "fp8"
    a = inputs("numpy")
    with pytest.raises(ValueError, match="KVCache, which carries the format"):
        mlafuse.mla_kv_cache(**a, kv_cache=c, tile_scale="ue8m0")
    with pytest.raises(ValueError, match="KVCache, which carries the format"):
        mlafuse.mla_kv_cache(**a, kv_cache=mlafuse.KVCache(kv), cache_format="auto",
                             kpe_cache=np.zeros((NB, BS, R), np.float32))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("inside", [False, True], ids=["passed-in", "made-inside"])
def test_kvcache_under_torch_compile(inside):
    """A KVCache passed to (or made inside) a compiled function: one graph, no break, the
    cache written in place as eagerly; a new KVCache of the same format is no recompile."""
    from torch._dynamo.utils import counters

    def step(a, cache):
        return mlafuse.mla_kv_cache(**a, kv_cache=cache)[0]

    def step_inside(a, kv, k_scale):
        return mlafuse.mla_kv_cache(**a, kv_cache=mlafuse.KVCache(kv, "fp8", k_scale=k_scale))[0]

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step_inside if inside else step, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in (1, 2, 3):
            a = inputs("cpu", seed)
            kv_e, kv_c = (torch.zeros(NB, BS, C + R, dtype=torch.uint8) for _ in range(2))
            s = torch.tensor([0.05])
            want = step(a, mlafuse.KVCache(kv_e, "fp8", k_scale=s))
            got = compiled(a, kv_c, s) if inside else compiled(a, mlafuse.KVCache(kv_c, "fp8",
                                                                                 k_scale=s))
            assert torch.equal(got, want) and torch.equal(kv_c, kv_e) and bool(kv_c.any())
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
