"""moto in-process as the local stack runs it: ``mock_aws`` with :func:`gpufleet.local.moto_patches.performance_patches`.

Those patches change how fast moto answers, never what it answers (each is compared with moto's own answers in
tests/functional/local/test_local_moto_patches.py, which uses plain ``mock_aws``), and the dev stack and every
e2e test run behind them. On the store and API tests they take about a fifth of the CPU off (moto's generic
response serializer and its item copies). Tests of moto itself or of the patches keep plain ``mock_aws``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from moto import mock_aws

from gpufleet.local.moto_patches import performance_patches


@contextmanager
def fast_mock_aws(**kwargs: Any) -> Iterator[None]:
    """``mock_aws(**kwargs)`` with the performance patches applied for as long as it is active."""
    with mock_aws(**kwargs), performance_patches():
        yield
