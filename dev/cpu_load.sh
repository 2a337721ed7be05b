#!/bin/sh
# dev/cpu_load.sh — the CPU backend's calls on an idle and on an oversubscribed machine.
#
# Usage: dev/cpu_load.sh [BUILD_DIR ...]            (default: build-cpu)
#   e.g. dev/cpu_load.sh build-old build-cpu        (an older build beside the current one)
# Environment: ROUNDS (3), REPS (10: --reps of each bench), TOKENS (1,64,4096,65536),
#   PRESET (glm-4.7-flash: split_qk_norm, mla_kv_cache, rope_q, moe_gate),
#   IDX_PRESET (glm-5: indexer_q, which needs a model with a DSA indexer),
#   LOAD (2: busy processes started for the loaded runs), OUT (a folder for the raw JSON;
#   default a temporary one, removed at the end).
#
# Every round runs, for every build (interleaved, in the same round), `mlafuse bench --backend
# cpu --json` with --threads 1 and with the default thread count, first on the idle machine, then
# with LOAD processes `sh -c 'while :; do :; done'` running (killed before the next round and
# on exit). Prints one table: per op, T and build the median over the rounds of each
# configuration's median call time (µs), and loaded / unloaded ratios:
#   load-def/1:  loaded default threads over loaded --threads 1 (a pool that stalls: >> 1)
#   load-def/unl1: loaded default threads over unloaded --threads 1
set -eu

ROUNDS=${ROUNDS:-3}
REPS=${REPS:-10}
TOKENS=${TOKENS:-1,64,4096,65536}
PRESET=${PRESET:-glm-4.7-flash}
IDX_PRESET=${IDX_PRESET:-glm-5}
LOAD=${LOAD:-2}
[ $# -gt 0 ] || set -- build-cpu
for b in "$@"; do
    [ -x "$b/tools/mlafuse" ] || { echo "cpu_load.sh: no $b/tools/mlafuse" >&2; exit 2; }
done
KEEP=1
if [ -z "${OUT:-}" ]; then OUT=$(mktemp -d); KEEP=0; fi
mkdir -p "$OUT"

LOAD_PIDS=""
stop_load() {
    for p in $LOAD_PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $LOAD_PIDS; do wait "$p" 2>/dev/null || true; done
    LOAD_PIDS=""
}
start_load() {
    i=0
    while [ "$i" -lt "$LOAD" ]; do
        sh -c 'while :; do :; done' &
        LOAD_PIDS="$LOAD_PIDS $!"
        i=$((i + 1))
    done
    sleep 1
}
cleanup() {
    stop_load
    [ "$KEEP" = 1 ] || rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# one configuration of one build: all ops of PRESET, then indexer_q of IDX_PRESET
bench() { # build load threads round
    tag=$(echo "$1" | tr '/' '_')
    th=""
    [ "$3" = def ] || th="--threads $3"
    # shellcheck disable=SC2086
    "$1/tools/mlafuse" bench --backend cpu --op all --preset "$PRESET" --tokens "$TOKENS" --reps "$REPS" $th \
        --json >"$OUT/$tag.$2.$3.$4.main.json" 2>/dev/null || true
    # shellcheck disable=SC2086
    "$1/tools/mlafuse" bench --backend cpu --op indexer_q --preset "$IDX_PRESET" --tokens "$TOKENS" --reps "$REPS" \
        $th --json >"$OUT/$tag.$2.$3.$4.idx.json" 2>/dev/null || true
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "# round $r/$ROUNDS: unloaded" >&2
    for b in "$@"; do for th in 1 def; do bench "$b" unl "$th" "$r"; done; done
    echo "# round $r/$ROUNDS: $LOAD busy processes" >&2
    start_load
    for b in "$@"; do for th in 1 def; do bench "$b" load "$th" "$r"; done; done
    stop_load
    r=$((r + 1))
done

python3 - "$OUT" "$@" <<'EOF'
import glob, json, os, statistics, sys
out, builds = sys.argv[1], sys.argv[2:]
t = {}  # (op, T, build, cfg) -> [median per round]
threads = {}
for b in builds:
    tag = b.replace('/', '_')
    for f in glob.glob(os.path.join(out, tag + '.*.json')):
        name = os.path.basename(f)[len(tag) + 1:].split('.')
        load, th = name[0], name[1]
        try:
            d = json.load(open(f))
        except Exception:
            continue
        if th == 'def':
            threads[b] = d.get('threads')
        for row in d.get('rows', []):
            if row.get('fused_us') is None:
                continue
            t.setdefault((row['op'], row['T'], b, load + '.' + th), []).append(row['fused_us'])
cfgs = ['unl.1', 'unl.def', 'load.1', 'load.def']
med = {k: statistics.median(v) for k, v in t.items()}
ops = []
for (op, T, b, c) in t:
    if op not in ops:
        ops.append(op)
print('# median over rounds of each bench median, µs; def = default threads (%s)' %
      ', '.join('%s: %s' % (b, threads.get(b)) for b in builds))
hdr = '%-14s %6s %-22s %10s %10s %10s %10s %12s %14s' % ('op', 'T', 'build', 'unl t=1', 'unl def',
                                                            'load t=1', 'load def', 'load def/1', 'load def/unl1')
print(hdr)
for op in ops:
    Ts = sorted({T for (o, T, b, c) in t if o == op})
    for T in Ts:
        for b in builds:
            v = [med.get((op, T, b, c)) for c in cfgs]
            if all(x is None for x in v):
                continue
            f = lambda x: '%10.1f' % x if x is not None else '%10s' % '-'
            r1 = '%12.2f' % (v[3] / v[2]) if v[2] and v[3] else '%12s' % '-'
            r2 = '%14.2f' % (v[3] / v[0]) if v[0] and v[3] else '%14s' % '-'
            print('%-14s %6d %-22s %s %s %s %s %s %s' % (op, T, b[-22:], f(v[0]), f(v[1]), f(v[2]), f(v[3]), r1, r2))
EOF
