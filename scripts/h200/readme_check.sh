#!/usr/bin/env bash
# The README's `check` sample on the H200 with the kit's real vLLM 0.25.1 (no server is started):
# the kit model with --offload-gb 0.5, then the section-6 model (config only) with --offload-gb 27.
# Usage (device run, kit and .vllm-h200/extra/google-re2 wheel carried, as for
# fixtures/h200-inspect/run-on-device.sh): bash scripts/h200/readme_check.sh "$OUT" [MORE_GB]
# MORE_GB adds a third run of the section-6 model with that offload (host_oom.sh: one the host cannot pin).
# Then copy $OUT/check-h200.txt to fixtures/h200-compare/ and run scripts/readme_outputs.py --write.
set -u
out=${1:?OUT}; more=${2:-}
. scripts/h200/doctor-env.sh "$out"
{
    date -u +"# %Y-%m-%d, vLLM $(vllm --version 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    runs=("-v --offload-gb 0.5 --model /tmp/qwen3-0.6b-random" "--offload-gb 27 --max-model-len 2048 --model /tmp/big")
    [ -n "$more" ] && runs+=("--offload-gb $more --max-model-len 2048 --model /tmp/big")
    for args in "${runs[@]}"; do
        echo "\$ offload-doctor check $args"
        # shellcheck disable=SC2086
        python3 -m vllm_offload_doctor check $args
        echo "exit $?"
    done
} >"$out/check-h200.txt" 2>&1
[ -n "$more" ] || cat "$out/check-h200.txt"
