"""Shared fixtures: one backend of each kind, and a byte pattern that shows where bytes came from."""

from __future__ import annotations

import pytest

import ferry

SENTINEL = 0xA5


def pattern(n: int, seed: int = 0) -> bytes:
    """n bytes with a long period (never SENTINEL), so a misplaced byte is visible."""
    return bytes((i * 7 + i // 251 + seed) % 251 for i in range(n))


@pytest.fixture
def cpu() -> ferry.CPUBackend:
    return ferry.CPUBackend()


@pytest.fixture
def dummy_real() -> ferry.DummyBackend:
    return ferry.DummyBackend(real_memory=True)


@pytest.fixture(params=["cpu", "dummy_real", "dummy_real_no_2d"])
def real_backend(request: pytest.FixtureRequest) -> ferry.Backend:
    """Every backend whose bytes can be read back."""
    if request.param == "cpu":
        return ferry.CPUBackend()
    return ferry.DummyBackend(real_memory=True, has_2d=request.param != "dummy_real_no_2d")
