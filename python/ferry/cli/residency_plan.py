"""`ferry residency-plan`: where each layer's KV should live over the devices, planned.

Per -npl and prefetch depth, each --strategy's placement of the layers' KV over the devices
(--devices, --link-gbps, --device-memory, --reserve, ...): its predicted step time and tokens/s,
and the memory it holds on each device (ferry.workloads.residency_plan). `ferry residency-bench`
runs the same plans beside their prediction."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import FerryError
from . import residency
from .options import apply_model, check_one_head_dim
from .reference import Verb, add_verb_parser

#: Every failure of this verb comes from its arguments: reported as a usage error (exit 2).
ARGUMENT_ERRORS = FerryError

VERB = Verb("residency-plan", "which layers' KV to keep on each device: each strategy's placement, step time and "
            "memory, predicted",
            " ".join((__doc__ or "").split("\n\n", 1)[-1].split()),
            "ferry residency-plan --devices 2 --link-gbps 2.45,0.33 --device-memory 6MiB,6MiB --layers 8 --overlap")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `residency-plan` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


def job(args: argparse.Namespace) -> residency.PlanJob:
    """The residency.PlanJob the parsed options args describe, --model read.

    Raises
    ------
    FerryError
        For a --model file that cannot be read, or options the planner refuses.
    """
    g = apply_model(args, {"c": lambda g: g.n_ctx, "kv_heads": lambda g: g.n_head_kv,
                           "head_dim": lambda g: g.head_dim_k, "heads": lambda g: g.n_head,
                           "layers": lambda g: g.n_layer})
    check_one_head_dim(g, args)
    return residency.plan_job(args, g)


def run(j: residency.PlanJob) -> int:
    """Print each strategy's plan (residency.run_plan). Returns the exit status 0; PlanDoesNotFitError
    (a usage error) when a plan cannot fit."""
    with residency.naming_budget():  # the planner's refusal names the option that set the budget
        return residency.run_plan(j)


def main(args: argparse.Namespace) -> int:
    """`ferry residency-plan` with the parsed options args: run(job(args))."""
    return run(job(args))
