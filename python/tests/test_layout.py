"""The ctypes mirrors of the C structs: sizes and offsets as a C compiler lays them out on
LP64 (values printed by a small C program with sizeof / offsetof over include/mlafuse.h; where
a C compiler and the repository's header are present, a test compiles that program and
compares every field of every mirrored struct)."""
import ctypes
import os
import shutil
import subprocess

import pytest

from mlafuse import _lib as L

EXPECTED = {
    L.Tensor: (80, {"data": 0, "dtype": 8, "ndim": 12, "shape": 16, "stride": 48}),
    L.ModelConfig: (164, {"q_lora_rank": 64, "score_func": 104, "routed_scaling_factor": 120,
                          "rms_norm_eps": 128, "n_shared_experts": 132, "rope_style": 136,
                          "index_n_heads": 140, "index_rope_style": 152, "kv_rope_tail": 156,
                          "n_hash_layers": 160}),
    L.SplitQkNormParams: (24, {"eps_q": 12, "eps_kv": 16, "kv_rope_tail": 20}),
    L.RopeParams: (16, {"style": 4, "head_norm": 8, "head_norm_eps": 12}),
    L.MlaKvCacheParams: (28, {"eps_kv": 16, "style": 20, "kv_rope_tail": 24}),
    L.MoeGateParams: (40, {"score_func": 12, "group_score": 16, "routed_scaling_factor": 24,
                           "eps": 32, "n_shared_experts": 36}),
    L.KvCacheDesc: (48, {"format": 0, "cache": 8, "kpe": 16, "scale": 24, "amax_out": 32,
                         "conv": 40, "tile_scale": 44}),
    L.IndexerParams: (20, {"style": 0, "hadamard": 4, "ln_eps": 8, "amax_eps": 12, "scale": 16}),
    L.IndexerK: (64, {"index_k": 0, "weight": 8, "bias": 16, "cache": 24, "out": 32, "topk_fill": 40,
                      "copies": 48, "copy_stride": 56}),
    L.GemmOut: (32, {"format": 0, "scale": 4, "data": 8, "scales": 16, "eps": 24}),
    L.RmsNormQuantParams: (4, {"eps": 0}),
}


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="offsets pinned for 64-bit")
@pytest.mark.parametrize("struct", list(EXPECTED), ids=lambda s: s.__name__)
def test_struct_layout(struct):
    size, offsets = EXPECTED[struct]
    assert ctypes.sizeof(struct) == size
    for field, off in offsets.items():
        assert getattr(struct, field).offset == off, field


C_NAMES = {L.Tensor: "mlaf_tensor", L.ModelConfig: "mlaf_model_config",
           L.SplitQkNormParams: "mlaf_split_qk_norm_params", L.RopeParams: "mlaf_rope_params",
           L.RopeScaling: "mlaf_rope_scaling", L.MlaKvCacheParams: "mlaf_mla_kv_cache_params",
           L.KvCacheDesc: "mlaf_kv_cache_desc", L.MoeGateParams: "mlaf_moe_gate_params",
           L.IndexerParams: "mlaf_indexer_params", L.IndexerK: "mlaf_indexer_k", L.GemmOut: "mlaf_gemm_out",
           L.RmsNormQuantParams: "mlaf_rms_norm_quant_params"}
HEADER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "include")
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.skipif(not os.path.exists(os.path.join(HEADER_DIR, "mlafuse.h")),
                    reason="not a source checkout (no include/mlafuse.h)")
