"""mla_kv_cache's cache formats (docs/kv_formats.md) through the Python API: "fp8" / "fp8_e4m3" (one
per-tensor scale, vLLM's k_scale or FlashInfer's quant_scale, optional amax_out, optional
separate kpe array) and "fp8_ds_mla" (FlashMLA's 656-byte record, three tile-scale modes), for
numpy arrays and torch tensors (both bindings: test_bindings reruns this file under the other
one). Every cache byte is compared with the format's formula applied to the op's own dense
row, transcribed here in plain torch (the e4m3 conversion by torch's float8_e4m3fn cast,
clamped first, since the cast does not saturate) and in numpy (reference.py, written from the
format's definition); the two transcriptions are checked against each other. Also: rows not
named stay bit-identical, slot_mapping shorter than the latent, errors, opcheck,
torch.compile and (on a GPU) CUDA-graph capture with the scale changed between replays."""
import zlib

import numpy as np
import pytest

import mlafuse
import reference as ref

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
HAS_CUDA = torch is not None and torch.cuda.is_available() and mlafuse.backend_available("cuda")
NO_CUDA = "no CUDA device visible to torch (or a CPU-only library)"
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]
POISON_BYTE = 0xA5
FLT_MIN = 2.0 ** -126


def run_or_skip(device, fn, *args, **kwargs):
    """Calls fn (every backend implements every format: an error fails the test)."""
    return fn(*args, **kwargs)


# ---- plain torch transcriptions of the formats ----------------------------------------------
def t_e4m3(y):
    """f32 tensor -> e4m3 bytes (uint8): torch's cast rounds to nearest even but turns values
    past the largest finite (448) into NaN, so clamp to +-448 first (saturation); NaN of
    either sign gives 0x7F (docs/kv_formats.md)."""
    y = y.float()
    b = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(y), torch.full_like(b, 0x7F), b)


def t_div(a, b):
    """a / b elementwise in f32 with b a tensor of a's shape (an IEEE division on the CPU; a
    scalar divisor could be turned into a reciprocal multiply)."""
    return a.float() / b.float().expand_as(a).contiguous()


def t_ceil_log2(v):
    bits = v.float().contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(torch.isinf(v), torch.full_like(e, 128), e)


def t_pow2(e):
    """2^e as f32 from the exponent bits; e = 128 gives +inf."""
    return ((e + 127) << 23).to(torch.int32).view(torch.float32)


def t_tile_scale(amax, mode):
    amax = amax.float()
    c448 = torch.full_like(amax, 448.0)
    if mode == "amax":
        return t_div(amax, c448).clamp_min(FLT_MIN)
    if mode == "ue8m0":
        return t_pow2(t_ceil_log2(t_div(amax.clamp_min(np.float32(1e-4).item()), c448)))
    assert mode == "ue8m0_floor_scaled"
    return t_pow2(t_ceil_log2(t_div(amax, c448).clamp_min(np.float32(1e-4).item())))


def t_nan_amax(x, dim=-1):
    a = x.float().abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim=dim)


def t_fp8_record(rows, scale, conv):
    """rows [n, W] dense values; scale a float: e4m3(x / scale) or e4m3(x * scale)."""
    rows = rows.float()
    s = torch.full_like(rows, scale)
    return t_e4m3(t_div(rows, s) if conv == "k_scale" else rows * s)


