#!/usr/bin/env python3
"""Prints a compact table from one or more `mlafuse bench --json` files (used by gpu-check).
   --md prints Markdown (for BENCHMARKS.md). Files from `bench --cache FORMAT` carry the cache
   format on their mla_kv_cache rows; the tables then get a cache column (fp8_ds_mla with its
   tile scale when it is not amax, fp8 with its scale when it is not 1)."""
import json
import sys

args = sys.argv[1:]
md = "--md" in args
files = [a for a in args if a != "--md"]

docs = []
for path in files:
    try:
        docs.append((path, json.load(open(path)), None))
    except Exception as e:  # keep going: one broken file must not hide the others
        docs.append((path, None, e))
show_cache = any("cache" in r for _, d, _ in docs if d for r in d.get("rows", []))


def cache_label(r):
    c = r.get("cache")
    if "cache" not in r and r.get("op") == "mla_kv_cache":
        return "plain"  # a file from before --cache, or run without it
    if not c:
        return "-"
    ts, ks = r.get("tile_scale"), r.get("kv_scale")
    if ts and ts != "amax":
        return f"{c}:{ts}"
    if ks is not None and ks != 1:
        return f"{c}:{ks:g}"
    return c


if md:
    print("| op |" + (" cache |" if show_cache else "") +
          " preset | dtype | T | mode | fused µs | GB/s | % of copy | same-bytes copy µs "
          "| % of it | kernel copy µs | % of it | unfused µs | speed-up | check |")
    print("|---|" + ("---|" if show_cache else "") +
          "---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
else:
    print(f"{'op':<14}" + (f"{'cache':<12}" if show_cache else "") +
          f"{'preset':<15}{'T':>7} {'mode':<6}{'fused_us':>10}{'%copy':>7}{'copy_us':>9}"
          f"{'%cpy=':>7}{'kcopy_us':>9}{'%kcpy=':>7}{'unfused_us':>11}{'speedup':>8}  check")
for path, doc, err in docs:
    if doc is None:
        print(f"{path}: unreadable ({err})")
        continue
    copy = doc.get("copy_gbps")
    for r in doc.get("rows", []):
        cache_md = f" {cache_label(r)} |" if show_cache else ""
        cache_tx = f"{cache_label(r):<12}" if show_cache else ""
        if r.get("error"):
            print(f"{r['op']:<14}{cache_tx}{r['preset']:<15}{r['T']:>7} ERROR {r['error']}")
            continue
        pct = r.get("pct_of_copy") or 0
        sp = r.get("speedup") or 0
        un = r.get("unfused_us") or 0
        cu = r.get("same_bytes_copy_us")
        cp = r.get("pct_of_same_bytes_copy")
        cus = f"{cu:.2f}" if cu is not None else "-"
        cps = f"{cp:.1f}" if cp is not None else "-"
        ku = r.get("kernel_copy_us")
        kp = r.get("pct_of_kernel_copy")
        kus = f"{ku:.2f}" if ku is not None else "-"
        kps = f"{kp:.1f}" if kp is not None else "-"
        if md:
            print(f"| {r['op']} |{cache_md} {r['preset']} | {doc.get('dtype', '')} | {r['T']} | {r.get('mode', '')} | "
                  f"{r['fused_us']:.2f} | {r.get('gbps', 0):.0f} | {pct:.1f} | {cus} | {cps} | {kus} | {kps} | {un:.2f} | "
                  f"{sp:.2f} | "
                  f"{r.get('baseline_check')} |")
        else:
            print(f"{r['op']:<14}{cache_tx}{r['preset']:<15}{r['T']:>7} {r.get('mode', ''):<6}"
                  f"{r['fused_us']:>10.2f}{pct:>7.1f}{cus:>9}{cps:>7}{kus:>9}{kps:>7}{un:>11.2f}{sp:>8.2f}  "
                  f"{r.get('baseline_check')}")
    if not md:
        print(f"  (copy {copy} GB/s, {doc.get('device')})")
