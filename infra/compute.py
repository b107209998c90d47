"""Compute construct: AWS Batch for cloud GPU attempts and the CPU finalize stage.

Contract:
- A VPC (public + private-with-egress subnets over two AZs, flow logs on) hosts
  three managed EC2 compute environments: GPU spot
  (``SPOT_PRICE_CAPACITY_OPTIMIZED``), GPU on-demand (``BEST_FIT_PROGRESSIVE``)
  and CPU on-demand for Finalize. Each has an explicit Batch service role.
- Cloud gangs: a fourth managed EC2 compute environment, GPU on-demand (AWS Batch runs no multi-node
  parallel job on Spot), in one subnet and a *cluster* placement group (one Availability Zone, close
  instances: what Batch advises for multi-node parallel jobs), with its own security group that lets its
  members reach each other on every TCP port (rendezvous, gloo/NCCL connections) and nothing else in; the
  queue ``<prefix>-gpu-gang`` (the default ``cloud-gang`` pool's) and the multi-node parallel job definition
  ``<prefix>-gpu-gang``: the GPU definition's container (same image, command, job role, logs) on every node
  of the open range ``0:``, main node 0, two nodes by default (SubmitJob's ``NodeOverrides`` set the count and
  each node's GPUs/vCPUs/memory: :func:`gpufleet.batchdef.node_overrides`). Multi-node parallel jobs run in
  ``awsvpc`` mode: each node's container has its own network interface with that security group.
- Job queues ``<prefix>-gpu-spot``, ``<prefix>-gpu-ondemand``, ``<prefix>-gpu-gang`` (the names cloud
  pools reference in ``gpufleet/pools.py``) and ``<prefix>-cpu``; job
  definitions ``<prefix>-gpu`` (1 GPU) and ``<prefix>-cpu``, both from the
  ``gpu_container`` image (built as a Docker image asset at deploy time, or
  the registry image in ``gpu_image`` context), running
  ``python -m gpufleet.runtime``; the envelope is passed per job via
  ``ContainerOverrides``.
- Every compute environment launches its instances from a launch template with IMDSv2
  required and ``HttpPutResponseHopLimit`` 1, so containers cannot reach the instance role: the CPU environment
  from ``WorkerLaunchTemplate``, the GPU ones (spot, on-demand, gang) from ``GpuWorkerLaunchTemplate``, whose user
  data (MIME multipart, as Batch requires) prepares the **host cache** (``gpu_host_cache_gib`` > 0):
  :data:`HOST_CACHE` on the instance store when the instance type has one (formatted and mounted at
  ``/var/lib/gpufleet``), else on the root volume, owned by the image's user (uid :data:`RUNTIME_UID`), mode 0700.
  The GPU definitions (single and gang) mount it at the image's ``GPUFLEET_CACHE_DIR`` and bound it with
  ``GPUFLEET_CACHE_MAX_BYTES``: back-to-back jobs on an instance load a published model once
  (:mod:`gpufleet.runtime.hostcache`; the runtime evicts, :func:`gpufleet.runtime.generate.evict_host_cache`).
  Only the platform's runtime mounts it: tenant containers' per-image definitions do not.
  Cloud container jobs run their own image under a per-image-digest multi-container definition
  (:mod:`gpufleet.batchdef`, no task role).
- Cloud container jobs' per-image definitions (registered at dispatch, :mod:`gpufleet.nodeapi.cloud_dispatch`, named
  ``<prefix>-tenant-*``) have no task role; their task execution role is ``self.tenant_execution_role``
  (``TenantExecutionRole``: pull images from this account's ECR repositories and write the task's log streams in
  ``self.job_log_group``, nothing else), and their supervisor image is ``self.runtime_image_uri`` (the runtime image
  of the GPU definition).
- Two job roles, one per job definition: ``RunJobRole`` (``self.run_job_role``) for the GPU definition's
  attempts (the generate stage, which runs a diffusion model on tenants' prompts, and the container stage)
  and ``FinalizeJobRole`` (``self.finalize_job_role``) for the CPU definition's finalize stage. Their data
  grants (infra/orchestration.py) follow what each stage calls (the control-plane survey checks both).
- The GPU definitions' containers (single and gang) name the deployment's published models in
  ``GPUFLEET_MODEL_S3_ROOT`` (``models_root``: ``s3://<models bucket>/models/``, :attr:`infra.data.Data.models_root`).
- ``SigningSecret`` (Secrets Manager) holds the production C2PA key and chain (JSON
  ``{private_key_pem, chain_pem}``; the template generates a placeholder the operator replaces with
  ``put-secret-value``, docs/operations.md). The finalize job definition names it in
  ``GPUFLEET_SIGNING_SECRET_ID``; only the finalize stage's roles may read it — the finalize job role and the
  finalize Lambda's role (``FinalizeLambda``, :meth:`Compute.add_signing_reader`: an identity grant of
  ``GetSecretValue``, and the resource policy denying it to every principal but ``signing_readers``, the run job
  role included; the stack seals it once every reader is named); no other role, the GPU job definition's environment or the template holds the key.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Size, Stack
from aws_cdk import aws_batch as batch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from gpufleet.errors import ConfigError
from infra.config import InfraConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = "gpu_container/Dockerfile"
#: Build-context exclusions (the context is the repository root so the image gets ``gpufleet``).
IMAGE_EXCLUDES = [
    ".git",
    ".venv",
    "cdk.out",
    "build",
    "tests",
    "benchmarks",
    "docs",
    "**/__pycache__",
    "*.egg-info",
    ".dev",
    ".gpufleet",
    "out",
    # tool caches: they change on every test run and would change the image's asset hash
    ".ci",
    ".hypothesis",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
]
RUNTIME_COMMAND = ["python", "-m", "gpufleet.runtime"]
#: the GPU instances' host cache (prepared by the GPU launch template's user data) and where the runtime finds it:
#: the image's own GPUFLEET_CACHE_DIR (gpu_container/Dockerfile), owned by the image's user
HOST_CACHE = "/var/lib/gpufleet/cache"
RUNTIME_CACHE_DIR = "/var/lib/gpufleet/cache"
RUNTIME_UID = 10001

#: user data of the GPU instances (a shell part of Batch's MIME multipart user data), run before the ECS agent
#: starts: the instance store (local NVMe: g5, g6) formatted and mounted at /var/lib/gpufleet when there is one and
#: nothing is mounted there yet, else the root volume; then the cache folder for the runtime's user alone
HOST_CACHE_SCRIPT = f"""set -euo pipefail
base=/var/lib/gpufleet
cache={HOST_CACHE}
uid={RUNTIME_UID}
mkdir -p "$base"
dev=$(for d in /dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*; do [ -e "$d" ] && readlink -f "$d"; done \\
      | sort -u | head -n 1 || true)