def t_ds_mla_record(k_nope, k_pe, mode):
    """k_nope [n, C], k_pe [n, R] bf16 dense rows -> [n, C + C/32 + 2R] bytes."""
    n, C = k_nope.shape
    tiles = k_nope.float().reshape(n, C // 128, 128)
    s = t_tile_scale(t_nan_amax(tiles), mode)
    q = t_e4m3(t_div(tiles, s[:, :, None])).reshape(n, C)
    scales = s.contiguous().view(torch.uint8).reshape(n, -1)  # little-endian hosts
    pe = k_pe.contiguous().view(torch.uint8).reshape(n, -1)
    return torch.cat([q, scales, pe], dim=1)


# ---- the two transcriptions agree, and with docs/kv_formats.md's fixed points -----------------------------
@needs_torch
def test_e4m3_transcriptions_agree():
    every_bf16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(
        torch.bfloat16).float()
    for s in (1.0, 2.0 ** -7, 3.7, 1 / 3, 1e-3):
        y = every_bf16 * s
        assert np.array_equal(t_e4m3(y).numpy(), ref.e4m3(y.numpy())), s
    y = torch.tensor([448.0, 449.0, 463.99, 464.0, 1e30, float("inf"), -float("inf"),
                      float("nan"), -float("nan"), 2.0 ** -10, -(2.0 ** -10), 3 * 2.0 ** -11,
                      2.0 ** -9, 0.0, -0.0, 2.0 ** -6, 1.0625, 1.1875])
    want = [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F, 0x00, 0x80, 0x01, 0x01,
            0x00, 0x80, 0x08, 0x38, 0x3A]  # 1.0625: tie to even 1.0; 1.1875: tie up to 1.25
    assert t_e4m3(y).tolist() == want
    assert ref.e4m3(y.numpy()).tolist() == want
    codes = np.arange(256, dtype=np.uint8)
    finite = ~np.isnan(ref.e4m3_decode(codes))
    assert np.array_equal(ref.e4m3_decode(codes)[finite],
                          torch.from_numpy(codes).view(torch.float8_e4m3fn).double().numpy()[finite])


@needs_torch
@pytest.mark.parametrize("mode", ["amax", "ue8m0", "ue8m0_floor_scaled"])
def test_tile_scale_transcriptions_agree(mode):
    amax = np.array([0.0, 1e-30, 1e-10, 448 * 2.0 ** -14, 448 * 2.0 ** -14 * 1.001, 0.04, 1.0,
                     447.9, 448.0, 449.0, 3e4, 1e30, np.inf], np.float32)
    got = t_tile_scale(torch.from_numpy(amax), mode).numpy()
    assert np.array_equal(got, ref.tile_scale(amax, mode))
    fixed = {"amax": {0: FLT_MIN, 8: 1.0, 12: np.inf},
             "ue8m0": {0: 2.0 ** -22, 8: 1.0, 9: 2.0, 12: np.inf},
             "ue8m0_floor_scaled": {0: 2.0 ** -13, 8: 1.0, 9: 2.0, 12: np.inf}}[mode]
    for i, v in fixed.items():
        assert got[i] == np.float32(v), (mode, amax[i], got[i])


# ---- cases -----------------------------------------------------------------------------------
TILE_W = (1.0, 30.0, 0.01, 3.0)  # w_kv factor per 128 columns: tiles of different amax


def make_case(device, dtype, T=24, Q=32, C=256, R=32, block_size=16, seed=0, n_map=None,
              special=True):
    """Inputs of one call, tokens chosen to exercise the rules: token 2 slot -1, token 5 a
    slot past the cache and token 7 a position past the table (both counted; special=False
    leaves these two out: their k_pe rows are not written), and with n_map only the first
    n_map tokens named by slot_mapping."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn(T, Q + C + R + 16, generator=g)
    latent = buf.to(device=device, dtype=dtype)[:, 5:5 + Q + C + R]
    w_q = (1 + 0.1 * torch.randn(Q, generator=g)).to(device) if Q else None
    factor = torch.tensor([TILE_W[(j // 128) % len(TILE_W)] for j in range(C)])
    w_kv = ((1 + 0.1 * torch.randn(C, generator=g)) * factor).to(device=device, dtype=dtype)
    max_pos = 128
    positions = torch.randint(0, max_pos, (T,), generator=g)
    num_blocks = (2 * T + block_size - 1) // block_size
    n_slots = num_blocks * block_size
    slots = torch.randperm(n_slots, generator=g)[:T]
    if T > 7:
        positions[7] = max_pos + 3
        slots[2] = -1
        slots[5] = n_slots + 7
    n_map = T if n_map is None else n_map
    if not special:
        positions[7:8] = 0
        slots[5:6] = -1
    return dict(latent=latent, w_q=w_q, w_kv=w_kv, positions=positions.to(device),
                cos_sin=mlafuse.rope_table(max_pos, R, device=device),
                slot_mapping=slots[:n_map].contiguous().to(device)), dict(
        Q=Q, C=C, R=R, T=T, N=n_map, num_blocks=num_blocks, block_size=block_size,
        n_slots=n_slots, max_pos=max_pos)


def counted(a, d):
    """The tokens the op counts in error_count (slot past the cache, or a named slot with a
    position past the table): they write no cache record and no k_pe row."""
    slots = a["slot_mapping"].cpu().tolist()
    pos = a["positions"].cpu().tolist()
    return [t for t, s in enumerate(slots)
            if s >= d["n_slots"] or (s >= 0 and not 0 <= pos[t] < d["max_pos"])]


def written(a, d):
    """(token, slot) of every token that writes a cache record, and the error count."""
    bad = counted(a, d)
    slots = a["slot_mapping"].cpu().tolist()
    return [(t, s) for t, s in enumerate(slots) if s >= 0 and t not in bad], len(bad)


def poisoned_bytes(shape, dtype, device, pad=0):
    """A byte cache filled with POISON_BYTE (a view of a wider buffer when pad > 0)."""
    nb, bs, w = shape
    buf = torch.full((nb, bs, w + pad), POISON_BYTE, dtype=torch.uint8, device=device)
    return buf, buf.view(dtype)[:, :, :w]


def check_dense(a, d, q, k, p, style="interleaved"):
    """The dense outputs against the float64 oracle (docs/conventions.md); k_pe of the tokens that write
    it (not the counted ones)."""
    Q, C, R = d["Q"], d["C"], d["R"]
    rq, rk, rp = ref.split_qk_norm(a["latent"], a["w_q"], a["w_kv"], Q, C, R, 1e-5, 1e-5)
    pos = a["positions"].cpu().numpy()
    ok = np.ones(d["T"], bool)
    ok[counted(a, d)] = False
    rp = ref.rope(rp[ok], pos[ok], a["cos_sin"].cpu(), style)
    dt = ref.dtype_name(a["latent"])
    if Q:
        ref.assert_close_ulp(q, rq, dt, "q")
    ref.assert_close_ulp(k, rk, dt, "k_nope")
    ref.assert_close_ulp(p.cpu()[torch.from_numpy(ok)], rp, dt, "k_pe", ref.rope_magnitude(rp, style))


def check_records(cache_bytes, want_rows, d, what):
    """cache_bytes [num_blocks, block_size, W] uint8 (CPU): the named slots hold want_rows
    {slot: bytes}, every other byte is POISON_BYTE."""
    flat = cache_bytes.reshape(d["n_slots"], -1)
    named = torch.zeros(d["n_slots"], dtype=torch.bool)
    for s, row in want_rows.items():
        got = flat[s]
        if not torch.equal(got, row):
            bad = (got != row).nonzero().flatten()[:8].tolist()
            raise AssertionError(f"{what}: slot {s} differs at bytes {bad}: got "
                                 f"{got[bad].tolist()}, want {row[bad].tolist()}")
        named[s] = True
    assert bool((flat[~named] == POISON_BYTE).all()), f"{what}: a record not named was written"


# ---- fp8 (per-tensor) --------------------------------------------------------------------------
FP8_DTYPES = [torch.uint8, torch.float8_e4m3fn] if torch is not None else []


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("conv", ["k_scale", "quant_scale"])
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=lambda d: str(d)[6:])
def test_fp8(device, dtype, conv, cache_dtype):
    dtype = getattr(torch, dtype)
    a, d = make_case(device, dtype, seed=zlib.crc32(f"{dtype}{conv}".encode()) % 1000, n_map=20)
    C, R = d["C"], d["R"]
    buf, cache = poisoned_bytes((d["num_blocks"], d["block_size"], C + R), cache_dtype, device)
    # k_scale 0.02: the 30x tile saturates; quant_scale is its reciprocal, rounded to f32
    scale_value = 0.02 if conv == "k_scale" else 50.0
    scale = torch.tensor([scale_value], device=device)
    amax = torch.tensor([0.25], device=device)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    fmt = "fp8" if conv == "k_scale" else "fp8_e4m3"
    q, k, p = run_or_skip(device, mlafuse.mla_kv_cache, **a, kv_cache=cache, cache_format=fmt,
                          **{conv: scale}, amax_out=amax, error_count=err, return_k_nope=True,
                          return_k_pe=True)
    check_dense(a, d, q, k, p)
    toks, errors = written(a, d)
    assert int(err.item()) == errors == 2
    rows = torch.cat([k, p], dim=1).cpu()
    want = t_fp8_record(rows, np.float32(scale_value).item(), conv)
    assert np.array_equal(want.numpy(), ref.fp8_record(rows.float().numpy(), scale_value,
                                                       "div" if conv == "k_scale" else "mul"))
    check_records(buf.cpu(), {s: want[t] for t, s in toks}, d, f"fp8 {conv}")
    assert bool((want == 0x7E).any() | (want == 0xFE).any()), "the case saturates somewhere"
    amax_want = max(0.25, float(t_nan_amax(rows[[t for t, _ in toks]].reshape(1, -1))))
    assert float(amax.item()) == amax_want


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_fp8_nonfinite_values_and_amax(device):
    """A NaN in a token's kv part makes its k_nope row NaN (bytes 0x7F) and is ignored by
    amax_out; a skipped token's huge rope values do not reach amax_out."""
    a, d = make_case(device, torch.bfloat16, seed=21)
    a["latent"][0, d["Q"] + 3] = float("nan")
    a["latent"][2, -d["R"]:] = 1e4  # token 2: slot -1
    C, R = d["C"], d["R"]
    buf, cache = poisoned_bytes((d["num_blocks"], d["block_size"], C + R), torch.uint8, device)
    amax = torch.zeros(1, device=device)
    k_scale = torch.tensor(0.5, device=device)  # 0-d, as vLLM keeps it
    q, k, p = run_or_skip(device, mlafuse.mla_kv_cache, **a, kv_cache=cache, cache_format="fp8",
                          k_scale=k_scale, amax_out=amax, return_k_nope=True, return_k_pe=True)
    toks, _ = written(a, d)
    rows = torch.cat([k, p], dim=1).cpu()
    want = t_fp8_record(rows, 0.5, "k_scale")
    assert bool((want[0, :C] == 0x7F).all())
    check_records(buf.cpu(), {s: want[t] for t, s in toks}, d, "fp8 nan")
    live = [t for t, _ in toks]
    assert float(amax.item()) == float(t_nan_amax(rows[live].reshape(1, -1)))
    assert float(amax.item()) < 1e3


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["auto", "fp8"])
def test_separate_kpe_cache(device, fmt):
    """FlashInfer / TRT-LLM keep ckv [.., C] and kpe [.., R] apart, each with its own strides."""
    a, d = make_case(device, torch.bfloat16, seed=31)
    C, R, nb, bs = d["C"], d["R"], d["num_blocks"], d["block_size"]
    if fmt == "fp8":
        ckv_buf, ckv = poisoned_bytes((nb, bs, C), torch.float8_e4m3fn, device)
        kpe_buf, kpe = poisoned_bytes((nb, bs, R), torch.float8_e4m3fn, device, pad=16)
        kw = dict(cache_format="fp8", quant_scale=torch.tensor([4.0], device=device))
    else:
        ckv_buf = torch.full((nb, bs, C), -3584.0, dtype=torch.bfloat16, device=device)
        kpe_buf = torch.full((nb, bs, R + 8), -3584.0, dtype=torch.bfloat16, device=device)
        ckv, kpe = ckv_buf, kpe_buf[:, :, :R]
        kw = {}
    q, k, p = run_or_skip(device, mlafuse.mla_kv_cache, **a, kv_cache=ckv, kpe_cache=kpe,
                          return_k_nope=True, return_k_pe=True, **kw)
    toks, _ = written(a, d)
    k, p = k.cpu(), p.cpu()
    if fmt == "fp8":
        wk, wp = t_fp8_record(k, 4.0, "quant_scale"), t_fp8_record(p, 4.0, "quant_scale")
        check_records(ckv_buf.cpu(), {s: wk[t] for t, s in toks}, d, "ckv")
        kb = kpe_buf.cpu()
        assert bool((kb[:, :, R:] == POISON_BYTE).all()), "kpe padding written"
        check_records(kb[:, :, :R].contiguous(), {s: wp[t] for t, s in toks}, d, "kpe")
    else:
        ckv_flat = ckv_buf.cpu().reshape(d["n_slots"], C)
        kpe_flat = kpe_buf.cpu().reshape(d["n_slots"], R + 8)
        named = torch.zeros(d["n_slots"], dtype=torch.bool)
        for t, s in toks:
            assert torch.equal(ckv_flat[s], k[t]) and torch.equal(kpe_flat[s, :R], p[t])
            named[s] = True
        assert bool((ckv_flat[~named] == -3584.0).all() and (kpe_flat[~named] == -3584.0).all())
        assert bool((kpe_flat[:, R:] == -3584.0).all())


