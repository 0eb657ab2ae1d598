"""Binding a backend to an attention: the static facts a Gaussian-sum plan needs, worked out from
the attention's parameters when it is built (:class:`ScoreBox`; the module docstring of
:mod:`.backends`, "What a plan needs before tracing")."""

from __future__ import annotations

import math

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
        row_norm: the largest row norm of Q and K (R = radius · row_norm), or None (unknown, or
            R declared directly); lets a wrapper that bounds |x| (``tp.Sphere``) fill in R.
        gamma_factor: γ / β (1 softmax, 2 ℓ², 1/ε Sinkhorn), for messages naming β.
    """

    k: int = eqx.field(static=True)
    radius: float | None = eqx.field(static=True)
    gamma: tuple[float, float] | None = eqx.field(static=True)
    note: str = eqx.field(static=True)
    row_norm: float | None = eqx.field(static=True, default=None)
    gamma_factor: float | None = eqx.field(static=True, default=None)

    def _identity(self):
        # with R unknown no plan can be made and every backend computes exactly: the parameter
        # data (γ, row norms, the note) must not make two such boxes differ, or an attention would
        # recompile for every new β and attentions of other parameters could not be stacked
        if self.radius is None:
            return (self.k, None)
        return (self.k, self.radius, self.gamma, self.note, self.row_norm, self.gamma_factor)

    def __eq__(self, other):
        return isinstance(other, ScoreBox) and self._identity() == other._identity()

    def __hash__(self):
        return hash(self._identity())

    @property
    def known(self) -> bool:
        return self.radius is not None and self.gamma is not None

    @property
    def beta(self) -> tuple[float, float] | None:
        """The β window (γ / gamma_factor), where known."""
        if self.gamma is None or not self.gamma_factor:
            return None
        return (self.gamma[0] / self.gamma_factor, self.gamma[1] / self.gamma_factor)

    def with_token_radius(self, r: float, who: str) -> ScoreBox:
        """This box with |x| <= ``r`` declared by ``who``: R = r · row_norm (unchanged where R is
        known or the row norms are not)."""
        if self.radius is not None or self.row_norm is None:
            return self
        radius, note = _from_rows(r, self.row_norm, f"|x| <= {r:g} declared by {who}")
        notes = [n for n in self.note.split("; ") if not n.startswith("no bound on |x|")]
        return ScoreBox(k=self.k, radius=radius, gamma=self.gamma, note="; ".join([note] + notes),
                        row_norm=self.row_norm, gamma_factor=self.gamma_factor)


# R below this is floored to it: Q = 0 or K = 0 makes every score 0 (the softmax a plain weighted
# average); the plan is then a handful of modes, and every point lies in the box.
MIN_RADIUS = 1e-12
"""The floor of a score box's radius R (Q = 0 or K = 0 make every score 0)."""


def _from_rows(r: float, rows: float, source: str) -> tuple[float | None, str]:
    """(R, note) for R = r · rows: None where it is not finite, floored at MIN_RADIUS."""
    radius = float(r) * float(rows)
    if not math.isfinite(radius):
        return None, (f"R = {source} x max row norm of Q, K {rows:.6g} is not finite: no plan "
                      "(declare score_radius=R)")
    if radius == 0.0:
        return MIN_RADIUS, (f"R = 0 ({source}, max row norm of Q, K {rows:.6g}): every score is "
                            f"0, planned at R = {MIN_RADIUS:g}")
    return radius, f"R = {source} x max row norm of Q, K {rows:.6g}"


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
        with np.errstate(over="ignore"):  # an overflowing norm is inf: no plan (score_box)
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
    rows = None
    if backend.score_radius is not None:
        radius = float(backend.score_radius)
        notes.append(f"R = score_radius = {radius:.6g}")
    else:
        rows, why = _row_norm_bound((Q, K), owner)
        if rows is None:
            radius = None
            notes.append(why)
        elif backend.radius is None:
            radius = None
            notes.append("no bound on |x| declared (tp.Sphere declares one; Auto(radius=r) "
                         "declares |x| <= r)")
        else:
            radius, note = _from_rows(backend.radius, rows, f"radius {backend.radius:g}")
            notes.append(note)
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
    return ScoreBox(k=k, radius=radius, gamma=gamma, note="; ".join(n for n in notes if n),
                    row_norm=rows, gamma_factor=gamma_factor)


__all__ = ["MIN_RADIUS", "ScoreBox", "score_box"]
