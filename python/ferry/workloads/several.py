"""The cost model's figures for a row of several tokens a step (`ferry bench --draft N`, `--chunk N`): each
step's predict_step over the host windows it verified, plus its draft steps', beside the measured row
(predict_several)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ..residency import DeviceSpec, expected_accepted_tokens, layers_from_geometry, predict_step
from .bench_config import DRAFT_LAYERS, BenchConfig

if TYPE_CHECKING:
    from .bench_rows import BenchRow

@dataclass(frozen=True)
class SeveralGeometry:
    """A draft or chunk row's steps as it ran them: what its prediction (predict_several) is made for.

    Attributes
    ----------
    tokens_per_step : int
        Query tokens each step brings per sequence: a verification's N + 1, or the chunk.
    draft : int
        Draft steps before each verification (0 for a chunk).
    windows : tuple of int
        Each step's window over the target's layers (cells per stream).
    draft_windows : tuple of tuple of int
        Each step's draft steps' windows over the draft's layers (() each for a chunk).
    token_share : float
        The split device's part of a one-token attention each further token adds (measure_token_share
        over the first step's window): the prediction's DeviceSpec.token_share.
    """

    tokens_per_step: int
    draft: int
    windows: Tuple[int, ...]
    draft_windows: Tuple[Tuple[int, ...], ...]
    token_share: float = 1.0


@dataclass(frozen=True)
class SeveralPrediction:
    """The cost model's figures for a draft or chunk row (predict_several), beside the measured ones.

    Attributes
    ----------
    step_s : float
        The mean over the row's steps of predict_step's step (tokens_per_step query tokens over the
        host windows, copied once) and its draft steps'.
    draft_s : float
        Of step_s, the draft steps' (each predict_step of the draft's layers, resident: one token, no copy).
    accepted_per_step : float
        Tokens the row's steps kept per sequence, as its seeded draws accepted them (the measured rate's
        own: the prediction is of the same run; the chunk for a chunk).
    tokens_per_s : float
        npl * accepted_per_step / step_s: the row's tok/s by the model, beside the measured.
    expected_accepted_per_step : float
        Tokens a step keeps per sequence in expectation: expected_accepted_tokens(N, P) for a draft (the
        chunk for a chunk).
    expected_tokens_per_s : float
        npl * expected_accepted_per_step / step_s: what the model expects of a draft of N at P, whatever
        the seed drew.
    token_share : float
        The part of compute_s each further token of a step adds, as the prediction took it (measured on the
        split device: SeveralGeometry.token_share).
    run_s : float
        The host's fixed cost of a scheduler run the prediction took (predict_step's run_seconds): the
        single-token row's decode time a step beyond its copies and compute; a step of a draft row pays it
        N + 1 times (its verification and each draft step are a run each).
    compute_s : float
        The one-token compute figure of a layer the prediction took: the single-token row's compute per
        step over its layers (predict_step scales it by the tokens a step brings).
    link_gbps : float
        The link the prediction took: the stand-in's modelled one, else the single-token row's measured
        copy bandwidth.
    """

    step_s: float
    draft_s: float
    accepted_per_step: float
    tokens_per_s: float
    compute_s: float
    link_gbps: float
    expected_accepted_per_step: float = 0.0
    expected_tokens_per_s: float = 0.0
    run_s: float = 0.0
    token_share: float = 1.0


def predict_several(cfg: BenchConfig, row: BenchRow, single: BenchRow, link_gbps: Optional[float] = None,
                    latency_us: float = 0.0) -> Optional[SeveralPrediction]:
    """The cost model's step time and tokens/s for a draft or chunk row, as it ran (row.several): each
    step's predict_step(layers_from_geometry at that step's window, every target layer in host memory,
    tokens_per_step=N + 1 or the chunk, each further token adding the split's measured token_share of a
    one-token attention), plus N draft steps' predict_step over the draft's layers
    (resident on the split device, one token each), each of those runs paying the host's fixed cost of a
    run (run_seconds: the single row's decode time a step beyond its copies and compute). Tokens/s are
    over the tokens the row's own draws kept (the measured rate's), and beside them over
    expected_accepted_tokens(N, P) (a chunk keeps all its tokens). A serial row's copies are the split's
    modelled link at the copies the row made (RunTimes.predicted_copy_s: under ragged each stream's own
    cells), its computes predict_step's; a prefetching row's copies, or a row without a modelled link,
    are layers_from_geometry's: each stream's whole window of n_kv cells, as ranges copies it (under
    ragged an upper bound, by the padding and by each stream's cells short of the longest's).

    Parameters
    ----------
    cfg : BenchConfig
        The run's configuration (the cache's geometry).
    row : BenchRow
        The draft or chunk row.
    single : BenchRow
        Its variant's single-token row: its compute per step over the layers is a layer's one-token figure,
        and its decode time a step beyond its copies and compute a run's fixed cost.
    link_gbps : float, optional
        The split's modelled link (the stand-in's); None: the single row's measured copy bandwidth.
    latency_us : float, optional
        The split's modelled latency per transfer.

    Returns
    -------
    SeveralPrediction or None
        None for a row without several tokens a step, or one split over several devices (the bench's
        rows give no per-device compute figure).
    """
    geo = row.several
    if geo is None or len(row.devices) > 1 or not geo.windows:
        return None
    g, q, npl = cfg.kv, cfg.sequences, row.key.npl
    per_layer = single.per_step(single.times.compute_s) / g.n_layer
    t = single.times  # one run a step: what its wall time holds beyond its copies and compute (none if overlapped)
    run_s = max(0.0, single.per_step(t.decode_s - t.copy_s - t.compute_s))
    link = link_gbps or single.copy_bandwidth / 1e9 or 1.0
    device = [DeviceSpec(link, latency_us, per_layer, token_share=geo.token_share)]
    figures: Dict[Tuple[int, int, int], List[Any]] = {}

    def layers(n_kv: int, n_layer: int, n_new: int) -> List[Any]:
        if (n_kv, n_layer, n_new) not in figures:
            figures[n_kv, n_layer, n_new] = layers_from_geometry(
                g.type_kv, g.type_kv, g.head_dim, g.n_head_kv, q.n_ctx, npl, n_kv, [None] * n_layer, g.v_trans,
                n_new=n_new, n_head=g.n_head)
        return figures[n_kv, n_layer, n_new]

    n_tok = geo.tokens_per_step
    # Serially a step is its copies and then its computes: the copies are the split's cost model at the
    # copies the row made (each stream's own cells under ragged, not the padded windows); prefetching, the
    # copies overlap the computes and predict_step simulates both, at the padded windows.
    serial = row.key.prefetch == 0 and link_gbps is not None
    copies = row.per_step(row.times.predicted_copy_s) if serial else 0.0
    verify = [predict_step(layers(n_kv, g.n_layer, n_tok), device, [serial] * g.n_layer, prefetch=row.key.prefetch,
                           tokens_per_step=n_tok, run_seconds=run_s).step_seconds for n_kv in geo.windows]
    drafts = [sum(predict_step(layers(n_kv, DRAFT_LAYERS, 1), device, [True] * DRAFT_LAYERS,
                               run_seconds=run_s).step_seconds
                  for n_kv in step) for step in geo.draft_windows]
    draft_s = sum(drafts) / len(geo.windows)
    step_s = sum(verify) / len(geo.windows) + draft_s + copies
    kept = row.tokens / row.ntg / npl  # the seeded draws' own: the measured rate's tokens
    expected = expected_accepted_tokens(geo.draft, q.accept) if geo.draft else float(n_tok)

    def rate(tokens: float) -> float:
        return npl * tokens / step_s if step_s > 0 else math.inf

    return SeveralPrediction(step_s=step_s, draft_s=draft_s, accepted_per_step=kept, tokens_per_s=rate(kept),
                             compute_s=per_layer, link_gbps=link, expected_accepted_per_step=expected,
                             expected_tokens_per_s=rate(expected), run_s=run_s, token_share=geo.token_share)
