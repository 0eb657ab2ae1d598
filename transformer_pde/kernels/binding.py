"""Binding a backend to an attention: the static facts a Gaussian-sum plan needs, worked out from
the attention's parameters when it is built (:class:`ScoreBox`; the module docstring of
:mod:`.backends`, "What a plan needs before tracing")."""

from __future__ import annotations

import equinox as eqx
import numpy as np

from .._checks import is_concrete
from ..params import PiecewiseConstant, param_shape


class ScoreBox(eqx.Module):
    """What a Gaussian-sum plan needs before tracing, worked out when the attention is built.

    Attributes:
        k: dimension of the score space (rows of Q and K).
        radius: R with ``|Qx|_∞, |Kx|_∞ <= R`` over the run, or None (unknown: no fast plan).
        gamma: the window ``(lo, hi)`` of γ, or None (β traced at construction, no declared
            window: no fast plan).
        note: where R and γ came from, or why they are unknown (in reports and error messages).
    """

    k: int = eqx.field(static=True)
    radius: float | None = eqx.field(static=True)
    gamma: tuple[float, float] | None = eqx.field(static=True)
    note: str = eqx.field(static=True)

    @property
    def known(self) -> bool:
        return self.radius is not None and self.gamma is not None


def _row_norm_bound(params, owner: str) -> tuple[float | None, str]:
    """max over rows (of every head, every layer) of |row|_2, or (None, why)."""
    best = 0.0
    for p in params:
        if isinstance(p, PiecewiseConstant):
            values = p.values
        elif callable(p):
            return None, (f"{owner}: a callable parameter has no norm bound before the run; pass "
                          "score_radius=R (a bound on |Qx|_inf, |Kx|_inf), or a PiecewiseConstant")
        else:
            values = p
        if not is_concrete(values):
            return None, (f"{owner}: Q, K are traced when the attention is built; pass "
                          "score_radius=R (a bound on |Qx|_inf, |Kx|_inf)")
        rows = np.linalg.norm(np.asarray(values, np.float64), axis=-1)
        best = max(best, float(rows.max()))
    return best, ""


def score_box(backend, owner: str, *, Q, K, beta, gamma_factor=1.0) -> ScoreBox:
    """The :class:`ScoreBox` of scores a = Qx, b = Kx with γ = ``gamma_factor`` · β.

    R comes from the backend's ``score_radius``, or from its ``radius`` times the largest row norm
    of Q and K; the γ window from its ``beta=(lo, hi)`` or the concrete β, times ``gamma_factor``
    (a Python number: 2 for ℓ², 1/ε for Sinkhorn, None when ε is traced).
    """
    k = int(param_shape(Q)[-2])
    notes = []
    if backend.score_radius is not None:
        radius = float(backend.score_radius)
        notes.append(f"R = score_radius = {radius:.6g}")
    else:
        rows, why = _row_norm_bound((Q, K), owner)
        radius = None if rows is None else float(backend.radius) * rows
        notes.append(why or f"R = radius {backend.radius:g} x max row norm of Q, K {rows:.6g}")
    if gamma_factor is None:
        gamma = None
        notes.append(f"{owner}: epsilon is traced when the attention is built; build it with a "
                     "concrete epsilon")
    elif backend.beta is not None:
        lo, hi = backend.beta
        if is_concrete(beta) and not lo <= float(beta) <= hi:
            raise ValueError(f"{owner}: beta={float(beta):g} lies outside the declared window "
                             f"beta={backend.beta}")
        gamma = (gamma_factor * float(lo), gamma_factor * float(hi))
        notes.append(f"gamma in [{gamma[0]:.6g}, {gamma[1]:.6g}] from the declared beta window")
    elif is_concrete(beta):
        if not float(beta) > 0:
            gamma = None
            notes.append(f"{owner}: beta={float(beta):g} <= 0 has no Gaussian form")
        else:
            gamma = (gamma_factor * float(beta),) * 2
            notes.append(f"gamma = {gamma[0]:.6g} from the concrete beta")
    else:
        gamma = None
        notes.append(f"{owner}: beta is traced when the attention is built (a sweep or a fit); "
                     "declare its window, beta=(lo, hi)")
    return ScoreBox(k=k, radius=radius, gamma=gamma, note="; ".join(n for n in notes if n))


__all__ = ["ScoreBox", "score_box"]
