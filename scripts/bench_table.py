#!/usr/bin/env python3
"""Prints a compact table from one or more `mlafuse bench --json` files (used by gpu-check).
   --md prints Markdown (for BENCHMARKS.md)."""
import json
import sys

args = sys.argv[1:]
md = "--md" in args
files = [a for a in args if a != "--md"]
if md:
    print("| op | preset | dtype | T | mode | fused µs | GB/s | % of copy | same-bytes copy µs "
          "| % of it | kernel copy µs | % of it | unfused µs | speed-up | check |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
else:
    print(f"{'op':<14}{'preset':<15}{'T':>7} {'mode':<6}{'fused_us':>10}{'%copy':>7}{'copy_us':>9}"
          f"{'%cpy=':>7}{'kcopy_us':>9}{'%kcpy=':>7}{'unfused_us':>11}{'speedup':>8}  check")
for path in files:
    try:
        doc = json.load(open(path))
    except Exception as e:  # keep going: one broken file must not hide the others
        print(f"{path}: unreadable ({e})")
        continue
    copy = doc.get("copy_gbps")
    for r in doc.get("rows", []):
        if r.get("error"):
            print(f"{r['op']:<14}{r['preset']:<15}{r['T']:>7} ERROR {r['error']}")
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
            print(f"| {r['op']} | {r['preset']} | {doc.get('dtype', '')} | {r['T']} | {r.get('mode', '')} | "
                  f"{r['fused_us']:.2f} | {r.get('gbps', 0):.0f} | {pct:.1f} | {cus} | {cps} | {kus} | {kps} | {un:.2f} | "
                  f"{sp:.2f} | "
                  f"{r.get('baseline_check')} |")
        else:
            print(f"{r['op']:<14}{r['preset']:<15}{r['T']:>7} {r.get('mode', ''):<6}"
                  f"{r['fused_us']:>10.2f}{pct:>7.1f}{cus:>9}{cps:>7}{kus:>9}{kps:>7}{un:>11.2f}{sp:>8.2f}  "
                  f"{r.get('baseline_check')}")
    if not md:
        print(f"  (copy {copy} GB/s, {doc.get('device')})")
