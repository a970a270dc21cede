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
    """Layer indices as runs: [0, 1, 2, 5] as "0-2,5" ("-" for none)."""
    runs: List[List[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"
