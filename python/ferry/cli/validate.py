"""`ferry validate`: the analogue of llama.cpp's llama-parallel hash gate.

It takes the window options of the other verbs: -npl is the streams a wave serves at once (one
sequence each; the gate runs once per number), -c the cells of those streams together (n_ctx /
npl each), -ntg the decode steps of every wave, -npp the longest prompt and --pad n_kv's
rounding; --sequences is how many sequences pass through in waves (default two waves)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List

from ..errors import InvalidArgumentError
from ..workloads import validate as validate_workload
from ..workloads.common import check_streams
from ..workloads.validate import ValidateConfig, ValidateResult
from .options import (
    POSITIVE,
    add_device_arg,
    add_devices_args,
    add_kv_args,
    add_policy_arg,
    add_shape_args,
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
                         "ferry validate -c 512 -npl 8 --sequences 16 -npp 60 -ntg 4 --type q8_0 --head-dim 128",
                         validate_workload.__doc__)
    add_shape_args(vp, ntg_minimum=1, gate=True)
    vp.add_argument("--sequences", type=POSITIVE, metavar="N",
                    help="sequences served, in waves of npl, each with its own content (default: 2 x npl, two "
                         "waves)")
    add_kv_args(vp, run=True)
    add_policy_arg(vp, "to compare")
    add_device_arg(vp)
    add_devices_args(vp)
    add_v_trans_arg(vp)
    vp.add_argument("--seed", type=count(0), default=d.seed, help=f"the sequences' content (default {d.seed})")
    vp.add_argument("--no-reuse", dest="reuse", action="store_false",
                    help="build and allocate every step's graph, even when the last one would do (default off: "
                         "reused)")
    vp.add_argument("--compact", action="store_true",
                    help="also hash each non-flat policy with compact staging (the split holds only the bytes read)")
    vp.add_argument("--no-overlap", dest="overlap", action="store_false",
                    help="leave out the overlapped runs (each policy prefetching its windows on the split's copy "
                         "queue, hashed as <policy>+overlap; default off: they run)")
    vp.add_argument("--prefetch", type=POSITIVE, default=d.prefetch, metavar="N",
                    help=f"layers an overlapped run queues ahead (default {d.prefetch})")
    vp.add_argument("--json", action="store_true",
                    help='a JSON list, one object per -npl: {"npl", "hashes": {policy: hex}, "identical", '
                         '"control_detected", ...}; with placements {"hashes": {"placement/policy": hex}, '
                         '"placements": {name: map}, ...}')
    return vp


def configs_from_args(args: argparse.Namespace) -> List[ValidateConfig]:
    """The gate's runs the parsed options args describe, one per -npl: npl streams of -c / npl cells,
    --sequences (default 2 x npl) served in waves of npl; each checked.

    Raises
    ------
    InvalidArgumentError
        For options a run cannot take.
    """
    out = []
    for npl in args.npl:
        check_streams(args.c, npl)
        cfg = ValidateConfig(n_seq=args.sequences or 2 * npl, n_stream=npl, n_layer=args.layers, n_step=args.ntg,
                             kv_size=args.c // npl, npp=args.npp, type_kv=args.type, n_head=args.heads,
                             head_dim=args.head_dim, n_head_kv=args.kv_heads, policies=tuple(args.policy),
                             device=args.device, seed=args.seed, compact=args.compact, pad=args.pad, reuse=args.reuse,
                             overlap=args.overlap, prefetch=args.prefetch, v_trans=args.v_trans,
                             devices=devices_from_args(args))
        cfg.check()
        out.append(cfg)
    return out


def main(args: argparse.Namespace) -> int:
    """Run `ferry validate` with the parsed options args, once per -npl: the reports (or a JSON list)
    on stdout, the text's last line the verdict over every npl. Returns the exit status, 0 when at
    every npl the policies agree and the control was detected, else 1; InvalidArgumentError for
    options the gate cannot run with or a --model file that cannot be read (a usage error),
    another FerryError when serving fails.
    """
    check_one_head_dim(apply_model(args, run_fields()), args)
    cfgs = configs_from_args(args)
    runs = [(cfg, validate_workload.run_validate(cfg)) for cfg in cfgs]
    failed = [cfg.n_stream for cfg, res in runs if not res.passed]
    if args.json:
        print(json.dumps([{"npl": cfg.n_stream, **res.as_dict()} for cfg, res in runs], indent=2))
    else:
        print("\n\n".join(format_result(cfg, res) for cfg, res in runs))
        if len(runs) > 1:
            print(f"\ngate at npl {', '.join(str(c.n_stream) for c in cfgs)}: "
                  + (f"FAIL at npl {', '.join(map(str, failed))}" if failed else "pass"))
    if failed:
        print("ferry validate: the gate failed", file=sys.stderr)
    return 1 if failed else 0
