"""Reporting a run whose program found non-finite tokens: :class:`NonFiniteRun`.

A program kept by :func:`~transformer_pde.runs.lower_program` holds no runtime check (a host
callback): it returns, beside its numbers, the time each of its runs became non-finite (inf
where it stayed finite; ``tp.layers(..., throw=False).nonfinite_time``), and the experiment
calls :func:`raise_if_nonfinite` after it ran, which names the first such run by its
parameters."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._checks import NonFiniteStateError


class NonFiniteRun(NonFiniteStateError):
    """Tokens of a run became NaN or inf (a :class:`~transformer_pde.NonFiniteStateError`).

    Attributes:
        where: what ran (``"phase-diagram"``, ``"normalization: scheme ngpt, ..."``).
        time: when the first such run became non-finite.
        parameters: that run's parameters, name -> value.
        count, total: how many runs became non-finite, of how many.
    """

    def __init__(self, where: str, time: float, parameters: dict, count: int, total: int, advice: str):
        at = ", ".join(f"{k} = {_text(v)}" for k, v in parameters.items())
        super().__init__(f"{where}: the tokens became non-finite (NaN or inf) by t = {time:.6g} at {at} "
                         f"({count} of {total} runs); {advice}")
        self.where, self.time, self.parameters, self.count, self.total = where, time, parameters, count, total


def _text(v) -> str:
    return f"{v:.6g}" if isinstance(v, (float, np.floating)) else str(v)


def raise_if_nonfinite(where: str, nonfinite_time, axes: Mapping[str, object], advice: str) -> None:
    """Raise :class:`NonFiniteRun` naming the first run whose ``nonfinite_time`` is finite.

    Args:
        where: what ran, the message's start.
        nonfinite_time: one time per run, inf where the run stayed finite, an array over the
            parameter axes.
        axes: name -> the values along each axis of ``nonfinite_time``, in order (``{"beta":
            betas, "start": np.arange(k)}``).
        advice: what to change (``"the step dt or beta is too large"``).
    """
    t = np.asarray(nonfinite_time, dtype=np.float64)
    values = [np.asarray(v) for v in axes.values()] if isinstance(axes, Mapping) else None
    if values is None or tuple(len(v) for v in values) != t.shape or any(v.ndim != 1 for v in values):
        raise ValueError(f"raise_if_nonfinite: axes must map a name to the values along each axis of "
                         f"nonfinite_time (shape {t.shape}), got {axes!r}"[:300])
    bad = np.isfinite(t)
    if not bad.any():
        return
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    parameters = {name: v[i].item() for (name, v), i in zip(zip(axes, values), index)}
    raise NonFiniteRun(where, float(t[index]), parameters, int(bad.sum()), bad.size, advice)


__all__ = ["NonFiniteRun", "raise_if_nonfinite"]
