#!/bin/bash
# The host-memory wall on the H200, in one device call: the README's `check` samples and the check benchmark,
# then compare under the V1 runner with an offload the 128 GiB host cannot pin (the section-6 model, config only).
# Everything lands in one archive, since a device call brings back at most 8 files.
# Usage (device run, kit and .vllm-h200/extra carried): scripts/h200/host_oom.sh OUTDIR [OFFLOAD_GB=112]
set -u -o pipefail
out=$1; gb=${2:-112}
work=$(mktemp -d)
trap 'tar -czf "$out/host-oom-$gb.tgz" -C "$work" .' EXIT
bash scripts/h200/readme_check.sh "$work" "$gb"  # sets up the device, then the check samples
. scripts/h200/doctor-env.sh "$work"  # this shell's PYTHONPATH (the kit is installed by now: quick)
python3 bench/bench_check.py -n 10 >"$work/bench-check.txt" 2>&1
VLLM_USE_V2_MODEL_RUNNER=0 CALL_BUDGET_S=${CALL_BUDGET_S:-400} bash scripts/h200/compare_big.sh "$work" "$gb" >"$work/run.txt" 2>&1
echo "compare_big exit: $?" >>"$work/run.txt"
free -m >"$work/free-after.txt"
(dmesg 2>/dev/null || journalctl -k 2>/dev/null) | grep -i -E "out of memory|oom-kill|killed process" | tail -20 >"$work/kernel-oom.txt"
tail -45 "$work/compare.txt"; cat "$work/bench-check.txt"; tail -12 "$work/check-h200.txt"
