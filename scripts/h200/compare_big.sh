#!/bin/bash
# compare on the section-6 model (151.8 GiB of bf16 weights, does not fit a 139.8 GiB H200 without offload).
# Usage (device run, kit carried): scripts/h200/compare_big.sh OUTDIR OFFLOAD_GB [extra compare options...]
# Runs the doctor from the working tree; the model is config-only (--load-format dummy) so nothing is downloaded.
set -u -o pipefail
deadline=$(( $(date +%s) + ${CALL_BUDGET_S:-585} ))
out=$1; gb=$2; shift 2
bash .vllm-h200/setup.sh >"$out/setup.out" 2>&1 || { echo "setup failed"; tail -20 "$out/setup.out"; exit 1; }
. /tmp/site/env.sh
# The doctor's own dependency the device's python3 lacks (google-re2), carried as a wheel beside the kit.
python3 -m pip install -q --no-deps --target /tmp/doctor-deps .vllm-h200/extra/*.whl >"$out/deps.out" 2>&1
export PYTHONPATH=.:/tmp/site:/tmp/doctor-deps
[ -d /tmp/big ] || python3 scripts/h200/make_big_model.py /tmp/qwen3-0.6b-random /tmp/big >"$out/make-big.out" 2>&1
python3 -m vllm_offload_doctor check --model /tmp/big --max-model-len 2048 \
  >"$out/check.txt" 2>&1
timeout $(( deadline - $(date +%s) )) python3 -m vllm_offload_doctor compare --model /tmp/big --served-model-name big \
  --offload-gb "$gb" --max-tokens 8 --repeats 1 --warmup 0 --out "$out/compare" "$@" \
  -- --load-format dummy --enforce-eager --max-model-len 2048 --attention-backend TRITON_ATTN 2>&1 | tee "$out/compare.txt"
echo "compare exit: $?"
