"""The test command's verdict does not change between runs: randomized tests draw fixed examples."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from hypothesis import settings

import ferry


@pytest.mark.skipif(os.environ.get("FERRY_HYPOTHESIS_PROFILE", "repeatable") != "repeatable",
                    reason="tools/fuzz explores with fresh seeds on purpose")
def test_hypothesis_runs_on_fixed_examples() -> None:
    # derandomize: each test's examples come from the test itself, not from a fresh seed
    assert settings.default.derandomize
    assert settings.default.database is None


def test_tools_fuzz_explores_every_randomized_test_file() -> None:
    """tools/fuzz runs every file whose tests draw examples with hypothesis (it once left out the
    paged cache's property tests): each file with a @given test or a state machine is among those
    its pytest collects."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    package = os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__)))  # the ferry these tests run
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run([os.path.join(root, "tools", "fuzz"), "1", "--", "--collect-only"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = {line.split("::")[0].split("/")[-1] for line in out.stdout.splitlines() if "::" in line}
    randomized = set()
    for name in os.listdir(here):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(here, name), encoding="utf-8") as f:
                text = f.read()
            if re.search(r"^\s*@given\(|\(\s*RuleBasedStateMachine\s*\)", text, re.M):  # a test or a state machine
                randomized.add(name)
    assert "test_paged_property.py" in randomized
    assert randomized <= collected, sorted(randomized - collected)
