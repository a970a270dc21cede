"""`ferry validate`: the analogue of llama.cpp's llama-parallel hash gate."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import InvalidArgumentError
from ..workloads import validate as validate_workload
from ..workloads.validate import ValidateConfig, ValidateResult
from .options import (
    POSITIVE,
    add_device_arg,
    add_devices_args,
    add_kv_args,
    add_policy_arg,
    add_v_trans_arg,
    add_verb_parser,
    apply_model,
    check_one_head_dim,
    count,
    devices_from_args,
    run_fields,
)

#: Failures that come from the options: reported as usage errors (exit 2); others end the run.
ARGUMENT_ERRORS = InvalidArgumentError


def format_result(cfg: ValidateConfig, res: ValidateResult) -> str:
    """The report of the ValidateResult res of the ValidateConfig cfg: the run, one hash per policy (per
    placement and policy when placements were compared, each placement's map listed) and the
    control's, the verdicts.
    """
    waves = -(-cfg.n_seq // cfg.n_stream)
    lines = [
        f"split backend: {res.split_name}",
        f"{cfg.n_seq} sequences through {cfg.n_stream} streams of {cfg.kv_size} cells ({waves} waves), "
        f"{cfg.n_layer} layers, {cfg.n_step} decode steps, K/V {cfg.type_kv}, {cfg.n_head} heads x {cfg.head_dim}, "
        f"{cfg.n_head_kv} KV heads",
        "sha256 of every attention output:",
    ]
    if res.placements:
        lines[2:2] = [f"{cfg.devices.n_devices} device(s), layers run on "
                      f"{','.join(map(str, cfg.devices.runs_on(cfg.n_layer)))}; placements (per layer: h host memory, "
                      "or the device holding it; one-device: every layer on device 0):"] + [
            f"  {name}: {text}" for name, text in res.placements.items()]
    width = max(len(p) for p in [*res.hashes, "control"])
    lines += [f"  {p.ljust(width)}  {h}  (split memory {res.split_memory.get(p, 0):,} B, "
              f"graph built at {res.builds.get(p, 0)} of {waves * cfg.n_step} steps)" for p, h in res.hashes.items()]
    lines.append(f"  {'control'.ljust(width)}  {res.control}  (ranges, each sequence reading its neighbour's stream)")
    what = "placements and policies" if res.placements else "policies"
    lines.append(f"{what}: {'identical' if res.identical else 'DIFFERENT'}; "
                 f"control: {'detected' if res.control_detected else 'NOT DETECTED'}; "
                 f"gate: {'pass' if res.passed else 'FAIL'}")
    return "\n".join(lines)


# ------------------------------------------------------------ the command


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `validate` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    d = ValidateConfig()
    vp = add_verb_parser(sub, "validate", "the hash gate: every copy policy gives identical attention outputs, and "
                         "a cross-stream read is detected (llama-parallel's gate)", __doc__,
                         "ferry validate --sequences 16 --streams 8 --type q8_0 --head-dim 128",
                         validate_workload.__doc__)
    vp.add_argument("--sequences", type=POSITIVE, default=d.n_seq, help=f"sequences served (default {d.n_seq})")
    vp.add_argument("--streams", type=POSITIVE, default=d.n_stream, help=f"streams of the cache (default {d.n_stream})")
    vp.add_argument("--cells", type=POSITIVE, default=d.kv_size, help=f"cells per stream (default {d.kv_size})")
    vp.add_argument("--steps", type=POSITIVE, default=d.n_step, help=f"decode steps per wave (default {d.n_step})")
    add_kv_args(vp, run=True)
    add_policy_arg(vp, "to compare")
    add_device_arg(vp)
    add_devices_args(vp)
    add_v_trans_arg(vp)
    vp.add_argument("--seed", type=count(0), default=d.seed, help=f"the sequences' content (default {d.seed})")
    vp.add_argument("--pad", type=POSITIVE, default=d.pad,
                    help=f"round a wave's n_kv up to this: steps of one padded n_kv reuse one graph (default {d.pad})")
    vp.add_argument("--no-reuse", dest="reuse", action="store_false",
                    help="build and allocate every step's graph, even when the last one would do")
    vp.add_argument("--compact", action="store_true",
                    help="also hash each non-flat policy with compact staging (the split holds only the bytes read)")
    vp.add_argument("--no-overlap", dest="overlap", action="store_false",
                    help="leave out the overlapped runs (each policy prefetching its windows on the split's copy "
                         "queue, hashed as <policy>+overlap)")
    vp.add_argument("--prefetch", type=POSITIVE, default=d.prefetch, metavar="N",
                    help=f"layers an overlapped run queues ahead (default {d.prefetch})")
    vp.add_argument("--json", action="store_true",
                    help='{"hashes": {policy: hex}, "identical", "control_detected", ...}; with placements '
                         '{"hashes": {"placement/policy": hex}, "placements": {name: map}, ...}')
    return vp


def main(args: argparse.Namespace) -> int:
    """Run `ferry validate` with the parsed options args: the report (or JSON) on stdout. Returns the
    exit status, 0 when the policies agree and the control was detected, else 1;
    InvalidArgumentError for options the gate cannot run with or a --model file that cannot be read
    (a usage error), another FerryError when serving fails.
    """
    check_one_head_dim(apply_model(args, run_fields()), args)
    cfg = ValidateConfig(n_seq=args.sequences, n_stream=args.streams, n_layer=args.layers, n_step=args.steps,
                         kv_size=args.cells, type_kv=args.type, n_head=args.heads, head_dim=args.head_dim,
                         n_head_kv=args.kv_heads, policies=tuple(args.policy), device=args.device, seed=args.seed,
                         compact=args.compact, pad=args.pad, reuse=args.reuse, overlap=args.overlap,
                         prefetch=args.prefetch, v_trans=args.v_trans, devices=devices_from_args(args))
    cfg.check()
    res = validate_workload.run_validate(cfg)
    if args.json:
        print(json.dumps(res.as_dict(), indent=2))
    else:
        print(format_result(cfg, res))
    if not res.passed:
        print("ferry validate: the gate failed", file=sys.stderr)
    return 0 if res.passed else 1
