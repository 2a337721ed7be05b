#!/usr/bin/env python3
"""Builds side by side from dev/gpu_ab.sh's JSON files: `ab_compare.py DIR STEP` reads every
DIR/STEP-BUILD-*.json (BUILD: new, old or a variant's name; every round) and prints one line per
(preset, op with its dtype when not bf16, cache, T, mode) and build: the fused us of its rounds,
the median against old's, and its % of copy and x unfused."""
import glob
import json
import os
import statistics
import sys

d, step = sys.argv[1], sys.argv[2]
rows = {}
for path in sorted(glob.glob(f"{d}/{step}-*.json")):
    build = os.path.basename(path)[len(step) + 1:].split("-")[0]
    try:
        doc = json.load(open(path))
    except Exception as e:  # a cut-short call: say so, keep the others
        print(f"{path}: {e}")
        continue
    for r in doc.get("rows", []):
        if r.get("fused_us") is None:
            continue
        op = r["op"] if doc.get("dtype", "bf16") == "bf16" else f'{r["op"]}:{doc["dtype"]}'
        k = (r.get("preset") or doc.get("preset") or "-", op, r.get("cache") or "-", r["T"], r.get("mode") or "-")
        v = rows.setdefault(k, {}).setdefault(build, {"us": [], "pct": [], "x": []})
        v["us"].append(r["fused_us"])
        v["pct"].append(r.get("pct_of_copy"))
        v["x"].append(r.get("speedup"))


def f(v):
    return "/".join("-" if x is None else f"{x:.2f}" for x in v)


order = lambda b: (b != "old", b != "new", b)
print(f"{'preset':18} {'op':13} {'cache':11} {'T':>7} {'mode':6} {'build':8} {'us':>15} {'/ old':>6} {'%copy':>11}"
      f" {'x unf':>11}")
for k in sorted(rows):
    old = rows[k].get("old")
    for b in sorted(rows[k], key=order):
        v = rows[k][b]
        ratio = statistics.median(v["us"]) / statistics.median(old["us"]) if old else None
        print(f"{k[0]:18} {k[1]:13} {k[2]:11} {k[3]:>7} {k[4]:6} {b:8} {f(v['us']):>15} "
              f"{'-' if ratio is None else f'{ratio:.3f}':>6} {f(v['pct']):>11} {f(v['x']):>11}")
