"""torch tensors: the mlafuse.* functions and the torch.ops.mlafuse custom ops on CPU and CUDA
tensors, against the float64 references; schema / fake-implementation checks (opcheck);
torch.compile(fullgraph=True); on CUDA also a non-default stream, a device other than 0,
and CUDA-graph capture. Skips (with a reason) where torch or a GPU is absent."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (numpy tests still run)")

import mlafuse  # noqa: E402
import reference as ref  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
NO_CUDA = "no CUDA device visible to torch (or MLAFUSE_TEST_ALLOW_NO_CUDA with a CPU-only library)"
POISON = -3584.0

if HAS_CUDA and not mlafuse.backend_available("cuda") and not os.environ.get(
        "MLAFUSE_TEST_ALLOW_NO_CUDA"):
    # A GPU machine must test the CUDA backend: a CPU-only library there is a build mistake.
    raise RuntimeError(f"torch sees a GPU but {mlafuse.library_path} has no CUDA backend "
                       "(set MLAFUSE_TEST_ALLOW_NO_CUDA=1 to test the CPU path only)")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA or not mlafuse.backend_available("cuda"), reason=NO_CUDA))]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
cuda_only = pytest.mark.skipif(not HAS_CUDA or not mlafuse.backend_available("cuda"),
                               reason=NO_CUDA)


def dname(dt):
    return str(dt).replace("torch.", "")


def wide_rows(gen, T, W, dtype, device, pad=(5, 11)):
    lo, hi = pad
    buf = torch.randn(T, lo + W + hi, generator=gen).to(device=device, dtype=dtype)
    return buf[:, lo:lo + W]


def gen(seed):
    return torch.Generator().manual_seed(seed)


def setup_kv(device, dtype, cache_dtype=None, T=19, Q=64, C=96, R=32, block_size=16, seed=0):
    g = gen(seed)
    latent = wide_rows(g, T, Q + C + R, dtype, device)
    w_q = (1 + 0.1 * torch.randn(Q, generator=g)).to(device) if Q else None
    w_kv = (1 + 0.1 * torch.randn(C, generator=g)).to(device=device, dtype=dtype)
    max_pos = 256
    cos_sin = mlafuse.rope_table(max_pos, R, device=device)
    positions = torch.randint(0, max_pos, (T,), generator=g).to(device)
    num_blocks = (2 * T + block_size - 1) // block_size
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T].to(device)
    slots[2] = -1
    cache = torch.full((num_blocks, block_size, C + R), POISON, dtype=cache_dtype or dtype,
                       device=device)
    return dict(latent=latent, w_q=w_q, w_kv=w_kv, positions=positions, cos_sin=cos_sin,
                slot_mapping=slots, kv_cache=cache)


def check_kv(a, q, k_nope, k_pe, style="interleaved", eps_q=1e-5, eps_kv=1e-5):
    lat = a["latent"]
    Q = a["w_q"].shape[0] if a["w_q"] is not None else 0
    C = a["w_kv"].shape[0]
    R = lat.shape[1] - Q - C
    rq, rk, rp = ref.split_qk_norm(lat, a["w_q"], a["w_kv"], Q, C, R, eps_q, eps_kv)
    pos = a["positions"].cpu().numpy()
    rp = ref.rope(rp, pos, a["cos_sin"].cpu(), style)
    mag = ref.rope_magnitude(rp, style)
    dt = ref.dtype_name(lat)
    if Q:
        ref.assert_close_ulp(q, rq, dt, "q")
    if k_nope is not None:
        ref.assert_close_ulp(k_nope, rk, dt, "k_nope")
    if k_pe is not None:
        ref.assert_close_ulp(k_pe, rp, dt, "k_pe", mag)
    cache = a["kv_cache"]
    flat = cache.reshape(-1, C + R).cpu()
    slots = a["slot_mapping"].cpu().numpy()
    live = slots >= 0
    rows = slots[live]
    cdt = ref.dtype_name(cache)
    ref.assert_close_ulp(flat[rows, :C], rk[live], cdt, "cache k_nope")
    ref.assert_close_ulp(flat[rows, C:], rp[live], cdt, "cache k_pe", mag[live])
    rest = np.setdiff1d(np.arange(flat.shape[0]), rows)
    assert bool((flat[rest].float() == POISON).all()), "a cache row not named was written"


# ---- eager, CPU and CUDA -------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("T", [0, 1, 37])
def test_split_qk_norm(device, dtype, T):
    g = gen(T)
    Q, C, R = 768, 512, 64
    latent = wide_rows(g, T, Q + C + R, dtype, device)
    w_q = torch.randn(Q, generator=g).to(device)               # f32 weights
    w_kv = torch.randn(C, generator=g).to(device=device, dtype=dtype)
    q, k, p = mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=1e-5, eps_kv=1e-6)
    assert q.device == latent.device and q.dtype == dtype
    rq, rk, rp = ref.split_qk_norm(latent, w_q, w_kv, Q, C, R, 1e-5, 1e-6)
    ref.assert_close_ulp(q, rq, dname(dtype), "q")
    ref.assert_close_ulp(k, rk, dname(dtype), "k_nope")
    assert torch.equal(p, latent[:, Q + C:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_split_qk_norm_out_and_inplace(device, dtype):
    g = gen(3)
    Q, C, R, T = 32, 64, 16, 11
    latent = wide_rows(g, T, Q + C + R, dtype, device)
    w_q = torch.randn(Q, generator=g).to(device)
    w_kv = torch.randn(C, generator=g).to(device)
    rq, rk, rp = ref.split_qk_norm(latent, w_q, w_kv, Q, C, R, 1e-5, 1e-5)
    qb = torch.full((T, Q + 8), POISON, dtype=dtype, device=device)
    q = qb[:, 4:4 + Q]
    out = mlafuse.split_qk_norm(latent, w_q, w_kv, q=q, return_k_pe=False)
    assert out[0] is q and out[2] is None
    ref.assert_close_ulp(q, rq, dname(dtype), "q given")
    assert bool((qb[:, :4] == POISON).all() and (qb[:, 4 + Q:] == POISON).all())
    ref.assert_close_ulp(out[1], rk, dname(dtype), "k_nope allocated")
    mlafuse.split_qk_norm(latent, w_q, w_kv, inplace=True)
    ref.assert_close_ulp(latent[:, :Q], rq, dname(dtype), "q in place")
    ref.assert_close_ulp(latent[:, Q:Q + C], rk, dname(dtype), "k_nope in place")
    assert np.array_equal(ref.f64(latent[:, Q + C:]), rp)


@pytest.mark.parametrize("device", DEVICES)
def test_ranks_given_or_from_the_shapes(device):
    """Without q_lora_rank / kv_lora_rank / rope_dim the torch path calls the _lean ops (the
    ranks from the shapes, in the op); with them, the ops taking the ranks. Same bytes, and the
    given ranks are checked."""
    a = setup_kv(device, torch.bfloat16, seed=5, Q=32, C=64, R=16)
    b = {k: (v.clone() if k == "kv_cache" else v) for k, v in a.items()}
    ranks = dict(q_lora_rank=32, kv_lora_rank=64, rope_dim=16)
    for form in ({}, dict(out=tuple(torch.empty(19, n, dtype=torch.bfloat16, device=device)
                                    for n in (32, 64, 16)))):
        got = mlafuse.split_qk_norm(a["latent"], a["w_q"], a["w_kv"], **form)
        want = mlafuse.split_qk_norm(a["latent"], a["w_q"], a["w_kv"], **ranks)
        assert all(torch.equal(x, y) for x, y in zip(got, want))
    got = mlafuse.mla_kv_cache(**a, return_k_pe=True)
    want = mlafuse.mla_kv_cache(**b, return_k_pe=True, **ranks)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert got[1] is None and torch.equal(a["kv_cache"], b["kv_cache"])
    with pytest.raises(mlafuse.MlafError, match="rope_dim"):
        mlafuse.split_qk_norm(a["latent"], a["w_q"], a["w_kv"], rope_dim=15)
    assert mlafuse.split_qk_norm(a["latent"], None, torch.ones(96, device=device,
                                                               dtype=torch.bfloat16))[0] is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("style", ["interleaved", "neox"])
def test_mla_kv_cache(device, dtype, style):
    a = setup_kv(device, dtype, torch.bfloat16, seed=4)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    q, k, p = mlafuse.mla_kv_cache(**a, style=style, return_k_nope=True, return_k_pe=True,
                                   error_count=err)
    check_kv(a, q, k, p, style)
    assert int(err.item()) == 0
    # out= form, no q LoRA
    b = setup_kv(device, dtype, Q=0, seed=5)
    kb = torch.empty(b["latent"].shape[0], 96, dtype=dtype, device=device)
    q, k, p = mlafuse.mla_kv_cache(**b, style=style, k_nope=kb)
    assert q is None and k is kb and p is None
    check_kv(b, None, k, None, style)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_rope_q_agrees_with_cache(device, dtype):
    a = setup_kv(device, dtype, dtype, Q=0, seed=6)
    mlafuse.mla_kv_cache(**a)
    T, C = a["latent"].shape[0], 96
    H, nope = 3, 8
    q = torch.zeros(T, H, nope + 32, dtype=dtype, device=device)
    q[:, :, nope:] = a["latent"][:, None, C:]
    mlafuse.rope_q(q, a["positions"], a["cos_sin"])
    slots = a["slot_mapping"]
    live = slots >= 0
    rows = a["kv_cache"].reshape(-1, C + 32)[slots[live], C:]
    for h in range(H):
        assert torch.equal(q[live, h, nope:], rows), "rope_q and mla_kv_cache bits differ"
    assert bool((q[:, :, :nope] == 0).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("preset,E", [("glm-4.7-flash", 64), ("deepseek-v3", 256),
                                      ("deepseek-v2", 160), ("kimi-k2", 384)])
def test_moe_gate(device, dtype, preset, E):
    g = gen(E)
    T = 33
    p = mlafuse.find_preset(preset)
    logits = wide_rows(g, T, E, dtype, device)
    bias = (0.01 * torch.randn(E, generator=g)).to(device) if p.has_score_bias else None
    w, ids, s = mlafuse.moe_gate(logits, bias, config=preset, return_scores=True)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.device == logits.device
    kw = p.moe_gate_kwargs()
    rs, c, rids, _ = ref.moe_gate(logits, bias, kw["top_k"], kw["n_group"], kw["topk_group"],
                                  kw["score_func"], kw["group_score"], kw["renormalize"],
                                  kw["routed_scaling_factor"], kw["apply_routed_scaling"])
    ids_np = ids.cpu().numpy()
    ref.assert_gate_ids(ids_np, c, rids, p.top_k, E)
    rw = ref.gate_weights(rs, ids_np, kw["renormalize"], kw["routed_scaling_factor"],
                          kw["apply_routed_scaling"])
    np.testing.assert_allclose(ref.f64(w), rw, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(ref.f64(s), rs, rtol=1e-5, atol=1e-12)
    # out= form with fused shared experts
    wo = torch.empty(T, p.top_k + 1, device=device)
    io = torch.empty(T, p.top_k + 1, dtype=torch.int32, device=device)
    mlafuse.moe_gate(logits, bias, config=preset, n_shared_experts=1, weights=wo, ids=io)
    assert bool((io[:, -1] == E).all())
    assert torch.equal(io[:, :-1], ids)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("tab_dtype", [torch.int32, torch.int64], ids=dname)
def test_moe_gate_v4_router(device, dtype, tab_dtype):
    """DeepSeek-V4: sqrt_softplus top-k, then hash routing with bad rows and the counter."""
    g = gen(256)
    T, E, k, vocab = 41, 256, 6, 30
    logits = wide_rows(g, T, E, dtype, device) * 4
    bias = (0.05 * torch.randn(E, generator=g)).to(device)
    w, ids, s = mlafuse.moe_gate(logits, bias, config="deepseek-v4-flash", return_scores=True)
    rs, c, rids, _ = ref.moe_gate(logits, bias, k, score_func="sqrt_softplus", scale=1.5)
    ids_np = ids.cpu().numpy()
    ref.assert_gate_ids(ids_np, c, rids, k, E)
    np.testing.assert_allclose(ref.f64(w), ref.gate_weights(rs, ids_np, True, 1.5), rtol=1e-5,
                               atol=1e-12)
    np.testing.assert_allclose(ref.f64(s), rs, rtol=1e-5, atol=1e-12)
    tab = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(vocab)]).to(tab_dtype)
    tab[3, 1] = E
    tab[4, 2] = tab[4, 0]
    tok = torch.randint(0, vocab, (T,), generator=g)
    tok[5] = vocab
    tok[6] = -2
    tab, tok = tab.to(device), tok.to(device)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    w, ids = mlafuse.moe_gate_hash(logits, tab, tok, config="deepseek-v4-flash", error_count=err)
    rs, rids, rw, bad = ref.moe_gate_hash(logits, tab.cpu().numpy(), tok.cpu().numpy(), k,
                                          "sqrt_softplus", True, 1.5)
    assert int(err.item()) == bad and bad >= 2
    assert np.array_equal(ids.cpu().numpy(), rids)
    np.testing.assert_allclose(ref.f64(w), rw, rtol=1e-5, atol=1e-12)
    wo = torch.empty(T, k + 1, device=device)
    io = torch.empty(T, k + 1, dtype=torch.int32, device=device)
    mlafuse.moe_gate_hash(logits, tab, tok, config="deepseek-v4-flash", n_shared_experts=1,
                          weights=wo, ids=io)
    assert bool((io[:, -1] == E).all()) and torch.equal(io[:, :-1], ids)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    latent = torch.zeros(4, 1340, device=device)
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(latent, torch.ones(768, device=device),
                              torch.ones(512, device=device), rope_dim=64)
    assert ei.value.status_name == "MLAF_ERR_SHAPE" and "latent.shape[1] = 1340" in ei.value.message
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(torch.zeros(4, 96, dtype=torch.float64, device=device),
                              torch.ones(32, device=device), torch.ones(32, device=device))
    assert ei.value.status_name == "MLAF_ERR_DTYPE"
    with pytest.raises(mlafuse.MlafError) as ei:  # innermost not contiguous
        mlafuse.split_qk_norm(torch.zeros(4, 192, device=device)[:, ::2],
                              torch.ones(32, device=device), torch.ones(32, device=device))
    assert ei.value.status_name == "MLAF_ERR_STRIDE"
    with pytest.raises(TypeError):
        mlafuse.split_qk_norm(torch.zeros(4, 96, device=device), np.ones(32, np.float32),
                              torch.ones(32, device=device))


@cuda_only
def test_error_mixed_devices():
    with pytest.raises(mlafuse.MlafError) as ei:
        mlafuse.split_qk_norm(torch.zeros(4, 96, device="cuda"), torch.ones(32),
                              torch.ones(32, device="cuda"))
    assert "w_q is on cpu" in ei.value.message


# ---- schema and fake implementations ---------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    """torch.library.opcheck: schema mutation annotations match what the ops write, fake
    implementations match real outputs, and the ops trace under AOT dispatch."""
    ops = torch.ops.mlafuse
    a = setup_kv(device, torch.bfloat16, seed=8, Q=32, C=64, R=16)
    lat, w_q, w_kv = a["latent"], a["w_q"], a["w_kv"]
    T = lat.shape[0]
    err = torch.zeros(1, dtype=torch.int32, device=device)
    kv_args = (lat, w_q, w_kv, a["positions"], a["cos_sin"], a["slot_mapping"], a["kv_cache"],
               err)
    logits = torch.randn(T, 64, device=device)
    bias = torch.randn(64, device=device) * 0.01
    gate_p = (4, 1, 1, 0, 0, True, 1.8, True, 1e-20, 0)
    hash_p = (4, 1, 1, 2, 0, True, 1.5, True, 1e-20, 0)  # sqrt_softplus
    tab = ((torch.arange(10)[:, None] * 3 + torch.arange(4)[None, :]) % 64).to(device)
    tok = (torch.arange(T) % 10).to(device)
    cases = [
        (ops.split_qk_norm, (lat, w_q, w_kv, 32, 64, 16, 1e-5, 1e-5, True)),
        (ops.split_qk_norm_out, (lat, w_q, w_kv, torch.empty(T, 32, dtype=lat.dtype, device=device),
                                 torch.empty(T, 64, dtype=lat.dtype, device=device), None,
                                 32, 64, 16, 1e-5, 1e-5)),
        (ops.split_qk_norm_inplace, (lat.clone(), w_q, w_kv, 32, 64, 16, 1e-5, 1e-5)),
        (ops.split_qk_norm_lean, (lat, w_q, w_kv, 1e-5, 1e-5)),
        (ops.split_qk_norm_lean_out, (lat, w_q, w_kv, torch.empty(T, 32, dtype=lat.dtype,
                                                                  device=device),
                                      torch.empty(T, 64, dtype=lat.dtype, device=device),
                                      torch.empty(T, 16, dtype=lat.dtype, device=device),
                                      1e-5, 1e-5)),
        (ops.mla_kv_cache, kv_args + (32, 64, 16, 1e-5, 1e-5, 0, True, True)),
        (ops.mla_kv_cache_out, kv_args + (torch.empty(T, 32, dtype=lat.dtype, device=device),
                                          None, None, 32, 64, 16, 1e-5, 1e-5, 1)),
        (ops.mla_kv_cache_lean, kv_args + (1e-5, 1e-5, 1, True, False)),
        (ops.mla_kv_cache_lean_out, kv_args + (torch.empty(T, 32, dtype=lat.dtype, device=device),
                                               torch.empty(T, 64, dtype=lat.dtype, device=device),
                                               None, 1e-5, 1e-5, 0)),
        (ops.rope_q, (torch.randn(T, 4, 24, device=device, dtype=torch.bfloat16),
                      a["positions"], a["cos_sin"], 16, 0, err)),
        (ops.moe_gate, (logits, bias) + gate_p + (True, None)),
        (ops.moe_gate_out, (logits, bias, torch.empty(T, 4, device=device),
                            torch.empty(T, 4, dtype=torch.int32, device=device), None) + gate_p),
        (ops.moe_gate_hash, (logits, tab, tok, torch.zeros(1, dtype=torch.int32, device=device))
         + hash_p + (True, None)),
        (ops.moe_gate_hash_out, (logits, tab, tok, torch.empty(T, 4, device=device),
                                 torch.empty(T, 4, dtype=torch.int32, device=device),
                                 torch.empty(T, 64, device=device),
                                 torch.zeros(1, dtype=torch.int32, device=device)) + hash_p),
    ]
    from mlafuse import _torch_ops

    indexer_ops = {"mla_kv_cache_dsa", "mla_kv_cache_dsa_out", "indexer_q", "indexer_q_out"}
    norm_ops = {"rms_norm_quant", "rms_norm_quant_out", "rms_norm_quant_inplace"}
    rowq_ops = {o + s for o in ("split_qk_norm_quant", "mla_kv_cache_quant",
                                "mla_kv_cache_dsa_quant") for s in ("", "_out")}
    norm_ops |= {"gemm_quant", "gemm_quant_out"}  # checked in test_gemm_quant
    assert {op._qualified_op_name.split("::")[1] for op, _ in cases} == set(
        _torch_ops.SCHEMAS) - indexer_ops - norm_ops - rowq_ops, \
        "every op is checked (the indexer's in test_torch_indexer, rms_norm_quant's in " \
        "test_torch_rms_norm_quant, the row ops' quantized forms in test_torch_row_quant)"
    for op, args in cases:
        # all of opcheck's checks: schema, autograd registration, fake tensor, AOT dispatch
        torch.library.opcheck(op, args)


# ---- torch.compile -------------------------------------------------------------------------
def _layer_step(latent, w_q, w_kv, positions, cos_sin, slot_mapping, kv_cache, logits, bias):
    q_lat, _, _ = mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slot_mapping,
                                       kv_cache)
    T = latent.shape[0]
    q = (q_lat.float() @ torch.ones(q_lat.shape[1], 2 * 24, device=latent.device) * 0.01).to(
        latent.dtype).view(T, 2, 24)
    mlafuse.rope_q(q, positions, cos_sin)
    w, ids = mlafuse.moe_gate(logits, bias, config="glm-4.7-flash")
    return q, w, ids


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    a = setup_kv(device, torch.bfloat16, seed=9, Q=32, C=64, R=16)
    T = a["latent"].shape[0]
    logits = torch.randn(T, 64, device=device)
    bias = 0.01 * torch.randn(64, device=device)
    b = {k: (v.clone() if v is not None else None) for k, v in a.items()}
    want = _layer_step(**a, logits=logits, bias=bias)
    torch._dynamo.reset()
    compiled = torch.compile(_layer_step, fullgraph=True)
    got = compiled(**b, logits=logits, bias=bias)
    for x, y in zip(want, got):
        assert torch.equal(x, y)
    assert torch.equal(a["kv_cache"], b["kv_cache"]), "the cache write was lost under compile"


# ---- CUDA specifics ------------------------------------------------------------------------
@cuda_only
def test_cuda_non_default_stream():
    """The op runs on torch's current stream: queued behind a long kernel that fills the
    latent on a side stream, it must see the filled latent."""
    a = setup_kv("cuda", torch.bfloat16, seed=10)
    src = a["latent"].clone()
    latent = torch.zeros_like(src)
    a["latent"] = latent
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        latent.copy_(src)
        q, k, p = mlafuse.mla_kv_cache(**a, return_k_nope=True, return_k_pe=True)
        w, ids = mlafuse.moe_gate(src[:, :64].float(), top_k=4)
    s.synchronize()
    check_kv(a, q, k, p)
    ref_w, ref_ids = mlafuse.moe_gate(src[:, :64].float(), top_k=4)
    assert torch.equal(ids, ref_ids)


@cuda_only
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more GPUs")
def test_cuda_second_device():
    torch.cuda.set_device(0)
    a = setup_kv("cuda:1", torch.bfloat16, seed=11)
    q, k, p = mlafuse.mla_kv_cache(**a, return_k_nope=True, return_k_pe=True)
    assert q.device == torch.device("cuda:1")
    torch.cuda.synchronize(1)
    check_kv(a, q, k, p)
    assert torch.cuda.current_device() == 0, "the call changed the current device"


@cuda_only
def test_cuda_graph_capture():
    a = setup_kv("cuda", torch.bfloat16, seed=12)
    T = a["latent"].shape[0]
    logits = torch.randn(T, 64, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")

    def step():
        q, _, _ = mlafuse.mla_kv_cache(**a, error_count=err)
        qh = q.view(T, 2, 32)
        mlafuse.rope_q(qh, a["positions"], a["cos_sin"])
        w, ids = mlafuse.moe_gate(logits, config="glm-4.7-flash")
        return qh, w, ids

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the capture (contexts, lazy loading)
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    # New inputs into the same buffers, then replay.
    gn = gen(13)
    a["latent"].copy_(torch.randn(a["latent"].shape, generator=gn))
    logits.copy_(torch.randn(logits.shape, generator=gn))
    a["kv_cache"].fill_(POISON)
    g.replay()
    torch.cuda.synchronize()
    cache_after = a["kv_cache"].clone()
    a["kv_cache"].fill_(POISON)
    want = step()
    torch.cuda.synchronize()
    assert torch.equal(cache_after, a["kv_cache"])
    for x, y in zip(out, want):
        assert torch.equal(x, y)
    assert int(err.item()) == 0


def test_set_cuda_pdl_leaves_cpu_calls_alone():
    a = setup_kv("cpu", torch.float32, seed=14)
    want = mlafuse.mla_kv_cache(**a, return_k_nope=True)
    mlafuse.set_cuda_pdl(True)
    try:
        got = mlafuse.mla_kv_cache(**a, return_k_nope=True)
    finally:
        mlafuse.set_cuda_pdl(False)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@cuda_only
def test_cuda_pdl():
    """Programmatic dependent launch: each op reads what the one before wrote (mla_kv_cache's q,
    roped in place, then routed as logits); off, on, and on inside a CUDA graph agree bit for
    bit. Below sm_90 the setting is refused at the next CUDA call."""
    a = setup_kv("cuda", torch.bfloat16, seed=15)
    T = a["latent"].shape[0]
    src = a["latent"].clone()

    def chain():
        a["latent"].copy_(src)
        q, _, _ = mlafuse.mla_kv_cache(**a)
        mlafuse.rope_q(q.view(T, 2, 32), a["positions"], a["cos_sin"])
        w, ids = mlafuse.moe_gate(q, top_k=4)
        return q, w, ids

    off = chain()
    torch.cuda.synchronize()
    if torch.cuda.get_device_capability()[0] < 9:
        mlafuse.set_cuda_pdl(True)
        try:
            with pytest.raises(mlafuse.MlafError, match="sm_90"):
                chain()
        finally:
            mlafuse.set_cuda_pdl(False)
        return
    mlafuse.set_cuda_pdl(True)
    try:
        on = chain()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            chain()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = chain()
        for x in out:
            x.fill_(0)
        g.replay()
        torch.cuda.synchronize()
    finally:
        mlafuse.set_cuda_pdl(False)
    for x, y, z in zip(off, on, out):
        assert torch.equal(x, y) and torch.equal(x, z)
