"""DeepSeek-V4's attention parts (docs/mla.md) through the Python API: mla_kv_cache with
kv_rope_tail (dense k_nope and a plain cache; the roped in-place form), the "fp8_v4" cache format
(584-byte planar pages; bf16, so numpy needs ml_dtypes, torch tensors always work) and rope_q's
head_norm / q_out. References: reference.py, from the definitions in docs/mla.md and
docs/kv_formats.md."""
import numpy as np
import pytest

import mlafuse
import reference as ref

try:
    import torch
except ImportError:
    torch = None

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

HAS_CUDA = torch is not None and torch.cuda.is_available() and mlafuse.backend_available("cuda")
NO_CUDA = "no CUDA device visible to torch (or a CPU-only library)"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]
TAIL = 64


def np_dtype(name):
    return {"float32": np.float32, "float16": np.float16}[name]


def round_to(x, dtype):
    """float64 values rounded once to the dtype (via f32 for bf16), back to float64."""
    x = np.asarray(x, np.float64)
    if dtype == "float32":
        return x.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def kv_tail_ref(latent, w_kv, Q, C, eps, positions, cos_sin, dtype):
    """docs/mla.md, kv_rope_tail: RMSNorm over all C values, rounded; the last 64 rotated (interleaved)."""
    kv = round_to(ref.rmsnorm(ref.f64(latent)[:, Q:Q + C], w_kv, eps), dtype)
    kv[:, C - TAIL:] = ref.rope(kv[:, C - TAIL:], positions, cos_sin, "interleaved")
    return kv


def tail_tolerance_mag(latent, w_kv, Q, C, eps, dtype):
    """The rope magnitude of the tail plus an ulp of the rounded input (the library's fp32 norm
    may round an input to the other neighbour): a generous but still per-value bound."""
    kv = round_to(ref.rmsnorm(ref.f64(latent)[:, Q:Q + C], w_kv, eps), dtype)
    mag = ref.rope_magnitude(kv[:, C - TAIL:], "interleaved")
    ulp_in = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    return mag * (1.0 + ulp_in * 2 ** 24 * 2)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("inplace", [False, True], ids=["dense", "inplace_roped"])