# ---- fp8_ds_mla --------------------------------------------------------------------------------
DS_C, DS_R = 512, 64
DS_BYTES = DS_C + DS_C // 32 + 2 * DS_R  # 656


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", [None, "amax", "ue8m0", "ue8m0_floor_scaled"])
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=lambda d: str(d)[6:])
def test_ds_mla(device, mode, cache_dtype):
    """FlashMLA's record, block_size 64; the cache a view of a padded buffer (row stride 672
    bytes). mode None: the default (amax)."""
    a, d = make_case(device, torch.bfloat16, T=13, Q=64, C=DS_C, R=DS_R, block_size=64,
                     seed=41, n_map=11)
    a["latent"][1, d["Q"]:d["Q"] + 128] = 0.0  # token 1: a zero tile (amax 0, floor scale)
    a["latent"][3, d["Q"] + 130] = float("nan")  # token 3: an all-NaN row (scale from amax 0)
    buf, cache = poisoned_bytes((d["num_blocks"], 64, DS_BYTES), cache_dtype, device, pad=16)
    kw = {} if mode is None else {"tile_scale": mode}
    q, k, p = run_or_skip(device, mlafuse.mla_kv_cache, **a, kv_cache=cache,
                          cache_format="fp8_ds_mla", return_k_nope=True, return_k_pe=True, **kw)
    mode = mode or "amax"
    toks, _ = written(a, d)
    k, p = k.cpu(), p.cpu()
    want = t_ds_mla_record(k, p, mode)
    assert want.shape[1] == DS_BYTES
    nref = ref.ds_mla_record(k.float().numpy(), p.view(torch.int16).numpy().view(np.uint16), mode)
    assert np.array_equal(want.numpy(), nref), "the torch and numpy transcriptions differ"
    b = buf.cpu()
    assert bool((b[:, :, DS_BYTES:] == POISON_BYTE).all()), "row padding written"
    check_records(b[:, :, :DS_BYTES].contiguous(), {s: want[t] for t, s in toks}, d, mode)
    # Decoding (docs/kv_formats.md, check 4): fp8 * scale is within half an e4m3 ulp of the dense value.
    for t, s in toks:
        if t == 3:
            continue
        rec = b.reshape(-1, DS_BYTES + 16)[s, :DS_BYTES]
        scales = rec[DS_C:DS_C + 16].contiguous().view(torch.float32).double()
        dec = torch.from_numpy(ref.e4m3_decode(rec[:DS_C].numpy())).reshape(4, 128) * scales[:, None]
        x = k[t].double().reshape(4, 128)
        y = (x / scales[:, None]).abs()
        half_ulp = torch.where(y < 2.0 ** -6, torch.full_like(y, 2.0 ** -10),
                               2.0 ** (torch.floor(torch.log2(y.clamp_min(2.0 ** -6))) - 4))
        # (a relative 1e-6 more: x / s is rounded to f32 before the e4m3 rounding)
        assert bool(((dec - x).abs() <= half_ulp * scales[:, None] * (1 + 1e-6)).all()), t
        assert torch.equal(rec[DS_C + 16:].contiguous().view(torch.bfloat16), p[t])


