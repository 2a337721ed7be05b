"""mlafuse.integrations.transformers on the hybrid MLA models (where the installed transformers
has them): GLM-5.3-Flash (glm5_next: NoPE MLA with the k-pool DSA indexer, KDA layers,
hyper-connection streams, a vision tower) and Kimi-Linear / Kimi-K3 (kimi_linear: MLA whose
rope slot is never rotated, KDA layers), plus a DeepSeek-V4.1-Flash-like deepseek_v4 config
through the routers-only patch. Tiny random seeded 2-layer models from the transformers config
classes, patched vs unpatched, with test_hf_integration's tolerances: f32 logits within
F32_TOL, greedy generate of 20 tokens identical, bf16 logits as BF16_*; the mlafuse ops are
checked to have run (and rope_q not to have); unsupported configs are refused."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the HF integration needs "
                                            "torch and transformers)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import mlafuse  # noqa: E402
import mlafuse.ops  # noqa: E402
from mlafuse.integrations.transformers import (  # noqa: E402
    UnsupportedModelError, is_patched, patch, unpatch)
from test_hf_integration import (  # noqa: E402
    DEVICES, F32_TOL, Counting, assert_bf16_close, assert_f32_and_greedy, rel)

SMALL = dict(vocab_size=160, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             tie_word_embeddings=False, pad_token_id=0)
LINEAR = dict(linear_head_dim=16, linear_num_heads=4)  # the KDA layers (transformers' own)


def _need(*names):
    missing = [n for n in names if not hasattr(transformers, n)]
    if missing:
        pytest.skip(f"transformers {transformers.__version__} has no {missing[0]}")


def _glm5_text(**kw):
    """GLM-5.3-Flash's text config: NoPE MLA (rope width 0), sigmoid router with the score
    correction bias; the indexer pools keys over 4 tokens and keeps index_topk / 4 pools plus
    the unfinished tail, which really masks the attention from 9 tokens on."""
    c = dict(SMALL, **LINEAR, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=0,
             qk_nope_head_dim=24, v_head_dim=24, n_routed_experts=16, num_experts_per_tok=4,
             n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5,
             norm_topk_prob=True, max_position_embeddings=256, index_n_heads=4,
             index_head_dim=32, index_topk=4, index_kpool=4,
             layer_types=["linear_attention", "indexed_attention"],
             mlp_layer_types=["dense", "sparse"], indexer_types=["full", "full"])
    c.update(kw)
    return c


def _glm5(**kw):
    _need("Glm5NextConfig", "Glm5NextForConditionalGeneration")
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
                  projection_intermediate_size=32)
    cfg = transformers.Glm5NextConfig(text_config=_glm5_text(**kw), vision_config=vision)
    return cfg, transformers.Glm5NextForConditionalGeneration


def _kimi(**kw):
    _need("KimiLinearConfig", "KimiLinearForCausalLM")
    c = dict(SMALL, **LINEAR, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=16,
             qk_nope_head_dim=16, v_head_dim=24, num_experts=16, num_experts_per_token=4,
             num_shared_experts=1, routed_scaling_factor=2.446, moe_renormalize=True,
             model_max_length=256, bos_token_id=1, eos_token_id=2, mla_use_nope=True,
             moe_router_activation_func="sigmoid",
             layer_types=["linear_attention", "full_attention"],
             mlp_layer_types=["dense", "sparse"])
    c.update(kw)
    return transformers.KimiLinearConfig(**c), transformers.KimiLinearForCausalLM


MODELS = {
    "glm5_next": lambda: _glm5(),
    "glm5_next_shared_topk": lambda: _glm5(layer_types=["indexed_attention"] * 2,
                                           indexer_types=["full", "shared"],
                                           mlp_layer_types=["sparse", "sparse"]),
    # bf16 (see test_hf_integration): a selection every key passes, so a near-tie pool pick
    # flipped by bf16 rounding of the indexer's inputs does not swamp the MLA arithmetic
    "glm5_next_all_keys": lambda: _glm5(index_topk=32),
    "kimi_linear": lambda: _kimi(),
    "kimi_linear_q_lora_grouped": lambda: _kimi(
        q_lora_rank=48, num_expert_group=4, topk_group=2,
        layer_types=["full_attention", "linear_attention"], mlp_layer_types=["sparse", "sparse"]),
}


def text_config(model):
    return getattr(model.config, "text_config", None) or model.config


def build(name, device, dtype=torch.float32, seed=0):
    cfg, cls = MODELS[name]()
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # routers start at zero: give them real choices, and the bias a role
        for mod in model.modules():
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.normal_(0, 0.02)
            if type(mod).__name__.endswith("TopkRouter"):
                mod.weight.normal_(0, 0.3)
            # norm weights of 1 would hide transformers' second rounding (after the weight)
            for norm in (getattr(mod, "q_a_layernorm", None), getattr(mod, "kv_a_layernorm", None)):
                if norm is not None:
                    norm.weight.copy_(torch.rand(norm.weight.shape, generator=g) + 0.5)
    return model.to(device=device, dtype=dtype)


def expected_calls(model):
    """One split_qk_norm per MLA layer, no rope_q, one moe_gate per MoE layer."""
    c = text_config(model)
    mla = sum(t in ("indexed_attention", "full_attention") for t in c.layer_types)
    return {"split_qk_norm": mla, "rope_q": 0,
            "moe_gate": sum(t == "sparse" for t in c.mlp_layer_types)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(MODELS))
def test_f32_logits_and_greedy_generate(name, device, monkeypatch):
    model = build(name, device)
    assert_f32_and_greedy(name, model, device, monkeypatch, expected_calls(model))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["glm5_next_all_keys", "kimi_linear",
                                  "kimi_linear_q_lora_grouped"])
def test_bf16_logits(name, device, monkeypatch):
    model = build(name, device, torch.bfloat16)
    ids = torch.randint(0, 160, (3, 17), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        want = model(ids).logits
        count = Counting(monkeypatch)
        patch(model)
        got = model(ids).logits
    assert count.calls == expected_calls(model)
    assert_bf16_close(name, got, want)


@pytest.mark.parametrize("name", ["glm5_next", "kimi_linear_q_lora_grouped"])
def test_bf16_router_alone_is_bit_identical(name, monkeypatch):
    model = build(name, "cpu", torch.bfloat16)
    ids = torch.randint(0, 160, (2, 13), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids).logits
        count = Counting(monkeypatch)
        patch(model, attention=False)
        got = model(ids).logits
    assert count.calls == dict(expected_calls(model), split_qk_norm=0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name,eps", [("glm5_next_shared_topk", 1e-5),
                                      ("kimi_linear_q_lora_grouped", 1e-6)])
def test_latent_norm_eps_is_the_modules(name, eps, monkeypatch):
    """split_qk_norm gets each norm module's own eps: GLM-5.3 builds its latent norms with the
    config's rms_norm_eps (1e-5), transformers' Kimi-Linear without it (its RMSNorm's 1e-6)."""
    model = build(name, "cpu")
    assert text_config(model).rms_norm_eps == 1e-5
    seen = []
    real = mlafuse.ops.split_qk_norm

    def recording(*a, **k):
        seen.append((k["eps_q"], k["eps_kv"]))
        return real(*a, **k)
    monkeypatch.setattr(mlafuse.ops, "split_qk_norm", recording)
    with torch.no_grad():
        patch(model)
        model(torch.randint(0, 160, (1, 5), generator=torch.Generator().manual_seed(8)))
    assert seen == [(eps, eps)] * expected_calls(model)["split_qk_norm"]


@pytest.mark.parametrize("name", ["glm5_next", "kimi_linear"])
def test_nope_cache_passes_between_patched_and_unpatched(name):
    """Nothing is rotated, so the cache holds transformers' own layout: a prefill while patched
    continued unpatched gives the unpatched logits."""
    model = build(name, "cpu")
    ids = torch.randint(0, 160, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = model(ids).logits[:, -3:]
        patch(model)
        out = model(ids[:, :9], use_cache=True)
        unpatch(model)
        got = model(ids[:, 9:], cache=out.cache).logits
    assert rel(got, want) <= F32_TOL, f"{name}: logits differ by {rel(got, want):.2e}"


def test_glm5_text_model_alone(monkeypatch):
    """The language model on its own (model_type glm5_next_text), two DSA layers sharing one
    top-k: last hidden states as unpatched."""
    _need("Glm5NextTextConfig", "Glm5NextTextModel")
    cfg = transformers.Glm5NextTextConfig(**_glm5_text(
        layer_types=["indexed_attention"] * 2, indexer_types=["full", "shared"],
        mlp_layer_types=["sparse", "dense"]))
    torch.manual_seed(0)
    model = transformers.Glm5NextTextModel(cfg).eval()
    ids = torch.randint(0, 160, (2, 15), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(ids).last_hidden_state
        count = Counting(monkeypatch)
        patch(model)
        got = model(ids).last_hidden_state
    assert count.calls == {"split_qk_norm": 2, "rope_q": 0, "moe_gate": 1}
    assert rel(got, want) <= F32_TOL, f"glm5_next_text: differs by {rel(got, want):.2e}"


KIMI_REFUSED = {"kimi_rotated_rope": ({"mla_use_nope": False}, "mla_use_nope"),
                "kimi_output_gate": ({"mla_use_output_gate": True}, "mla_use_output_gate"),
                "kimi_softmax_router": ({"moe_router_activation_func": "softmax"},
                                        "moe_router_activation_func")}


@pytest.mark.parametrize("kind", list(KIMI_REFUSED) + ["glm5_quantized_projection",
                                                       "glm5_other_indexer", "v4_gate_temp"])
def test_refused_configs(kind):
    if kind in KIMI_REFUSED:
        kw, match = KIMI_REFUSED[kind]
        cfg, cls = _kimi(**kw)
        model = cls(cfg)
    elif kind == "v4_gate_temp":
        _need("DeepseekV4Config")

        class Stub(torch.nn.Module):  # refused on the config, before any module is looked at
            config = transformers.DeepseekV4Config(gate_temp=2.0)
        model, match = Stub(), "gate_temp"
    else:
        cfg, cls = _glm5(layer_types=["indexed_attention"] * 2)
        model = cls(cfg)
        attn = model.model.language_model.layers[1].self_attn
        if kind == "glm5_quantized_projection":
            class FakeFp8Linear(torch.nn.Linear):
                pass
            attn.kv_a_proj_with_mqa = FakeFp8Linear(64, 32, bias=False)
            match = "FakeFp8Linear"
        else:
            class OtherIndexer(torch.nn.Module):
                def forward(self, hidden_states, q_residual, cache):
                    raise AssertionError("not called")
            attn.indexer = OtherIndexer()
            match = "indexer takes no"
    with pytest.raises(UnsupportedModelError, match=match):
        patch(model, attention=kind != "v4_gate_temp")
    assert not is_patched(model)
    assert not any("forward" in vars(m) for m in model.modules())


def _v4_1_flash_like(device, dtype=torch.float32):
    """DeepSeek-V4.1-Flash's text config on a tiny model: q_lora 1280, 384 experts top-6,
    sqrt-softplus, rms_norm_eps 1e-20, gate_temp 1, no hash layers (num_hash_layers 0:
    transformers' default is 3 hash-routed layers)."""
    _need("DeepseekV4Config", "DeepseekV4ForCausalLM")
    cfg = transformers.AutoConfig.for_model(
        "deepseek_v4", vocab_size=160, hidden_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, head_dim=32, q_lora_rank=1280, o_groups=2,
        o_lora_rank=16, n_routed_experts=384, num_experts_per_tok=6,
        scoring_func="sqrtsoftplus", num_hash_layers=0, routed_scaling_factor=1.5,
        rms_norm_eps=1e-20, gate_temp=1.0,
        layer_types=["sliding_attention", "sliding_attention"], max_position_embeddings=256,
        tie_word_embeddings=False)
    assert cfg.model_type == "deepseek_v4" and cfg.mlp_layer_types == ["moe", "moe"]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for mod in model.modules():
            if type(mod).__name__ == "DeepseekV4TopKRouter":
                mod.weight.normal_(0, 0.3)
                mod.e_score_correction_bias.normal_(0, 0.02)
    return model.to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_v4_1_flash_like_routers(device, monkeypatch):
    model = _v4_1_flash_like(device)
    assert not any(type(m).__name__ == "DeepseekV4HashRouter" for m in model.modules())
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
        count = Counting(monkeypatch)
        monkeypatch.setattr(mlafuse.ops, "moe_gate_hash", counted)
        patch(model, attention=False)
        got = model(ids).logits
        assert count.calls == {"split_qk_norm": 0, "rope_q": 0, "moe_gate": 2}
        assert hashed["n"] == 0
        gen_got = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert rel(got, want) <= F32_TOL, f"deepseek_v4: logits differ by {rel(got, want):.2e}"
    assert torch.equal(gen_got, gen_want), "deepseek_v4: greedy tokens differ"


def test_v4_1_flash_like_routers_bf16():
    """bf16, routers only: transformers scores and renormalizes in bf16, moe_gate in f32 from the
    same bf16 logits (weights rounded once at the end), so the expert weights differ by up to a
    bf16 ulp; within the BF16_* tolerances."""
    model = _v4_1_flash_like("cpu", torch.bfloat16)
    ids = torch.randint(0, 160, (3, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
        patch(model, attention=False)
        got = model(ids).logits
    assert_bf16_close("deepseek_v4 (V4.1-Flash-like)", got, want)
