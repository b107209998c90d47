"""gpufleet: GPU jobs across on-prem machines and AWS.

The package root re-exports the public SDK surface lazily so that importing
``gpufleet`` stays cheap (Lambda cold start) and free of heavy dependencies.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "Client"]


def __getattr__(name: str):  # pragma: no cover - trivial lazy import
    if name == "Client":
        from gpufleet.sdk import Client

        return Client
    raise AttributeError(name)
