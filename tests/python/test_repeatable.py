"""The test command's verdict does not change between runs: randomized tests draw fixed examples."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings


@pytest.mark.skipif(os.environ.get("FERRY_HYPOTHESIS_PROFILE", "repeatable") != "repeatable",
                    reason="tools/fuzz explores with fresh seeds on purpose")
def test_hypothesis_runs_on_fixed_examples() -> None:
    # derandomize: each test's examples come from the test itself, not from a fresh seed
    assert settings.default.derandomize
    assert settings.default.database is None
