"""The job runtime: ``python -m gpufleet.runtime --envelope-json ... | --envelope-file ...``.

One entrypoint for the on-prem agent and the cloud GPU container. Stages:
``generate`` (:mod:`gpufleet.runtime.generate`), ``finalize``
(:mod:`gpufleet.runtime.finalize`) and ``container``
(:mod:`gpufleet.runtime.container`). Exit codes are
:class:`gpufleet.envelope.ExitCode`. See docs/runtime.md.
"""
