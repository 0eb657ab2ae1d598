"""Pseudo-arclength continuation of the roots of R(a, K) = 0 (a the state's coefficients, K the
coupling), shared by the circle (:mod:`.circle`) and the zonal sphere (:mod:`.zonal`)
(docs: math/noise.md#stationary-branches).

The branch leaves the uniform law at its first instability (a generalized eigenvalue problem of
the Jacobian, affine in K there), each predictor steps along the tangent and each corrector is an
``optimistix.Newton`` root find on R and the arclength condition; a corrector that fails at the
smallest step is :class:`ContinuationError` (the branch is lost, not guessed). Folds are where
dK/ds changes sign.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._checks import check_in_range, check_int, check_scalar


class ContinuationError(ValueError):
    """The continuation lost the branch: the Newton corrector failed at the smallest step."""


def check_controls(*, ds, ds_min, ds_max, tol, max_points, order_max) -> None:
    """ValueError naming a bad control of :func:`pseudo_arclength` (and the order parameter's stop)."""
    # the step halves on a failed corrector until below ds_min: ds_min > 0 ends that loop
    for name, value in (("ds_min", ds_min), ("ds", ds), ("ds_max", ds_max), ("tol", tol)):
        check_scalar(value, name, positive=True)
    if not ds_min <= ds <= ds_max:
        raise ValueError(f"the arclength steps must satisfy ds_min <= ds <= ds_max, got ds_min={ds_min:g}, "
                         f"ds={ds:g}, ds_max={ds_max:g} (a ds_max below ds_min cannot leave the bifurcation)")
    check_int(max_points, "max_points", minimum=2)
    check_in_range(order_max, "order_max", low=0.0, high=1.0, low_open=True,
                   meaning="the order parameter of a density is in [0, 1]")


@eqx.filter_jit
def corrector(residual, u_pred, tangent, rtol, atol):
    """Newton on (R(u), ⟨tangent, u − u_pred⟩) = 0 from u_pred; (u, converged)."""
    def fn(u, args):
        return jnp.concatenate([residual(u), jnp.dot(tangent, u - u_pred)[None]])

    sol = optx.root_find(fn, optx.Newton(rtol=rtol, atol=atol), u_pred, throw=False, max_steps=30)
    return sol.value, sol.result == optx.RESULTS.successful


@eqx.filter_jit
def jacobian(residual, u):
    """∂R/∂u ``(M, M+1)``."""
    return jax.jacfwd(residual)(u)


def tangent(J, t_old):
    """The unit null vector of the (M × M+1) Jacobian J, oriented along t_old."""
    A = np.vstack([J, t_old[None, :]])
    b = np.zeros(A.shape[0])
    b[-1] = 1.0
    t = np.linalg.solve(A, b)
    return t / np.linalg.norm(t)


def first_instability(jd, jt):
    """(K_b, v): the smallest K > 0 with (jd + K jt) v = 0 (jd, jt: the Jacobian at the uniform law
    at K = 0 and its K-derivative); ValueError if there is none."""
    import scipy.linalg  # here, not at import: 0.3 s of every process's start otherwise

    Ks, V = scipy.linalg.eig(-jd, jt)
    good = np.isfinite(Ks) & (np.abs(Ks.imag) < 1e-9 * np.abs(Ks)) & (Ks.real > 0)
    if not np.any(good):
        raise ValueError("the uniform law does not lose stability at any K > 0 for this attention")
    i = np.flatnonzero(good)[np.argmin(Ks.real[good])]
    Kb, v = float(Ks[i].real), np.real(V[:, i])
    return Kb, v / np.linalg.norm(v) * np.sign(v[np.argmax(np.abs(v))] if v[0] == 0 else v[0])


def pseudo_arclength(residual, u, t, *, ds: float, ds_min: float, ds_max: float, max_points: int, tol: float,
                     stop: Callable[[np.ndarray], str | None], describe: Callable[[np.ndarray], str]):
    """Follows the branch of R(u) = 0 (u = (a, K)) from the point ``u`` along the unit tangent ``t``.

    Args:
        residual: a callable pytree u -> R(u) (e.g. ``eqx.Partial`` of a module-level function).
        ds, ds_min, ds_max: the arclength step: initial, smallest before :class:`ContinuationError`,
            largest (grows by 1.3 after each accepted point).
        max_points, tol: the most points; the Newton tolerance (absolute, on R).
        stop: the reason to stop at an accepted point (None: go on).
        describe: where a point is, for the error message.

    Returns (U ``(P, M+1)``, tangents ``(P, M+1)``, the stop reason: ``"max_points"`` or ``stop``'s).
    """
    pts, tangents = [u], [t]
    step, why = ds, "max_points"
    while len(pts) < max_points:
        u_pred = u + step * t
        u_new, ok = corrector(residual, jnp.asarray(u_pred), jnp.asarray(t), tol, tol)
        u_new = np.asarray(u_new)
        res = np.abs(np.asarray(residual(jnp.asarray(u_new)))).max()
        if not (bool(ok) and np.all(np.isfinite(u_new)) and res < 1e3 * tol):
            step /= 2
            if step < ds_min:
                raise ContinuationError(
                    f"the continuation lost the branch at {describe(u)}: the Newton corrector (tol = {tol:g}) "
                    f"fails at step {step * 2:.3g} < ds_min = {ds_min:g}")
            continue
        t = tangent(np.asarray(jacobian(residual, jnp.asarray(u_new))), t)
        u = u_new
        pts.append(u)
        tangents.append(t)
        step = min(step * 1.3, ds_max)
        reason = stop(u)
        if reason is not None:
            why = reason
            break
    return np.array(pts), np.array(tangents), why


def turning_points(U, tangents, x: int = 0) -> list:
    """(K, u_x) at the turning points (dK/ds changes sign, the bifurcation itself excluded): the
    vertex of the parabola K(u_x) through the three points around each sign change."""
    tK = tangents[:, -1]
    out = []
    for j in np.flatnonzero(np.sign(tK[1:]) != np.sign(tK[:-1])):
        if j == 0:
            continue  # the bifurcation point itself has dK/ds = 0
        lo = max(j - 1, 0)
        xs, ys = U[lo:lo + 3, x], U[lo:lo + 3, -1]
        c = np.polyfit(xs, ys, 2) if len(xs) == 3 else None
        if c is not None and c[0] != 0:
            out.append((float(c[2] - c[1] ** 2 / (4 * c[0])), float(-c[1] / (2 * c[0]))))
        else:
            out.append((float(U[j, -1]), float(U[j, x])))
    return out


def folds(U, tangents, x: int = 0) -> tuple:
    """The K of the :func:`turning_points`."""
    return tuple(K for K, _ in turning_points(U, tangents, x))


__all__ = ["ContinuationError", "check_controls", "corrector", "first_instability", "folds", "jacobian",
           "pseudo_arclength", "tangent", "turning_points"]
