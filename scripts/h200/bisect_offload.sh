#!/bin/bash
# Smallest --cpu-offload-gb that loads AND serves the section-6 model on this GPU (V1 runner, vLLM 0.25.1 kit).
# Each try: start vllm serve, wait for /v1/models 200 (serves) or exit (fails), send one 8-token request, stop.
# Usage: bisect_offload.sh OUTDIR GB [GB ...]   (tries the values in the order given; a deadline guards the call)
set -u
out=$1; shift
deadline=$(( $(date +%s) + ${BISECT_BUDGET_S:-540} ))
port=8123
for gb in "$@"; do
  left=$(( deadline - $(date +%s) ))
  [ "$left" -lt 150 ] && { echo "bisect: $left s left, stopping before $gb"; break; }
  log="$out/bisect-$gb.log"
  t0=$(date +%s)
  VLLM_USE_V2_MODEL_RUNNER=0 vllm serve /tmp/big --served-model-name big --host 127.0.0.1 --port $port \
    --max-model-len 2048 --attention-backend TRITON_ATTN --load-format dummy --enforce-eager \
    --cpu-offload-gb "$gb" >"$log" 2>&1 &
  pid=$!
  result=fail
  while kill -0 $pid 2>/dev/null; do
    if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; then
      if curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
          -d '{"model":"big","prompt":"hello","max_tokens":8}' >"$out/bisect-$gb.answer" 2>&1; then
        result=serves
      else
        result=ready-but-request-failed
      fi
      break
    fi
    [ $(( $(date +%s) - t0 )) -gt 300 ] && { result=timeout; break; }
    sleep 2
  done
  kill -INT $pid 2>/dev/null; sleep 3; pkill -KILL -f "vllm serve /tmp/big" 2>/dev/null; wait $pid 2>/dev/null
  sleep 2
  echo "bisect: offload $gb GiB -> $result after $(( $(date +%s) - t0 )) s; $(grep -hE 'Total CPU offloaded|Model loading took|Available KV cache memory|KV cache size|Error|larger than' "$log" | head -6 | tr '\n' '|')"
done