@needs_torch
def test_ds_mla_layout_offsets():
    """The 656-byte record: e4m3 at [0, 512), four f32 scales at byte 512, rope at byte 528."""
    from mlafuse import _lib as L

    assert L.mlaf_kv_record_bytes(L.KV_FP8_DS_MLA, L.U8, 512, 64) == DS_BYTES == 656
    a, d = make_case("cpu", torch.bfloat16, T=1, Q=0, C=512, R=64, block_size=1)
    a["positions"][:] = 3
    a["slot_mapping"] = torch.tensor([0])
    cache = torch.zeros(1, 1, 656, dtype=torch.uint8)
    _, k, p = mlafuse.mla_kv_cache(**a, kv_cache=cache, cache_format="fp8_ds_mla",
                                   tile_scale="ue8m0", return_k_nope=True, return_k_pe=True)
    rec = cache[0, 0]
    scales = rec[512:528].view(torch.float32)
    for i in range(4):
        amax = k[0, 128 * i:128 * (i + 1)].float().abs().max()
        assert float(scales[i]) >= float(amax) / 448 and float(scales[i]) < 2 * float(amax) / 448
        assert float(torch.log2(scales[i])).is_integer()
    assert torch.equal(rec[528:656].view(torch.bfloat16), p[0])


# ---- slot_mapping shorter than the latent; the plain format ------------------------------------
@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_plain_short_slot_mapping(device):
    """N < T: rows past N write no cache row (not counted), while q and every dense output
    are written; the call is the plain one of before (no format arguments)."""
    a, d = make_case(device, torch.bfloat16, seed=51, n_map=9)
    C, R = d["C"], d["R"]
    cache = torch.full((d["num_blocks"], d["block_size"], C + R), -3584.0, dtype=torch.bfloat16,
                       device=device)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    q, k, p = mlafuse.mla_kv_cache(**a, kv_cache=cache, error_count=err, return_k_nope=True,
                                   return_k_pe=True)
    check_dense(a, d, q, k, p)
    toks, errors = written(a, d)
    assert int(err.item()) == errors == 2
    flat = cache.cpu().reshape(d["n_slots"], C + R)
    named = torch.zeros(d["n_slots"], dtype=torch.bool)
    for t, s in toks:
        assert torch.equal(flat[s], torch.cat([k[t], p[t]]).cpu())
        named[s] = True
    assert bool((flat[~named] == -3584.0).all())


