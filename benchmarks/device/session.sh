#!/usr/bin/env bash
# Every prepared GPU check in one device run (the device tool bills each machine start, so they travel together):
#   run(command="bash benchmarks/device/session.sh", carry=[".whl"], timeout_s=540)
# after `bash benchmarks/device/wheels.sh` here. Each step has its own time limit and writes its log to $OUT:
# 1. benchmarks/device/check.sh: the tiny Wan model on the GPU, resume from a snapshot bitwise, and the checkpoint
#    overhead benchmark (ROUNDS rounds);
# 2. benchmarks/gpu_util_check.py: the runtime's NVML sampler against imposed duty cycles 1, 0.5, 0;
# 3. benchmarks/batching.py: jobs per minute, single jobs vs batches of 4, bitwise-equal outputs (64² and 256²).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp}
export OUT PYTHONUNBUFFERED=1
ROUNDS=${ROUNDS:-5} timeout 300 bash benchmarks/device/check.sh; echo "check.sh exit $?"
export PYTHONPATH=/tmp/site:$PWD
timeout 60 python3 benchmarks/gpu_util_check.py --seconds 4 2>&1 | tee "$OUT/gpu_util.log"; echo "gpu_util exit $?"
timeout 120 python3 benchmarks/batching.py --jobs 16 --rounds 3 --steps 10 2>&1 | tee "$OUT/batching64.log"
echo "batching 64 exit $?"
timeout 120 python3 benchmarks/batching.py --jobs 16 --rounds 2 --steps 10 --side 256 2>&1 | tee "$OUT/batching256.log"
echo "batching 256 exit $?"
