#!/bin/bash
# compare on the section-6 model (151.8 GiB of bf16 weights, does not fit a 139.8 GiB H200 without offload).
# Usage (device run, kit carried): scripts/h200/compare_big.sh OUTDIR OFFLOAD_GB [extra compare options...]
# Runs the doctor from the working tree; the model is config-only (--load-format dummy) so nothing is downloaded.
set -u -o pipefail
deadline=$(( $(date +%s) + ${CALL_BUDGET_S:-585} ))
out=$1; gb=$2; shift 2
. scripts/h200/doctor-env.sh "$out"
python3 -m vllm_offload_doctor check --model /tmp/big --max-model-len 2048 \
  >"$out/check.txt" 2>&1
timeout $(( deadline - $(date +%s) )) python3 -m vllm_offload_doctor compare --model /tmp/big --served-model-name big \
  --offload-gb "$gb" --max-tokens 8 --repeats 1 --warmup 0 --out "$out/compare" "$@" \
  -- --load-format dummy --enforce-eager --max-model-len 2048 --attention-backend TRITON_ATTN 2>&1 | tee "$out/compare.txt"
echo "compare exit: $?"
