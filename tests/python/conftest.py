"""Shared fixtures: one backend of each kind, a byte pattern that shows where bytes came from, and the
command line's refusal as the tests read it."""

from __future__ import annotations

import os
from typing import List

import pytest
from hypothesis import settings

import ferry

# Randomized tests give the same verdict on every run of a commit: the "repeatable" profile
# derives each test's examples from the test itself (derandomize). tools/fuzz selects
# "explore" (fresh seeds, printed on failure) to hunt for new failures; each one found is
# kept as an explicit @example beside its test.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("FERRY_HYPOTHESIS_PROFILE", "repeatable"))

SENTINEL = 0xA5

#: The slowest tests under CI's coverage build (pytest --durations), run first: on several workers
#: (pytest-xdist hands tests out in collection order) they then overlap the many short ones, instead
#: of one left running alone at the end while the other workers wait.
SLOW_FIRST = (
    "test_cli.py::test_every_verb_runs_with_no_arguments[bench]",
    "test_cli.py::test_every_verb_runs_with_no_arguments[paged-bench]",
    "test_bench.py::test_default_table_fits_100_columns",
    "test_api_property.py::test_pieces_of_any_rows_are_their_bytes_or_refused_naming_the_row",
    "test_residency_memory.py::test_a_plan_runs_in_the_memory_it_was_given[1]",
    "test_residency_memory.py::test_a_plan_runs_in_the_memory_it_was_given[0]",
    "test_residency_memory.py::test_a_plan_runs_in_the_memory_it_was_given[2]",
    "test_api_property.py::test_fit_piece_curve_gives_back_the_times_it_came_from_or_refuses_naming_the_point",
)


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """SLOW_FIRST first, the rest in their order (a stable sort): the verdict is the same, the wall
    time of a parallel run shorter."""
    items.sort(key=lambda item: not item.nodeid.endswith(SLOW_FIRST))

# (name, bytes per block, values per block), written out here rather than read from ferry.
TYPES = [("f32", 4, 1), ("f16", 2, 1), ("bf16", 2, 1), ("i32", 4, 1), ("q8_0", 34, 32), ("q4_0", 18, 32)]


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


def refused(argv: List[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `ferry` with argv, which it must refuse as a usage error (exit status 2, no traceback);
    return what it wrote on stderr."""
    from ferry.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err
