"""`ferry residency-bench`: each strategy's KV placement planned, then run beside its prediction.

Per -npl and prefetch depth, each --strategy's plan (as `ferry residency-plan` prints it) run on
stand-in devices whose links and memory the plan takes, the placements taking turns: its predicted
and measured step time and their ratio, and whether the attention outputs agree across the
placements (ferry.workloads.residency_bench)."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import InvalidArgumentError
from . import residency
from .options import apply_model, check_one_head_dim, run_fields
from .reference import Verb, add_verb_parser

#: Failures that come from the options: reported as usage errors (exit 2); others end the run.
ARGUMENT_ERRORS = InvalidArgumentError

VERB = Verb("residency-bench", "each strategy's KV placement run on stand-ins: measured step time beside the "
            "predicted",
            " ".join((__doc__ or "").split("\n\n", 1)[-1].split()),
            "ferry residency-bench --devices 2 --link-gbps 2.45,0.33 --kv-device-layers 2 --layers 4 --repeat 3")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `residency-bench` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


def job(args: argparse.Namespace) -> residency.BenchJob:
    """The residency.BenchJob the parsed options args describe, --model read.

    Raises
    ------
    InvalidArgumentError
        For options that cannot run, or a --model file that cannot be read.
    """
    g = apply_model(args, run_fields())
    check_one_head_dim(g, args)
    return residency.bench_job(args, g)


def run(j: residency.BenchJob) -> int:
    """Plan and run each placement (residency.run_bench). Returns the exit status 0; PlanDoesNotFitError
    when a plan cannot fit."""
    with residency.naming_budget():  # the planner's refusal names the option that set the budget
        return residency.run_bench(j)


def main(args: argparse.Namespace) -> int:
    """`ferry residency-bench` with the parsed options args: run(job(args))."""
    return run(job(args))
