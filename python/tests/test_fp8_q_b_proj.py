"""examples/fp8_q_b_proj.py, the consumer of mlafuse's quantized q: every source of its Q_SOURCES
(split_qk_norm's quantized q, the default, and rms_norm_quant's) gives the e4m3 q and scales of the
unfused path (dense q_norm, then a per-token-group quantize pass in torch) bit for bit, in each
scale layout, the same block-scaled GEMM gives equal products within the fp8 bound of the dense
product; a source plugs in as one function, and a wrong one is caught. CPU
(dequantize-then-matmul); CUDA (torch._scaled_mm where it runs) skips without a GPU."""
import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the numpy tests still run)")

import mlafuse  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "fp8_q_b_proj.py")
HAS_CUDA = torch.cuda.is_available() and mlafuse.backend_available("cuda")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device visible to torch, or a CPU-only mlafuse"))]


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("fp8_q_b_proj", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model,tokens", [("glm-4.7-flash", 1), ("glm-4.7-flash", 37),
                                          ("deepseek-v3", 5)])
def test_fused_q_equals_unfused_and_feeds_the_gemm(ex, device, model, tokens):
    res = ex.run(device, tokens, model, seed=tokens, quiet=True)
    assert set(res) == set(ex.Q_SOURCES) >= {"split_qk_norm", "rms_norm_quant"}
    assert next(iter(ex.Q_SOURCES)) == "split_qk_norm", "the default source comes first"
    for name, (inputs_equal, products_equal, within) in res.items():
        assert inputs_equal, f"{name}: e4m3 q / scales differ from the unfused path"
        assert products_equal and within, name


@pytest.mark.parametrize("source", ["split_qk_norm", "rms_norm_quant"])
@pytest.mark.parametrize("fmt", ["fp8_1x128", "fp8_1x128_cm", "fp8_1x128_mn"])
def test_each_scale_layout(ex, source, fmt):
    """The fused q in the layouts block-scaled GEMMs take, against the unfused pass's copy."""
    g = torch.Generator().manual_seed(3)
    latent = torch.randn(7, 768 + 512 + 64, generator=g).to(torch.bfloat16)
    w_q, w_kv = torch.rand(768, generator=g) + 0.5, torch.ones(512)
    a0, s0 = ex.q_unfused(latent, w_q, w_kv, 1e-5, fmt)
    a, s = ex.Q_SOURCES[source](latent, w_q, w_kv, 1e-5, fmt)
    assert ex.same_bits(a, a0) and torch.equal(s, s0) and s.stride() == s0.stride()
    assert s.stride() == {"fp8_1x128": (6, 1), "fp8_1x128_cm": (1, 7),
                          "fp8_1x128_mn": (1, 8)}[fmt]


def test_a_source_plugs_in_as_one_function_and_a_wrong_one_is_caught(ex, monkeypatch):
    """A new source (here: the dense y of rms_norm_quant, quantized by the example's pass) is one
    function added to Q_SOURCES; a source whose bytes or scales are off is reported."""
    def from_dense(latent, w_q, w_kv, eps, q_format="fp8_1x128"):
        y, _, _ = mlafuse.rms_norm_quant(latent[:, :w_q.shape[0]], w_q, eps=eps)
        return ex.per_token_group_quant(y, q_format)

    def off_by_one_code(latent, w_q, w_kv, eps, q_format="fp8_1x128"):
        q, s = ex.q_from_rms_norm_quant(latent, w_q, w_kv, eps, q_format)
        u = q.view(torch.uint8).clone()
        u[0, 5] ^= 1
        return u.view(torch.float8_e4m3fn), s

    def half_scales(latent, w_q, w_kv, eps, q_format="fp8_1x128"):
        q, s = ex.q_from_rms_norm_quant(latent, w_q, w_kv, eps, q_format)
        return q, s * 0.5

    monkeypatch.setitem(ex.Q_SOURCES, "dense_then_pass", from_dense)
    monkeypatch.setitem(ex.Q_SOURCES, "off_by_one_code", off_by_one_code)
    monkeypatch.setitem(ex.Q_SOURCES, "half_scales", half_scales)
    res = ex.run("cpu", 9, "glm-4.7-flash", seed=1, quiet=True)
    assert all(res["dense_then_pass"]) and all(res["rms_norm_quant"]) and all(res["split_qk_norm"])
    assert res["off_by_one_code"][0] is False and res["off_by_one_code"][1] is False
    assert res["half_scales"][:2] == (False, False) and res["half_scales"][2] is False


def test_gemm_choice_on_cpu_and_no_q_lora(ex):
    gemm, fmt = ex.pick_gemm(torch.device("cpu"))
    assert gemm is ex.mm_dequant and fmt == "fp8_1x128"
    with pytest.raises(SystemExit, match="no q LoRA"):
        ex.run("cpu", 2, "deepseek-v2-lite", quiet=True)


def test_script_runs():
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(mlafuse.__file__))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + ([env["PYTHONPATH"]] if
                                                      env.get("PYTHONPATH") else []))
    p = subprocess.run([sys.executable, EXAMPLE, "--tokens", "5"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "split_qk_norm    e4m3 q and scales = unfused: True" in out
    assert "rms_norm_quant   e4m3 q and scales = unfused: True" in out
    assert out.index("split_qk_norm    e4m3") < out.index("rms_norm_quant   e4m3"), "default first"
