"""Deploy a synthesized cloud assembly into moto, the way ``cdk deploy`` does into AWS.

Contract:
- :func:`deploy` publishes the assembly's file assets to the bootstrap bucket
  ``cdk-hnb659fds-assets-<account>-<region>`` (directories zipped, zips cached
  next to the assembly), writes the bootstrap version parameter
  ``/cdk-bootstrap/hnb659fds/version``, runs ``CreateStack`` with the
  synthesized template and fails with the stack's failure events unless it
  reaches ``CREATE_COMPLETE``.
- Docker image assets are not built (they are listed in ``Deployment.unbuilt_images``):
  the local Batch runner runs the runtime itself, and an image Lambda (CheckPrompt) runs
  in-process from its staged build context, which ``Deployment.assets`` maps from the image
  tag (the asset hash its ``Code.ImageUri`` ends with).
- moto's CloudFormation creates state machines in the plain Step Functions
  backend; :func:`register_state_machines` copies each one (same name, so the
  same ARN) into the executing (parser) backend. This needs the moto backends
  in this process: in-process ``mock_aws`` or a ``ThreadedMotoServer``.
- Clients come from ``client_factory(service)`` so the caller decides the endpoint.
"""

from __future__ import annotations

import fcntl
import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import ConfigError

BOOTSTRAP_QUALIFIER = "hnb659fds"
BOOTSTRAP_VERSION = "30"
CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]

ClientFactory = Callable[[str], Any]


@dataclass
class Deployment:
    stack_name: str
    stack_id: str
    account: str
    region: str
    assembly_dir: Path
    outputs: dict[str, str]
    #: logical id -> physical id of every created resource
    resources: dict[str, str]
    #: asset hash -> asset directory: a zip asset (what a zip Lambda's S3Key names) or an image's
    #: staged build context (what an image Lambda's ImageUri tag names)
    assets: dict[str, Path]
    unbuilt_images: list[str] = field(default_factory=list)


def _substitute(text: str, account: str, region: str) -> str:
    return text.replace("${AWS::AccountId}", account).replace("${AWS::Region}", region).replace(
        "${AWS::Partition}", "aws"
    )


def _zip_dir(src: Path, cache: Path) -> Path:
    """Zip ``src`` once (deterministic order) into ``cache``; concurrent callers share the result."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cache.is_file():
            return cache
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for path in sorted(src.rglob("*")):
                if path.is_file():
                    zf.write(path, path.relative_to(src).as_posix())
        tmp.rename(cache)
    return cache


def publish_assets(assembly_dir: Path, stack_name: str, s3: Any, account: str, region: str) -> tuple[dict, list]:
    manifest = json.loads((assembly_dir / f"{stack_name}.assets.json").read_text())
    assets: dict[str, Path] = {}
    for digest, asset in manifest.get("files", {}).items():
        src = assembly_dir / asset["source"]["path"]
        packaging = asset["source"].get("packaging", "file")
        if packaging == "zip" and src.is_dir():
            body_path = _zip_dir(src, assembly_dir / ".zips" / f"{digest}.zip")
            assets[digest] = src
        else:
            body_path = src
        for dest in asset["destinations"].values():
            bucket = _substitute(dest["bucketName"], account, region)
            s3.put_object(Bucket=bucket, Key=_substitute(dest["objectKey"], account, region), Body=body_path.read_bytes())
    images = []
    for digest, asset in manifest.get("dockerImages", {}).items():
        images.append(asset.get("displayName", digest))
        for dest in asset["destinations"].values():
            assets[dest.get("imageTag", digest)] = assembly_dir / asset["source"]["directory"]
    return assets, images


def bootstrap(s3: Any, ssm: Any, account: str, region: str) -> str:
    """The parts of ``cdk bootstrap`` a deploy needs: the assets bucket and the version parameter."""
    bucket = f"cdk-{BOOTSTRAP_QUALIFIER}-assets-{account}-{region}"
    kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        s3.create_bucket(Bucket=bucket, **kwargs)
    ssm.put_parameter(
        Name=f"/cdk-bootstrap/{BOOTSTRAP_QUALIFIER}/version", Value=BOOTSTRAP_VERSION, Type="String", Overwrite=True
    )
    return bucket


def register_state_machines(account: str, region: str, arns: list[str]) -> None:
    """Copy CloudFormation-created state machines into moto's executing backend (same name and ARN)."""
    from moto.stepfunctions.models import stepfunctions_backends
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    plain = stepfunctions_backends[account][region]
    executing = stepfunctions_parser_backends[account][region]
    for arn in arns:
        sm = plain.describe_state_machine(arn)
        if any(m.arn == arn for m in executing.state_machines):
            continue
        created = executing.create_state_machine(
            name=sm.name,
            definition=sm.definition,
            roleArn=sm.roleArn,
            loggingConfiguration=sm.loggingConfiguration,
            tracingConfiguration=sm.tracingConfiguration,
        )
        if created.arn != arn:
            raise ConfigError(f"re-registered state machine has ARN {created.arn}, expected {arn}")


def deploy(
    assembly_dir: Path,
    client_factory: ClientFactory,
    *,
    stack_name: str | None = None,
    account: str = "123456789012",
    region: str = "us-east-1",
) -> Deployment:
    """Publish assets, create the stack, re-register its state machines; return what was deployed."""
    from infra.config import STACK_NAME

    stack_name = stack_name or STACK_NAME
    s3, ssm, cfn = client_factory("s3"), client_factory("ssm"), client_factory("cloudformation")
    bootstrap(s3, ssm, account, region)
    assets, images = publish_assets(assembly_dir, stack_name, s3, account, region)
    template_body = (assembly_dir / f"{stack_name}.template.json").read_text()
    stack_id = cfn.create_stack(StackName=stack_name, TemplateBody=template_body, Capabilities=CAPABILITIES)["StackId"]
    stack = cfn.describe_stacks(StackName=stack_id)["Stacks"][0]
    if stack["StackStatus"] != "CREATE_COMPLETE":
        events = cfn.describe_stack_events(StackName=stack_id)["StackEvents"]
        failed = [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in events if "FAILED" in e["ResourceStatus"]]
        raise ConfigError(f"stack {stack_name} is {stack['StackStatus']}: {failed}")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    resources = {
        r["LogicalResourceId"]: r.get("PhysicalResourceId", "")
        for r in cfn.list_stack_resources(StackName=stack_id)["StackResourceSummaries"]
    }
    template = json.loads(template_body)
    machines = [
        resources[lid]
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::StepFunctions::StateMachine" and resources.get(lid)
    ]
    register_state_machines(account, region, machines)
    return Deployment(stack_name, stack_id, account, region, assembly_dir, outputs, resources, assets, images)
