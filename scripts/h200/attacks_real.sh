#!/bin/bash
# Issue 20's attacks against the real vLLM 0.25.1 on the H200, in one device call:
#  1. compare (offload 0 vs 0.5, vLLM's default runner) with secrets planted in the server's flags and
#     environment: none of them may appear in anything compare printed or wrote;
#  2. a compare hung up (SIGHUP, a closed terminal) while its first server is ready: exit 129, no vLLM
#     process left, the lock gone, report.json readable and saying `interrupted`;
#  3. an --out holding a planted `.offload-doctor.lock` link: refused before any server starts, the
#     link's target untouched.
# Usage (device run, kit and .vllm-h200/extra carried): scripts/h200/attacks_real.sh OUTDIR
set -u -o pipefail
out=$1
work=$(mktemp -d)
trap 'tar -czf "$out/attacks.tgz" -C "$work" .' EXIT
. scripts/h200/doctor-env.sh "$work"
say() { echo "$*" | tee -a "$out/summary.txt"; }
servers() { ps -eo pid,args | grep -E "bin/vllm serve|VLLM::EngineCore" | grep -v grep; }
model=(--model /tmp/qwen3-0.6b-random --served-model-name Qwen/Qwen3-0.6B --max-model-len 2048)
vllm_args=(--enforce-eager --attention-backend TRITON_ATTN)

# 1. planted secrets (random each run: nothing of them is in the doctor's source)
hf="hf_$(head -c 64 /dev/urandom | tr -dc 'A-Za-z0-9' | head -c 34)"
key="sk-proj-$(head -c 96 /dev/urandom | tr -dc 'A-Za-z0-9' | head -c 48)"
pw="$(head -c 64 /dev/urandom | tr -dc 'A-Za-z0-9' | head -c 20)"
HF_TOKEN=$hf HF_ENDPOINT="https://user:$pw@hub.example.invalid" \
  python3 -m vllm_offload_doctor compare "${model[@]}" --offload-gb 0.5 --repeats 2 --warmup 1 \
  --max-tokens 16 --out "$work/secrets" -- "${vllm_args[@]}" --api-key "$key" \
  >"$work/secrets.stdout" 2>"$work/secrets.stderr"
say "1. compare with planted secrets: exit $?"
leaks=$(grep -rl -F -e "$hf" -e "$key" -e "$pw" "$work/secrets" "$work/secrets.stdout" "$work/secrets.stderr" | wc -l)
say "   files holding a planted secret: $leaks (of $(find "$work/secrets" -type f | wc -l) artifacts + stdout + stderr)"
say "   verdict: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["verdict"]["status"], [m["status"] for m in r["modes"]])' "$work/secrets/report.json")"
say "   vLLM processes left: $(servers | wc -l)"

# 2. SIGHUP once the first server is ready
python3 -m vllm_offload_doctor compare "${model[@]}" --offload-gb 0.5 --repeats 50 --warmup 1 \
  --out "$work/hup" -- "${vllm_args[@]}" >"$work/hup.stdout" 2>"$work/hup.stderr" &
doctor=$!
for _ in $(seq 240); do grep -q "ready in" "$work/hup.stderr" && break; sleep 1; done
sleep 2
say "2. at SIGHUP: $(grep -c 'ready in' "$work/hup.stderr") server(s) ready, vLLM processes: $(servers | wc -l)"
kill -HUP $doctor
wait $doctor
say "   exit $? (129 expected)"
sleep 2
say "   vLLM processes left 2 s later: $(servers | wc -l)"
servers >>"$out/summary.txt"
say "   lock left: $(ls -A "$work/hup" | grep -c offload-doctor.lock)"
say "   report: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print([m["status"] for m in r["modes"]])' "$work/hup/report.json")"

# 3. a planted lock link
mkdir "$work/planted" && echo "the victim's own words" >"$work/victim"
ln -s "$work/victim" "$work/planted/.offload-doctor.lock"
start=$(date +%s.%N)
python3 -m vllm_offload_doctor compare "${model[@]}" --out "$work/planted" -- "${vllm_args[@]}" \
  >"$work/planted.stdout" 2>"$work/planted.stderr"
rc=$?
say "3. planted lock link: exit $rc in $(python3 -c "import time; print(round(time.time() - $start, 2))") s: $(tail -1 "$work/planted.stderr")"
say "   victim: $(cat "$work/victim"); vLLM processes: $(servers | wc -l)"
tail -30 "$work/secrets.stderr"
