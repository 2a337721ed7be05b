#!/usr/bin/env bash
# one device call: build the moe_gate dev bench, time every router; ncu stall summary of K
set -o pipefail
B=build-gpu
(cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAF_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DMLAF_BUILD_DEV=ON > $OUT/cfg.log 2>&1 && ninja -C $B dev_moe_gate_bench > $OUT/build.log 2>&1) || { tail -40 $OUT/build.log; exit 1; }
echo built
timeout 200 $B/dev/moe_gate/moe_gate_bench > $OUT/bench.txt 2>&1; echo "bench rc=$?"
grep -E "FAIL|^[a-z]" $OUT/bench.txt | head -20
grep -E "^[a-z]|^  (T|v)" $OUT/bench.txt | grep -v validate
for K in ${K:-team_kernelIfLi32ELi8ELi4096ELb0 team_kernelIfLi16ELi16ELi4096ELb0}; do
MOE_NOTIME=1 MOE_ONLY=deepseek-v3 MOE_DT=f32 timeout 100 ncu --clock-control none --kernel-name-base mangled -k regex:$K -s 0 -c 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --section WarpStateStats --section Occupancy --section InstructionStats --section LaunchStats $B/dev/moe_gate/moe_gate_bench > $OUT/ncu-$K.txt 2>&1; echo "== $K rc=$?"
grep -E "stalled" $OUT/ncu-$K.txt | awk '$NF+0 > 0.3' | sort -k3 -g | tail -6
grep -E "Executed Instructions  |Warp Cycles Per Issued|Registers Per|Achieved Active|Theoretical Occ" $OUT/ncu-$K.txt
done
