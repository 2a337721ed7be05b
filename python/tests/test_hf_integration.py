"""mlafuse.integrations.transformers: tiny random (seeded, 2-layer) DeepSeek-V2 / V3,
GLM-4.7-Flash and (where the installed transformers has them) GLM-5 / DeepSeek-V3.2 DSA models
from the transformers config classes, patched vs unpatched: f32 logits
within 1e-4 relative, greedy generate of 20 tokens identical, bf16 logits as BF16_* below;
the mlafuse ops are checked to have run; unsupported models and configs are refused."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the HF integration needs "
                                            "torch and transformers)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import mlafuse  # noqa: E402
import mlafuse.ops  # noqa: E402
from mlafuse.integrations.transformers import (  # noqa: E402
    UnsupportedModelError, is_patched, patch, unpatch)

HAS_CUDA = torch.cuda.is_available() and mlafuse.backend_available("cuda")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device visible to torch, or a CPU-only mlafuse"))]
# bf16: transformers rounds each RMSNorm output twice and ropes with bf16 cos / sin, mlafuse
# rounds once from f32. The 1-ulp differences in q and k move the logits by 5e-4 to 1e-3 of
# their largest magnitude on average (the routers alone are bit-identical); where they move a
# later layer's router input across a near-tie between two experts, that token's logits
# change by up to ~0.1. So: mean difference <= BF16_MEAN_TOL, max <= BF16_MAX_TOL, and at
# least BF16_ARGMAX_AGREE of the positions keep their argmax.
BF16_MEAN_TOL = 2e-3
BF16_MAX_TOL = 0.2
BF16_ARGMAX_AGREE = 0.9
F32_TOL = 1e-4

SMALL = dict(vocab_size=160, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             max_position_embeddings=256, first_k_dense_replace=1, n_shared_experts=1,
             tie_word_embeddings=False)
MLA = dict(kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24)


def _v3(**kw):
    c = dict(SMALL, **MLA, q_lora_rank=48, n_routed_experts=16, num_experts_per_tok=4,
             n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)
    c.update(kw)
    return transformers.DeepseekV3Config(**c), transformers.DeepseekV3ForCausalLM


def _glm(**kw):
    c = dict(SMALL, **MLA, q_lora_rank=40, n_routed_experts=16, num_experts_per_tok=4,
             n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True,
             rms_norm_eps=1e-5)
    c.update(kw)
    return transformers.Glm4MoeLiteConfig(**c), transformers.Glm4MoeLiteForCausalLM


def _v2(**kw):
    c = dict(SMALL, **MLA, q_lora_rank=None, n_routed_experts=24, num_experts_per_tok=3,
             topk_method="group_limited_greedy", n_group=4, topk_group=2,
             routed_scaling_factor=16.0)
    c.update(kw)
    return transformers.DeepseekV2Config(**c), transformers.DeepseekV2ForCausalLM


def _dsa(kind, **kw):
    """GLM-5 (glm_moe_dsa) or DeepSeek-V3.2 (deepseek_v32): MLA + the DSA indexer, whose top-8
    selection really masks the attention at 11+ tokens."""
    names = {"glm": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM"),
             "v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM")}[kind]
    if not all(hasattr(transformers, n) for n in names):
        pytest.skip(f"transformers {transformers.__version__} has no {names[1]}")
    c = dict(SMALL, **MLA, q_lora_rank=48, n_routed_experts=16, num_experts_per_tok=4,
             n_group=4 if kind == "v32" else 1, topk_group=2 if kind == "v32" else 1,
             routed_scaling_factor=2.5, norm_topk_prob=True, index_n_heads=4,
             index_head_dim=32, index_topk=8)
    c.update(kw)
    return getattr(transformers, names[0])(**c), getattr(transformers, names[1])


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
        "mscale_all_dim": 1.0}
MODELS = {
    "deepseek_v3": lambda: _v3(),
    "deepseek_v3_yarn": lambda: _v3(rope_parameters=dict(YARN)),
    "kimi_k2_like": lambda: _v3(n_group=1, topk_group=1, n_routed_experts=24),
    "glm4_moe_lite": lambda: _glm(),
    "glm4_moe_lite_neox": lambda: _glm(rope_interleave=False),
    "deepseek_v2_lite": lambda: _v2(topk_method="greedy", n_group=None, topk_group=None),
    "deepseek_v2_q_lora": lambda: _v2(q_lora_rank=48),
    "glm5_dsa": lambda: _dsa("glm"),
    "glm5_dsa_shared_topk": lambda: _dsa("glm", indexer_types=["full", "shared"]),
    "deepseek_v32": lambda: _dsa("v32"),
    # bf16: a selection every key passes (index_topk >= the 17 tokens). bf16 rounding of the
    # indexer's inputs flips near-tie top-k picks between the two runs, and one flipped key
    # moves a row's logits far more than the MLA arithmetic does; the f32 tests, where the
    # picks are exact, check the selection (identical greedy tokens).
    "glm5_dsa_all_keys": lambda: _dsa("glm", index_topk=32),
    "deepseek_v32_all_keys": lambda: _dsa("v32", index_topk=32),
}


def build(name, device, dtype=torch.float32, seed=0):
    cfg, cls = MODELS[name]()
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # routers start at zero: give them real choices, and the bias a role
        for mod in model.modules():
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.normal_(0, 0.02)
            if type(mod).__name__.endswith("TopkRouter"):
                mod.weight.normal_(0, 0.3)
    return model.to(device=device, dtype=dtype)


class Counting:
    """Counts calls of the mlafuse ops the integration must use."""

    NAMES = ("split_qk_norm", "rope_q", "moe_gate")

    def __init__(self, monkeypatch):
        self.calls = dict.fromkeys(self.NAMES, 0)
        for n in self.NAMES:
            real = getattr(mlafuse.ops, n)

            def wrapped(*a, _real=real, _n=n, **k):
                self.calls[_n] += 1
                return _real(*a, **k)
            monkeypatch.setattr(mlafuse.ops, n, wrapped)


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def assert_bf16_close(name, got, want):
    """Patched bf16 logits against unpatched: the BF16_* tolerances above."""
    assert got.dtype == torch.bfloat16
    got, want = got.float(), want.float()
    mean = float((got - want).abs().mean() / want.abs().max())
    agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    assert mean <= BF16_MEAN_TOL, f"{name}: bf16 logits differ by {mean:.2e} on average"
    assert rel(got, want) <= BF16_MAX_TOL, f"{name}: bf16 logits differ by {rel(got, want):.2e}"
    assert agree >= BF16_ARGMAX_AGREE, f"{name}: argmax agrees at {agree:.0%} of positions"

def assert_f32_and_greedy(name, model, device, monkeypatch, calls):
    """f32 logits patched vs unpatched within F32_TOL, 20 greedy tokens identical, the mlafuse
    ops called as `calls` says (one forward), and unpatch restoring the model's own logits."""
    ids = torch.randint(0, 160, (2, 11), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        want = model(ids).logits
        gen_want = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
        count = Counting(monkeypatch)
        patch(model)
        assert is_patched(model)
        got = model(ids).logits
        assert count.calls == calls
        gen_got = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
        unpatch(model)
        again = model(ids).logits
    assert rel(got, want) <= F32_TOL, f"{name}: logits differ by {rel(got, want):.2e}"
    assert gen_got.shape == (2, 31)
    assert torch.equal(gen_got, gen_want), f"{name}: greedy tokens differ"
    assert not is_patched(model) and torch.equal(again, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(MODELS))
def test_f32_logits_and_greedy_generate(name, device, monkeypatch):
    model = build(name, device)
    layers = model.config.num_hidden_layers
    assert_f32_and_greedy(name, model, device, monkeypatch,
                          {"split_qk_norm": layers, "rope_q": 2 * layers, "moe_gate": 1})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["deepseek_v3", "glm4_moe_lite", "deepseek_v2_lite",
                                  "glm5_dsa_all_keys", "deepseek_v32_all_keys"])
