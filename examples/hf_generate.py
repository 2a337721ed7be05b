"""Greedy generate and prefill time of Hugging Face transformers models, unpatched vs patched
with mlafuse.integrations.transformers, on one device.

    python examples/hf_generate.py                      # every shape; CUDA when available, else CPU
    python examples/hf_generate.py --device cuda --model deepseek_v3 --tokens 8192

Each model is built from its transformers config class with random (seeded) weights: the real
model's attention and router shapes (GLM-4.7-Flash, DeepSeek-V3, and GLM-5 with its DSA indexer
where transformers has it: q_lora, kv_lora, rope, nope, v, heads, experts, top-k, groups), fewer layers and a smaller hidden / expert width so that it
fits anywhere. For each model:
  1. generate: 20 greedy tokens from a seeded 2 x 8 prompt, unpatched then patched, in float32
     (there the logits agree to ~1e-6, so the tokens must be identical; in bf16 transformers
     rounds each RMSNorm output twice and mlafuse once, which can legitimately flip a near-tie);
  2. prefill: median time of a forward of one batch of --tokens (default 4096 on CUDA, 256 on
     CPU) in --dtype, logits of the last position only, unpatched vs patched, their ratio, and
     how far the patched logits are from the unpatched.
mlafuse replaces only the memory-bound steps (two RMSNorms, RoPE, router top-k); the GEMMs,
attention and transformers' expert loop dominate, so expect a ratio near 1 that grows with the
share of those steps. The last line is a one-line summary; the exit status is 1 when the greedy
tokens differ.
"""
import argparse
import statistics
import sys
import time

import torch
import transformers

from mlafuse.integrations.transformers import patch, unpatch

SHAPES = {
    "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM, dict(
        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, num_attention_heads=32, num_key_value_heads=32, n_routed_experts=256,
        num_experts_per_tok=8, n_group=8, topk_group=4, routed_scaling_factor=2.5,
        norm_topk_prob=True)),
    "glm4_moe_lite": (transformers.Glm4MoeLiteConfig, transformers.Glm4MoeLiteForCausalLM, dict(
        q_lora_rank=768, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=192,
        v_head_dim=256, num_attention_heads=20, num_key_value_heads=20, n_routed_experts=64,
        num_experts_per_tok=4, n_group=1, topk_group=1, routed_scaling_factor=1.8,
        norm_topk_prob=True, rms_norm_eps=1e-5)),
}
if hasattr(transformers, "GlmMoeDsaConfig"):  # GLM-5: MLA + the DSA indexer (transformers' own)
    SHAPES["glm_moe_dsa"] = (transformers.GlmMoeDsaConfig, transformers.GlmMoeDsaForCausalLM, dict(
        q_lora_rank=2048, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=192,
        v_head_dim=256, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=256,
        num_experts_per_tok=8, n_group=1, topk_group=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, rms_norm_eps=1e-5, index_n_heads=32, index_head_dim=128,
        index_topk=2048))
NEW_TOKENS = 20


def build(name, args):
    """The model in float32 on args.device."""
    cfg_cls, model_cls, shape = SHAPES[name]
    cfg = cfg_cls(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                  moe_intermediate_size=args.expert_width, num_hidden_layers=args.layers,
                  first_k_dense_replace=1, n_shared_experts=1,
                  max_position_embeddings=max(4096, args.tokens), **shape)
    cfg._attn_implementation = args.attn
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # routers start at zero: give them real choices, and the bias a role
        for mod in model.modules():
            if type(mod).__name__.endswith("TopkRouter"):
                mod.weight.normal_(0, 0.05)
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.normal_(0, 0.01)
    return model.to(args.device)


def generate(model, prompt):
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              pad_token_id=0)


def time_prefill(model, ids, reps, device):
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    times = []
    with torch.no_grad():
        for i in range(reps + 2):  # two warm-up runs
            sync()
            t0 = time.perf_counter()
            out = model(ids, logits_to_keep=1).logits
            sync()
            if i >= 2:
                times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run(name, args):
    """Prints the checks and timings of one model; returns (tokens identical, speed-up)."""
    model = build(name, args)
    prompt = torch.randint(0, args.vocab, (2, 8),
                           generator=torch.Generator().manual_seed(2)).to(args.device)
    want = generate(model, prompt)
    patch(model)
    got = generate(model, prompt)
    unpatch(model)
    same = torch.equal(got, want)

    model.to(getattr(torch, args.dtype))
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens),
                        generator=torch.Generator().manual_seed(1)).to(args.device)
    base, want = time_prefill(model, ids, args.reps, args.device)
    patch(model)
    fused, got = time_prefill(model, ids, args.reps, args.device)
    unpatch(model)
    base2, _ = time_prefill(model, ids, args.reps, args.device)  # drift check
    diff = float((got.float() - want.float()).abs().max() / want.float().abs().max())

    print(f"== {name}-shaped, {args.layers} layers, hidden {args.hidden}, {args.device}, "
          f"attention {args.attn}")
    print(f"generate: {'identical' if same else 'DIFFER'} (float32, 2 x 8 prompt + {NEW_TOKENS} "
          "greedy tokens, unpatched vs patched)")
    print(f"prefill {args.dtype}, batch {args.batch} x T = {args.tokens} tokens:")
    print(f"  unpatched {base * 1e3:9.2f} ms   (again after unpatch: {base2 * 1e3:.2f} ms)")
    print(f"  patched   {fused * 1e3:9.2f} ms")
    print(f"  speed-up  {base / fused:9.3f}x   last-position logits differ by {diff:.2e} "
          "(relative to their largest magnitude)", flush=True)
    return same, base / fused


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", choices=["all"] + sorted(SHAPES), default="all")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                    help="of the prefill timing (generate runs in float32)")
    ap.add_argument("--tokens", type=int, default=None, help="prefill length T (default: 4096 "
                    "on CUDA, 256 on CPU)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--expert-width", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--attn", default="sdpa", help="transformers attention implementation")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.tokens is None:
        args.tokens = 4096 if args.device.startswith("cuda") else 256

    names = list(SHAPES) if args.model == "all" else [args.model]
    results = {name: run(name, args) for name in names}
    print("hf_generate: " + ", ".join(f"{name} {'identical' if same else 'DIFFER'} {ratio:.2f}x"
                                      for name, (same, ratio) in results.items()))
    return 0 if all(same for same, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
