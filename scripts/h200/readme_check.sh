#!/usr/bin/env bash
# The README's `check` sample on the H200 with the kit's real vLLM 0.25.1 (no server is started):
# the kit model with --offload-gb 0.5, then the section-6 model (config only) with --offload-gb 27.
# Usage (device run, kit and .vllm-h200/extra/google-re2 wheel carried, as for
# fixtures/h200-inspect/run-on-device.sh): bash scripts/h200/readme_check.sh "$OUT"
# Then copy $OUT/check-h200.txt to fixtures/h200-compare/ and run scripts/readme_outputs.py --write.
set -u
out=${1:?OUT}
bash .vllm-h200/setup.sh >"$out/setup.out" 2>&1 || { tail -20 "$out/setup.out"; exit 1; }
. /tmp/site/env.sh
python3 -m pip install -q --no-deps --target /tmp/doctor-deps .vllm-h200/extra/*.whl >"$out/deps.out" 2>&1
export PYTHONPATH=.:/tmp/site:/tmp/doctor-deps
[ -d /tmp/big ] || python3 scripts/h200/make_big_model.py /tmp/qwen3-0.6b-random /tmp/big >"$out/make-big.out" 2>&1
{
    date -u +"# %Y-%m-%d, vLLM $(vllm --version 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    for args in "-v --offload-gb 0.5 --model /tmp/qwen3-0.6b-random" "--offload-gb 27 --max-model-len 2048 --model /tmp/big"; do
        echo "\$ offload-doctor check $args"
        # shellcheck disable=SC2086
        python3 -m vllm_offload_doctor check $args
        echo "exit $?"
    done
} >"$out/check-h200.txt" 2>&1
cat "$out/check-h200.txt"