def test_bf16_logits(name, device):
    model = build(name, device, torch.bfloat16)
    ids = torch.randint(0, 160, (3, 17), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        want = model(ids).logits
        patch(model)
        got = model(ids).logits
    assert_bf16_close(name, got, want)


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2_lite"])
def test_bf16_router_alone_is_bit_identical(name, monkeypatch):
    """The routers take transformers' own f32 logits: patched alone, nothing changes."""
    model = build(name, "cpu", torch.bfloat16)
    ids = torch.randint(0, 160, (2, 13), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids).logits
        count = Counting(monkeypatch)
        patch(model, attention=False)
        got = model(ids).logits
    assert count.calls == {"split_qk_norm": 0, "rope_q": 0, "moe_gate": 1}
    assert torch.equal(got, want)


def test_patch_twice_is_a_noop_and_weights_follow_changes():
    model = build("deepseek_v3", "cpu")
    ids = torch.randint(0, 160, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        patch(patch(model))
        before = model(ids).logits
        attn = model.model.layers[0].self_attn
        attn.kv_a_proj_with_mqa.weight.mul_(1.5)  # the fused q-a / kv-a weight must follow
        got = model(ids).logits
        unpatch(model)
        want = model(ids).logits
    assert not torch.equal(before, got)
    assert rel(got, want) <= F32_TOL


def test_positions_outside_the_table_are_an_error():
    model = build("glm4_moe_lite", "cpu")
    patch(model)
    ids = torch.zeros(1, 3, dtype=torch.long)
    with torch.no_grad(), pytest.raises(ValueError, match="outside the mlafuse RoPE table"):
        model(ids, position_ids=torch.tensor([[10, 11, 300]]))


@pytest.mark.parametrize("kind", ["rope_linear", "v2_norm_topk_prob", "v2_topk_method",
                                  "not_mla", "quantized_projection"])
def test_refused_configs(kind):
    if kind == "quantized_projection":
        cfg, cls = _glm()
        model = cls(cfg)

        class FakeFp8Linear(torch.nn.Linear):
            pass
        attn = model.model.layers[1].self_attn
        attn.kv_a_proj_with_mqa = FakeFp8Linear(64, 48, bias=False)
        with pytest.raises(UnsupportedModelError, match="FakeFp8Linear"):
            patch(model)
        assert not is_patched(model) and "forward" not in vars(model.model.layers[0].self_attn)
        return
    if kind == "rope_linear":
        cfg, cls = _v3(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                        "factor": 2.0})
        match = "rope type 'linear'"
    elif kind == "v2_norm_topk_prob":
        cfg, cls = _v2(norm_topk_prob=True)
        match = "norm_topk_prob"
    elif kind == "v2_topk_method":
        cfg, cls = _v2()
        cfg.topk_method = "noaux_tc"
        match = "topk_method"
    else:
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=2)
        cls = transformers.LlamaForCausalLM
        match = "'llama' is not covered"
    model = cls(cfg)
    with pytest.raises(UnsupportedModelError, match=match):
        patch(model)
    assert not is_patched(model)


