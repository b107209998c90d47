"""Point the AWS deployment check (tests/aws/test_aws_container_jobs.py) at a running ``gpufleet dev`` stack.

    eval "$(python tests/aws/local_stack_env.py <state-dir>)"

prints ``export`` lines: the stack's client profile (``GPUFLEET_PROFILE``), the local tools image by digest
(``GPUFLEET_AWS_CHECK_IMAGE``, built from this host's packages into the rootless podman user's store: what the
stack's cloud runner runs), a job timeout for the local runner, and the stack's moto server as the AWS endpoint of
the check's describe calls (``AWS_ENDPOINT_URL`` and the keys moto accepts). Only the environment is local: the
check itself goes through the same API and describe calls as on AWS.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path


def exports(state_dir: Path) -> dict[str, str]:
    from gpufleet.local import oci_image

    manifest = json.loads((state_dir / "stack.json").read_text())
    aws = manifest["aws"]
    reason = oci_image.local_oci_unavailable()
    if reason:
        raise SystemExit(f"tenant containers are unavailable here: {reason}")
    return {
        "GPUFLEET_AWS_CHECK": "1",
        "GPUFLEET_PROFILE": str((state_dir / "profile.json").resolve()),
        "GPUFLEET_AWS_CHECK_IMAGE": oci_image.pinned_ref(oci_image.prepare_local().podman),
        "GPUFLEET_AWS_CHECK_TIMEOUT_S": "300",
        "AWS_ENDPOINT_URL": aws["endpoint_url"],
        "AWS_ACCESS_KEY_ID": aws["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": aws["secret_access_key"],
        "AWS_REGION": aws["region"],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for k, v in exports(Path(argv[0])).items():
        print(f"export {k}={shlex.quote(v)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
