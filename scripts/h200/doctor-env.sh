# Sourced by the device scripts: the kit's vLLM 0.25.1 and the doctor's own google-re2 (which the
# device's python3 lacks, carried as a wheel in .vllm-h200/extra), then PYTHONPATH for both.
# Usage: . scripts/h200/doctor-env.sh LOGDIR   (setup.out and deps.out land in LOGDIR)
_logs=${1:?LOGDIR}
bash .vllm-h200/setup.sh >"$_logs/setup.out" 2>&1 || { echo "setup failed"; tail -20 "$_logs/setup.out"; exit 1; }
. /tmp/site/env.sh
python3 -m pip install -q --no-deps --target /tmp/doctor-deps .vllm-h200/extra/*.whl >"$_logs/deps.out" 2>&1
export PYTHONPATH=.:/tmp/site:/tmp/doctor-deps
# The section-6 model (config only), made once per warm machine.
[ -d /tmp/big ] || python3 scripts/h200/make_big_model.py /tmp/qwen3-0.6b-random /tmp/big >"$_logs/make-big.out" 2>&1
