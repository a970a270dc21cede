"""The progress bar of long verbs, drawn by tqdm on a terminal's stderr and nowhere else."""

from __future__ import annotations

import sys
from typing import Optional, TextIO

from tqdm import tqdm


def progress_stream() -> Optional[TextIO]:
    """Where a bar goes.

    Returns
    -------
    TextIO or None
        stderr when it is a terminal; None (no bar) in logs and pipes.
    """
    return sys.stderr if sys.stderr.isatty() else None


class Progress:
    """A bar of `total` steps with the label of the current one, or nothing when there is no stream.

    Parameters
    ----------
    total : int
        Steps to come (at least 1 is shown).
    stream : TextIO or None
        Where to draw (stderr, never stdout: the output stays clean); None draws nothing.
    width : int, optional
        Characters of the bar itself.
    unit : str, optional
        What the count counts, shown after it ("s"); empty: steps, shown bare.

    Notes
    -----
    The bar appears at the first step, so that a verb that fails before it starts leaves no
    half-drawn bar behind.
    """

    def __init__(self, total: int, stream: Optional[TextIO], width: int = 30, unit: str = "") -> None:
        self._total = max(total, 1)
        self._stream = stream
        self._width = width
        self._unit = f" {unit}" if unit else ""
        self._bar: Optional[tqdm] = None

    def step(self, n: int = 1, label: Optional[str] = None) -> None:
        """Advance the bar.

        Parameters
        ----------
        n : int, optional
            Steps done.
        label : str, optional
            The run now going, shown after the count.
        """
        if self._stream is None:
            return
        if self._bar is None:  # drawn first with this step done
            self._bar = tqdm(total=self._total, initial=n, file=self._stream, ascii="-#", desc=label or "",
                             bar_format="[{bar:%d}] {n_fmt}/{total_fmt}%s {desc}" % (self._width, self._unit))
            return
        if label is not None:
            self._bar.set_description_str(label, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
