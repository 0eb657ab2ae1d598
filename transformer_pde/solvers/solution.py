"""What :func:`transformer_pde.solve` returns: :class:`Solution` (particles, coupled states, ODEs)
and :class:`GaussianSolution` (the Gaussian closure)."""

from __future__ import annotations

from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


class Solution(eqx.Module):
    """Result of :func:`~transformer_pde.solve` for particles (and coupled states, ODEs).

    Attributes:
        ts: save times, shape ``(T,)`` (several saves, ``SaveAt(subs=[...])``: a tuple of them).
        xs: states at ``ts`` (particles: shape ``(T, n, d)``; a coupled state: the pytree of its
            parts' values with a leading axis T); None when only statistics were saved.
        stats: the pytree returned by ``SaveAt(fn=fn)``'s ``fn(t, x, args)`` at each save time
            (None when states were saved; several saves: a tuple, one entry per save, the states
            where a save has no ``fn``).
        weights: token weights, shape ``(n,)`` (None for states that are not particles).
        num_steps: accepted solver steps.
        result: diffrax's result code (success unless ``throw=False`` and it failed;
            ``RESULTS.event_occurred`` when the run stopped on a non-finite state).
        nonfinite_time: end of the first solver step whose state held a NaN or inf (the run
            stops there; with ``event=tp.BlowUpAtSaves()`` the first save time, or t1, whose
            state held one; from ``tp.layers`` the first save whose tokens held one); ``inf``
            when the state stayed finite, None when nothing watched it (``event=None``). Saves
            of a solve after it are ``inf``.
    """

    ts: jax.Array | tuple[jax.Array, ...]
    xs: Any
    stats: Any
    weights: jax.Array | None
    num_steps: jax.Array
    result: diffrax.RESULTS
    nonfinite_time: jax.Array | None = None

    @property
    def final(self):
        """The last saved state (particles: shape ``(n, d)``)."""
        if self.xs is None:
            raise ValueError("this solution saved statistics only (SaveAt(fn=...)); no states")
        return jax.tree.map(lambda a: a[-1], self.xs)

    @property
    def succeeded(self):
        return self.result == diffrax.RESULTS.successful

    @property
    def stop_time(self):
        """When the run stopped on a blow-up: ``nonfinite_time`` (inf, or None unwatched, if not)."""
        return self.nonfinite_time


class GaussianSolution(eqx.Module):
    """Result of :func:`~transformer_pde.solve` for a Gaussian initial state N(mean, cov).

    Attributes:
        ts: the requested save times ``(T,)``.
        means: ``(T, d)``; covs: ``(T, d, d)``, exactly symmetric. Entries at times after
            ``blowup_time`` are ``inf`` (the covariance has left every bounded set).
        blowup_time: the first time at which tr Σ exceeded ``threshold`` (or stopped being
            finite; with ``event=tp.BlowUpAtSaves()`` the first save time, or t1, where it had);
            ``inf`` when it stayed below up to t1. For a Riccati blow-up
            (softmax, multi-head) this is t* up to O(1/threshold) with adaptive steps, up
            to about one step with constant steps.
        final_time, final_mean, final_cov: the state where the integration stopped (t1, or
            the time the threshold was crossed).
        threshold: the trace threshold used (NaN with ``event=None``).
        num_steps: accepted solver steps.
        result: diffrax's result code (``RESULTS.event_occurred`` after a blow-up).
    """

    ts: jax.Array
    means: jax.Array
    covs: jax.Array
    blowup_time: jax.Array
    final_time: jax.Array
    final_mean: jax.Array
    final_cov: jax.Array
    threshold: jax.Array
    num_steps: jax.Array
    result: diffrax.RESULTS

    @property
    def stop_time(self):
        """When the run stopped on a blow-up: ``blowup_time`` (inf if it did not)."""
        return self.blowup_time

    @property
    def blew_up(self):
        """True when tr Σ crossed the threshold before t1."""
        return jnp.isfinite(self.blowup_time)

    @property
    def reached(self):
        """Mask ``(T,)`` of the save times reached before the solve stopped."""
        return (self.ts <= self.final_time) & jnp.all(jnp.isfinite(self.covs), axis=(1, 2))

    @property
    def succeeded(self):
        return finished(self.result)


def finished(result):
    """Where a run's diffrax result code says it did not fail: it reached t1, or stopped on its
    event (a blow-up, reported by its time)."""
    return (result == diffrax.RESULTS.successful) | (result == diffrax.RESULTS.event_occurred)


def raise_if_failed(result, nonfinite_time=None, *, where: str = "solve",
                    advice: str = "lower the step dt0 or the parameters") -> None:
    """Raise what ``tp.solve`` raises (``throw=True``) for the first of these runs that failed,
    after the program that ran them: such a program (``tp.solve(..., throw=False)`` under your own
    ``jit``/``vmap``) then holds no check, a host callback, and JAX can keep it between processes.

    Args:
        result: ``Solution.result`` of one run or of many (a ``vmap``: any batch shape), or a
            :class:`Solution` (its ``result`` and ``nonfinite_time``). A failure (the steps
            exhausted, a step size too small, ...) raises ``eqx.EquinoxRuntimeError`` with diffrax's
            message, as ``tp.solve`` does, for the first failed run in row-major order.
        nonfinite_time: ``Solution.nonfinite_time`` of the same runs (inf where a run stayed
            finite), or None: a finite one raises :class:`~transformer_pde.NonFiniteStateError`
            naming the first such run and its time.
        where, advice: what ran (the message's start) and what to change.

    Concrete values only (what a program returned); inside a trace let ``tp.solve`` raise
    (``throw=True``)."""
    from .._checks import NonFiniteStateError, is_concrete

    if isinstance(result, Solution):
        result, nonfinite_time = result.result, result.nonfinite_time if nonfinite_time is None else nonfinite_time
    if not isinstance(result, diffrax.RESULTS):
        raise ValueError(f"raise_if_failed: result must be diffrax's result code (Solution.result), "
                         f"got {result!r}"[:300])
    code, = jax.tree.leaves(result)  # an enumeration item is a pytree of its index
    if not (is_concrete(code) and is_concrete(nonfinite_time)):
        raise ValueError("raise_if_failed takes the values a program returned (concrete), not traced ones: "
                         "inside jit or vmap let tp.solve raise (throw=True)")
    codes = np.asarray(code)
    times = None if nonfinite_time is None else np.asarray(nonfinite_time)
    if times is not None and (times.shape != codes.shape or not np.issubdtype(times.dtype, np.floating)):
        raise ValueError(f"raise_if_failed: nonfinite_time must be the runs' times (floats of shape {codes.shape}, "
                         f"inf where a run stayed finite), got {nonfinite_time!r}"[:300])
    ok = np.asarray(finished(result))
    if not ok.all():
        first = np.asarray(np.ravel(codes)[int(np.argmax(~np.ravel(ok)))])
        raise eqx.EquinoxRuntimeError(diffrax.RESULTS[jax.tree.unflatten(jax.tree.structure(result), [first])])
    if times is None or not np.isfinite(times).any():
        return
    bad = np.isfinite(times)
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    run = "" if times.ndim == 0 else (f" in run {index[0] if len(index) == 1 else index} "
                                      f"({int(bad.sum())} of {bad.size} runs)")
    raise NonFiniteStateError(f"{where}: the state became non-finite (NaN or inf) at t = {float(times[index]):.6g}"
                              f"{run}; {advice}")


__all__ = ["GaussianSolution", "Solution", "raise_if_failed"]
