"""The ctypes mirrors of the C structs: sizes and offsets as a C compiler lays them out on
LP64 (values printed by a small C program with sizeof / offsetof over include/mlafuse.h)."""
import ctypes

import pytest

from mlafuse import _lib as L

EXPECTED = {
    L.Tensor: (80, {"data": 0, "dtype": 8, "ndim": 12, "shape": 16, "stride": 48}),
    L.ModelConfig: (156, {"q_lora_rank": 64, "score_func": 104, "routed_scaling_factor": 120,
                          "rms_norm_eps": 128, "n_shared_experts": 132, "rope_style": 136,
                          "index_n_heads": 140, "index_rope_style": 152}),
    L.SplitQkNormParams: (20, {"eps_q": 12, "eps_kv": 16}),
    L.RopeParams: (8, {"style": 4}),
    L.MlaKvCacheParams: (24, {"eps_kv": 16, "style": 20}),
    L.MoeGateParams: (40, {"score_func": 12, "group_score": 16, "routed_scaling_factor": 24,
                           "eps": 32, "n_shared_experts": 36}),
}


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="offsets pinned for 64-bit")
@pytest.mark.parametrize("struct", list(EXPECTED), ids=lambda s: s.__name__)
def test_struct_layout(struct):
    size, offsets = EXPECTED[struct]
    assert ctypes.sizeof(struct) == size
    for field, off in offsets.items():
        assert getattr(struct, field).offset == off, field


def test_moe_params_from_config_matches_python_mirror():
    import mlafuse

    for p in mlafuse.presets():
        c = L.mlaf_moe_gate_params_from_config(L.mlaf_preset_find(p.name.encode()))
        kw = p.moe_gate_kwargs()
        assert c.top_k == kw["top_k"] and c.n_group == kw["n_group"]
        assert c.topk_group == kw["topk_group"]
        assert c.score_func == {"sigmoid": 0, "softmax": 1}[kw["score_func"]]
        assert c.group_score == {"top2_sum": 0, "max": 1}[kw["group_score"]]
        assert bool(c.renormalize) == kw["renormalize"]
        assert c.routed_scaling_factor == pytest.approx(kw["routed_scaling_factor"], rel=1e-7)
        assert bool(c.apply_routed_scaling) == kw["apply_routed_scaling"]
        assert c.eps == pytest.approx(kw["eps"], rel=1e-7)
        assert c.n_shared_experts == kw["n_shared_experts"]


def test_version_and_backends():
    import mlafuse

    assert mlafuse.version() == mlafuse.__version__
    major, minor, patch = map(int, mlafuse.version().split("."))
    assert mlafuse.version_number() == major * 10000 + minor * 100 + patch
    assert mlafuse.backend_available("cpu")
    assert isinstance(mlafuse.backend_available("cuda"), bool)
    with pytest.raises(ValueError):
        mlafuse.backend_available("tpu")


def test_presets():
    import mlafuse

    ps = mlafuse.presets()
    assert ps[0].name == "glm-4.7-flash"
    glm = ps[0]
    assert (glm.q_lora_rank, glm.kv_lora_rank, glm.qk_rope_head_dim, glm.num_heads) == (
        768, 512, 64, 20)
    assert glm.routed_scaling_factor == 1.8 and glm.rms_norm_eps == 1e-5
    assert mlafuse.find_preset("DeepSeek-R1").name == "deepseek-v3"
    assert mlafuse.find_preset("deepseek-v2-lite").q_lora_rank == 0
    assert mlafuse.find_preset("no-such-model") is None