def test_kv_rope_tail_numpy(dtype, inplace):
    T, Q, C, max_pos, bs = 9, 32, 256, 40, 4
    eps = 1e-6
    rng = np.random.default_rng(41)
    buf = rng.standard_normal((T, Q + C + 8)).astype(np_dtype(dtype))
    latent = buf[:, :Q + C]  # strided rows
    before, pad0 = latent.copy(), buf[:, Q + C:].copy()
    w_q = (1 + 0.1 * rng.standard_normal(Q)).astype(np_dtype(dtype))
    w_kv = (1 + 0.1 * rng.standard_normal(C)).astype(np_dtype(dtype))
    positions = rng.integers(0, max_pos, T).astype(np.int64)
    positions[3] = max_pos + 2  # rejected: counted, no cache row, no tail values
    cos_sin = mlafuse.rope_table(max_pos, TAIL)
    slots = rng.permutation(T * 2)[:T].astype(np.int64)
    slots[5] = -1
    cache = np.full((T * 2 // bs + 1, bs, C), -7.0, np_dtype(dtype))
    cache0 = cache.copy()
    err = np.zeros(1, np.int32)
    k_nope = latent[:, Q:] if inplace else np.full((T, C), np.nan, np_dtype(dtype))
    q = latent[:, :Q] if inplace else None
    q_out, kn, kp = mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slots, cache,
                                         eps_q=eps, eps_kv=eps, kv_rope_tail=TAIL, q=q,
                                         k_nope=k_nope, error_count=err)
    assert kp is None and kn is k_nope
    assert err[0] == 1
    want = kv_tail_ref(before, w_kv, Q, C, eps, positions % max_pos, cos_sin, dtype)
    mag = tail_tolerance_mag(before, w_kv, Q, C, eps, dtype)
    ok = np.arange(T) != 3
    ref.assert_close_ulp(kn[ok, :C - TAIL], ref.rmsnorm(ref.f64(before)[ok, Q:], w_kv, eps)[:, :C - TAIL],
                         dtype, "k_nope (nope part)")
    ref.assert_close_ulp(kn[ok, C - TAIL:], want[ok, C - TAIL:], dtype, "k_nope (rope tail)", mag[ok])
    # the rejected token: nope values written, the tail as it was (NaN poison, or the latent)
    ref.assert_close_ulp(kn[3, :C - TAIL], ref.rmsnorm(ref.f64(before)[3:4, Q:], w_kv, eps)[0, :C - TAIL],
                         dtype, "k_nope of a rejected token")
    tail3 = kn[3, C - TAIL:]
    assert np.all(np.isnan(tail3)) if not inplace else np.array_equal(tail3, before[3, Q + C - TAIL:])
    ref.assert_close_ulp(q_out, ref.rmsnorm(ref.f64(before)[:, :Q], w_q, eps), dtype, "q")
    if inplace:  # the row is [q_norm | rope-tailed kv_norm] (checked above); padding untouched
        assert np.array_equal(buf[:, Q + C:].view(np.uint8), pad0.view(np.uint8))
    written = np.zeros(cache.shape[:2], bool)
    for t in range(T):
        if t == 3 or slots[t] < 0:
            continue
        b, o = divmod(int(slots[t]), bs)
        written[b, o] = True
        assert np.array_equal(cache[b, o].view(np.uint8), kn[t].view(np.uint8)), t
    assert np.array_equal(cache[~written].view(np.uint8), cache0[~written].view(np.uint8))


def test_kv_rope_tail_errors():
    latent = np.zeros((2, 8 + 128), np.float32)
    args = (latent, np.ones(8, np.float32), np.ones(128, np.float32), np.zeros(2, np.int64),
            mlafuse.rope_table(4, TAIL), np.zeros(2, np.int64), np.zeros((1, 2, 128), np.float32))
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.mla_kv_cache(*args, kv_rope_tail=TAIL, style="neox")
    assert ei.value.status_name == "MLAF_ERR_INVALID_ARGUMENT" and "kv_rope_tail" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.mla_kv_cache(*args, kv_rope_tail=TAIL, return_k_pe=True)
    assert "k_pe" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:  # fp8_v4 wants a bf16 latent
        mlafuse.mla_kv_cache(latent[:, :8 + 128].astype(np.float16), np.ones(8, np.float16),
                             np.ones(128, np.float16), args[3], args[4], args[5],
                             np.zeros((1, 2, 584), np.uint8), kv_rope_tail=TAIL,
                             cache_format="fp8_v4")
    assert ei.value.status_name in ("MLAF_ERR_DTYPE", "MLAF_ERR_INVALID_ARGUMENT")


# ---- fp8_v4 ---------------------------------------------------------------------------------
def v4_record(k_nope_bf16_f32, k_nope_bf16_bits):
    """The fp8_v4 record (docs/kv_formats.md) of dense rows [n, 512] (bf16 values as f32, and their bits): the data
    row [448 e4m3 | 64 bf16] and the scale row [7 UE8M0 | 0], as two arrays."""
    x = np.asarray(k_nope_bf16_f32, np.float32)
    n = x.shape[0]
    blocks = x[:, :448].reshape(n, 7, 64)
    e = ref.ceil_log2(np.maximum(ref.nan_amax(blocks), np.float32(1e-4)) / np.float32(448))
    with np.errstate(all="ignore"):
        q = ref.e4m3(np.ldexp(blocks.astype(np.float64), -e[:, :, None]).astype(np.float32)).reshape(n, 448)
    rope = np.ascontiguousarray(np.asarray(k_nope_bf16_bits)[:, 448:].astype("<u2")).view(np.uint8).reshape(n, 128)
    scales = np.concatenate([np.clip(e + 127, 0, 255).astype(np.uint8), np.zeros((n, 1), np.uint8)], axis=1)
    return np.concatenate([q, rope], axis=1), scales


def _check_v4_pages(cache_bytes, stride, bs, slots, kn_f32, kn_bits, poison):
    """cache_bytes: the whole cache as bytes (num_blocks * stride)."""
    data, scales = v4_record(kn_f32, kn_bits)
    mine = np.zeros(cache_bytes.shape, bool)
    for t, s in enumerate(slots):
        if s < 0:
            continue
        page, o = divmod(int(s), bs)
        d0, s0 = page * stride + o * 576, page * stride + bs * 576 + o * 8
        assert np.array_equal(cache_bytes[d0:d0 + 576], data[t]), f"data row of token {t}"
        assert np.array_equal(cache_bytes[s0:s0 + 8], scales[t]), f"scale row of token {t}"
        mine[d0:d0 + 576] = True
        mine[s0:s0 + 8] = True
    assert np.all(cache_bytes[~mine] == poison)


def _v4_inputs(rng, T):
    Q, C = 64, 512
    latent = rng.standard_normal((T, Q + C)).astype(np.float32)
    latent[0, Q:Q + 64] *= 1e-6  # a block whose amax is under the 1e-4 floor
    return Q, C, latent, 1 + 0.1 * rng.standard_normal(Q + C).astype(np.float32)


@pytest.mark.skipif(ml_dtypes is None, reason="numpy bf16 needs ml_dtypes")
def test_fp8_v4_numpy():
    rng = np.random.default_rng(58)
    T, bs, nb, max_pos = 7, 3, 4, 32
    Q, C, lat32, w32 = _v4_inputs(rng, T)
    bf = ml_dtypes.bfloat16
    latent, w = lat32.astype(bf), w32.astype(bf)
    stride = bs * 584 + 8 + 32  # bytes, a multiple of 16
    store = np.full(nb * stride, 0xA5, np.uint8)
    cache = np.lib.stride_tricks.as_strided(store, (nb, bs, 584), (stride, 584, 1))
    slots = np.array([5, 0, -1, 11, 2, 7, 9], np.int64)
    positions = rng.integers(0, max_pos, T).astype(np.int64)
    q, kn, _ = mlafuse.mla_kv_cache(latent, w[:Q], w[Q:], positions, mlafuse.rope_table(max_pos, TAIL),
                                    slots, cache, eps_q=1e-6, eps_kv=1e-6, kv_rope_tail=TAIL,
                                    cache_format="fp8_v4", return_k_nope=True)
    _check_v4_pages(store, stride, bs, slots, kn.astype(np.float32), kn.view(np.uint16), 0xA5)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_fp8_v4_torch(device):
    rng = np.random.default_rng(59)
    T, bs, nb, max_pos = 9, 64, 2, 64
    Q, C, lat32, w32 = _v4_inputs(rng, T)
    latent = torch.from_numpy(lat32).to(device, torch.bfloat16)
    w = torch.from_numpy(w32).to(device, torch.bfloat16)
    cache = torch.full((nb, bs, 584), 0xA5, dtype=torch.uint8, device=device)  # stride (bs * 584, 584, 1)
    slots = torch.tensor([70, 0, -1, 127, 2, 64, 9, 33, 100], dtype=torch.int64, device=device)
    positions = torch.from_numpy(rng.integers(0, max_pos, T)).to(device)
    q, kn, _ = mlafuse.mla_kv_cache(latent, w[:Q], w[Q:], positions, mlafuse.rope_table(max_pos, TAIL, device=device),
                                    slots, cache, eps_q=1e-6, eps_kv=1e-6, kv_rope_tail=TAIL,
                                    cache_format="fp8_v4", return_k_nope=True)
    kn_cpu = kn.cpu()
    _check_v4_pages(cache.cpu().reshape(-1).numpy(), bs * 584, bs, slots.cpu().numpy(),
                    kn_cpu.float().numpy(), kn_cpu.view(torch.int16).numpy().view(np.uint16), 0xA5)


# ---- rope_q head_norm -------------------------------------------------------------------------
def head_norm_ref(q, positions, cos_sin, R, eps):
    x = ref.f64(q)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    y[..., -R:] = ref.rope(y[..., -R:], positions, cos_sin, "interleaved")
    return y


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("out", [False, True], ids=["inplace", "q_out"])
def test_rope_q_head_norm_numpy(dtype, out):
    T, H, D, R, max_pos, eps = 6, 3, 96, 32, 20, 1e-6
    rng = np.random.default_rng(60)
    buf = rng.standard_normal((T, H + 1, D)).astype(np_dtype(dtype))
    q = buf[:, 1:, :]  # strided heads
    before = q.copy()
    positions = rng.integers(0, max_pos, T).astype(np.int64)
    positions[2] = -1  # rejected: nothing of the token written
    cos_sin = mlafuse.rope_table(max_pos, R)
    err = np.zeros(1, np.int32)
    q_out = np.full((T, 8, D), np.nan, np_dtype(dtype)) if out else None
    got = mlafuse.rope_q(q, positions, cos_sin, head_norm=True, head_norm_eps=eps, q_out=q_out,
                         error_count=err)
    assert err[0] == 1
    assert got is (q_out if out else q)
    ok = np.arange(T) != 2
    want = head_norm_ref(before[ok], positions[ok], cos_sin, R, eps)
    mag = np.zeros_like(want)
    mag[..., -R:] = ref.rope_magnitude(want[..., -R:], "interleaved") * 2
    ref.assert_close_ulp(got[ok][:, :H], want, dtype, "rope_q head_norm", mag)
    if out:
        assert np.array_equal(q, before)  # q only read
        pad = got[ok][:, H:]
        assert np.all(pad == 0) and not np.any(np.signbit(pad))  # +0.0
        assert np.all(np.isnan(got[2]))  # the rejected token's row untouched
    else:
        assert np.array_equal(q[2], before[2])


def test_rope_q_out_without_head_norm():
    T, H, D, R = 4, 2, 24, 8
    rng = np.random.default_rng(61)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    positions = np.arange(T, dtype=np.int32)
    cos_sin = mlafuse.rope_table(8, R)
    q_out = np.full((T, 4, D), 5.0, np.float32)
    mlafuse.rope_q(q, positions, cos_sin, q_out=q_out)
    want = q.copy()
    mlafuse.rope_q(want, positions, cos_sin)
    assert np.array_equal(q_out[:, :H], want)
    assert np.all(q_out[:, H:] == 0)


def test_rope_q_out_errors():
    q = np.zeros((2, 3, 16), np.float32)
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.rope_q(q, np.zeros(2, np.int64), mlafuse.rope_table(4, 8), q_out=np.zeros((2, 2, 16), np.float32))
    assert ei.value.status_name == "MLAF_ERR_SHAPE" and "q_out.shape[1]" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.rope_q(q, np.zeros(2, np.int64), mlafuse.rope_table(4, 8), head_norm=True, head_norm_eps=-1.0)
    assert "head_norm_eps" in ei.value.message


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_rope_q_head_norm_torch(device):
    T, H, D, R, max_pos = 5, 64, 512, 64, 16
    g = torch.Generator().manual_seed(62)
    q = torch.randn(T, H, D, generator=g).to(device, torch.bfloat16)
    positions = torch.randint(0, max_pos, (T,), generator=g).to(device)
    cos_sin = mlafuse.rope_table(max_pos, R, device=device)
    q_out = torch.empty(T, 128, D, dtype=torch.bfloat16, device=device)
    got = mlafuse.rope_q(q, positions, cos_sin, head_norm=True, q_out=q_out)
    assert got is q_out
    want = head_norm_ref(q, positions.cpu().numpy(), cos_sin.cpu(), R, 1e-6)
    mag = np.zeros_like(want)
    mag[..., -R:] = ref.rope_magnitude(want[..., -R:], "interleaved") * 2
    ref.assert_close_ulp(q_out[:, :H], want, "bfloat16", "rope_q head_norm (torch)", mag)
    assert torch.all(q_out[:, H:] == 0)
    inplace = q.clone()
    mlafuse.rope_q(inplace, positions, cos_sin, head_norm=True)
    assert torch.equal(inplace.view(torch.int16), q_out[:, :H].view(torch.int16))
