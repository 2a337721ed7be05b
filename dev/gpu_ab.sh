#!/usr/bin/env bash
# One device call of timings: earlier or variant builds of `mlafuse` against the pack's, interleaved
# so all see the same GPU state; the row-layout sweep; the fp8 cache formats.
#   bash dev/gpu_ab.sh [steps]   steps: ab sweep fp8 v4 dsa v32 peers (default ab sweep fp8)
#   ab     GLM-4.7-Flash and DeepSeek-V3, every op, the pack's build (new) against old;
#   v4     DeepSeek-V4's fp8_v4 rows, T = 1 ... 131072, two rounds of every build;
#   dsa    GLM-5 and DeepSeek-V3.2 with the indexer and fp8_ds_mla (and the unfused chain), two
#          rounds of every build;
#   v32    split_qk_norm and mla_kv_cache at T = 1 ... 512 (graph to 64), DeepSeek-V3.2 and
#          GLM-4.7-Flash, plain and --pdl (step v32pdl in the table), two rounds of every build.
#   peers  the shapes where a peer kernel's figure is the bar (routers T = 1 ... 4096, rope_q,
#          DeepSeek-V3.2 mla_kv_cache graph rows with --pdl), three rounds of every build.
#   gate   the routers of every score function (sigmoid, softmax, sqrt_softplus, hash), f32 and
#          bf16 logits, T = 1 ... 131072 (graph to 64), two rounds of every build.
# The other builds travel in the pack: scripts/gpu-pack takes .gpu-pack/ab/mlafuse-NAME into it as
# tools/mlafuse-NAME; NAME old is the baseline (OLD=path overrides it), any other NAME a variant
# that v4 and dsa time beside it, or only the step STEP when NAME is STEP.VARIANT (v4.minb7).
# Packs every JSON into $OUT/ab.tgz (or /tmp/mlaf-ab) and prints a short table per step last
# (v4, dsa: dev/ab_compare.py, every build's rounds side by side).
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-/tmp/mlaf-ab}; mkdir -p "$FINAL"; DEST=$(mktemp -d)
trap 'tar czf "$FINAL/ab.tgz" -C "$DEST" .' EXIT # one file back, also when cut short
steps=${*:-ab sweep fp8}
# GPU_PREBUILT=DIR: a build directory (DIR/tools/mlafuse) in place of the pack
if [ -n "${GPU_PREBUILT:-}" ]; then P=$GPU_PREBUILT; OLD=${OLD:-.gpu-pack/ab/mlafuse-old}
else P=/tmp/mlaf-prebuilt; rm -rf $P; mkdir -p $P; tar xJf .gpu-pack/pack.tar.xz -C $P; fi
export LD_LIBRARY_PATH=$P/lib
NEW=$P/tools/mlafuse; OLD=${OLD:-$P/tools/mlafuse-old}
variants=; for v in $P/tools/mlafuse-*; do n=${v##*/mlafuse-}; [ "$n" = old ] || variants="$variants $n"; done
builds() { echo new old; for n in $variants; do case $n in *.*) [ "${n%%.*}" = "$1" ] && echo $n ;; *) echo $n ;; esac; done; }
bin() { case $1 in new) echo $NEW ;; old) echo $OLD ;; *) echo $P/tools/mlafuse-$1 ;; esac; }
b() { local out=$1; shift; timeout 150 "$@" --backend cuda --json ${REPS:+--reps $REPS} > "$DEST/$out.json" 2> "$DEST/$out.err" || echo "$out: rc=$?"; }
for s in $steps; do case $s in
  ab) for p in glm-4.7-flash deepseek-v3; do
        b ab-new-$p $NEW bench --op all --preset $p; b ab-old-$p $OLD bench --op all --preset $p
      done ;;
  sweep) for op in split_qk_norm mla_kv_cache; do
        b sweep-$op $NEW bench --op $op --sweep --tokens 4096,32768; done ;;
  fp8) for r in 1 2; do for p in glm-4.7-flash deepseek-v3; do for c in fp8 fp8_ds_mla; do for w in $(builds fp8); do
        b fp8-$w-$c-$p-$r "$(bin $w)" bench --op mla_kv_cache --preset $p --cache $c --tokens 1,64,4096,32768,131072
        done; done; done; done ;;
  gate) for r in 1 2; do for w in $(builds gate); do x="$(bin $w)"
        for p in glm-4.7-flash deepseek-v3 deepseek-v2 kimi-k2 deepseek-v4-flash; do for d in f32 bf16; do
          b gate-$w-$p-$d-$r $x bench --op moe_gate --preset $p --dtype $d --tokens 1,64,1024,4096,32768,131072; done; done
        b gate-$w-hash-f32-$r $x bench --op moe_gate --preset deepseek-v4-flash --dtype f32 --hash --tokens 1,64,4096,131072
      done; done ;;
  v4) for r in 1 2; do for w in $(builds v4); do
        b v4-$w-$r "$(bin $w)" bench --op mla_kv_cache --preset deepseek-v4-flash --cache fp8_v4 \
          --tokens 1,8,64,4096,32768,131072; done; done ;;
  dsa) for r in 1 2; do for p in glm-5 deepseek-v3.2; do for w in $(builds dsa); do
        b dsa-$w-$p-$r "$(bin $w)" bench --op mla_kv_cache --indexer --cache fp8_ds_mla --preset $p \
          --tokens 1,64,1024,4096,32768; done; done; done ;;
  v32) for r in 1 2; do for p in deepseek-v3.2 glm-4.7-flash; do for w in $(builds v32); do
        for op in split_qk_norm mla_kv_cache; do
          b v32-$w-$p-$op-$r "$(bin $w)" bench --op $op --preset $p --tokens 1,8,16,64,256,512
          b v32pdl-$w-$p-$op-$r "$(bin $w)" bench --op $op --preset $p --tokens 1,8,16,64,256,512 --pdl
        done; done; done; done ;;
  peers) for r in 1 2 3; do for w in $(builds peers); do x="$(bin $w)" # rows where a peer's figure is the bar
        b peers-$w-gate-glm-graph-$r $x bench --op moe_gate --preset glm-4.7-flash --dtype f32 --tokens 1,16,64 --pdl
        for p in glm-4.7-flash deepseek-v3; do for d in f32 bf16; do
          b peers-$w-gate-$p-$d-$r $x bench --op moe_gate --preset $p --dtype $d --tokens 128,256,512,1024,2048,4096; done; done
        b peers-$w-rope-glm-$r $x bench --op rope_q --preset glm-4.7-flash --tokens 1024,4096,16384
        b peers-$w-rope-dsv3-$r $x bench --op rope_q --preset deepseek-v3 --tokens 64 --pdl
        b peers-$w-kv-v32-$r $x bench --op mla_kv_cache --preset deepseek-v3.2 --tokens 1,16,64 --pdl
      done; done ;;
esac; done
for s in $steps; do echo "== $s"; case $s in
  v4|dsa|peers|gate|fp8) python3 dev/ab_compare.py "$DEST" $s ;;
  v32) python3 dev/ab_compare.py "$DEST" v32; echo "== v32 --pdl"; python3 dev/ab_compare.py "$DEST" v32pdl ;;
  *) python3 scripts/bench_table.py "$DEST"/$s-*.json ;;
esac; done
