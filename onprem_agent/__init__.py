"""The gpufleet on-prem agent: runs jobs on a host's local GPUs under the runtime contract.

Entry points: ``python -m onprem_agent [--config F] [--check]`` and ``gpufleet agent``.
See docs/agent.md for installation and operation.
"""
