"""`ferry validate`: the analogue of llama.cpp's llama-parallel hash gate.

Many sequences (default 16), each with its own content, are served through a non-unified
KV cache of fewer streams (default 8): in waves, wave w putting sequences w*S .. w*S+S-1 in
streams 0..S-1. At the start of a wave each sequence's prompt cells are written into its
stream (over whatever the previous wave left there); each decode step writes the sequence's
next cell and then runs, per layer, attention over the window of the wave's streams on the
split backend (CUDA, or the CPU stand-in), each sequence with its own query and length. The
sha256 of every attention output, in order, is one hash per copy policy: they must be
identical, since a copy policy changes what is moved, never what the graph reads.

The negative control shows the gate can fail: the cache has one stream more than a wave
uses, kept as a copy of stream 0 (so stream S is stream 0's neighbour after S-1), and the
control runs the `ranges` policy with each wave's window shifted one stream up, so that every
sequence reads its neighbour's range with its own query and length. Its hash must differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import hash_gate
from ..errors import InvalidArgumentError
from ..hash_gate import ValidateConfig, ValidateResult
from ..workload import KV_TYPES, SPLIT_BACKENDS
from .options import policy_list

#: Failures that come from the options: reported as usage errors (exit 2); others end the run.
ARGUMENT_ERRORS = InvalidArgumentError


def format_result(cfg: ValidateConfig, res: ValidateResult) -> str:
    """The gate's report: the run, one hash per policy and the control's, and the verdicts."""
    waves = -(-cfg.n_seq // cfg.n_stream)
    lines = [
        f"split backend: {res.split_name}",
        f"{cfg.n_seq} sequences through {cfg.n_stream} streams of {cfg.kv_size} cells ({waves} waves), "
        f"{cfg.n_layer} layers, {cfg.n_step} decode steps, K/V {cfg.type_kv}, {cfg.n_head} heads x {cfg.head_dim}, "
        f"{cfg.n_head_kv} KV heads",
        "sha256 of every attention output:",
    ]
    width = max(len(p) for p in [*res.hashes, "control"])
    lines += [f"  {p.ljust(width)}  {h}  (split memory {res.split_memory.get(p, 0):,} B)"
              for p, h in res.hashes.items()]
    lines.append(f"  {'control'.ljust(width)}  {res.control}  (ranges, each sequence reading its neighbour's stream)")
    lines.append(f"policies: {'identical' if res.identical else 'DIFFERENT'}; "
                 f"control: {'detected' if res.control_detected else 'NOT DETECTED'}; "
                 f"gate: {'pass' if res.passed else 'FAIL'}")
    return "\n".join(lines)


# ------------------------------------------------------------ the command


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `validate` verb to the `ferry` command's subparsers and return its parser."""
    d = ValidateConfig()
    vp = sub.add_parser("validate", help="the hash gate: every copy policy gives identical attention outputs, "
                                         "and a cross-stream read is detected (llama-parallel's gate)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vp.add_argument("--sequences", type=int, default=d.n_seq, help=f"sequences served (default {d.n_seq})")
    vp.add_argument("--streams", type=int, default=d.n_stream, help=f"streams of the cache (default {d.n_stream})")
    vp.add_argument("--cells", type=int, default=d.kv_size, help=f"cells per stream (default {d.kv_size})")
    vp.add_argument("--layers", type=int, default=d.n_layer, help=f"default {d.n_layer}")
    vp.add_argument("--steps", type=int, default=d.n_step, help=f"decode steps per wave (default {d.n_step})")
    vp.add_argument("--type", default=d.type_kv, choices=KV_TYPES, help=f"K and V type (default {d.type_kv})")
    vp.add_argument("--heads", type=int, default=d.n_head, help=f"query heads (default {d.n_head})")
    vp.add_argument("--head-dim", type=int, default=d.head_dim, help=f"default {d.head_dim}")
    vp.add_argument("--kv-heads", type=int, default=d.n_head_kv, help=f"default {d.n_head_kv}")
    vp.add_argument("--policy", type=policy_list, default=list(d.policies), metavar="P,P,...",
                    help=f"copy policies to compare (default {','.join(d.policies)})")
    vp.add_argument("--backend", default=d.backend, choices=SPLIT_BACKENDS,
                    help="the split's backend: cuda, cpu (the stand-in device), auto (cuda when a device is usable)")
    vp.add_argument("--seed", type=int, default=d.seed, help=f"the sequences' content (default {d.seed})")
    vp.add_argument("--compact", action="store_true",
                    help="also hash each non-flat policy with compact staging (the split holds only the bytes read)")
    vp.add_argument("--json", action="store_true", help='{"hashes": {policy: hex}, "identical", "control_detected"}')
    return vp


def main(args: argparse.Namespace) -> int:
    """Run `ferry validate`: the report (or JSON) on stdout.

    Returns
    -------
    int
        The exit status: 0 when the policies agree and the control was detected, else 1.

    Raises
    ------
    InvalidArgumentError
        For options that cannot run (a usage error).
    FerryError
        When a run fails.
    """
    cfg = ValidateConfig(n_seq=args.sequences, n_stream=args.streams, n_layer=args.layers, n_step=args.steps,
                         kv_size=args.cells, type_kv=args.type, n_head=args.heads, head_dim=args.head_dim,
                         n_head_kv=args.kv_heads, policies=tuple(args.policy), backend=args.backend, seed=args.seed,
                         compact=args.compact)
    cfg.check()
    res = hash_gate.run_validate(cfg)
    if args.json:
        print(json.dumps(res.as_dict(), indent=2))
    else:
        print(format_result(cfg, res))
    if not res.passed:
        print("ferry validate: the gate failed", file=sys.stderr)
    return 0 if res.passed else 1