if [ -n "$dev" ] && ! mountpoint -q "$base"; then
  mkfs.xfs -f "$dev" && mount -o noatime "$dev" "$base" || echo "gpufleet: instance store $dev not mounted" >&2
fi
mkdir -p "$cache"
chown "$uid:$uid" "$cache"
chmod 0700 "$cache"
"""


def host_cache_user_data() -> ec2.UserData:
    """The GPU launch template's user data: :data:`HOST_CACHE_SCRIPT` as Batch wants it (MIME multipart)."""
    shell = ec2.UserData.for_linux()
    shell.add_commands(*HOST_CACHE_SCRIPT.splitlines())
    multipart = ec2.MultipartUserData()
    multipart.add_part(ec2.MultipartBody.from_user_data(shell))
    return multipart



class Compute(Construct):
    def __init__(self, scope: Construct, cid: str, *, config: InfraConfig, log_retention: logs.RetentionDays,
                 models_root: str | None = None) -> None:
        super().__init__(scope, cid)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="workers",
                    subnet_type=(
                        ec2.SubnetType.PRIVATE_WITH_EGRESS if config.nat_gateways else ec2.SubnetType.PRIVATE_ISOLATED
                    ),
                    cidr_mask=20,
                ),
            ],
        )
        flow_log_group = logs.LogGroup(self, "FlowLogs", retention=log_retention)
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group))
        workers = ec2.SubnetSelection(subnet_group_name="workers")
        self.security_group = ec2.SecurityGroup(
            self, "WorkerSg", vpc=self.vpc, description="Batch workers: egress only", allow_all_outbound=True
        )
        service_role = iam.Role(
            self,
            "BatchServiceRole",
            assumed_by=iam.ServicePrincipal("batch.amazonaws.com"),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("service-role/AWSBatchServiceRole")],
        )
        # Instance metadata for the workers: IMDSv2 only, and a PUT response hop limit of 1, so a process in
        # a container (one network hop behind the instance) cannot get a token, hence no instance role.
        imds = dict(http_endpoint=True, http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
                    http_put_response_hop_limit=1, require_imdsv2=True)
        self.launch_template = ec2.LaunchTemplate(self, "WorkerLaunchTemplate", **imds)
        self.gpu_launch_template = ec2.LaunchTemplate(
            self, "GpuWorkerLaunchTemplate", user_data=host_cache_user_data() if config.gpu_host_cache_gib else None,
            **imds)
        common = dict(
            vpc=self.vpc,
            launch_template=self.launch_template,
            vpc_subnets=workers,
            security_groups=[self.security_group],
            service_role=service_role,
            minv_cpus=0,
            use_optimal_instance_classes=False,
            update_to_latest_image_version=True,
        )
        gpu_types = [ec2.InstanceType(t) for t in config.gpu_instance_types]
        gpu_common = {**common, "launch_template": self.gpu_launch_template}
        self.spot_env = batch.ManagedEc2EcsComputeEnvironment(
            self,
            "GpuSpot",
            spot=True,
            allocation_strategy=batch.AllocationStrategy.SPOT_PRICE_CAPACITY_OPTIMIZED,
            instance_types=gpu_types,
            images=[batch.EcsMachineImage(image_type=batch.EcsMachineImageType.ECS_AL2_NVIDIA)],
            maxv_cpus=config.spot_max_vcpus,
            **gpu_common,
        )
        self.ondemand_env = batch.ManagedEc2EcsComputeEnvironment(
            self,
            "GpuOnDemand",
            allocation_strategy=batch.AllocationStrategy.BEST_FIT_PROGRESSIVE,
            instance_types=gpu_types,
            images=[batch.EcsMachineImage(image_type=batch.EcsMachineImageType.ECS_AL2_NVIDIA)],
            maxv_cpus=config.ondemand_max_vcpus,
            **{**gpu_common, "minv_cpus": config.ondemand_min_vcpus},
        )
        self.cpu_env = batch.ManagedEc2EcsComputeEnvironment(
            self,
            "Cpu",
            allocation_strategy=batch.AllocationStrategy.BEST_FIT_PROGRESSIVE,
            instance_types=[ec2.InstanceType(t) for t in config.cpu_instance_types],
            maxv_cpus=config.cpu_max_vcpus,
            **common,
        )
        # Cloud gangs: multi-node parallel jobs need on-demand capacity; one subnet and a cluster placement group
        # keep a gang's instances together, and only the gang environment's members may reach each other.
        self.gang_security_group = ec2.SecurityGroup(
            self, "GangWorkerSg", vpc=self.vpc, allow_all_outbound=True,
            description="Batch gang workers: egress, and TCP between the gang environment members only",
        )
        self.gang_security_group.add_ingress_rule(
            self.gang_security_group, ec2.Port.all_tcp(), "gang members: rendezvous and collectives"
        )
        self.gang_placement_group = ec2.CfnPlacementGroup(self, "GangPlacementGroup", strategy="cluster")
        gang_common = {**gpu_common, "security_groups": [self.gang_security_group],
                       "vpc_subnets": ec2.SubnetSelection(subnet_group_name="workers", one_per_az=True,
                                                          availability_zones=[self.vpc.availability_zones[0]])}
        self.gang_env = batch.ManagedEc2EcsComputeEnvironment(
            self,
            "GpuGang",
            allocation_strategy=batch.AllocationStrategy.BEST_FIT_PROGRESSIVE,
            instance_types=gpu_types,
            images=[batch.EcsMachineImage(image_type=batch.EcsMachineImageType.ECS_AL2_NVIDIA)],
            maxv_cpus=config.gang_max_vcpus,
            **gang_common,
        )
        # Ref (the group's name), as CloudFormation documents it for a compute environment's PlacementGroup
        self.gang_env.node.default_child.add_property_override("ComputeResources.PlacementGroup",
                                                               {"Ref": self.gang_placement_group.logical_id})
        for env in (self.spot_env, self.ondemand_env, self.gang_env, self.cpu_env):
            # The L2 renders "managed"; CloudFormation documents (and moto requires) the upper-case value.
            env.node.default_child.add_property_override("Type", "MANAGED")
        self.gpu_spot_queue = batch.JobQueue(
            self,
            "GpuSpotQueue",
            job_queue_name=config.name("gpu-spot"),
            priority=10,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=self.spot_env, order=1)],
        )
        self.gpu_ondemand_queue = batch.JobQueue(
            self,
            "GpuOnDemandQueue",
            job_queue_name=config.name("gpu-ondemand"),
            priority=10,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=self.ondemand_env, order=1)],
        )
        self.gpu_gang_queue = batch.JobQueue(
            self,
            "GpuGangQueue",
            job_queue_name=config.name("gpu-gang"),
            priority=10,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=self.gang_env, order=1)],
        )
        self.cpu_queue = batch.JobQueue(
            self,
            "CpuQueue",
            job_queue_name=config.name("cpu"),
            priority=1,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=self.cpu_env, order=1)],
        )

        image = self._image(config)
        tasks = iam.ServicePrincipal("ecs-tasks.amazonaws.com")
        self.run_job_role = iam.Role(
            self, "RunJobRole", assumed_by=tasks,
            description="Batch run attempts (generate, container stages): job items and objects, never the signing key",
        )
        self.finalize_job_role = iam.Role(
            self, "FinalizeJobRole", assumed_by=tasks,
            description="Batch finalize stage: job items and outputs, and the only reader of the C2PA signing key",
        )
        self.signing_secret = secretsmanager.Secret(
            self,
            "SigningSecret",
            description="gpufleet C2PA signing key and certificate chain (JSON {private_key_pem, chain_pem}), read "
            "only by the finalize stage's Batch job role",
            generate_secret_string=secretsmanager.SecretStringGenerator(password_length=32, exclude_punctuation=True),
            removal_policy=RemovalPolicy.RETAIN if config.removal == "retain" else RemovalPolicy.DESTROY,
        )
        #: the roles that may read the signing secret: the finalize stage's (this Batch job role, and the finalize
        #: Lambda's role once :meth:`add_signing_reader` names it); :meth:`seal_signing_secret` denies every other
        self.signing_readers: list[iam.IRole] = []
        self.add_signing_reader(self.finalize_job_role)
        # The watermark keys (gpufleet.provenance.keys.watermark_keys_from_secret): a random seed generated at deploy,
        # so every finalize container of the deployment embeds under the same key and the API's provenance lookup
        # detects with it; read by the finalize roles and the API only (sealed like the signing secret).
        self.watermark_secret = secretsmanager.Secret(
            self,
            "WatermarkSecret",
            description="gpufleet watermark keys (JSON {seed} generated at deploy, or {keys_hex: [...]} to rotate), "
            "read only by the finalize stage's roles and the API's provenance lookup",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                secret_string_template="{}", generate_string_key="seed", password_length=64,
                exclude_punctuation=True),
            removal_policy=RemovalPolicy.RETAIN if config.removal == "retain" else RemovalPolicy.DESTROY,
        )
        #: the roles that may read the watermark secret (:meth:`add_watermark_reader`); sealed by
        #: :meth:`seal_signing_secret` too
        self.watermark_readers: list[iam.IRole] = []
        self.add_watermark_reader(self.finalize_job_role)
        self.job_log_group = logs.LogGroup(self, "JobLogs", retention=log_retention)
        # cloud container jobs (per-image definitions, no task role): the execution role pulls the images and writes
        # the containers' log streams, nothing else; no container of the task can use it (ECS uses it to start them)
        self.tenant_execution_role = iam.Role(
            self, "TenantExecutionRole", assumed_by=tasks,
            description="Task execution role of cloud container jobs' definitions: image pull and logs only",
        )
        self.tenant_execution_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))  # no resource-level scope
        self.tenant_execution_role.add_to_principal_policy(iam.PolicyStatement(
            actions=["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"],
            resources=[Stack.of(self).format_arn(service="ecr", resource="repository", resource_name="*")]))
        self.tenant_execution_role.add_to_principal_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.job_log_group.log_group_arn]))  # arn:...:log-group:<name>:* (its streams)
        log_driver = ecs.LogDrivers.aws_logs(stream_prefix="job", log_group=self.job_log_group)

        gpu_env: dict[str, str] = {}
        if models_root:  # published models (the models bucket's models/, read-only to the run role)
            gpu_env["GPUFLEET_MODEL_S3_ROOT"] = models_root
        if config.gpu_host_cache_gib:
            gpu_env["GPUFLEET_CACHE_DIR"] = RUNTIME_CACHE_DIR
            gpu_env["GPUFLEET_CACHE_MAX_BYTES"] = str(config.gpu_host_cache_gib * 2**30)

        def gpu_container(cid: str) -> batch.EcsEc2ContainerDefinition:
            """The platform's GPU runtime container (one job's, or one gang node's), with the host cache mounted."""
            return batch.EcsEc2ContainerDefinition(
                self, cid, image=image, cpu=config.gpu_job_vcpus, memory=Size.mebibytes(config.gpu_job_memory_mib),
                gpu=1, command=RUNTIME_COMMAND, job_role=self.run_job_role, logging=log_driver,
                readonly_root_filesystem=False, environment=gpu_env or None,
                volumes=[batch.HostVolume(name="host-cache", host_path=HOST_CACHE, container_path=RUNTIME_CACHE_DIR)]
                if config.gpu_host_cache_gib else None,
            )

        self.gpu_job_definition = batch.EcsJobDefinition(
            self,
            "GpuJob",
            job_definition_name=config.name("gpu"),
            timeout=Duration.seconds(config.run_timeout_seconds),
            retry_attempts=1,
            container=gpu_container("GpuContainer"),
        )
        # One node range, open-ended (0:), so SubmitJob's NodeOverrides.NumNodes may set the gang's size.
        self.gpu_gang_job_definition = batch.MultiNodeJobDefinition(
            self,
            "GpuGangJob",
            job_definition_name=config.name("gpu-gang"),
            timeout=Duration.seconds(config.run_timeout_seconds),
            retry_attempts=1,
            main_node=0,
            containers=[batch.MultiNodeContainer(start_node=0, end_node=1, container=gpu_container("GpuGangContainer"))],
        )
        self.gpu_gang_job_definition.node.default_child.add_property_override(
            "NodeProperties.NodeRangeProperties.0.TargetNodes", "0:"
        )
        self.cpu_job_definition = batch.EcsJobDefinition(
            self,
            "CpuJob",
            job_definition_name=config.name("cpu"),
            timeout=Duration.seconds(config.finalize_timeout_seconds),
            retry_attempts=1,
            container=batch.EcsEc2ContainerDefinition(
                self,
                "CpuContainer",
                image=image,
                cpu=config.cpu_job_vcpus,
                memory=Size.mebibytes(config.cpu_job_memory_mib),
                command=RUNTIME_COMMAND,
                job_role=self.finalize_job_role,
                logging=log_driver,
                environment={"GPUFLEET_SIGNING_SECRET_ID": self.signing_secret.secret_arn,
                             "GPUFLEET_WATERMARK_SECRET_ID": self.watermark_secret.secret_arn},
            ),
        )

    def add_signing_reader(self, role: iam.IRole) -> None:
        """Let ``role`` (a finalize stage's) read the C2PA signing secret: an identity grant, and the secret's resource
        policy stops denying it."""
        _grant_read(self.signing_secret, role)
        self.signing_readers.append(role)

    def add_watermark_reader(self, role: iam.IRole) -> None:
        """Let ``role`` (a finalize stage's, or the API's lookup) read the watermark secret (as
        :meth:`add_signing_reader`)."""
        _grant_read(self.watermark_secret, role)
        self.watermark_readers.append(role)

    def seal_signing_secret(self) -> None:
        """The signing and watermark secrets' resource policies: ``GetSecretValue`` denied to every principal but
        their readers (called once, by the stack, after every reader is named)."""
        _seal(self.signing_secret, self.signing_readers)
        _seal(self.watermark_secret, self.watermark_readers)

    @staticmethod
    def _image_asset_path() -> Path:
        return REPO_ROOT / DOCKERFILE

    def _image(self, config: InfraConfig) -> ecs.ContainerImage:
        if config.gpu_image:
            self.runtime_image_uri = config.gpu_image
            return ecs.ContainerImage.from_registry(config.gpu_image)
        if not self._image_asset_path().is_file():
            raise ConfigError(f"{DOCKERFILE} is missing; build it or pass -c gpufleet:gpu_image=<registry image>")
        self.image_asset = ecr_assets.DockerImageAsset(
            self,
            "GpuImage",
            directory=str(REPO_ROOT),
            file=DOCKERFILE,
            exclude=IMAGE_EXCLUDES,
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.runtime_image_uri = self.image_asset.image_uri
        return ecs.ContainerImage.from_docker_image_asset(self.image_asset)

    @property
    def gpu_queues(self) -> dict[str, batch.JobQueue]:
        return {"spot": self.gpu_spot_queue, "ondemand": self.gpu_ondemand_queue, "gang": self.gpu_gang_queue}


def _grant_read(secret: secretsmanager.Secret, role: iam.IRole) -> None:
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"], resources=[secret.secret_arn])
    )


def _seal(secret: secretsmanager.Secret, readers: list[iam.IRole]) -> None:
    secret.add_to_resource_policy(
        iam.PolicyStatement(
            effect=iam.Effect.DENY,
            principals=[iam.AnyPrincipal()],
            actions=["secretsmanager:GetSecretValue"],
            resources=["*"],
            conditions={"ArnNotEquals": {"aws:PrincipalArn": [r.role_arn for r in readers]}},
        )
    )
