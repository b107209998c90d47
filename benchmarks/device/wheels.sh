#!/usr/bin/env bash
# Prepare, on a machine with PyPI, the wheels a GPU device machine lacks for benchmarks/device/check.sh.
#
# The device image (see the device tool's KINDS.md) has Python 3.12, CUDA torch, numpy, safetensors,
# sentencepiece, werkzeug, jinja2, requests, pyyaml, ... but not boto3, moto, diffusers or pydantic, and
# it cannot reach PyPI. This downloads our pinned versions (constraints.txt) as cp312 manylinux wheels
# into .whl/ (ignored through .git/info/exclude) for the device run's `carry`. About 50 MiB.
#
# Usage (repo root): bash benchmarks/device/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
# What check.sh imports beyond the device image: the AWS SDK + moto server (S3, DynamoDB), diffusers,
# pydantic, and transformers at our pin (the tiny model's tokenizer and encoder are built against it).
pkgs="boto3 botocore s3transfer jmespath moto xmltodict responses cryptography cffi pycparser flask flask-cors
      blinker itsdangerous py-partiql-parser diffusers transformers huggingface_hub tokenizers pydantic
      pydantic_core annotated-types typing-inspection"
pins=()
for p in $pkgs; do
  pin=$(grep -i -E "^${p//[-_]/[-_]}==" constraints.txt || true)
  [ -n "$pin" ] || { echo "not pinned in constraints.txt: $p" >&2; exit 2; }
  pins+=("$pin")
done
plat=()
for n in 2_28 2_27 2_17 2_34 2_31; do plat+=(--platform "manylinux_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}"
du -sh .whl
ls .whl
