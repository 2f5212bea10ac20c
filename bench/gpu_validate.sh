#!/usr/bin/env bash
# GPU validation on a lent CUDA machine (see docs/gpu-validation.md).
#   bash bench/gpu_validate.sh tests    # gpu-marked tests, the roofline bench, then the rest of the suite
#   bash bench/gpu_validate.sh benches  # the GPU halves of the benchmarks
#   bash bench/gpu_validate.sh short    # gpu-marked tests, then the closed loop on a GPU-sized GPT (~2 min)
#   bash bench/gpu_validate.sh overhead # the light path and deep steps on CUDA, ~20 ms steps and the small defaults
#   bash bench/gpu_validate.sh e2e      # attach a bf16 GPT; an enforced budget's OOM, its plan, the planned run
#   bash bench/gpu_validate.sh deep     # each deep step of a 25 ms GPT over a light one, and where its time goes
# Logs go to $OUT (the device tool's return folder) or ./gpu-logs. Textual and its
# dependencies may be carried as wheels in .whl/ (the machine has no network).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-logs}"; mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } 2>&1 | tee "$out/env.txt"
stage="${1:-tests}"; shift || true
case "$stage" in
  tests)
    timeout 300 python3 -m pytest -m gpu -v -p no:cacheprovider -rs "$@" 2>&1 | tee "$out/gpu-tests.txt"
    timeout 150 python3 bench/roofline.py 2>&1 | tee "$out/roofline.txt"
    # The rest of the suite on CUDA (the examples pick the GPU themselves); the session timeout
    # lets pytest print its summary even when the lease runs short.
    python3 -m pytest -q -m "not gpu" -n 12 -p no:cacheprovider -rfE --timeout 200 \
      --session-timeout "${SUITE_S:-240}" --junitxml="$out/suite.xml" "$@" > "$out/suite.txt" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$out/suite.txt"
    ;;
  short)
    timeout "${TESTS_S:-240}" python3 -m pytest -m gpu -v -p no:cacheprovider -rs "$@" 2>&1 | tee "$out/gpu-tests.txt"
    echo "== python3 bench/prediction.py (CUDA, 8 x 1024 GPT)" | tee "$out/prediction.txt"
    timeout "${BENCH_S:-200}" python3 bench/prediction.py --steps 22 --apply-at-step 10 --budgets 0.5,0.7 \
      --script-args "--layers 8 --hidden 1024 --seq 1024 --batch 8 --vocab 8192 --heads 16" 2>&1 | tee -a "$out/prediction.txt"
    ;;
  e2e)
    gpt="examples/gpt.py --layers 8 --hidden 1024 --seq 1024 --batch 8 --vocab 8192 --heads 16"
    export ADVISOR_HOME="$out/home"
    python3 -m advisor attach --headless --steps 30 --json "$out/bf16.json" $gpt --steps 30 --dtype bfloat16 \
      > "$out/bf16.txt" 2>&1; echo "bf16 attach: exit $?"
    # 3 GiB: under half the fp32 run's 6.6 GiB peak, over what checkpointing every block needs (2.7)
    python3 -m advisor attach --headless --steps 10 --memory-budget 3GiB --enforce-budget --json "$out/oom.json" \
      $gpt > "$out/oom.txt" 2>&1; echo "enforced budget: exit $?"
    python3 -m advisor plan latest -o "$out/plan.json" 2>&1 | tail -3; echo "plan: exit $?"
    python3 -m advisor attach --headless --steps 10 --memory-budget 3GiB --enforce-budget --plan "$out/plan.json" \
      --json "$out/planned.json" $gpt > "$out/planned.txt" 2>&1; echo "planned run: exit $?"
    rm -rf "$out/home"
    ;;
  overhead)
    # ~20 ms fp32 steps on an H100/H200 (the issue's target step), then the small defaults (3-10 ms)
    gpt="--layers 8 --hidden 1024 --seq 1024 --batch 1 --vocab 8192 --heads 16"
    { echo "== bench/overhead_inproc.py --device cuda --threads 0 --mlp 4096,8,1024 --gpt-args '$gpt'"
      timeout "${BENCH_S:-150}" python3 bench/overhead_inproc.py --device cuda --threads 0 --mlp 4096,8,1024 --gpt-args "$gpt"
      echo "== bench/overhead_inproc.py --device cuda --threads 0 --blocks 16"
      timeout "${BENCH_S:-150}" python3 bench/overhead_inproc.py --device cuda --threads 0 --blocks 16; } 2>&1 | tee -a "$out/overhead.txt"
    ;;
  deep)
    gpt="--layers 8 --hidden 1024 --seq 1024 --batch 1 --vocab 8192 --heads 16"
    timeout "${BENCH_S:-150}" python3 bench/deep_profile.py --device cuda --threads 0 --gpt-args "$gpt" --repeat 3 \
      --callers acquire 2>&1 | tee "$out/deep_profile.txt"
    ;;
  benches)
    for cmd in "bench/offload.py --device cuda --layers 8 --hidden 1024 --seq 1024 --batch 8" \
               "bench/prediction.py --suite" \
               "bench/overhead.py --inproc --threads 0 --device cuda"; do
      echo "== python3 $cmd" | tee -a "$out/benches.txt"
      timeout "${BENCH_S:-170}" python3 $cmd 2>&1 | tail -40 | tee -a "$out/benches.txt"
    done
    ;;
esac
