#!/usr/bin/env bash
# Issue 17's check row on the H200: `offload-doctor check` against `nvidia-smi -q`, with the
# breakdown of bench/bench_check.py (imports, each probe alone, the probes overlapped), in the kit's
# environment as scripts/h200/readme_check.sh (its vLLM 0.25.1 on PATH, so the interpreter probe has
# vLLM to read; google-re2 from the carried wheel).
# Usage (device run, kit and .vllm-h200/extra/google-re2 wheel carried):
#   bash scripts/h200/bench_check.sh "$OUT" [ROUNDS] [BASELINE_TREE]
# ROUNDS: default 20. BASELINE_TREE: a folder holding another vllm_offload_doctor/ (e.g. main's,
# carried) to time alongside. Writes $OUT/bench-check.txt (table, then JSON) and $OUT/bench-check.json.
set -u
out=${1:?OUT}; rounds=${2:-20}; base=${3:-}
. scripts/h200/doctor-env.sh "$out"
{
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
    echo "# $(python3 -V 2>&1) at $(command -v python3); vllm on PATH: $(command -v vllm || echo none)"
    python3 bench/bench_check.py -n "$rounds" -o "$out/bench-check.json" ${base:+--baseline "$base"}
    echo "exit $?"
} >"$out/bench-check.txt" 2>&1
cat "$out/bench-check.txt"
