"""Run a deployed Lambda function in this process, from its asset.

Contract:
- :class:`LambdaRunner` is the ``invoker`` for :func:`gpufleet.local.moto_patches.patch_lambda`:
  ``runner(function, event) -> (payload JSON, errored, log text)``.
- The function is located by its deployed code (``Code.S3Key`` = the CDK asset
  hash) in the cloud assembly; its handler module must exist in that asset
  and be byte-identical to the module this process imports (so a stale asset,
  a missing handler or a typo in ``Handler`` fails as it would in AWS).
- Each invocation sees the function's environment variables (from the deployed
  template) and the Lambda runtime's standard ones on top of this process's
  environment, and, in server
  mode, ``AWS_ENDPOINT_URL`` pointing at the moto server. They are a layer that only the
  invoking thread sees (:mod:`gpufleet.local.invocation_env`): the process-wide environment is
  never changed, so another thread reading it cannot race an invocation.
- Invocations run one at a time, under one re-entrant lock (handler modules cache per container; a
  Lambda that writes to a table whose stream triggers another Lambda nests safely). A lock per
  handler module was tried: on the dev stack under 5 submissions/s the API's requests then timed out
  (p50 151 s; docs/benchmarks.md, "Embedded stack: admission under load and Ctrl-C"), most likely
  because the background functions' DynamoDB requests, no longer one function at a time, crowd the
  API's out of moto's one DynamoDB lock. So the one lock stays.
- With a ``gate`` (:class:`gpufleet.local.foreground.ForegroundGate`; the dev stack's), an invocation
  that is not foreground waits for its background turn before it queues for the lock (an invocation
  nested in a running one never waits): a burst of API requests goes before the work it causes.
- :meth:`released` (inside an invocation): the invocation gives up the lock for the block and takes it again
  after, so queued invocations run meanwhile (the harness makes it the prompt checks' yield window,
  :mod:`gpufleet.prompt_batch`: CheckPrompt invocations queued at once share one batch). Outside an
  invocation it does nothing. :meth:`queued` is how many invocations wait for the lock (none: the prompt check's
  leader has nothing to wait for).
- :meth:`close` (the dev stack's Ctrl-C) refuses every invocation from then on, also those waiting
  for the lock, with the error payload ``LocalStackStopping``; invocations already running
  finish (:meth:`wait_idle` waits for them, bounded).
- A container-image function (``PackageType: Image``, such as CheckPrompt, whose dependencies
  do not fit a zip) runs the handler named in ``ImageConfig.Command[0]`` (CDK ``cmd=``; moto keeps
  it through :func:`gpufleet.local.moto_patches.patch_cfn_lambda_image`), in-process, with the
  image's staged build context as its asset: the tag of ``Code.ImageUri`` (the CDK asset hash) must
  name an image asset of the assembly, and the handler module must be in that context and
  byte-identical to the imported one, as for a zip. The image itself is never built.
- A raised exception becomes an error payload ``{"errorType": <class name>,
  "errorMessage", "stackTrace"}``, as the Python runtime reports it, so Step
  Functions ``Catch``/``Retry`` match on the exception's class name.
- Each function runs as its own Lambda container would: the handler modules keep what they
  cache per container (settings, clients: ``functools.lru_cache`` functions and the like) only
  while they serve the same function. When a handler module is invoked for a function ARN other
  than the one it served last, or for the first time (another deployment in the same process —
  tests deploy several stacks — or code that imported and called the handler directly), every
  ``lambdas.*`` module's caches are cleared first (:func:`cold_start`), so no function sees
  settings cached from another environment.
- A function whose key (``GPUFLEET_FUNCTION``) is in ``isolated`` runs, in server mode, in a worker process of its
  own (:mod:`gpufleet.local.lambda_worker`: a warm execution environment per concurrent invocation, the function's
  environment, its timeout, at most its reserved concurrency of environments), outside the lock: a long function
  (FinalizeLambda: seconds of moderation and encoding; the scheduler pass: tenths of a second of reads on every
  timer tick and event) then neither holds up the in-process functions and the API behind the lock nor shares this
  process's interpreter with them, as on AWS, where each function has execution environments of its own. The handler is
  verified against the asset as above; :meth:`close` also ends the workers. In-process mode (no endpoint for a
  worker to reach) runs every function in-process.
- :meth:`initialize` runs a function's init phase ahead of its first event (a warmed execution environment):
  the handler module's ``init()``, when it defines one (CheckPrompt: the prompt filter's encoder, policy and speller),
  with the function's environment, under the lock, as the first invocation would after a cold start; the first
  invocation then finds the module warm (no cold start in between). A function without ``init()`` is left alone.
- ``invocations`` records every call (function key, request id, errored) for
  tests and the control-plane cost benchmark.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import ConfigError
from gpufleet.local import invocation_env
from gpufleet.local.foreground import ForegroundGate
from gpufleet.local.lambda_worker import WorkerPool


@dataclass
class LambdaContext:
    """The subset of the Lambda context object handlers and Powertools use."""

    function_name: str
    memory_limit_in_mb: int
    invoked_function_arn: str
    aws_request_id: str
    timeout_s: float
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = "local"
    _deadline: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


@dataclass(frozen=True)
class Invocation:
    function_name: str
    function_key: str
    request_id: str
    errored: bool
    error_type: str | None = None


class LambdaRunner:
    """In-process Lambda runtime over the assets of one cloud assembly."""

    def __init__(
        self,
        assets: Mapping[str, Path],
        *,
        region: str = "us-east-1",
        endpoint_url: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        isolated: Collection[str] = (),
        gate: ForegroundGate | None = None,
    ) -> None:
        self._assets = dict(assets)
        self._gate = gate
        self._nesting = threading.local()
        self._region = region
        self._endpoint_url = endpoint_url
        self._extra_env = dict(extra_env or {})
        #: guards _active and _closed; notified when an invocation ends
        self._state = threading.Condition()
        self._lock = threading.RLock()
        self._active = 0
        self._waiting = 0  # invocations waiting for the lock
        self._closed = False
        self._verified: set[tuple[Path, str]] = set()
        self.invocations: list[Invocation] = []
        #: function keys run in worker processes (server mode only: a worker reaches AWS through the endpoint)
        self._isolated = frozenset(isolated) if endpoint_url else frozenset()
        self.workers = WorkerPool()

    # -- asset resolution --------------------------------------------------------------
    @staticmethod
    def is_image(fn: Any) -> bool:
        return getattr(fn, "package_type", "Zip") == "Image"

    @classmethod
    def handler_name(cls, fn: Any) -> str:
        """``module.function``: a zip function's ``Handler``, an image function's ``ImageConfig.Command[0]``."""
        if not cls.is_image(fn):
            return fn.handler or ""
        command = list(getattr(getattr(fn, "image_config", None), "cmd", None) or [])
        if not command:
            raise ConfigError(f"{fn.function_name}: image function names no handler (ImageConfig.Command)")
        return command[0]

    @staticmethod
    def image_tag(fn: Any) -> str:
        """The tag of an image function's ``Code.ImageUri`` (``<registry>/<repository>:<tag>``)."""
        uri = (fn.code or {}).get("ImageUri", "")
        repository, sep, tag = uri.rpartition("/")[2].partition(":")
        if not (repository and sep and tag) or "@" in tag:
            raise ConfigError(f"{fn.function_name}: image {uri!r} has no tag naming an asset")
        return tag

    def asset_dir(self, fn: Any) -> Path:
        """The asset folder of ``fn``: the zip asset its ``S3Key`` names, or the image build context its tag names."""
        if self.is_image(fn):
            digest = self.image_tag(fn)
            if digest not in self._assets:
                raise ConfigError(f"{fn.function_name}: image {fn.code.get('ImageUri')!r} is not an asset of "
                                  "this assembly")
            return self._assets[digest]
        key = (fn.code or {}).get("S3Key", "")
        digest = key.rsplit("/", 1)[-1].removesuffix(".zip")
        if digest not in self._assets:
            raise ConfigError(f"{fn.function_name}: code {key!r} is not an asset of this assembly")
        return self._assets[digest]

    def _verify_handler(self, asset: Path, module_name: str) -> None:
        if (asset, module_name) in self._verified:
            return
        rel = Path(*module_name.split("."))
        in_asset = next((p for p in (asset / f"{rel}.py", asset / rel / "__init__.py") if p.is_file()), None)
        if in_asset is None:
            raise ConfigError(f"handler module {module_name} is not in the deployed asset {asset.name}")
        spec = importlib.util.find_spec(module_name)
        if spec is None or spec.origin is None:
            raise ConfigError(f"handler module {module_name} is not importable here")
        if Path(spec.origin).read_bytes() != in_asset.read_bytes():
            raise ConfigError(f"deployed asset {asset.name} is stale for {module_name}; synthesize again")
        self._verified.add((asset, module_name))

    # -- invocation ----------------------------------------------------------------------
    def _environment(self, fn: Any) -> dict[str, str]:
        env = {
            **{k: str(v) for k, v in (fn.environment_vars or {}).items()},
            **self._extra_env,
            "AWS_REGION": self._region,
            "AWS_DEFAULT_REGION": self._region,
            "AWS_LAMBDA_FUNCTION_NAME": fn.function_name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(fn.memory_size),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "_HANDLER": self.handler_name(fn),
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
        }
        if getattr(fn, "run_time", None):  # a managed runtime; an image function has none
            env["AWS_EXECUTION_ENV"] = f"AWS_Lambda_{fn.run_time}"
        if self._endpoint_url:
            env["AWS_ENDPOINT_URL"] = self._endpoint_url
        return env

    def __call__(self, fn: Any, event: Any) -> tuple[str, bool, str]:
        request_id = str(uuid.uuid4())
        key = (fn.environment_vars or {}).get("GPUFLEET_FUNCTION", fn.function_name)
        if key in self._isolated:
            return self._call_isolated(fn, key, event, request_id)
        lock = self._lock
        nested = getattr(self._nesting, "depth", 0)
        if self._gate is not None and not nested:
            self._gate.background_turn()
        if not lock.acquire(blocking=False):
            with self._state:
                self._waiting += 1
            try:
                while not lock.acquire(timeout=0.1):
                    if self._closed:
                        return self._refused(fn, key, request_id)
            finally:
                with self._state:
                    self._waiting -= 1
        self._nesting.depth = nested + 1
        try:
            with self._state:
                if self._closed:
                    return self._refused(fn, key, request_id)
                self._active += 1
            try:
                with invocation_env.invocation(self._environment(fn)):
                    payload = json.dumps(self._invoke(fn, event, request_id), default=str)
                self.invocations.append(Invocation(fn.function_name, key, request_id, False))
                return payload, False, ""
            except Exception as exc:  # the Lambda runtime reports any exception as a function error
                tb = traceback.format_exception(exc)
                body = {"errorType": type(exc).__name__, "errorMessage": str(exc), "stackTrace": tb}
                self.invocations.append(Invocation(fn.function_name, key, request_id, True, type(exc).__name__))
                return json.dumps(body), True, "".join(tb)
            finally:
                with self._state:
                    self._active -= 1
                    self._state.notify_all()
        finally:
            self._nesting.depth = nested
            lock.release()

    def _call_isolated(self, fn: Any, key: str, event: Any, request_id: str) -> tuple[str, bool, str]:
        """``fn`` in a worker process of its own (:mod:`gpufleet.local.lambda_worker`), outside the lock."""
        with self._state:
            if self._closed:
                return self._refused(fn, key, request_id)
            self._active += 1
        try:
            try:
                handler = self.handler_name(fn)
                self._verify_handler(self.asset_dir(fn), handler.rpartition(".")[0])
            except ConfigError as exc:
                answer = {"ok": False, "errorType": type(exc).__name__, "errorMessage": str(exc), "stackTrace": []}
            else:
                env = {**dict(os.environ), **self._environment(fn)}
                context = {"function_name": fn.function_name, "memory_limit_in_mb": int(fn.memory_size),
                           "invoked_function_arn": fn.function_arn, "aws_request_id": request_id,
                           "timeout_s": float(fn.timeout), "function_version": "$LATEST",
                           "log_group_name": fn.logs_group_name, "log_stream_name": "local"}
                pool_key = (fn.function_arn, json.dumps(env, sort_keys=True))
                reserved = getattr(fn, "reserved_concurrency", None)
                answer = self.workers.invoke(pool_key, handler, env, event, context, float(fn.timeout),
                                             limit=int(reserved) if reserved else None)
            if answer.get("ok"):
                self.invocations.append(Invocation(fn.function_name, key, request_id, False))
                return json.dumps(answer["payload"]), False, ""
            body = {k: answer.get(k) for k in ("errorType", "errorMessage", "stackTrace")}
            self.invocations.append(Invocation(fn.function_name, key, request_id, True, body["errorType"]))
            return json.dumps(body), True, "".join(body["stackTrace"] or [])
        finally:
            with self._state:
                self._active -= 1
                self._state.notify_all()

    @contextmanager
    def released(self) -> Iterator[None]:
        """Give up the lock this thread holds (every level of it) for the block (see the module contract)."""
        depth = getattr(self._nesting, "depth", 0)
        for _ in range(depth):
            self._lock.release()
        try:
            yield
        finally:
            for _ in range(depth):
                self._lock.acquire()

    def queued(self) -> int:
        """How many invocations wait for the lock now (the prompt checks' yield window reads it)."""
        return self._waiting

    def _refused(self, fn: Any, key: str, request_id: str) -> tuple[str, bool, str]:
        self.invocations.append(Invocation(fn.function_name, key, request_id, True, "LocalStackStopping"))
        body = {"errorType": "LocalStackStopping", "errorMessage": "the local stack is stopping", "stackTrace": []}
        return json.dumps(body), True, ""

    def close(self) -> None:
        """Refuse every invocation from now on (see the module contract); running ones finish."""
        with self._state:
            self._closed = True
            self._state.notify_all()
        self.workers.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def initialize(self, fn: Any) -> bool:
        """Run ``fn``'s init phase now (its handler module's ``init()``); False when the module defines none or
        ``fn`` runs in worker processes (which start their own)."""
        if (fn.environment_vars or {}).get("GPUFLEET_FUNCTION", fn.function_name) in self._isolated:
            return False
        with self._lock, invocation_env.invocation(self._environment(fn)):
            init = getattr(self._container_module(fn), "init", None)
            if not callable(init):
                return False
            init()
            return True

    def _container_module(self, fn: Any) -> Any:
        """``fn``'s handler module, verified against its asset, its caches those of ``fn``'s container."""
        module_name = self.handler_name(fn).rpartition(".")[0]
        self._verify_handler(self.asset_dir(fn), module_name)
        if _SERVED.get(module_name) != fn.function_arn:  # also the first time: the module may have been
            cold_start()                                   # used directly (a test), with another environment
        _SERVED[module_name] = fn.function_arn
        return importlib.import_module(module_name)

    def _invoke(self, fn: Any, event: Any, request_id: str) -> Any:
        handler = getattr(self._container_module(fn), self.handler_name(fn).rpartition(".")[2])
        context = LambdaContext(
            function_name=fn.function_name,
            memory_limit_in_mb=int(fn.memory_size),
            invoked_function_arn=fn.function_arn,
            aws_request_id=request_id,
            timeout_s=float(fn.timeout),
            log_group_name=fn.logs_group_name,
        )
        return handler(event, context)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no invocation is running (True) or ``timeout`` passes (False)."""
        with self._state:
            return self._state.wait_for(lambda: self._active == 0, timeout)

    def count(self, function_key: str | None = None) -> int:
        return sum(1 for i in self.invocations if function_key is None or i.function_key == function_key)


#: handler module -> ARN of the function it served last, process-wide like the modules' caches
#: (several runners, one per deployed stack, may share one process)
_SERVED: dict[str, str] = {}


def cold_start(package: str = "lambdas") -> int:
    """Forget what the handler modules under ``package`` cached for their container: clear every
    ``functools`` cache and reset every module-level ``_api``-style singleton they define (an
    attribute whose value has a ``cache_clear``, or a module attribute named in ``__container__``).
    Returns how many caches were cleared."""
    cleared = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        for attr in list(vars(module).values()):
            if callable(getattr(attr, "cache_clear", None)) and getattr(attr, "__module__", None) == name:
                attr.cache_clear()
                cleared += 1
        for attr_name in getattr(module, "__container__", ()):
            setattr(module, attr_name, None)
            cleared += 1
    return cleared
