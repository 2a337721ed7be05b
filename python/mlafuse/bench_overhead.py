"""Host overhead per call at small T: mlafuse's torch binding against torch's own eager ops.

    python -m mlafuse.bench_overhead                 # CUDA when a GPU is visible, else CPU
    python -m mlafuse.bench_overhead --device cpu --no-compile
    python -m mlafuse.bench_overhead --compare       # both bindings (ext and ctypes), one table

Each row is the wall clock per call of one Python-level call (many calls, one synchronize at
the end, the best of --repeats timed runs, garbage collection off as in timeit), eagerly and
inside torch.compile(fullgraph=True); every eager row runs before the first compile, the eager
rows in rounds (each round times every row once, so load on the machine reaches all alike).
At T = 1 the kernels take a few microseconds of device time, so the numbers are the host's
cost of issuing the call: Python, the dispatcher, output allocation and the launch. Rows:

  torch: plain launch            x.add_(0) on a small tensor
  torch: 2x F.rms_norm           the two RMSNorms that split_qk_norm fuses
  torch: kv-cache chain          2 rms_norm + interleaved RoPE + the cache row write
  torch: router                  sigmoid, + bias, topk, gather, renormalize (what moe_gate fuses)
  mlafuse.split_qk_norm          the Python function (the public API), outputs allocated
  mlafuse.split_qk_norm, outputs given   the same writing into preallocated outputs,
                                 out=(q, k_nope, k_pe) (an engine's per-step call)
  torch.ops.mlafuse.split_qk_norm  the custom op called directly
  mlafuse.mla_kv_cache, mlafuse.rope_q, mlafuse.moe_gate

The eager column's "x plain" is each row over the plain launch of the same run; the lines
under the table give split_qk_norm's two ratios (host cost targets: given outputs within 1.3x a
plain launch, allocated within 2x).

Shapes are GLM-4.7-Flash's (Q 768, C 512, R 64, 64 experts, top 4), bf16 activations.
The binding in use is mlafuse.BINDING ("ext": the compiled torch extension, "ctypes": the
Python custom ops); MLAFUSE_BINDING=ext|ctypes chooses it.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time


PLAIN, ALLOC, GIVEN = ("torch: plain launch", "mlafuse.split_qk_norm",
                      "mlafuse.split_qk_norm, outputs given")
TARGETS = {GIVEN: 1.3, ALLOC: 2.0}  # host cost per eager call over a plain launch


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m mlafuse.bench_overhead",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if visible)")
    ap.add_argument("--tokens", "-T", type=int, default=1, help="tokens per call (default 1)")
    ap.add_argument("--iters", type=int, default=None,
                    help="calls per timed run (default 2000 on CUDA, 1000 on CPU)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs; the best is kept")
    ap.add_argument("--calls-per-graph", type=int, default=8, metavar="K",
                    help="also time one compiled function making K calls (on K distinct "
                         "inputs) and report per call: the op's cost inside a graph, with "
                         "torch.compile's fixed cost per compiled call spread over K "
                         "(default 8; 1 leaves the column out)")
    ap.add_argument("--rows", default=None,
                    help="only rows whose name contains one of these comma-separated words")
    ap.add_argument("--no-compile", action="store_true", help="eager rows only")
    ap.add_argument("--compare", action="store_true",
                    help="run once per binding (MLAFUSE_BINDING=ext, then ctypes) in child "
                         "processes and print both")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON (one object)")
    return ap.parse_args(argv)


def _timer(sync, iters, repeats):
    def per_call_us(fn, *args):
        return per_call_us_each([(fn, args)])[0]

    def per_call_us_each(calls):
        """The best per-call time of each (fn, args), timed in rounds: every round runs each
        one for `iters` calls, so a busy spell of the machine touches them all alike."""
        for fn, args in calls:
            for _ in range(max(iters // 10, 20)):
                fn(*args)
        sync()
        best = [float("inf")] * len(calls)
        # As timeit: no garbage collection inside a timed run (after torch.compile has run,
        # a collection walks its many objects and lands on whichever call triggers it).
        enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(repeats):
                for i, (fn, args) in enumerate(calls):
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        fn(*args)
                    sync()
                    best[i] = min(best[i], (time.perf_counter() - t0) / iters)
        finally:
            if enabled:
                gc.enable()
        return [b * 1e6 for b in best]

    return per_call_us, per_call_us_each


def _many(fn, n_args, k):
    """One function making k calls of fn, call i on the i-th group of n_args arguments."""
    def many(*flat):
        return [fn(*flat[i * n_args:(i + 1) * n_args]) for i in range(k)]

    return many


def measure(args) -> dict:
    import torch
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    import mlafuse

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if device.index is None:  # "cuda": the current device (set_device needs an index)
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
    else:
        def sync():
            pass
    iters = args.iters or (2000 if device.type == "cuda" else 1000)
    per_call_us, per_call_us_each = _timer(sync, iters, args.repeats)
    K = max(int(args.calls_per_graph), 1)

    T, Q, C, R = args.tokens, 768, 512, 64
    E, top_k, eps = 64, 4, 1e-5
    bf16 = torch.bfloat16
    g = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=bf16, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device, dtype)

    # K distinct inputs of each kind (call i of a K-call graph uses the i-th), shared weights,
    # tables and cache; cache slots of different calls never collide.
    latents = [randn(T, Q + C + R) for _ in range(K)]
    split_outs = [(torch.empty(T, Q, dtype=bf16, device=device),
                   torch.empty(T, C, dtype=bf16, device=device),
                   torch.empty(T, R, dtype=bf16, device=device)) for _ in range(K)]
    w_q, w_kv = randn(Q, scale=0.1) + 1, randn(C, scale=0.1) + 1
    max_pos, block = 4096, 64
    cos_sin = mlafuse.rope_table(max_pos, R, device=device)
    num_blocks = max(64, (2 * K * T) // block + 1)
    perm = torch.randperm(num_blocks * block, generator=g)[:K * T].to(device)
    slot_sets = [perm[i * T:(i + 1) * T] for i in range(K)]
    pos_sets = [torch.randint(0, max_pos, (T,), generator=g).to(device) for _ in range(K)]
    kv_cache = torch.zeros(num_blocks, block, C + R, dtype=bf16, device=device)
    q_heads = [randn(T, 20, 256) for _ in range(K)]
    logits = [randn(T, E, dtype=torch.float32) for _ in range(K)]
    bias = randn(E, dtype=torch.float32, scale=0.01)
    x = torch.zeros(16, device=device)
    ops = torch.ops.mlafuse

    def plain(x):
        return x.add_(0)

    def rms2(latent, w_q, w_kv):
        return (F.rms_norm(latent[:, :Q], (Q,), w_q, eps),
                F.rms_norm(latent[:, Q:Q + C], (C,), w_kv, eps))

    def kv_chain(latent, w_q, w_kv, positions, cos_sin, slots, kv_cache):
        qn = F.rms_norm(latent[:, :Q], (Q,), w_q, eps)
        kn = F.rms_norm(latent[:, Q:Q + C], (C,), w_kv, eps)
        pe = latent[:, Q + C:].float()
        cs = cos_sin[positions]
        c, s = cs[:, :R // 2], cs[:, R // 2:]
        x0, x1 = pe[:, 0::2], pe[:, 1::2]
        pe = torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).flatten(1)
        kv_cache.view(-1, C + R).index_copy_(0, slots, torch.cat((kn, pe.to(bf16)), dim=1))
        return qn

    def router(logits, bias):
        s = logits.sigmoid()
        _, ids = (s + bias).topk(top_k, dim=-1)
        w = s.gather(1, ids)
        return w / w.sum(-1, keepdim=True), ids

    def m_split(latent, w_q, w_kv):
        return mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=eps, eps_kv=eps)

    def m_split_given(latent, w_q, w_kv, q, k_nope, k_pe):
        return mlafuse.split_qk_norm(latent, w_q, w_kv, eps_q=eps, eps_kv=eps,
                                     out=(q, k_nope, k_pe))

    def o_split(latent, w_q, w_kv):
        return ops.split_qk_norm(latent, w_q, w_kv, Q, C, R, eps, eps)

    def m_kv(latent, w_q, w_kv, positions, cos_sin, slots, kv_cache):
        return mlafuse.mla_kv_cache(latent, w_q, w_kv, positions, cos_sin, slots, kv_cache,
                                    eps_q=eps, eps_kv=eps)

    def m_rope(q_heads, positions, cos_sin):
        return mlafuse.rope_q(q_heads, positions, cos_sin)

    def m_gate(logits, bias):
        return mlafuse.moe_gate(logits, bias, config="glm-4.7-flash")

    def kv_args(i):
        return (latents[i], w_q, w_kv, pos_sets[i], cos_sin, slot_sets[i], kv_cache)

    rows = [
        ("torch: plain launch", plain, lambda i: (x,)),
        ("torch: 2x F.rms_norm", rms2, lambda i: (latents[i], w_q, w_kv)),
        ("torch: kv-cache chain", kv_chain, kv_args),
        ("torch: router", router, lambda i: (logits[i], bias)),
        ("mlafuse.split_qk_norm", m_split, lambda i: (latents[i], w_q, w_kv)),
        (GIVEN, m_split_given, lambda i: (latents[i], w_q, w_kv, *split_outs[i])),
        ("torch.ops.mlafuse.split_qk_norm", o_split, lambda i: (latents[i], w_q, w_kv)),
        ("mlafuse.mla_kv_cache", m_kv, kv_args),
        ("mlafuse.rope_q", m_rope, lambda i: (q_heads[i], pos_sets[i], cos_sin)),
        ("mlafuse.moe_gate", m_gate, lambda i: (logits[i], bias)),
    ]
    if args.rows:
        words = [w.strip() for w in args.rows.split(",") if w.strip()]
        rows = [r for r in rows if r[0] == PLAIN or any(w in r[0] for w in words)]
    # Every eager row first, in rounds: nothing compiled yet in the process, as an eager
    # engine runs.
    eager = per_call_us_each([(fn, args_for(0)) for _, fn, args_for in rows])
    out = [{"name": name, "eager_us": us, "compiled_us": None, "compiled_k_us": None,
            "graphs": None} for (name, _, _), us in zip(rows, eager)]
    for row, (name, fn, args_for) in zip(out, rows):
        a0 = args_for(0)
        if not args.no_compile:
            torch._dynamo.reset()
            counters.clear()
            row["compiled_us"] = per_call_us(torch.compile(fn, fullgraph=True, dynamic=False),
                                             *a0)
            graphs = counters["stats"]["unique_graphs"]
            if K > 1:
                torch._dynamo.reset()
                counters.clear()
                flat = tuple(a for i in range(K) for a in args_for(i))
                many = torch.compile(_many(fn, len(a0), K), fullgraph=True, dynamic=False)
                row["compiled_k_us"] = per_call_us(many, *flat) / K
                graphs = max(graphs, counters["stats"]["unique_graphs"])
            # 1 = compiled once; more means it recompiled while it was being timed
            row["graphs"] = graphs
    plain = out[0]["eager_us"]  # the plain launch is always timed, first
    for row in out:
        row["eager_x_plain"] = row["eager_us"] / plain
    return {"binding": mlafuse.BINDING, "device": str(device), "torch": torch.__version__,
            "T": T, "iters": iters, "K": K, "rows": out}


def _print(results: list[dict]) -> None:
    r0 = results[0]
    print(f"mlafuse overhead: wall clock per call, T = {r0['T']}, {r0['device']}, "
          f"torch {r0['torch']}, best of runs of {r0['iters']} calls (one sync per run)")
    cols = []
    for r in results:
        b = r["binding"]
        cols.append((f"eager[{b}]", "eager_us", r))
        cols.append(("x plain", "eager_x_plain", r))
        if any(x["compiled_us"] is not None for x in r["rows"]):
            cols.append((f"compiled[{b}]", "compiled_us", r))
        if any(x["compiled_k_us"] is not None for x in r["rows"]):
            cols.append((f"in-graph[{b}]", "compiled_k_us", r))
    w = max(len(x["name"]) for x in r0["rows"]) + 2
    cw = max(len(c[0]) for c in cols) + 2
    print("".ljust(w) + "".join(c[0].rjust(cw) for c in cols) + "   (µs per call)")
    for i, row in enumerate(r0["rows"]):
        line = row["name"].ljust(w)
        for _, key, r in cols:
            v = r["rows"][i][key]
            fmt = "{:.2f}x" if key == "eager_x_plain" else "{:.1f}"
            line += ("-" if v is None else fmt.format(v)).rjust(cw)
        print(line)
    notes = ["eager: the call itself; compiled: torch.compile(fullgraph=True) of a function "
             "making that one call"]
    if any(c[1] == "compiled_k_us" for c in cols):
        notes.append(f"in-graph: a compiled function making {r0['K']} such calls on distinct "
                     "inputs, per call (torch.compile's fixed cost per compiled call spread "
                     "over them)")
    for r in results:
        again = [x["name"] for x in r["rows"] if (x["graphs"] or 1) > 1]
        if again:
            notes.append(f"[{r['binding']}] recompiled while timed: {', '.join(again)}")
    for n in notes:
        print("  " + n)
    for r in results:
        by_name = {x["name"]: x for x in r["rows"]}
        parts = [f"{name.split(', ')[-1] if name == GIVEN else 'outputs allocated'} "
                 f"{by_name[name]['eager_us']:.1f} µs = {by_name[name]['eager_x_plain']:.2f}x "
                 f"(target {want}x)" for name, want in TARGETS.items() if name in by_name]
        if parts:
            print(f"  [{r['binding']}] split_qk_norm eager against a plain launch of "
                  f"{by_name[PLAIN]['eager_us']:.1f} µs: " + "; ".join(parts))


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.compare:
        results = []
        child = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--compare"]
        for binding in ("ext", "ctypes"):
            env = dict(os.environ, MLAFUSE_BINDING=binding)
            p = subprocess.run([sys.executable, "-m", "mlafuse.bench_overhead", "--json"] + child,
                               env=env, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"binding {binding}: failed\n{p.stderr.strip()}", file=sys.stderr)
                continue
            results.append(json.loads(p.stdout.strip().splitlines()[-1]))
        if not results:
            return 1
        _print(results)
        return 0
    res = measure(args)
    if args.json:
        print(json.dumps(res))
    else:
        _print([res])
    return 0


if __name__ == "__main__":
    sys.exit(main())
