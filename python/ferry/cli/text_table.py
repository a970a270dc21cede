"""The one text-table layout of the command line: columns as wide as their widest cell; and the cells
several verbs write alike."""

from __future__ import annotations

from typing import Collection, List, Sequence


def format_table(rows: Sequence[Sequence[str]], left: Collection[int] = (), indent: str = "") -> List[str]:
    """Lay out rows of cells as aligned text lines.

    Parameters
    ----------
    rows : sequence of sequences of str
        The header, then the body; every row has the same number of cells.
    left : collection of int, optional
        Columns aligned to the left; the others align to the right (numbers).
    indent : str, optional
        Written before every line.

    Returns
    -------
    list of str
        One line per row, cells two spaces apart.
    """
    widths = [max(len(cell) for cell in column) for column in zip(*rows)]
    return [indent + "  ".join(cell.ljust(w) if j in left else cell.rjust(w)
                               for j, (cell, w) in enumerate(zip(row, widths)))
            for row in rows]


def fmt_layers(layers: Sequence[int]) -> str:
    """Layer indices as runs, named so that they do not read as counts: [0, 1, 2, 5] as "layers 0-2,5",
    [3] as "layer 3", none as "none"."""
    runs: List[List[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    if not text:
        return "none"
    return ("layer " if len(layers) == 1 else "layers ") + text

def fmt_seconds(s: float) -> str:
    """The duration s (seconds) with a unit that keeps 3-4 significant digits: µs, ms or s."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"

def fmt_mib(n: int) -> str:
    """The n bytes in MiB with one decimal."""
    return f"{n / 2**20:,.1f} MiB"

def fmt_tps_digits(tps: float) -> str:
    """Tokens/s with at least 4 significant digits (7.123, 71.23, 712.3, 7,123): a difference of a few
    tenths of a percent shows, as the gains claim."""
    for limit, decimals in ((10.0, 3), (100.0, 2), (1000.0, 1)):
        if abs(tps) < limit:
            return f"{tps:,.{decimals}f}"
    return f"{tps:,.0f}"


def fmt_link(gbps: float) -> str:
    """A link's speed gbps (GB/s) with 3 significant digits: "6.81 GB/s", "0.33 GB/s", "24.5 GB/s"."""
    return f"{gbps:.3g} GB/s"