# ---- errors ------------------------------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    a, d = make_case(device, torch.bfloat16, seed=61)
    C, R, nb, bs = d["C"], d["R"], d["num_blocks"], d["block_size"]
    _, cache = poisoned_bytes((nb, bs, C + R), torch.uint8, device)
    s = torch.ones(1, device=device)
    call = lambda **kw: mlafuse.mla_kv_cache(**a, **kw)  # noqa: E731

    def status(kw, name, text=None):
        with pytest.raises(mlafuse.MlafError) as ei:
            call(**kw)
        assert ei.value.status_name == name, ei.value
        if text is not None:
            assert text in ei.value.message, ei.value.message
        assert bool((cache.view(torch.uint8) == POISON_BYTE).all()), "written on error"

    for fmt in ("fp8_e5m2", "nvfp4_ds_mla", "FP8_E5M2"):
        status(dict(kv_cache=cache, cache_format=fmt, k_scale=s), "MLAF_ERR_UNSUPPORTED",
               repr(fmt))
    for bad in ("fp9", "bf16_ds_mla", ""):
        with pytest.raises(ValueError, match="cache_format"):
            call(kv_cache=cache, cache_format=bad)
    with pytest.raises(ValueError, match="tile_scale"):
        call(kv_cache=cache, cache_format="fp8_ds_mla", tile_scale="max")
    status(dict(kv_cache=cache, cache_format="fp8"), "MLAF_ERR_NULL_POINTER", "k_scale")
    status(dict(kv_cache=cache, cache_format="fp8", k_scale=s, quant_scale=s),
           "MLAF_ERR_INVALID_ARGUMENT", "both")
    status(dict(kv_cache=cache, k_scale=s), "MLAF_ERR_INVALID_ARGUMENT", "k_scale")
    status(dict(kv_cache=cache, cache_format="fp8_ds_mla", amax_out=s),
           "MLAF_ERR_INVALID_ARGUMENT", "amax_out")
    status(dict(kv_cache=cache, cache_format="fp8", k_scale=s, tile_scale="ue8m0"),
           "MLAF_ERR_INVALID_ARGUMENT", "tile_scale")
    # dtypes: a byte cache for the plain format, a bf16 cache for fp8, an f16 scale
    status(dict(kv_cache=cache), "MLAF_ERR_DTYPE", "kv_cache.dtype")
    bf16_cache = torch.zeros(nb, bs, C + R, dtype=torch.bfloat16, device=device)
    status(dict(kv_cache=bf16_cache, cache_format="fp8", k_scale=s), "MLAF_ERR_DTYPE",
           "kv_cache.dtype")
    status(dict(kv_cache=cache, cache_format="fp8", k_scale=s.half()), "MLAF_ERR_DTYPE",
           "scale.dtype")
    status(dict(kv_cache=cache, cache_format="fp8", k_scale=torch.ones(2, device=device)),
           "MLAF_ERR_SHAPE", "scale")
    status(dict(kv_cache=cache.view(torch.int8), cache_format="fp8", k_scale=s),
           "MLAF_ERR_DTYPE", "kv_cache.dtype = torch.int8")
    status(dict(kv_cache=cache, cache_format="fp8", k_scale=s,
                kpe_cache=torch.zeros(nb, bs, R, dtype=torch.float8_e4m3fn, device=device)),
           "MLAF_ERR_SHAPE")  # kv_cache is C + R wide while kpe is given
    # fp8_ds_mla: needs a bf16 latent, C % 128 == 0, the record width
    status(dict(kv_cache=cache, cache_format="fp8_ds_mla"), "MLAF_ERR_SHAPE", "kv_cache.shape[2]")
    h = dict(a, latent=a["latent"].half(), w_kv=a["w_kv"].half())
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.mla_kv_cache(**h, kv_cache=cache, cache_format="fp8_ds_mla")
    assert ei.value.status_name == "MLAF_ERR_DTYPE" and "bf16" in ei.value.message
    with pytest.raises(TypeError, match="k_scale"):
        call(kv_cache=cache, cache_format="fp8", k_scale=0.5)  # a number, not a tensor
    with pytest.raises(TypeError):
        call(kv_cache=cache, cache_format="fp8", k_scale=np.ones(1, np.float32))
    if device == "cuda":
        status(dict(kv_cache=cache, cache_format="fp8", k_scale=torch.ones(1)),
               "MLAF_ERR_INVALID_ARGUMENT", "scale is on cpu")


