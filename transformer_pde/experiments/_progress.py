"""The one progress path of the experiments: tqdm bars on stderr, never ``print``.

``bar = progress_bar(progress, total=..., desc=...)`` is a tqdm bar, hidden when
``progress`` is False (``--no-progress``); ``note(bar, text)`` writes a line of results above
it (only when shown), and ``bar.note`` is the same as a ``Callable[[str], None]`` for library
functions that report progress by lines (:func:`transformer_pde.sweep`,
:func:`transformer_pde.convergence.convergence_study`). Solves draw their own tqdm bars from inside jit
(``progress_meter=solver_meter(progress)``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tqdm is imported when a bar is made: the experiments' modules stay light
    from tqdm import tqdm


def progress_bar(enabled: bool, total: int | None = None, desc: str | None = None,
                 unit: str = "it") -> tqdm:
    """A tqdm bar on stderr; disabled (no output at all) when ``enabled`` is False."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr,
               dynamic_ncols=True)
    bar.note = lambda text: note(bar, text)
    return bar


def solver_meter(enabled: bool):
    """The progress meter a solve draws from inside jit: diffrax's tqdm meter when shown."""
    if not enabled:
        return None
    import diffrax

    return diffrax.TqdmProgressMeter()


def note(bar: tqdm, text: str) -> None:
    """A line above ``bar`` (e.g. the outcome of a finished stage); nothing when hidden."""
    if not bar.disable:
        bar.write(text, file=sys.stderr)


__all__ = ["note", "progress_bar"]
