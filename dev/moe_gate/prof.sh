#!/usr/bin/env bash
# One device call for router work: build the moe_gate dev bench, the moe_gate test and the
# mlafuse tool; run the CUDA tests of moe_gate (+ compute-sanitizer on the tie / non-finite
# group unless SAN=0), the dev bench (MOE_* filters pass through; MOE_V4ONLY=1 keeps v1, the
# library, the solo and tiny kernels) and an ncu summary of each entry of K, router:dtype:regex
# (first matching launch of the validation run, or of one launch per variant at
# T = NCU_T when that is set).
set -o pipefail
B=build-gpu
(cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAF_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DMLAF_BUILD_DEV=ON > $OUT/cfg.log 2>&1 && ninja -C $B dev_moe_gate_bench test_moe_gate mlafuse > $OUT/build.log 2>&1) || { tail -40 $OUT/build.log; exit 1; }
echo built
MLAF_TEST_BACKEND=cuda timeout 300 $B/tests/test_moe_gate > $OUT/test.txt 2>&1; echo "test rc=$? $(tail -1 $OUT/test.txt)"
grep -E "FAIL" $OUT/test.txt | head -5
if [ "${SAN:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    MLAF_TEST_BACKEND=cuda timeout 240 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/test_moe_gate ties > $OUT/san-$tool.txt 2>&1
    echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/san-$tool.txt | tail -1) $(tail -1 $OUT/san-$tool.txt | cut -c1-80)"
  done
fi
timeout ${BENCH_S:-240} $B/dev/moe_gate/moe_gate_bench ${BENCH_ARGS:-} > $OUT/bench.txt 2>&1; echo "bench rc=$?"
grep -E "FAIL" $OUT/bench.txt | head -20
grep -E "^[a-zA-Z]|^  (T|v)" $OUT/bench.txt | grep -v validate
for spec in ${K:-}; do
  IFS=: read -r router dt k <<< "$spec"
  env ${NCU_T:+MOE_PROFILE_T=$NCU_T} MOE_NOTIME=1 MOE_ONLY=$router MOE_DT=$dt timeout 120 ncu --clock-control none --kernel-name-base mangled -k regex:$k -s 0 -c 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --section WarpStateStats --section Occupancy --section InstructionStats --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis $B/dev/moe_gate/moe_gate_bench > $OUT/ncu-$router-$dt.txt 2>&1; echo "== $router $dt $k rc=$?"
  grep -E "stalled" $OUT/ncu-$router-$dt.txt | awk '$NF+0 > 0.3' | sort -k3 -g | tail -7
  grep -E "Executed Instructions  |Warp Cycles Per Issued|Registers Per|Achieved Active|Theoretical Occ|Block Limit|Memory Throughput|Duration|Compute \(SM\) Th|Issue Slots Busy|L1/TEX Hit|Bank" $OUT/ncu-$router-$dt.txt | head -24
done
