#!/usr/bin/env bash
# The GPU device check for the generate stage and the checkpoint-overhead target, as one prepared run.
#
# Run on a device machine through the device tool, from the repo root, with the wheels from
# benchmarks/device/wheels.sh carried:   run(command="bash benchmarks/device/check.sh", carry=[".whl"],
# timeout_s=540). Here (CPU), `DEVICE=cpu PYTHON=.venv/bin/python bash benchmarks/device/check.sh` runs
# the same steps on the CPU.
#
# 1. the tiny Wan model generates on the device, and a run interrupted at step k and resumed from its
#    serialized snapshot ends with the same latents as an uninterrupted run (bitwise, and the largest
#    difference if not: GPU kernels may be nondeterministic);
# 2. benchmarks/checkpoint_overhead.py on the device (ABA rounds, A/A control), printing its JSON line.
# Everything it prints also goes to $OUT/device_check.log when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEV=${DEVICE:-cuda}
LOG=${OUT:-/tmp}/device_check.log
exec > >(tee "$LOG") 2>&1
if [ -z "${PYTHON:-}" ] && ls .whl/*.whl > /dev/null 2>&1; then  # the device: carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY - "$DEV" <<'PY' || exit 4
import sys, time
import torch
from gpufleet.models.tiny_wan import build_tiny_wan
from gpufleet.runtime import denoise
from gpufleet.runtime.device import torch_device

device = torch_device(sys.argv[1])
print("torch", torch.__version__, "device", device, torch.cuda.get_device_name() if device != "cpu" else "")
pipe = build_tiny_wan()
pipe.to(device)
req = denoise.GenerationRequest("a red fox running in snow", "", 9, 256, 256, 12, 0, 5.0, 16)

def run(stop_at=None):
    state = denoise.start(pipe, req, "check")
    while state.next_step < req.steps:
        if stop_at is not None and state.next_step == stop_at:
            blob = denoise.serialize(denoise.snapshot(pipe, state))
            state = denoise.restore(pipe, denoise.deserialize(blob))  # what a fresh process does on resume
            stop_at = None
        denoise.denoise_step(pipe, req, state)
    return state.latents

t = time.perf_counter()
full = run()
print(f"uninterrupted: {(time.perf_counter() - t) * 1000 / req.steps:.1f} ms/step on {full.device}")
for k in (0, 1, 6, 11):
    resumed = run(k)
    same = torch.equal(full, resumed)
    print(f"resume at step {k}: bitwise {'identical' if same else 'DIFFERENT'}, "
          f"max |diff| {(full - resumed).abs().max().item():.3g}")
frames = denoise.decode(pipe, full)
print("decoded", frames.shape, frames.dtype)
PY
$PY benchmarks/checkpoint_overhead.py --device "$DEV" --threads "${THREADS:-4}" --rounds "${ROUNDS:-9}" \
  --side "${SIDE:-256}" --steps "${STEPS:-50}"
