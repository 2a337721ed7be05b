#!/usr/bin/env python3
"""Prints a compact table from one or more `mlafuse bench --json` files (used by gpu-check)."""
import json
import sys

print(f"{'op':<14}{'preset':<15}{'T':>7} {'mode':<6}{'fused_us':>10}{'%copy':>7}"
      f"{'unfused_us':>11}{'speedup':>8}  check")
for path in sys.argv[1:]:
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
        pct = r.get("pct_of_copy")
        sp = r.get("speedup")
        print(f"{r['op']:<14}{r['preset']:<15}{r['T']:>7} {r.get('mode', ''):<6}"
              f"{r['fused_us']:>10.2f}{(pct or 0):>7.1f}{(r.get('unfused_us') or 0):>11.2f}"
              f"{(sp or 0):>8.2f}  {r.get('baseline_check')}")
    print(f"  (copy {copy} GB/s, {doc.get('device')})")
