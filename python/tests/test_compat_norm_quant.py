"""mlafuse.compat's fused RMSNorm + fp8 1x128 block-quant adapters (vLLM's rms_norm_per_block_quant
and its op, FlashInfer's fused_add_rmsnorm_fp8_block_quant) against references written here in
plain torch / numpy: the residual round(x + residual) bit for bit, the dense y within an ulp of
float64, and every fp8 byte and scale equal to a per-token-group quantize pass with the engine's
scale rule over the dense y (mlafuse's dense op, or FlashInfer's normed_out), in the engine's
scale layout; errors for what mlafuse cannot honour. CPU; CUDA where a GPU and a CUDA build are."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (mlafuse.compat takes torch "
                                            "tensors; the numpy tests still run)")

import mlafuse  # noqa: E402
import mlafuse.compat as compat  # noqa: E402
from test_rms_norm_quant import e4m3  # noqa: E402
from test_torch_rms_norm_quant import DEVICES, check_dense, make, u8  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def group_pass(y, floor):
    """The per-token-group (1x128) quantize pass in torch / numpy: f32 scale = max(amax, floor) /
    448 (IEEE division), bytes e4m3(y / scale) (round to nearest even). Returns (bytes [T, H]
    uint8, scales [T, H / 128] f32)."""
    T, H = y.shape
    yf = y.detach().cpu().float().view(T, H // 128, 128)
    amax = yf.abs().amax(dim=2)
    f32 = torch.float32
    scale = torch.maximum(amax, torch.tensor(floor, dtype=f32)) / torch.tensor(448.0, dtype=f32)
    data = e4m3((yf / scale.unsqueeze(2)).reshape(T, H).numpy())
    return torch.from_numpy(data), scale


def dense(x, w, eps, r):
    """mlafuse's dense op on copies: (y, the written residual)."""
    rc = None if r is None else r.clone()
    y, _, _ = mlafuse.rms_norm_quant(x, w, eps=eps, residual=rc)
    return y, rc


