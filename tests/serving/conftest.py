"""Fixtures shared by the serving tests."""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def wait_until():
    """``wait_until(check, what, timeout_s)``: poll ``check()`` until truthy and return its value.

    Connection errors and half-written answers (``OSError``, ``ValueError``,
    ``KeyError``, ``IndexError``) count as "not yet"; the test fails naming
    ``what`` after ``timeout_s``.
    """
    def wait(check, what: str = "the expected state", timeout_s: float = 10.0):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = check()
                if value:
                    return value
            except (OSError, ValueError, KeyError, IndexError):
                pass
            assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
            time.sleep(0.05)

    return wait
