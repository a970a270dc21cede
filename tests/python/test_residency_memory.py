"""The residency plan's memory against what its run holds: a plan the planner prints runs on stand-in
devices of exactly the memory it was given (no out-of-memory error), at any prefetch depth, for every
strategy; the memory the plan states is what the run's devices hold, to the byte (beside the
reserve, which nothing allocates); and the model's least (no measurement) is never more than that.
Steps of one token, and verifications of a draft (4 query tokens per stream: their queries, outputs
and own cells in the plan's memory) alike.

The runs go through the bench's own code (ferry.workloads.residency_bench.run_residency) with a small
cache and one or two steps, so that they are quick."""

from __future__ import annotations

from typing import Optional, Tuple

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ferry.residency import STRATEGIES, PlanDoesNotFitError, ResidencyPlan, predict_step
from ferry.workloads.residency_bench import ResidencyRow, run_residency
from ferry.workloads.residency_plan import ResidencyModel, run_windows

KIB = 1 << 10


@st.composite
def configurations(draw: st.DrawFn) -> Tuple[ResidencyModel, int, int, int]:
    """A model (geometry, devices, links, budgets, prefetch depth) and its run's -npl, -npp, -ntg."""
    n_layer = draw(st.integers(1, 8))
    n_devices = draw(st.integers(1, 3))
    npl = draw(st.sampled_from((1, 2)))
    n_ctx = draw(st.sampled_from((256, 512, 1024)))
    kv_size = n_ctx // npl
    ntg = draw(st.integers(1, 2))
    draft = draw(st.sampled_from((0, 0, 3)))  # a draft of 3 verified a step: 4 query tokens per stream
    npp = draw(st.integers(1, kv_size - ntg - draft))
    windows = tuple(draw(st.sampled_from((None, None, 16, 100))) for _ in range(n_layer))
    layer_devices = None
    if n_devices > 1 and draw(st.booleans()):
        layer_devices = tuple(draw(st.integers(0, n_devices - 1)) for _ in range(n_layer))
    links = tuple(draw(st.sampled_from((0.33, 1.0, 2.45))) for _ in range(n_devices))
    head_dim = draw(st.sampled_from((32, 64)))
    n_head_kv = draw(st.sampled_from((1, 2)))
    # budgets from a few KiB (nothing fits) to about a device's share of the layers (all fit)
    layer_bytes = 4 * n_ctx * head_dim * n_head_kv  # an f16 full layer's K and V
    share = layer_bytes * -(-n_layer // n_devices)
    memory = tuple(int(draw(st.floats(0.0, 1.2)) * share) + draw(st.integers(4 * KIB, 32 * KIB))
                   for _ in range(n_devices))
    reserve = tuple(draw(st.sampled_from((0, 0, 64, 4 * KIB))) for _ in range(n_devices))
    type_kv = draw(st.sampled_from(("f16", "f16", "q8_0")))
    model = ResidencyModel.of(type_kv=type_kv, head_dim=head_dim, n_head_kv=n_head_kv, n_head=2 * n_head_kv,
                              n_ctx=n_ctx, layer_windows=windows, v_trans=type_kv == "f16" and draw(st.booleans()),
                              compact=draw(st.booleans()), n_devices=n_devices,
                              link_gbps=links, latency_us=(draw(st.sampled_from((0.0, 20.0))),), memory=memory,
                              reserve=reserve, compute_us=draw(st.sampled_from((2.0, 50.0, 400.0))),
                              layer_devices=layer_devices, draft=draft)
    return model, npl, npp, ntg


def _run(model: ResidencyModel, strategy: str, npl: int, npp: int, ntg: int, prefetch: int) -> Optional[ResidencyRow]:
    """The strategy's plan run as `ferry bench --residency` runs it, or None where the planner refuses.
    The plan's memory, less each device's reserve, must be what the run's devices held."""
    try:
        result = run_residency(model, [strategy], [npl], npp, ntg, pad=1, repeat=1, prefetch_depths=(prefetch,),
                               calibrate=False)
    except PlanDoesNotFitError:
        return None
    (row,) = result.rows
    assert row.plan.prediction.measured
    for d, held in enumerate(row.run.held_bytes):
        memory, reserves = model.devices.memory, model.planner.reserve
        budget = memory[0 if len(memory) == 1 else d]
        reserve = reserves[0 if len(reserves) == 1 else d] if reserves else 0
        assert held == (row.plan.memory[d] - reserve if budget else None), (d, row.plan, row.run)  # 0: unlimited
    return row


def _least_is_below_measured(model: ResidencyModel, npl: int, npp: int, ntg: int, prefetch: int,
                             plan: ResidencyPlan) -> None:
    """The model's least (no measurement) never exceeds the measured memory, device by device, for
    the plan's placement and for every layer in host memory."""
    kv_size = model.windows.n_ctx // npl
    windows = run_windows(npp, ntg, 1, kv_size, model.n_tok)
    m = model.at(n_stream=npl, n_kv=windows[-1], step_windows=windows, prefetch=prefetch)
    layers = m.layers()
    devices = m.device_specs((1e-6,) * m.n_layer, (1.0,) * m.devices.n_devices)
    with m.step_memory() as measure:
        for resident in (plan.resident, (False,) * m.n_layer):
            least = predict_step(layers, devices, resident, m.devices.layer_devices, prefetch, tokens_per_step=m.n_tok)
            measured = predict_step(layers, devices, resident, m.devices.layer_devices, prefetch, measure,
                                    tokens_per_step=m.n_tok)
            assert not least.measured and measured.measured
            assert all(a <= b for a, b in zip(least.memory, measured.memory)), (least, measured)
            assert least.resident_bytes == measured.resident_bytes


#: The issue's example (`ferry plan --residency` printed auto keeping layers 0,2 and 4,6 in 41.0 of 48.0 MiB,
#: whose run then ran out of memory), at an eighth of its size: two devices of 6 MiB, eight layers.
ISSUE = (ResidencyModel.of(head_dim=64, n_head_kv=2, n_head=8, n_ctx=4096, layer_windows=(None,) * 8, n_devices=2,
                           link_gbps=(2.45, 0.33), memory=(6 << 20, 6 << 20), compute_us=3000.0), 2, 256, 4)


@pytest.mark.parametrize("prefetch", [0, 1, 2])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configurations())
@example(config=ISSUE)
def test_a_plan_runs_in_the_memory_it_was_given(config: Tuple[ResidencyModel, int, int, int], prefetch: int) -> None:
    """Each strategy's plan runs on stand-ins of the budgets it was planned for; then on budgets of
    exactly the memory that plan states (as tight as the plan claims to be), the plan made there runs
    too. A refusal is PlanDoesNotFitError (anything else fails the test)."""
    model, npl, npp, ntg = config
    for strategy in STRATEGIES:
        row = _run(model, strategy, npl, npp, ntg, prefetch)
        if row is None:
            continue
        if strategy == "auto":
            _least_is_below_measured(model, npl, npp, ntg, prefetch, row.plan)
        _run(model.at(memory=tuple(row.plan.memory)), strategy, npl, npp, ntg, prefetch)
