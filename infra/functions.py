"""The Lambda functions of the app: one function per :class:`FunctionDef`.

Contract:
- A zip function runs ``LAMBDA_RUNTIME`` from ``build/lambda`` (see
  infra/lambda_asset.py); a function whose definition names an ``image`` is a
  container-image function (``PackageType: Image``, no Handler/Runtime) built from
  that Dockerfile with command ``[handler]`` on ``IMAGE_ARCHITECTURE`` (see
  infra/lambda_image.py). Either way: X-Ray tracing, its own log group with the
  configured retention, and the shared environment (table and bucket names,
  Powertools service/namespace) plus its own extra variables.
- Permissions are granted by the constructs that own the resources; nothing
  here grants data access.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import METRICS_NAMESPACE, FunctionDef, InfraConfig
from infra.lambda_asset import build_lambda_asset
from infra.lambda_image import IMAGE_ARCHITECTURE, image_code

#: Must match the interpreter that built the asset (binary wheels such as pydantic_core).
LAMBDA_RUNTIME = lambda_.Runtime.PYTHON_3_11


#: what the Lambda asset's fingerprint and copy skip (CDK glob patterns): bytecode compiled in place
ASSET_EXCLUDES = ("**/__pycache__", "**/*.pyc")


class Functions(Construct):
    """``self[key]`` is the function of ``FunctionDef.key``."""

    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        config: InfraConfig,
        definitions: tuple[FunctionDef, ...],
        environment: Mapping[str, str],
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, cid)
        # bytecode is not part of the asset: local Lambda workers run from the same folder and write their
        # __pycache__ there (atomically, through temporary names) while a synth may be hashing it
        code = lambda_.Code.from_asset(str(build_lambda_asset()), exclude=list(ASSET_EXCLUDES))
        self._functions: dict[str, lambda_.Function] = {}
        for d in definitions:
            name = "".join(p.capitalize() for p in d.key.split("_"))
            log_group = logs.LogGroup(self, f"{name}Logs", retention=log_retention)
            if d.image:
                packaging = {"code": image_code(d), "architecture": IMAGE_ARCHITECTURE}
                factory = lambda_.DockerImageFunction
            else:
                packaging = {"code": code, "runtime": LAMBDA_RUNTIME, "handler": d.handler}
                factory = lambda_.Function
            self._functions[d.key] = factory(
                self,
                name,
                **packaging,
                description=d.description,
                timeout=Duration.seconds(d.timeout_s),
                memory_size=d.memory_mb,
                tracing=lambda_.Tracing.ACTIVE,
                log_group=log_group,
                environment={
                    **environment,
                    "POWERTOOLS_SERVICE_NAME": f"{config.prefix}-{d.key.replace('_', '-')}",
                    "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
                    "GPUFLEET_FUNCTION": d.key,
                },
            )

    def __getitem__(self, key: str) -> lambda_.Function:
        return self._functions[key]

    def items(self):
        return self._functions.items()

    def subset(self, keys) -> dict[str, lambda_.Function]:
        return {k: self._functions[k] for k in keys}
