"""``python -m gpufleet.local.moto_server [moto.server's arguments]``: moto's own server, with
:func:`gpufleet.local.moto_patches.performance_patches` applied (answers unchanged, fewer CPU seconds each).

For a moto server in a process of its own that must behave as plain moto does (the agent's functional tests
drive a state machine through it); the embedded stack runs moto in-process with every patch
(:class:`gpufleet.local.harness.LocalStack`).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    from gpufleet.local.moto_patches import performance_patches

    with performance_patches():
        moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
