"""CDK entry point: ``cdk synth`` runs ``python -m infra.app`` (see cdk.json).

Contract: :func:`build_app` builds the app from context (``gpufleet:*`` keys,
see infra/config.py), applies the cdk-nag AwsSolutions pack with the reasoned
suppressions of infra/nag.py, and returns it; :func:`synth` returns the cloud
assembly. Synthesis needs node but no AWS credentials, no network and no Docker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
import cdk_nag

from infra.config import STACK_NAME, InfraConfig
from infra.nag import acknowledge_findings
from infra.stack import GpufleetStack


def build_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> tuple[cdk.App, GpufleetStack]:
    kwargs: dict[str, Any] = {}
    if context:
        kwargs["context"] = dict(context)
    if outdir:
        kwargs["outdir"] = outdir
    app = cdk.App(**kwargs)
    config = InfraConfig.from_context(app.node.try_get_context)
    env = None
    account, region = os.environ.get("CDK_DEFAULT_ACCOUNT"), os.environ.get("CDK_DEFAULT_REGION")
    if account and region:
        env = cdk.Environment(account=account, region=region)
    stack = GpufleetStack(app, STACK_NAME, config=config, env=env, description="gpufleet control plane and compute")
    acknowledge_findings(stack)
    cdk.Validations.of(app).add_plugins(cdk_nag.AwsSolutionsChecks(app, verbose=True))
    return app, stack


def synth(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> cdk.cx_api.CloudAssembly:
    app, _ = build_app(context, outdir)
    return app.synth()


def main() -> None:
    synth()


if __name__ == "__main__":
    main()
