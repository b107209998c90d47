"""Per-invocation environment variables for the in-process Lambda runtime, without touching the process's.

Contract:
- :func:`install` replaces ``os.environ`` (once per process, idempotent) with a :class:`LayeredEnviron`
  over the original mapping. Outside an invocation it reads and writes the original, so
  ``monkeypatch.setenv``, ``os.getenv`` and subprocesses behave as before.
- :func:`invocation` sets a layer for the current context (thread): inside it, reads see the layer's
  variables over the process's, writes and deletes go to the layer only, and the layer disappears when
  the block ends. Nested invocations (a Lambda whose write triggers another Lambda on the same thread)
  stack: the inner one starts from what the outer one sees.
- Another thread never sees an invocation's variables and never sees the process's environment change
  under it: nothing in the process-wide mapping is set or removed for an invocation, so iterating
  ``os.environ`` (``os.environ.copy()``, pydantic-settings, botocore's credential chain) cannot race one.
- A subprocess started inside an invocation without ``env=`` inherits the process's environment, not
  the layer (the C-level environment is never changed for an invocation); pass ``env=dict(os.environ)``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextvars import ContextVar

#: the current invocation's variables: name -> value, or None for a variable the invocation removed
_LAYER: ContextVar[dict[str, str | None] | None] = ContextVar("gpufleet_invocation_env", default=None)
_INSTALL_LOCK = threading.Lock()


class LayeredEnviron(MutableMapping[str, str]):
    """``os.environ`` with the current invocation's variables over the process's."""

    def __init__(self, base: MutableMapping[str, str]) -> None:
        self.base = base

    def __getitem__(self, key: str) -> str:
        layer = _LAYER.get()
        if layer is not None and key in layer:
            value = layer[key]
            if value is None:
                raise KeyError(key)
            return value
        return self.base[key]

    def __setitem__(self, key: str, value: str) -> None:
        layer = _LAYER.get()
        if layer is None:
            self.base[key] = value
            return
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"str expected, not {type(key if not isinstance(key, str) else value).__name__}")
        layer[key] = value

    def __delitem__(self, key: str) -> None:
        layer = _LAYER.get()
        if layer is None:
            del self.base[key]
            return
        if key not in self:
            raise KeyError(key)
        layer[key] = None

    def __iter__(self) -> Iterator[str]:
        layer = _LAYER.get()
        base = list(self.base)  # a snapshot: keys only, nothing here reads a value
        if layer is None:
            return iter(base)
        shown = [k for k in base if layer.get(k, "") is not None]
        seen = set(base)
        return iter(shown + [k for k, v in layer.items() if v is not None and k not in seen])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        layer = _LAYER.get()
        if layer is not None and key in layer:
            return layer[key] is not None  # type: ignore[index]
        return key in self.base

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        try:
            return self[key]
        except KeyError:
            return default

    def copy(self) -> dict[str, str]:
        """A plain dict of what this thread sees, read without racing another thread's invocation."""
        layer = _LAYER.get()
        out: dict[str, str] = {}
        for key in list(self.base):
            value = self.base.get(key)  # a key another thread removed in between is skipped, not a KeyError
            if value is not None:
                out[key] = value
        for key, value in (layer or {}).items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    def __repr__(self) -> str:
        return f"LayeredEnviron({self.copy()!r})"


def install() -> LayeredEnviron:
    """Make ``os.environ`` layered (once per process) and return it."""
    with _INSTALL_LOCK:
        if not isinstance(os.environ, LayeredEnviron):
            # replacing it on purpose: the original mapping stays underneath, nothing is cleared
            os.environ = LayeredEnviron(os.environ)  # type: ignore[assignment]  # noqa: B003
        return os.environ  # type: ignore[return-value]


@contextlib.contextmanager
def invocation(variables: Mapping[str, str]) -> Iterator[None]:
    """Run the block with ``variables`` over the environment, seen by this context only."""
    install()
    outer = _LAYER.get()
    token = _LAYER.set({**(outer or {}), **{k: str(v) for k, v in variables.items()}})
    try:
        yield
    finally:
        _LAYER.reset(token)
