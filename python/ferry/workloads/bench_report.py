"""What `ferry bench` says of its rows (BenchResult, finished into a BenchReport for the command line to print):
each row's gain over flat and over the unified cache with their intervals, an overlapped row beside its serial
run, a draft or chunk row beside its single-token row and the cost model's prediction."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from .bench_config import LINK_OVERRUN, BenchConfig, variants
from .bench_rows import DRAFT_ROW_KEYS, BenchRow, RunKey, RunTimes
from .estimate import Interval, gain_interval
from .several import SeveralPrediction, predict_several
from .trace import TracedStep


@dataclass(frozen=True)
class OverlapFigures:
    """An overlapped row beside its variant's serial run (BenchResult's bound, floor and exposed).

    Attributes
    ----------
    serial : RunTimes
        The serial run's times.
    bound_s : float
        max(copy, compute) of the serial run: a repetition's decode time when one hides the other.
    floor_s, own_floor_s : float or None
        The least decode time prefetching can reach, from the serial run's copy and compute, and from the
        overlapped run's own (None where the layers are not alike).
    exposed_share : float
        Of what prefetching could hide, the share its decode still pays.
    """

    serial: RunTimes
    bound_s: float
    floor_s: Optional[float]
    own_floor_s: Optional[float]
    exposed_share: float


@dataclass(frozen=True)
class ReportRow:
    """A row with what the report says of it, finished for the command line to print: its gains and
    intervals, its variant's unified row, and an overlapped row's figures beside its serial run.

    Attributes
    ----------
    row : BenchRow
        The run.
    gain : Interval or None
        Its gain over flat (same npl and layout, serial or overlapped alike); None without a flat run.
    replica_gains : tuple of float
        Each replica's gain over flat's replica of the same rank; () for flat or without a flat run.
    over_unified : Interval or None
        A split-cache row's gain over the unified cache under the same variant; None for a unified row or
        when the unified cache did not run.
    unified : BenchRow or None
        The same variant's row on the unified cache, beside a split-cache row; None otherwise.
    overlap : OverlapFigures or None
        An overlapped row's figures; None for a serial row.
    single : BenchRow or None
        Beside a draft row, the single-token row of its variant (--draft 0's); None otherwise.
    predicted : SeveralPrediction or None
        A draft or chunk row's step and tokens/s by the cost model (predict_several); None otherwise.
    """

    row: BenchRow
    gain: Optional[Interval] = None
    replica_gains: Tuple[float, ...] = ()
    over_unified: Optional[Interval] = None
    unified: Optional[BenchRow] = None
    overlap: Optional[OverlapFigures] = None
    single: Optional[BenchRow] = None
    predicted: Optional[SeveralPrediction] = None

    @property
    def bytes_over_single(self) -> Optional[float]:
        """A draft row's bytes copied per accepted token over its single-token row's per token; None for
        other rows."""
        s = self.single
        return None if s is None else self.row.bytes_per_token / s.bytes_per_token if s.bytes_per_token else None

    @property
    def speedup_over_single(self) -> Optional[float]:
        """A draft row's tokens/s (accepted tokens) over its single-token row's; None for other rows."""
        s = self.single
        return None if s is None else self.row.tokens_per_s / s.tokens_per_s

    @property
    def is_serial_cells(self) -> bool:
        """Whether the row is a serial single-token run of the cells cache (the main table's rows)."""
        return not self.row.key.overlap and not self.row.key.gather and not self.row.key.tokens_per_step

    def as_dict(self) -> Dict[str, object]:
        """The row as `ferry bench --json` writes it (without "config"): BenchRow.as_dict, an overlapped row's
        figures, then its gains (see BenchResult.as_dicts)."""
        r, g, u, o = self.row, self.gain, self.over_unified, self.overlap
        d = r.as_dict()
        decode = r.times.decode_s
        if o is not None:
            s = o.serial
            d.update(serial_decode_s=s.decode_s, bound_s=o.bound_s, over_bound=decode / o.bound_s,
                     over_serial=decode / s.decode_s, exposed_share=o.exposed_share, floor_s=o.floor_s,
                     over_floor=None if o.floor_s is None else decode / o.floor_s, own_floor_s=o.own_floor_s,
                     over_own_floor=None if not o.own_floor_s else decode / o.own_floor_s,
                     compute_over_serial=r.times.compute_s / s.compute_s if s.compute_s > 0 else None)
        k = r.key
        d.update(gain=None if g is None else g.estimate, gain_low=None if g is None else g.low,
                 gain_high=None if g is None else g.high,
                 gain_within_noise=None if g is None or k.policy == "flat" else g.within_noise,
                 gain_claimed=not k.unified and k.policy != "flat" and g is not None,
                 over_unified=None if u is None else u.estimate, over_unified_low=None if u is None else u.low,
                 over_unified_high=None if u is None else u.high)
        if self.single is not None:
            d.update(bytes_per_token_over_single=self.bytes_over_single,
                     tokens_per_s_over_single=self.speedup_over_single)
        p = self.predicted
        if p is not None:  # predicted: at the seeded draws' accepted tokens, as measured; expected: at E(N, P)
            d.update(accepted_per_step=r.tokens / r.ntg / k.npl,
                     expected_accepted_per_step=p.expected_accepted_per_step,
                     predicted_step_s=p.step_s, predicted_draft_s=p.draft_s, predicted_tokens_per_s=p.tokens_per_s,
                     tokens_per_s_over_predicted=r.tokens_per_s / p.tokens_per_s if p.tokens_per_s > 0 else None,
                     expected_tokens_per_s=p.expected_tokens_per_s, predicted_compute_s=p.compute_s,
                     predicted_run_s=p.run_s, predicted_token_share=p.token_share, predicted_link_gbps=p.link_gbps)
        return d


@dataclass(frozen=True)
class NplSummary:
    """What the report says of one npl beneath its table.

    Attributes
    ----------
    npl : int
        Sequences.
    outputs_identical : bool
        Whether every run of npl (each policy, both layouts, serial and overlapped) gave the same outputs.
    rebuilds : int
        How many later steps rebuilt the step's graph, in the first variant's serial run of the cells cache.
    """

    npl: int
    outputs_identical: bool
    rebuilds: int


@dataclass(frozen=True)
class BenchReport:
    """A run's report, finished for the command line to print: it formats from this alone.

    Attributes
    ----------
    rows : tuple of ReportRow
        Every row, in the rows' order (BenchResult.report).
    per_npl : tuple of NplSummary
        Per npl, in the configuration's order.
    variants : tuple of (str, bool)
        The (policy, compact) runs in table order (BenchResult.variants); the main table shows the unified
        cache's row of the first.
    """

    rows: Tuple[ReportRow, ...]
    per_npl: Tuple[NplSummary, ...]
    variants: Tuple[Tuple[str, bool], ...]


@dataclass
class BenchResult:
    """Every run of a configuration, and which backends ran it."""

    config: BenchConfig
    split_name: str
    cache_memory: str
    rows: List[BenchRow]
    device_names: List[str] = field(default_factory=list)  # every device, in index order (split_name: device 0)
    standin_link_gbps: Optional[float] = None  # the stand-in split's modelled link (None: unmodelled, or CUDA)
    standin_latency_us: float = 0.0  # the stand-in split's modelled latency per transfer
    link_overrun: float = 0.0  # over the timed rounds, the most a stand-in's copies ran past its link, a share
    seconds: float = 0.0  # the run's wall time
    traces: Dict[str, List[TracedStep]] = field(default_factory=dict)  # with cfg.sampling.trace: per variant's label,
    # the steps of its last timed repetition in the first replica

    def row(self, npl: int, policy: str, unified: bool = False, compact: bool = False, prefetch: int = 0,
            gather: str = "", within: bool = False) -> BenchRow:
        """The row of one run, serial or prefetching that many parts ahead (across steps, or within each
        with within), of the cells cache or (gather one of PAGED_GATHERS) the paged cache (StopIteration
        for a run the configuration did not make)."""
        key = RunKey(npl=npl, policy=policy, unified=unified, compact=compact, prefetch=prefetch,
                     prefetch_next=prefetch > 0 and not within, gather=gather)
        return next(r for r in self.rows if r.key == key)

    def single_of(self, r: BenchRow) -> BenchRow:
        """The single-token row of a draft row's variant (the row itself for a single-token row)."""
        return next(x for x in self.rows if x.key == replace(r.key, draft=0, chunk=0))

    def serial_of(self, r: BenchRow) -> BenchRow:
        """The serial run of an overlapped row's variant (the row itself when it is serial)."""
        k = r.key
        return self.row(k.npl, k.policy, k.unified, k.compact)

    def bound(self, r: BenchRow) -> float:
        """max(copy, compute) of the row's serial run: a step's decode time when one hides the other."""
        serial = self.serial_of(r).times
        return max(serial.copy_s, serial.compute_s)

    def floor(self, r: BenchRow, own: bool = False) -> Optional[float]:
        """The least decode time prefetching can reach for the row's variant, from its serial run's copy
        and compute (with own, from the overlapped row's own, which the copies and computes running
        side by side may have slowed). Within a step: the first layer's copy (nothing computes before
        it), then each layer's compute under the next layer's copy, then the last layer's compute; with
        L equal layers, copy / L + (L - 1) / L * max(copy, compute) + compute / L, past the bound by the
        first layer's copy or the last layer's compute, a large share of a step of few layers. Across
        steps (prefetch_next), a step that kept its first layer's windows copied under the step before
        (BenchRow.steps_ahead of the ntg: all but a repetition's first, whose lengths fell, so that it
        copies them again; none on the unified cache, whose windows carry no lengths) can reach the
        bound, max(copy, compute): ((ntg - k) * that floor + k * bound) / ntg. None where the layers
        are not alike (some KV on a device, or several devices)."""
        cfg = self.config
        if cfg.devices.n_devices != 1 or cfg.devices.placed:
            return None
        s, n, k = (r if own else self.serial_of(r)).times, cfg.kv.n_layer, r.counts.steps_ahead
        bound = max(s.copy_s, s.compute_s)
        within = (s.copy_s + (n - 1) * bound + s.compute_s) / n
        return ((cfg.sequences.ntg - k) * within + k * bound) / cfg.sequences.ntg

    def exposed(self, r: BenchRow) -> float:
        """An overlapped row's exposed share: of what prefetching could hide (min(copy, compute) of the serial
        run), the share its decode still pays: (decode - max(copy, compute)) / min(copy, compute); 0 when it
        hides it all, 1 when it hides nothing."""
        serial = self.serial_of(r).times
        hideable = min(serial.copy_s, serial.compute_s)
        return (r.times.decode_s - self.bound(r)) / hideable if hideable > 0 else 0.0

    def variants(self) -> List[Tuple[str, bool]]:
        """(policy, compact) in table order: every policy, then the non-flat ones with compact staging."""
        return variants(self.config)

    def flat_of(self, r: BenchRow) -> Optional[BenchRow]:
        """flat's row of the same npl and layout (overlapped for an overlapped row); None without flat."""
        if "flat" not in self.config.variants.policies:
            return None
        k = r.key
        return self.row(k.npl, "flat", k.unified, prefetch=k.prefetch, within=not k.prefetch_next)

    def gain_interval(self, r: BenchRow) -> Optional[Interval]:
        """A row's gain over flat (same npl and layout, serial or overlapped alike) with its interval
        (estimate.gain_interval); None without a flat run."""
        flat = self.flat_of(r)
        return None if flat is None else gain_interval(r.replica_rates, flat.replica_rates)

    def gain(self, r: BenchRow) -> Optional[float]:
        """A row's gain over flat: the estimate of gain_interval (None without flat)."""
        g = self.gain_interval(r)
        return None if g is None else g.estimate

    def unified_gain(self, r: BenchRow) -> Optional[Interval]:
        """A split-cache row's gain over the unified cache under the same policy; None for a unified row
        or when the unified cache did not run."""
        k = r.key
        if k.unified or not self.config.runs_unified:
            return None
        u = self.row(k.npl, k.policy, True, k.compact, k.prefetch, within=not k.prefetch_next)
        return gain_interval(r.replica_rates, u.replica_rates)

    def warnings(self) -> List[str]:
        """What makes the figures less sure than they look: a stand-in's copies running past its link."""
        if self.link_overrun <= LINK_OVERRUN:
            return []
        return [f"the stand-in's copies ran {self.link_overrun:.0%} past the modelled link's time: the host did not "
                "keep to the link (copies slower than it, or a busy machine), so copy times partly follow the host; "
                "a lower --link-gbps leaves it room"]

    def report(self) -> List[ReportRow]:
        """Every row, in the rows' order, finished with what the report says of it (ReportRow)."""
        out = []
        for r in self.rows:
            k = r.key
            if k.tokens_per_step:
                single = self.single_of(r)
                out.append(ReportRow(row=r, single=single, predicted=predict_several(
                    self.config, r, single, self.standin_link_gbps, self.standin_latency_us)))
                continue
            flat = self.flat_of(r)
            gains = () if flat is None or k.policy == "flat" else tuple(
                a / b - 1 for a, b in zip(r.replica_rates, flat.replica_rates))
            unified = None
            if not k.unified and not k.gather and self.config.runs_unified:
                unified = self.row(k.npl, k.policy, True, k.compact, k.prefetch, within=not k.prefetch_next)
            overlap = None
            if k.overlap:
                overlap = OverlapFigures(serial=self.serial_of(r).times, bound_s=self.bound(r), floor_s=self.floor(r),
                                         own_floor_s=self.floor(r, own=True), exposed_share=self.exposed(r))
            out.append(ReportRow(row=r, gain=self.gain_interval(r), replica_gains=gains,
                                 over_unified=self.unified_gain(r), unified=unified, overlap=overlap))
        return out

    def finished(self) -> BenchReport:
        """The whole report, finished: every row (report), each npl's summary and the variants."""
        runs = tuple(self.variants())
        policy, compact = runs[0]
        per_npl = tuple(NplSummary(npl=npl, outputs_identical=self.outputs_identical(npl),
                                   rebuilds=self.row(npl, policy, False, compact).counts.rebuilds)
                        for npl in self.config.sequences.npl)
        return BenchReport(rows=tuple(self.report()), per_npl=per_npl, variants=runs)

    def as_dicts(self) -> List[Dict[str, object]]:
        """The rows as `ferry bench --json` writes them: each ReportRow's as_dict: the row's (BenchRow.as_dict);
        an overlapped row's serial decode time and bound ("serial_decode_s", "bound_s"), its decode time over
        each ("over_bound", "over_serial"), its exposed share ("exposed_share", see exposed), the pipeline's
        floor ("floor_s", "over_floor"; None where floor has none), the same from its own copy and compute
        ("own_floor_s", "over_own_floor"), and its compute over the serial run's ("compute_over_serial": what
        running beside the copies cost the compute); its gain over flat and its interval ("gain", "gain_low",
        "gain_high", "gain_within_noise"; "gain_claimed": False for flat and the unified cache); a split row's
        gain over the unified cache ("over_unified", "over_unified_low", "over_unified_high"); "config": the
        whole configuration (BenchConfig.as_dict)."""
        config = self.config.as_dict()
        drafted = self.config.tokens_per_step > 1
        return [{**{k: v for k, v in f.as_dict().items() if drafted or k not in DRAFT_ROW_KEYS}, "config": config}
                for f in self.report()]

    def outputs_identical(self, npl: int) -> bool:
        """Whether every run of npl (each policy, both layouts, serial and overlapped) gave the same
        attention outputs, and every draft row the same as the other draft rows."""
        return all(len({r.output_sha256 for r in self.rows if r.key.npl == npl and r.key.tokens_per_step == d}) <= 1
                   for d in (False, True))
