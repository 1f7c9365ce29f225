#!/bin/bash
# The host-memory wall on the H200, in one device call: the README's `check` samples and the check benchmark,
# then compare under the V1 runner with an offload the 128 GiB host cannot pin (the section-6 model, config only).
# Everything lands in one archive, since a device call brings back at most 8 files.
# Usage (device run, kit and .vllm-h200/extra carried): scripts/h200/host_oom.sh OUTDIR [OFFLOAD_GB=112]
set -u -o pipefail
out=$1; gb=${2:-112}
work=$(mktemp -d)
trap 'tar -czf "$out/host-oom-$gb.tgz" -C "$work" .' EXIT
bash .vllm-h200/setup.sh >"$work/setup.out" 2>&1 || { tail -20 "$work/setup.out"; exit 1; }
. /tmp/site/env.sh
python3 -m pip install -q --no-deps --target /tmp/doctor-deps .vllm-h200/extra/*.whl >"$work/deps.out" 2>&1
export PYTHONPATH=.:/tmp/site:/tmp/doctor-deps
[ -d /tmp/big ] || python3 scripts/h200/make_big_model.py /tmp/qwen3-0.6b-random /tmp/big >"$work/make-big.out" 2>&1
{
    date -u +"# %Y-%m-%d, vLLM $(vllm --version 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    for args in "-v --offload-gb 0.5 --model /tmp/qwen3-0.6b-random" "--offload-gb 27 --max-model-len 2048 --model /tmp/big" "--offload-gb $gb --max-model-len 2048 --model /tmp/big"; do
        echo "\$ offload-doctor check $args"
        # shellcheck disable=SC2086
        python3 -m vllm_offload_doctor check $args
        echo "exit $?"
    done
} >"$work/check-h200.txt" 2>&1
python3 bench/bench_check.py -n 10 >"$work/bench-check.txt" 2>&1
VLLM_USE_V2_MODEL_RUNNER=0 CALL_BUDGET_S=${CALL_BUDGET_S:-400} bash scripts/h200/compare_big.sh "$work" "$gb" >"$work/run.txt" 2>&1
echo "compare_big exit: $?" >>"$work/run.txt"
free -m >"$work/free-after.txt"
(dmesg 2>/dev/null || journalctl -k 2>/dev/null) | grep -i -E "out of memory|oom-kill|killed process" | tail -20 >"$work/kernel-oom.txt"
tail -45 "$work/compare.txt"; cat "$work/bench-check.txt"; tail -12 "$work/check-h200.txt"