# ---- vLLM ---------------------------------------------------------------------------------------
VLLM_FLOOR = 2.0 ** -9  # max(amax / 448, 1 / (448 * 512)) = max(amax, 2^-9) / 448


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("layout", ["row", "transposed", "tma"])
def test_vllm_rms_norm_per_block_quant(device, dtype, residual, layout):
    T, H = 37, 1024
    x, r, w = make(hash((str(dtype), residual, layout)) % 2 ** 31, T, H, dtype, device, residual)
    x[3, :128] = 1e-5  # one group below the floor
    if r is not None:
        r[3, :128] = 0.0
    r0 = None if r is None else r.clone()
    y, r_want = dense(x, w, 1e-6, r)
    out, s = compat.rms_norm_per_block_quant(
        x, w, 1e-6, torch.float8_e4m3fn, [1, 128], residual=r,
        is_scale_transposed=layout != "row", has_tma_aligned_scales=layout == "tma")
    check_dense(y, x, r0, w, 1e-6, dtype)
    if residual:
        assert torch.equal(r, r_want)
        assert torch.equal(r.cpu(), (x.cpu().float() + r0.cpu().float()).to(dtype))
    assert out.shape == x.shape and out.dtype == torch.float8_e4m3fn
    data, scale = group_pass(y, VLLM_FLOOR)
    assert torch.equal(u8(out).cpu(), data) and torch.equal(s.cpu(), scale)
    assert scale[3, 0] == torch.tensor(1.0, dtype=torch.float32) / (448 * 512)
    ld = {"row": None, "transposed": T, "tma": (T + 3) // 4 * 4}[layout]
    assert s.shape == (T, H // 128) and s.stride() == ((H // 128, 1) if ld is None else (1, ld))


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_leading_dims(device):
    x, r, w = make(4, 12, 256, torch.bfloat16, device, True)
    x3, r3 = x.contiguous().view(3, 4, 256), r.clone().view(3, 4, 256)
    out3, s3 = compat.rms_norm_per_block_quant(x3, w, 1e-5, torch.float8_e4m3fn, [1, 128],
                                               residual=r3)
    out2, s2 = compat.rms_norm_per_block_quant(x, w, 1e-5, torch.float8_e4m3fn, [1, 128],
                                               residual=r)
    assert out3.shape == (3, 4, 256) and s3.shape == (12, 2)
    assert torch.equal(u8(out3).view(12, 256), u8(out2)) and torch.equal(s3, s2)
    assert torch.equal(r3.view(12, 256), r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transposed,tma", [(False, False), (True, False), (True, True)])
def test_vllm_op_addresses_scale_as_the_kernel(device, transposed, tma):
    """The op form writes result and scale in place: scale (t, j) at t * G + j, or j * rows + t
    (rows T or round_up(T, 4)) from the buffer's first element; the rest stays."""
    T, H = 6, 512
    G = H // 128
    x, r, w = make(8, T, H, torch.float16, device, True)
    r0 = r.clone()
    y, r_want = dense(x, w, 1e-6, r)
    rows = (T + 3) // 4 * 4 if tma else T
    buf = torch.full((G * rows + 3,), -7.0, device=device)
    scale = buf[:G * rows]  # any strides: the kernel reads the data pointer only
    result = torch.empty(T, H, dtype=torch.float8_e4m3fn, device=device)
    assert compat.rms_norm_per_block_quant_op(result, x, w, scale, 1e-6, None, r, 128,
                                              transposed, tma) is None
    data, ref = group_pass(y, VLLM_FLOOR)
    assert torch.equal(u8(result).cpu(), data) and torch.equal(r, r_want)
    flat = buf.cpu()
    t, j = torch.meshgrid(torch.arange(T), torch.arange(G), indexing="ij")
    at = j * rows + t if transposed else t * G + j
    assert torch.equal(flat[at], ref)
    written = torch.zeros(buf.numel(), dtype=torch.bool)
    written[at.flatten()] = True
    assert torch.all(flat[~written] == -7.0), "padding rows and the tail untouched"
    with pytest.raises(ValueError, match="cannot hold"):
        compat.rms_norm_per_block_quant_op(result, x, w, buf[:G * T - 1], 1e-6, None, r0, 128,
                                           transposed, tma)


def test_vllm_errors():
    x, w = torch.randn(4, 256), torch.ones(256)
    f8 = torch.float8_e4m3fn
    with pytest.raises(NotImplementedError, match="scale_ub"):
        compat.rms_norm_per_block_quant(x, w, 1e-6, f8, [1, 128], scale_ub=torch.ones(1))
    with pytest.raises(NotImplementedError, match="int8"):
        compat.rms_norm_per_block_quant(x, w, 1e-6, torch.int8, [1, 128])
    with pytest.raises(NotImplementedError, match="group_size 64"):
        compat.rms_norm_per_block_quant(x, w, 1e-6, f8, [1, 64])
    with pytest.raises(ValueError, match="group size 32"):
        compat.rms_norm_per_block_quant(x, w, 1e-6, f8, [1, 32])
    with pytest.raises(ValueError, match="group_size"):
        compat.rms_norm_per_block_quant(x, w, 1e-6, f8, 128)
    with pytest.raises(ValueError, match="residual"):
        compat.rms_norm_per_block_quant(x, w, 1e-6, f8, [1, 128], residual=x.half())
    with pytest.raises(ValueError, match="contiguous"):
        compat.rms_norm_per_block_quant(torch.randn(2, 3, 300)[:, :, :256], w, 1e-6, f8,
                                        [1, 128])
    with pytest.raises(ValueError, match="result.dtype"):
        compat.rms_norm_per_block_quant_op(torch.empty(4, 256), x, w, torch.empty(8), 1e-6,
                                           None, None, 128, False, False)
    with pytest.raises(mlafuse.MlafError, match="multiple of 128"):
        compat.rms_norm_per_block_quant(torch.randn(4, 200), torch.ones(200), 1e-6, f8, [1, 128])
    with pytest.raises(TypeError, match="input is a ndarray"):
        compat.rms_norm_per_block_quant(x.numpy(), w, 1e-6, f8, [1, 128])


# ---- FlashInfer ------------------------------------------------------------------------------
FI_FLOOR = 1e-4


def fi_buffers(M, H, dtype, device, out_dtype=torch.float8_e4m3fn):
    m_pad = (M + 3) // 4 * 4
    return (torch.empty(M, H, dtype=out_dtype, device=device),
            torch.full((H // 128, m_pad), -3.0, device=device),
            torch.empty(M, H, dtype=dtype, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("M", [1, 6, 8])
def test_flashinfer_fused_add_rmsnorm_fp8_block_quant(device, dtype, M):
    H = 2048
    x, r, w = make(M * 7 + len(str(dtype)), M, H, dtype, device, True)
    x[0, 128:256] = 0.0  # a zero block: the amax floor 1e-4
    r[0, 128:256] = 0.0
    x0, r0 = x.clone(), r.clone()
    out, block_scale, normed = fi_buffers(M, H, dtype, device)
    assert compat.fused_add_rmsnorm_fp8_block_quant(out, block_scale, normed, x, r, w,
                                                    1e-6) is None
    assert torch.equal(x, x0), "input is only read"
    assert torch.equal(r.cpu(), (x0.cpu().float() + r0.cpu().float()).to(dtype))
    check_dense(normed, x0, r0, w, 1e-6, dtype)
    data, scale = group_pass(normed, FI_FLOOR)
    assert torch.equal(u8(out).cpu(), data), "out = the re-quantization of normed_out"
    assert torch.equal(block_scale[:, :M].t().cpu(), scale)
    assert block_scale[1, 0] == torch.tensor(1e-4, dtype=torch.float32) / 448
    assert torch.all(block_scale[:, M:] == -3.0), "columns M .. round_up(M, 4) untouched"


@pytest.mark.parametrize("device", DEVICES)
def test_flashinfer_uint8_out_and_enable_pdl(device):
    M, H = 5, 512
    x, r, w = make(2, M, H, torch.bfloat16, device, True)
    ra, rb = r.clone(), r.clone()
    out_a, bs_a, n_a = fi_buffers(M, H, torch.bfloat16, device)
    out_b, bs_b, n_b = fi_buffers(M, H, torch.bfloat16, device, torch.uint8)
    compat.fused_add_rmsnorm_fp8_block_quant(out_a, bs_a, n_a, x, ra, w)
    compat.fused_add_rmsnorm_fp8_block_quant(out_b, bs_b, n_b, x, rb, w, eps=1e-6,
                                             enable_pdl=True)
    assert torch.equal(u8(out_a), out_b) and torch.equal(bs_a, bs_b) and torch.equal(n_a, n_b)
    assert torch.equal(ra, rb)


def test_flashinfer_errors_write_nothing():
    M, H = 4, 256
    x, r, w = make(3, M, H, torch.bfloat16, "cpu", True)
    r0 = r.clone()
    fn = compat.fused_add_rmsnorm_fp8_block_quant
    out, bs, normed = fi_buffers(M, H, torch.bfloat16, "cpu")
    with pytest.raises(NotImplementedError, match="e5m2"):
        fn(torch.empty(M, H, dtype=torch.float8_e5m2), bs, normed, x, r, w)
    with pytest.raises(ValueError, match="multiple of 128"):
        fn(out[:, :200], bs, normed[:, :200], x[:, :200], r[:, :200], w[:200])
    with pytest.raises(ValueError, match="block_scale"):
        fn(out, torch.zeros(2, M + 1), normed, x, r, w)
    with pytest.raises(ValueError, match="normed_out"):
        fn(out, bs, normed.half(), x, r, w)
    with pytest.raises(ValueError, match="row stride"):
        fn(out, bs, torch.empty(M, H + 8, dtype=torch.bfloat16)[:, :H], x, r, w)
    with pytest.raises(mlafuse.MlafError, match="eps"):
        fn(out, bs, normed, x, r, w, 0.0)
    assert torch.equal(r, r0) and torch.all(bs == -3.0), "a rejected call writes nothing"
