"""`ferry validate`: the analogue of llama.cpp's llama-parallel hash gate.

It takes the window options of the other verbs: -npl is the streams a wave serves at once (one
sequence each; the gate runs once per number), -c the cells of those streams together (n_ctx /
npl each), -ntg the decode steps of every wave, -npp the longest prompt and --pad n_kv's
rounding; --sequences is how many sequences pass through in waves (default two waves)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ..errors import InvalidArgumentError
from ..workloads import validate as validate_workload
from ..workloads.common import PREFETCH_NEXT, KVGeometry, VariantOptions, check_streams
from ..workloads.paged_tables import PagedOptions
from ..workloads.validate import ValidateConfig, ValidateResult, Waves
from . import remote_hook
from .options import apply_model, check_one_head_dim, devices_from_args, run_fields
from .reference import Verb, add_verb_parser

#: Failures that come from the options: reported as usage errors (exit 2); others end the run.
ARGUMENT_ERRORS = InvalidArgumentError


def format_result(cfg: ValidateConfig, res: ValidateResult) -> str:
    """The report of the ValidateResult res of the ValidateConfig cfg: the run, one hash per policy (per
    placement and policy when placements were compared, each placement's map listed) and the
    control's, the verdicts.
    """
    w, g, paged = cfg.waves, cfg.kv, cfg.paged_cache
    waves = -(-w.n_seq // w.n_stream)
    lines = [
        f"split backend: {res.split_name}",
        f"{w.n_seq} sequences through {w.n_stream} streams of {w.kv_size} cells ({waves} waves), "
        f"{g.n_layer} layers, {w.n_step} decode steps, K/V {g.type_kv}, {g.n_head} heads x {g.head_dim}, "
        f"{g.n_head_kv} KV heads",
        "sha256 of every attention output:",
    ]
    if paged.paged:
        lines.insert(2, f"paged cache: {paged.block_size}-cell blocks, adjacency {paged.adjacency:g}; served under "
                        "ragged once per gather method (paged/<method>), and through a device pool's table "
                        "(paged/device_table)")
    if res.placements:
        lines[2:2] = [f"{cfg.devices.n_devices} device(s), layers run on "
                      f"{','.join(map(str, cfg.devices.runs_on(g.n_layer)))}; placements (per layer: h host memory, "
                      "or the device holding it; one-device: every layer on device 0):"] + [
            f"  {name}: {text}" for name, text in res.placements.items()]
    width = max(len(p) for p in [*res.hashes, *res.draft_hashes, "control"])
    lines += [f"  {p.ljust(width)}  {h}  (split memory {res.split_memory.get(p, 0):,} B, "
              f"graph built at {res.builds.get(p, 0)} of {waves * w.n_step} steps)" for p, h in res.hashes.items()]
    lines.append(f"  {'control'.ljust(width)}  {res.control}  (ranges, each sequence reading its neighbour's stream)")
    if res.draft_hashes:
        lines.append(f"served by drafts of {w.draft} tokens (each accepted with chance {w.accept:g}, its "
                     f"predecessors accepted), one verification of {w.draft + 1} tokens a step, the rejected cells "
                     "rolled back:")
        lines += [f"  {p.ljust(width)}  {h}" for p, h in res.draft_hashes.items()]
        lines.append(f"drafts: {'identical' if res.draft_identical else 'DIFFERENT'}; against one-token steps: "
                     f"{res.draft_error:.3g} at most (tolerance {validate_workload.DRAFT_TOLERANCE:g})")
    what = ("placements and policies" if res.placements else "policies") + (
        " and paged gathers" if paged.paged else "")
    lines.append(f"{what}: {'identical' if res.identical else 'DIFFERENT'}; "
                 f"control: {'detected' if res.control_detected else 'NOT DETECTED'}; "
                 f"gate: {'pass' if res.passed else 'FAIL'}")
    return "\n".join(lines)


# ------------------------------------------------------------ the command


VERB = Verb("validate", "the hash gate: every copy policy gives identical attention outputs, and a cross-stream "
            "read is detected (llama-parallel's gate)", " ".join((__doc__ or "").split("\n", 1)[-1].split()),
            "ferry validate -c 512 -npl 8 --sequences 16 -npp 60 -ntg 4 --type q8_0 --head-dim 128")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `validate` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


@dataclass(frozen=True)
class Job:
    """What `ferry validate` runs and prints: one gate per -npl, and JSON or text."""

    configs: Tuple[ValidateConfig, ...]
    json: bool
    remote: Optional[str] = None  # --remote: "" a server on the loopback, or the peer's HOST:PORT


def job(args: argparse.Namespace) -> Job:
    """The gate's runs the parsed options args describe, one per -npl: npl streams of -c / npl cells,
    --sequences (default 2 x npl) served in waves of npl; each checked. --model is read.

    Raises
    ------
    InvalidArgumentError
        For options a run cannot take.
    """
    check_one_head_dim(apply_model(args, run_fields()), args)
    out = []
    for npl in args.npl:
        check_streams(args.c, npl)
        cfg = ValidateConfig(
            waves=Waves(n_seq=args.sequences or 2 * npl, n_stream=npl, n_step=args.ntg, kv_size=args.c // npl,
                        npp=args.npp, lengths=args.lengths, pad=args.pad, seed=args.seed, draft=args.draft,
                        accept=args.accept),
            kv=KVGeometry(n_layer=args.layers, type_kv=args.type, n_head=args.heads, head_dim=args.head_dim,
                          n_head_kv=args.kv_heads, v_trans=args.v_trans),
            variants=VariantOptions(policies=tuple(args.policy), compact=args.compact, reuse=args.reuse,
                                    overlap=args.overlap, prefetch=tuple(args.prefetch),
                                    prefetch_next=PREFETCH_NEXT[args.prefetch_next]),
            paged_cache=PagedOptions(paged=args.paged, block_size=args.block_size, adjacency=args.adjacency),
            device=args.device, devices=devices_from_args(args))
        cfg.check()
        out.append(cfg)
    return Job(tuple(out), args.json, remote_hook.check(args))


def run(j: Job) -> int:
    """Run the gate of the Job j once per -npl: the reports (or a JSON list) on stdout, the text's last
    line the verdict over every npl. Returns the exit status, 0 when at every npl the policies agree
    and the control was detected, else 1; a FerryError when serving fails.
    """
    runs = [(cfg, validate_workload.run_validate(cfg)) for cfg in j.configs]
    failed = [cfg.waves.n_stream for cfg, res in runs if not res.passed]
    remote = None
    if j.remote is not None:  # the remote tier's pulls, byte for byte against the local cache; a difference fails
        w, c0 = j.configs[0].waves, j.configs[0]
        npp = w.npp if w.npp is not None else w.kv_size - w.n_step  # as the gate's waves take it
        remote = remote_hook.run(w.kv_size * w.n_stream, [c.waves.n_stream for c in j.configs], npp, w.n_step,
                                 w.pad, w.lengths, c0.kv, c0.variants.policies, w.seed, j.remote, c0.paged_cache)
        wrong = {r.npl for r in remote.rows if not r.identical} | {s.npl for s in remote.steps if not s.identical}
        failed += sorted(wrong - set(failed))
    if j.json:
        print(json.dumps([{"npl": cfg.waves.n_stream, **res.as_dict()} for cfg, res in runs]
                         + ([remote_hook.as_json(remote)] if remote else []), indent=2))
    else:
        print("\n\n".join([format_result(cfg, res) for cfg, res in runs] + ([remote_hook.text(remote)] if remote
                                                                             else [])))
        if len(runs) > 1:
            print(f"\ngate at npl {', '.join(str(c.waves.n_stream) for c in j.configs)}: "
                  + (f"FAIL at npl {', '.join(map(str, failed))}" if failed else "pass"))
    if failed:
        print("ferry validate: the gate failed", file=sys.stderr)
    return 1 if failed else 0


def main(args: argparse.Namespace) -> int:
    """`ferry validate` with the parsed options args: run(job(args)). InvalidArgumentError for options
    the gate cannot run with or a --model file that cannot be read (a usage error)."""
    return run(job(args))
