#!/usr/bin/env bash
# One call on the GPU machine (the device tool): every gpu test, the small tests on the GPU, the CLI, the
# benchmarks. Logs and the loss plot go to $OUT. Needs, in .whl, offline wheels of the test dependencies (nbval,
# pytest, numpy<2.5, ...) for a machine that has torch and numba-cuda but no network.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" && export MPLBACKEND=Agg || exit 1
export PYTHONUNBUFFERED=1 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FP8LAB_BACKEND=gpu
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -m fp8lab.cli info 2>&1 | tee "$OUT/info.txt"
if [[ $what == all || $what == tests ]]; then
  python3 -m pytest -p no:cacheprovider -q -rs -m gpu tests 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
  python3 -m pytest -p no:cacheprovider -q -m "not gpu" tests 2>&1 | tee "$OUT/small-tests-on-gpu.log" | tail -5
fi
if [[ $what == all || $what == notebooks ]]; then
  python3 -m pytest -p no:cacheprovider -q --nbval-lax --nbval-current-env notebooks 2>&1 | tee "$OUT/notebooks.log" | tail -5
fi
if [[ $what == all || $what == train ]]; then
  python3 -m fp8lab.cli train --recipe fp8-tensor --no-progress --plot "$OUT/train_loss.png" --json "$OUT/train.json" 2>&1 | tee "$OUT/train.txt"
fi
if [[ $what == all || $what == bench ]]; then
  python3 -m fp8lab.cli bench all --markdown 2>&1 | tee "$OUT/bench.md"  # all: the kernel modules, then overhead
fi
if [[ $what == all || $what == executed ]]; then
  # the executed copies behind `make site` (copy $OUT/executed/* to docs/executed/ and commit them)
  (unset MPLBACKEND; python3 scripts/site.py execute --out "$OUT/executed") 2>&1 | tee "$OUT/executed.log" | tail -3
fi
