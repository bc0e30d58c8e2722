"""Shared by the kernel path's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_tlshd(monkeypatch):
    """The kernel path's TLS depends on whether a tlshd runs on the machine (keyring.
    tlshd_running): pinned to "none runs" so that these tests mean the same on a host that
    runs one; tests of the TLS connect pin it to True themselves."""
    from fx100io.kernel import keyring

    monkeypatch.setattr(keyring, "tlshd_running", lambda: False)