def test_struct_layout_matches_the_c_compiler(tmp_path):
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "mlafuse.h"',
             "int main(void) {"]
    want = []
    for struct, cname in C_NAMES.items():
        lines.append(f'    printf("%zu\\n", sizeof({cname}));')
        want.append((cname, "sizeof", ctypes.sizeof(struct)))
        for field, *_ in struct._fields_:
            lines.append(f'    printf("%zu\\n", offsetof({cname}, {field}));')
            want.append((cname, field, getattr(struct, field).offset))
    lines += ["    return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([CC, "-I", HEADER_DIR, str(src), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert len(got) == len(want)
    for (cname, field, value), g in zip(want, got):
        assert int(g) == value, f"{cname}.{field}: C says {g}, the ctypes mirror {value}"


def test_enums_and_names():
    """The enum numbers of the mirror (as in mlafuse.h) agree with the library's own names."""
    names = {L.F32: "f32", L.F16: "f16", L.BF16: "bf16", L.I32: "i32", L.I64: "i64",
             L.U8: "u8", L.FP8_E4M3: "fp8_e4m3"}
    assert (L.U8, L.FP8_E4M3) == (5, 6)
    for code, name in names.items():
        assert L.mlaf_dtype_name(code).decode() == name
    assert L.mlaf_dtype_size(L.U8) == 1 and L.mlaf_dtype_size(L.FP8_E4M3) == 1
    assert (L.KV_PLAIN, L.KV_FP8, L.KV_FP8_DS_MLA, L.KV_FP8_V4) == (0, 1, 2, 3)
    assert (L.FP8_DIV, L.FP8_MUL) == (0, 1)
    assert (L.TILE_AMAX, L.TILE_UE8M0, L.TILE_UE8M0_FLOOR_SCALED) == (0, 1, 2)
    for code, name in ((L.KV_PLAIN, "plain"), (L.KV_FP8, "fp8"), (L.KV_FP8_DS_MLA, "fp8_ds_mla"),
                       (L.KV_FP8_V4, "fp8_v4"), (4, "unknown"), (-1, "unknown")):
        assert L.mlaf_kv_format_name(code).decode() == name


def test_gemm_formats_by_name():
    """The GEMM-input formats and roundings as the library's table names them (docs/gemm_formats.md)."""
    assert L.GEMM_FORMATS == {"none": 0, "fp8_1x128": 1, "fp8_1x128_mn": 2, "fp8_1x128_ue8m0": 3, "mxfp8": 4,
                              "fp8_1x128_cm": 5}
    assert L.GEMM_SCALES == {"f32": 0, "ue8m0": 1, "mx_floor": 2, "mx_ceil": 3}
    assert [L.mlaf_gemm_format_group(f) for f in range(6)] == [0, 128, 128, 128, 32, 128]
    assert L.OP_RMS_NORM_QUANT == 5 and L.mlaf_op_name(5).decode() == "rms_norm_quant"


def test_kv_record_bytes():
    rb = L.mlaf_kv_record_bytes
    assert rb(L.KV_FP8_V4, L.U8, 512, 0) == 584 and rb(L.KV_FP8_V4, L.FP8_E4M3, 512, 0) == 584
    assert rb(L.KV_FP8_V4, L.U8, 512, 64) == 0 and rb(L.KV_FP8_V4, L.BF16, 512, 0) == 0
    assert rb(L.KV_PLAIN, L.BF16, 512, 64) == 1152 and rb(L.KV_PLAIN, L.F32, 512, 64) == 2304
    assert rb(L.KV_FP8, L.U8, 512, 64) == 576 and rb(L.KV_FP8, L.FP8_E4M3, 512, 64) == 576
    assert rb(L.KV_FP8_DS_MLA, L.U8, 512, 64) == 656  # FlashMLA's sparse record
    assert rb(L.KV_FP8_DS_MLA, L.FP8_E4M3, 512, 64) == 656
    assert rb(L.KV_FP8_DS_MLA, L.U8, 96, 64) == 0     # C not a multiple of 128
    assert rb(L.KV_FP8, L.BF16, 512, 64) == 0 and rb(L.KV_PLAIN, L.U8, 512, 64) == 0
    assert rb(3, L.U8, 512, 64) == 0


def test_moe_params_from_config_matches_python_mirror():
    import mlafuse

    for p in mlafuse.presets():
        c = L.mlaf_moe_gate_params_from_config(L.mlaf_preset_find(p.name.encode()))
        kw = p.moe_gate_kwargs()
        assert c.top_k == kw["top_k"] and c.n_group == kw["n_group"]
        assert c.topk_group == kw["topk_group"]
        assert c.score_func == {"sigmoid": 0, "softmax": 1, "sqrt_softplus": 2}[kw["score_func"]]
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
