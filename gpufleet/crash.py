"""Crash fingerprints: what makes two failed attempts "the same crash" (pure).

A worker that crashes records on its attempt item (``crash``, fenced) the exit code and a
fingerprint of the last :data:`TAIL_LINES` lines of what it was doing when it died: the Python
traceback of an unexpected exception in the runtime, or the last lines a tenant container printed
before a crash signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT). ClassifyFailure compares them:
the same fingerprint on a second, different worker is a deterministic crash of the job's own
spec — a USER failure (gpufleet.lifecycle.decide), not a platform one.

"Identically" means: the same exit code and the same tail after :func:`normalize`, which removes
what differs between machines and runs but not between two runs of the same bug — memory
addresses, directory prefixes of file paths (site-packages lives elsewhere on another node),
timestamps, pids, job/attempt ids and numbers in temporary names. Line numbers, exception types
and messages are kept. A worker killed from outside (SIGKILL, a lost node) records nothing, so
it never looks deterministic.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

#: lines of the crash's tail that are compared
TAIL_LINES = 20
#: container exit codes (128 + signal) that mean the code itself crashed; SIGKILL (137: the OOM killer,
#: an operator) and SIGTERM are not, since they come from outside the program
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 11})  # SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV

_RULES = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r'File "(?:[^"]*/)?([^"/]+)"'), r'File "\1"'),
    (re.compile(r"(?<![\w.])/(?:[\w.@+-]+/)+"), "/…/"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<ts>"),
    (re.compile(r"\bjob_[0-9a-z]{26}\b"), "<job>"),
    (re.compile(r"\b(pid|tid|thread|process)[ =:]\d+", re.I), r"\1 <n>"),
    (re.compile(r"\btmp[\w]*\b"), "<tmp>"),
)


def normalize(line: str) -> str:
    """One line with machine- and run-specific details replaced (see the module docstring)."""
    out = line.rstrip()
    for pattern, repl in _RULES:
        out = pattern.sub(repl, out)
    return out


def tail(lines: Iterable[str], n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` non-blank lines, normalized."""
    kept = [normalize(x) for x in lines if x.strip()]
    return kept[-n:]


def fingerprint(exit_code: int, lines: Iterable[str], n: int = TAIL_LINES) -> str:
    """``sha256`` (hex, 32 digits) of the exit code and the normalized tail; equal for two identical crashes."""
    body = "\n".join([f"exit {int(exit_code)}", *tail(lines, n)])
    return hashlib.sha256(body.encode("utf-8", "replace")).hexdigest()[:32]


def record(exit_code: int, lines: Iterable[str], n: int = TAIL_LINES) -> dict:
    """What a worker stores as the attempt's ``crash``: exit code, fingerprint and the tail itself
    (at most ``n`` lines of 300 characters, so an operator can read what matched)."""
    kept = tail(lines, n)
    return {"exit_code": int(exit_code), "fingerprint": fingerprint(exit_code, kept, n),
            "tail": [x[:300] for x in kept]}