@needs_torch
def test_raw_op_enum_arguments():
    """torch.ops.mlafuse.mla_kv_cache with bad enum numbers: named by the library, or by the
    binding when the number does not fit an int32 (it would wrap into a valid one)."""
    a, d = make_case("cpu", torch.bfloat16, seed=71)
    _, cache = poisoned_bytes((d["num_blocks"], d["block_size"], d["C"] + d["R"]),
                              torch.uint8, "cpu")
    args = (a["latent"], a["w_q"], a["w_kv"], a["positions"], a["cos_sin"], a["slot_mapping"],
            cache, None, d["Q"], d["C"], d["R"], 1e-5, 1e-5, 0, False, False)
    s = torch.ones(1)
    for fmt, conv, tile, text in ((7, 0, 0, "cache.format = 7"), (2 ** 32 + 1, 0, 0, "cache_format"),
                                  (1, 5, 0, "cache.conv = 5"), (1, -2 ** 40, 0, "fp8_conv")):
        with pytest.raises(RuntimeError) as ei:
            torch.ops.mlafuse.mla_kv_cache(*args, fmt, s, conv, None, tile, None)
        e = mlafuse.ops._torch_error(ei.value)
        assert isinstance(e, mlafuse.MlafError) and e.status_name == "MLAF_ERR_INVALID_ARGUMENT"
        assert text in e.message, e.message
    a2, d2 = make_case("cpu", torch.bfloat16, T=2, Q=0, C=DS_C, R=DS_R, block_size=16)
    with pytest.raises(RuntimeError, match="cache.tile_scale = 3"):
        torch.ops.mlafuse.mla_kv_cache(
            a2["latent"], None, a2["w_kv"], a2["positions"], a2["cos_sin"], a2["slot_mapping"],
            torch.zeros(d2["num_blocks"], 16, DS_BYTES, dtype=torch.uint8), None, 0, DS_C, DS_R,
            1e-5, 1e-5, 0, False, False, 2, None, 0, None, 3, None)