@pytest.mark.parametrize("model_type,match", [("deepseek_v4", "attention=False")])
def test_refused_model_types(model_type, match):
    """DeepSeek-V4's attention (transformers 5.x has the model) is not wrapped: patch(model)
    refuses with the reason and the routers-only form."""
    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    cfg = transformers.AutoConfig.for_model(model_type)

    class Stub(torch.nn.Module):  # patch() refuses on the config alone, before any module
        config = cfg
    with pytest.raises(UnsupportedModelError, match=match):
        patch(Stub())


def _v4(device):
    """A tiny DeepSeek-V4: a hash-routed layer, then a sqrt-softplus top-k layer; the hash table
    holds distinct experts per token id, as a checkpoint's does (transformers starts it at 0)."""
    if not hasattr(transformers, "DeepseekV4Config"):
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV4ForCausalLM")
    cfg = transformers.DeepseekV4Config(
        vocab_size=160, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, head_dim=32, q_lora_rank=32, o_groups=2,
        o_lora_rank=16, num_local_experts=16, num_experts_per_tok=4,
        mlp_layer_types=["hash_moe", "moe"],
        layer_types=["sliding_attention", "sliding_attention"], max_position_embeddings=256,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for mod in model.modules():
            name = type(mod).__name__
            if name in ("DeepseekV4TopKRouter", "DeepseekV4HashRouter"):
                mod.weight.normal_(0, 0.3)
            if name == "DeepseekV4HashRouter":
                mod.tid2eid.copy_(torch.stack([torch.randperm(16, generator=g)[:4]
                                               for _ in range(160)]))
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.normal_(0, 0.02)
    return model.to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_v4_routers(device, monkeypatch):
    """DeepSeek-V4, patch(model, attention=False): the sqrt-softplus router through moe_gate,
    the hash router through moe_gate_hash; f32 logits and greedy tokens as unpatched."""
    model = _v4(device)
    ids = torch.randint(0, 160, (2, 11), generator=torch.Generator().manual_seed(1)).to(device)
    hashed = {"n": 0}
    real_hash = mlafuse.ops.moe_gate_hash

    def counted(*a, **k):
        hashed["n"] += 1
        return real_hash(*a, **k)
    with torch.no_grad():
        want = model(ids).logits
        gen_want = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
        with pytest.raises(UnsupportedModelError, match="attention=False"):
            patch(model)
        assert not is_patched(model)
        count = Counting(monkeypatch)
        monkeypatch.setattr(mlafuse.ops, "moe_gate_hash", counted)
        patch(model, attention=False)
        got = model(ids).logits
        assert count.calls == {"split_qk_norm": 0, "rope_q": 0, "moe_gate": 1} and hashed["n"] == 1
        gen_got = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
        unpatch(model)
    assert rel(got, want) <= F32_TOL, f"deepseek_v4: logits differ by {rel(got, want):.2e}"
    assert torch.equal(gen_got, gen_want), "deepseek_v4: greedy tokens differ"
