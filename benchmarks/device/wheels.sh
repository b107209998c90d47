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
# pydantic-settings (the runtime's settings), and huggingface_hub's own HTTP stack at our pin (httpx2, httpcore2,
# truststore): found by importing what benchmarks/device/check.sh runs and listing the distributions loaded.
pkgs="boto3 botocore s3transfer jmespath moto xmltodict responses cryptography cffi pycparser flask flask-cors
      blinker itsdangerous py-partiql-parser diffusers transformers huggingface_hub tokenizers pydantic
      pydantic_core annotated-types typing-inspection pydantic-settings python-dotenv httpx2 httpcore2 truststore"
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
# The working tree and the carried wheels travel together under the device tool's 64 MiB: botocore's wheel (17 MB)
# carries every AWS service's model; keep only the services the device check's moto and clients touch.
python3 - <<'PY'
import glob, zipfile
keep = {"dynamodb", "dynamodbstreams", "s3", "sts", "sqs", "sso", "sso-oidc", "stepfunctions", "events", "batch",
        "lambda", "iam", "secretsmanager", "kms", "logs", "cloudwatch"}
for path in glob.glob(".whl/botocore-*.whl"):
    with zipfile.ZipFile(path) as z:
        items = [(i, z.read(i)) for i in z.infolist()]
    def kept(name):
        parts = name.split("/")
        return not (len(parts) > 3 and parts[:2] == ["botocore", "data"] and parts[2] not in keep)
    items = [(i, b) for i, b in items if kept(i.filename)]
    names = {i.filename for i, _ in items}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i, b in items:
            if i.filename.endswith(".dist-info/RECORD"):
                b = "".join(line + "\n" for line in b.decode().splitlines() if line.split(",")[0] in names).encode()
            z.writestr(i, b)
PY
du -sh .whl
