#!/usr/bin/env bash
# rlaccel's GPU checks, as one prepared run for a lent GPU machine (about 5 minutes on one H200):
#   1. the CUDA-graph equivalence tests (tests/equivalence/test_sb3_cuda_graphs.py): stock SB3 vs the graphed
#      fused train() on the GPU, the sparse/dense phases and the device-side NaN skip;
#   2. python -m benchmarks.gpu_bench: gradient steps/s, stock vs fused eager vs fused + CUDA graphs
#      (DQN, SAC, TD3 256-256; NatureCNN DQN at batch 32 and 512), and learn() end to end;
#   3. the ONNX export in TensorRT, only where TensorRT is installed.
# The machine has no network: packages it lacks travel as wheels in .whl/ (see the README's "GPU").
# Logs go to $OUT (the device tool's folder) or /tmp/rlaccel-gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rlaccel-gpu}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD:$PWD/adapters/sb3:$PWD/adapters/tianshou:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, stable_baselines3 as sb3; print('torch', torch.__version__, '| SB3', sb3.__version__)" \
    | tee -a "$OUT/machine.txt"
status=0
timeout 240 python3 -m pytest -q -p no:cacheprovider -s -o addopts="" tests/equivalence/test_sb3_cuda_graphs.py \
    tests/equivalence/test_sb3_collection.py::test_lean_collection_is_sb3s_collection_on_cuda 2>&1 \
    | tee "$OUT/equivalence.log" || status=1
timeout 300 python3 -m benchmarks.gpu_bench --learn --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_bench.log" || status=1
if python3 -c "import tensorrt" 2>/dev/null; then
    echo "TensorRT found: not wired in yet" | tee "$OUT/tensorrt.log"
else
    echo "TensorRT: not installed on this machine, the ONNX-in-TensorRT check is skipped" | tee "$OUT/tensorrt.log"
fi
exit "$status"