# ---- opcheck, torch.compile ----------------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_formats(device):
    """Schema mutation annotations (the cache, kpe_cache, amax_out), fake implementations and
    AOT dispatch with the format arguments given."""
    ops = torch.ops.mlafuse
    # no counted tokens: their k_pe rows are left unwritten, which opcheck would see as
    # outputs that differ between runs
    a, d = make_case(device, torch.bfloat16, T=9, Q=32, C=128, R=32, seed=81, special=False)
    C, R, nb, bs = d["C"], d["R"], d["num_blocks"], d["block_size"]
    lat = a["latent"]
    base = (lat, a["w_q"], a["w_kv"], a["positions"], a["cos_sin"], a["slot_mapping"])
    P = (d["Q"], C, R, 1e-5, 1e-5, 0)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    scale = torch.tensor([0.05], device=device)
    amax = torch.zeros(1, device=device)
    u8 = torch.zeros(nb, bs, C + R, dtype=torch.uint8, device=device)
    e4 = torch.zeros(nb, bs, C, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    kpe = torch.zeros(nb, bs, R, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    a2, d2 = make_case(device, torch.bfloat16, T=9, Q=0, C=DS_C, R=DS_R, seed=82, n_map=7,
                       special=False)
    ds = torch.zeros(d2["num_blocks"], d2["block_size"], DS_BYTES, dtype=torch.uint8,
                     device=device)
    qo = torch.empty(9, 32, dtype=lat.dtype, device=device)
    cases = [
        (ops.mla_kv_cache, base + (u8, err) + P + (True, True, 1, scale, 0, amax, 0, None)),
        (ops.mla_kv_cache, base + (e4, None) + P + (False, True, 1, scale, 1, None, 0, kpe)),
        (ops.mla_kv_cache_out, base + (u8, err, qo, None, None) + P + (1, scale, 1, amax, 0, None)),
        (ops.mla_kv_cache, (a2["latent"], None, a2["w_kv"], a2["positions"], a2["cos_sin"],
                            a2["slot_mapping"], ds, None, 0, DS_C, DS_R, 1e-5, 1e-5, 0, True,
                            False, 2, None, 0, None, 1, None)),
    ]
    every = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic")
    for op, args in cases:
        run_or_skip(device, op, *args)  # a CUDA backend without the format skips here
        # torch's schema checker compares tensors with arithmetic that float8 tensors lack;
        # the uint8 cases cover the schema
        fp8 = any(isinstance(x, torch.Tensor) and x.dtype == torch.float8_e4m3fn for x in args)
        torch.library.opcheck(op, args, test_utils=every[1:] if fp8 else every)


def _fp8_step(latent, w_q, w_kv, positions, cos_sin, slots, caches, layer, k_scale, amax):
    kv_cache = caches[layer]  # a view of the per-layer buffer, as engines keep it
    q, _, _ = mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slots, kv_cache,
                                   cache_format="fp8", k_scale=k_scale, amax_out=amax)
    rec = kv_cache.view(torch.uint8).view(-1, kv_cache.shape[-1])[slots.clamp(min=0)]
    return q, rec.float().sum()


def _fp8_step_args(device, seed, scale=0.1):
    g = torch.Generator().manual_seed(seed)
    T, Q, C, R = 5, 32, 64, 16
    return dict(latent=torch.randn(T, Q + C + R, generator=g).to(device, torch.bfloat16),
                w_q=torch.ones(Q, device=device),
                w_kv=torch.ones(C, device=device, dtype=torch.bfloat16),
                positions=torch.randint(0, 64, (T,), generator=g).to(device),
                cos_sin=mlafuse.rope_table(64, R, device=device),
                slots=torch.randperm(64, generator=g)[:T].to(device),
                caches=torch.zeros(3, 4, 16, C + R, dtype=torch.uint8, device=device).view(
                    torch.float8_e4m3fn),
                layer=1, k_scale=torch.tensor([scale], device=device),
                amax=torch.zeros(1, device=device))


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fp8(device):
    """torch.compile(fullgraph) of a step writing an fp8 cache: one graph, the cache, amax_out
    written in place (no copies in the generated code), eager's bytes; a new scale value is
    data, not a recompile."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_fp8_step, fullgraph=True)
    a, b = _fp8_step_args(device, 1), _fp8_step_args(device, 1)
    want = run_or_skip(device, _fp8_step, **a)
    got, codes = run_and_get_code(compiled, **b)
    code = "\n".join(codes)
    assert "torch.ops.mlafuse.mla_kv_cache_lean.default(" in code  # ranks from the shapes
    for bad in (".copy_(", "aten.copy", "clone", "auto_functionalized", ".item()"):
        assert bad not in code, f"{bad} in the compiled code:\n{code}"
    for x, y in zip(want, got):
        assert torch.equal(x, y)
    assert torch.equal(a["caches"].view(torch.uint8), b["caches"].view(torch.uint8))
    assert torch.equal(a["amax"], b["amax"]) and float(a["amax"]) > 0
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, scale in ((2, 0.01), (3, 3.0)):
            c, e = _fp8_step_args(device, seed, scale), _fp8_step_args(device, seed, scale)
            for x, y in zip(_fp8_step(**c), compiled(**e)):
                assert torch.equal(x, y)
            assert torch.equal(c["caches"].view(torch.uint8), e["caches"].view(torch.uint8))
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


# ---- CUDA graphs -------------------------------------------------------------------------------
@cuda_only
@pytest.mark.parametrize("conv", ["k_scale", "quant_scale"])
def test_cuda_graph_fp8_scale_changes_between_replays(conv):
    """A captured call reads the scale from device memory at replay: writing a new value into
    the scale tensor changes the bytes the next replay stores, with no re-capture."""
    a, d = make_case("cuda", torch.bfloat16, seed=91)
    C, R = d["C"], d["R"]
    buf, cache = poisoned_bytes((d["num_blocks"], d["block_size"], C + R), torch.uint8, "cuda")
    scale = torch.tensor([0.5], device="cuda")
    amax = torch.zeros(1, device="cuda")
    kw = dict(kv_cache=cache, cache_format="fp8", amax_out=amax, return_k_nope=True,
              return_k_pe=True, **{conv: scale})
    run_or_skip("cuda", mlafuse.mla_kv_cache, **a, **kw)  # warm-up (contexts, lazy loading)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q, k, p = mlafuse.mla_kv_cache(**a, **kw)
    toks, _ = written(a, d)
    for value in (0.5, 0.03, 8.0):
        scale.fill_(value)
        amax.zero_()
        buf.fill_(POISON_BYTE)
        g.replay()
        torch.cuda.synchronize()
        rows = torch.cat([k, p], dim=1).cpu()
        want = t_fp8_record(rows, value, conv)
        check_records(buf.cpu(), {s: want[t] for t, s in toks}, d, f"replay, scale {value}")
        assert float(amax.item()) == float(t_nan_amax(rows[[t for t, _ in toks]].reshape(1, -1)))


@cuda_only
def test_cuda_graph_ds_mla():
    a, d = make_case("cuda", torch.bfloat16, T=13, Q=0, C=DS_C, R=DS_R, block_size=64, seed=92)
    buf, cache = poisoned_bytes((d["num_blocks"], 64, DS_BYTES), torch.uint8, "cuda")
    kw = dict(kv_cache=cache, cache_format="fp8_ds_mla", tile_scale="ue8m0",
              return_k_nope=True, return_k_pe=True)
    run_or_skip("cuda", mlafuse.mla_kv_cache, **a, **kw)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _, k, p = mlafuse.mla_kv_cache(**a, **kw)
    a["latent"].copy_(torch.randn(a["latent"].shape, generator=torch.Generator().manual_seed(93)))
    buf.fill_(POISON_BYTE)
    g.replay()
    torch.cuda.synchronize()
    toks, _ = written(a, d)
    want = t_ds_mla_record(k.cpu(), p.cpu(), "ue8m0")
    check_records(buf.cpu(), {s: want[t] for t, s in toks}, d, "ds_mla replay")


# ---- numpy arrays (the ctypes path without torch) ----------------------------------------------
def np_case(dtype, T=17, Q=16, C=256, R=32, seed=0, n_map=None):
    rng = np.random.default_rng(seed)
    latent = rng.standard_normal((T, Q + C + R + 8)).astype(dtype)[:, 3:3 + Q + C + R]
    w_q = np.ones(Q, np.float32)
    factor = np.array([TILE_W[(j // 128) % len(TILE_W)] for j in range(C)])
    w_kv = ((1 + 0.1 * rng.standard_normal(C)) * factor).astype(dtype)
    max_pos = 64
    positions = rng.integers(0, max_pos, T).astype(np.int64)
    slots = rng.permutation(2 * T)[:T].astype(np.int32)
    slots[1] = -1
    slots = slots[:n_map or T].copy()
    return latent, w_q, w_kv, positions, mlafuse.rope_table(max_pos, R), slots


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("conv", ["k_scale", "quant_scale"])
@pytest.mark.parametrize("separate_kpe", [False, True])
def test_numpy_fp8(dtype, conv, separate_kpe):
    C, R, T, N = 256, 32, 17, 14
    latent, w_q, w_kv, pos, cs, slots = np_case(np.dtype(dtype), seed=7, n_map=N)
    if separate_kpe:
        cache = np.full((2 * T, 1, C), POISON_BYTE, np.uint8)
        kpe = np.full((2 * T, 1, R), POISON_BYTE, np.uint8)
    else:
        cache, kpe = np.full((2 * T, 1, C + R), POISON_BYTE, np.uint8), None
    value = 0.02 if conv == "k_scale" else 50.0
    amax = np.zeros(1, np.float32)
    q, k, p = mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cs, slots, cache, cache_format="fp8",
                                   **{conv: np.array([value], np.float32)}, amax_out=amax,
                                   kpe_cache=kpe, return_k_nope=True, return_k_pe=True)
    rk, rp = ref.split_qk_norm(latent, w_q, w_kv, 16, C, R, 1e-5, 1e-5)[1:]
    ref.assert_close_ulp(k, rk, dtype, "k_nope")
    rp = ref.rope(rp, pos, cs, "interleaved")
    ref.assert_close_ulp(p, rp, dtype, "k_pe", ref.rope_magnitude(rp, "interleaved"))
    c = "div" if conv == "k_scale" else "mul"
    rows = np.concatenate([k, p], axis=1).astype(np.float32)
    want = ref.fp8_record(rows, value, c)
    got = np.concatenate([cache, kpe], axis=2) if separate_kpe else cache
    named = np.zeros(2 * T, bool)
    for t in range(N):
        if slots[t] >= 0:
            assert np.array_equal(got[slots[t], 0], want[t]), t
            named[slots[t]] = True
    assert np.all(got[~named] == POISON_BYTE)
    live = [t for t in range(N) if slots[t] >= 0]
    assert amax[0] == ref.nan_amax(rows[live].reshape(1, -1))[0]


def test_numpy_ds_mla():
    try:
        import ml_dtypes
    except ImportError:
        pytest.skip("fp8_ds_mla needs a bf16 latent: numpy has bf16 only with ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    latent, _, w_kv, pos, cs, slots = np_case(bf16, Q=0, C=512, R=64, seed=8)
    cache = np.full((34, 1, 656), POISON_BYTE, np.uint8)
    _, k, p = mlafuse.mla_kv_cache(latent, None, w_kv, pos, cs, slots, cache,
                                   cache_format="fp8_ds_mla", tile_scale="ue8m0_floor_scaled",
                                   return_k_nope=True, return_k_pe=True)
    want = ref.ds_mla_record(k.astype(np.float32), p.view(np.uint16), "ue8m0_floor_scaled")
    for t, s in enumerate(slots):
        if s >= 0:
            assert np.array_equal(cache[s, 0], want[t]), t


def test_numpy_errors():
    latent, w_q, w_kv, pos, cs, slots = np_case(np.dtype("float32"), seed=9)
    cache = np.full((34, 1, 288), POISON_BYTE, np.uint8)
    one = np.ones(1, np.float32)
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cs, slots, cache, cache_format="fp8_e5m2",
                             k_scale=one)
    assert ei.value.status_name == "MLAF_ERR_UNSUPPORTED" and "'fp8_e5m2'" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cs, slots, cache, cache_format="fp8")
    assert ei.value.status_name == "MLAF_ERR_NULL_POINTER"
    with pytest.raises(mlafuse.MlafError) as ei:  # f32 latent: not fp8_ds_mla's
        mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cs, slots, cache, cache_format="fp8_ds_mla")
    assert ei.value.status_name in ("MLAF_ERR_DTYPE", "MLAF_ERR_SHAPE")
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cs, slots, cache, cache_format="fp8",
                             k_scale=np.ones(1, np.float64))
    assert ei.value.status_name == "MLAF_ERR_DTYPE"
    with pytest.raises(ValueError):
        mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cs, slots, cache, cache_format="int8")
    assert np.all(cache == POISON_BYTE)
    if torch is not None:
        with pytest.raises(TypeError):
            mlafuse.mla_kv_cache(latent, w_q, w_kv, pos, cs, slots, cache, cache_format="fp8",
                                 k_scale=torch.ones(1))
