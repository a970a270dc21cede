"""`ferry paged-bench`: decode steps over a paged cache, its gathers against the cells cache's copy.

Beside the cells cache's ragged run, the same sequences in a paged cache of --block-size cells a
block, each sequence's table drawn with --adjacency of its blocks right after their predecessor:
its windows gathered per block (one copy a block, the baseline), every run in one batched call (on a
stand-in) and by the gather ferry chooses.
Each row: tokens/s, copy calls, copy time against the copies' predicted time, bytes copied and
read per step. It is `ferry bench`'s run on a paged cache (ferry.workloads.bench, paged), serial,
on one device with every layer's KV in host memory: bench's options for policies, overlap,
devices and placement are not its own. With --remote its windows are also pulled from a remote
tier holding the pools (`ferry remote-serve --paged`)."""

from __future__ import annotations

import argparse
from typing import Any, Dict

from . import bench
from .option_table import add_options
from .reference import Verb, add_verb_parser

#: Failures that come from the options: reported as usage errors (exit 2); others end the run.
ARGUMENT_ERRORS = bench.ARGUMENT_ERRORS

VERB = Verb("paged-bench", "decode steps over a paged cache: per-block, batched and merged gathers beside the cells "
            "cache's ragged copy",
            " ".join((__doc__ or "").split("\n\n", 1)[-1].split()),
            "ferry paged-bench -c 16384 -npl 4,8 -npp 1024 --block-size 16 --adjacency 0.5 --latency-us 5")


def bench_defaults() -> Dict[str, Any]:
    """`ferry bench`'s parsed defaults: what a paged run keeps of the options it does not take."""
    parser = argparse.ArgumentParser(add_help=False)
    add_options(parser, "bench")
    return vars(parser.parse_args([]))


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `paged-bench` verb to the `ferry` command's subparsers sub; returns the verb's parser. Its
    parsed options are bench's: its own, bench's defaults for the rest, the paged cache and the ragged
    policy (the cells cache's copy of the same bytes, contiguous)."""
    p = add_verb_parser(sub, VERB)
    own = {a.dest for a in p._actions}
    p.set_defaults(**{**{k: v for k, v in bench_defaults().items() if k not in own}, "paged": True,
                      "policy": ["ragged"]})
    return p


def job(args: argparse.Namespace) -> bench.Job:
    """The bench.Job of a paged run the parsed options args describe (bench.job, whose errors it raises)."""
    return bench.job(args)


def run(j: bench.Job) -> int:
    """Run the job as `ferry bench` runs one (bench.run): the paged table (or JSON) on stdout."""
    return bench.run(j)


def main(args: argparse.Namespace) -> int:
    """`ferry paged-bench` with the parsed options args: run(job(args))."""
    return run(job(args))
