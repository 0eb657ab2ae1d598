"""What :func:`transformer_pde.solve` returns: :class:`Solution` (particles, coupled states, ODEs)
and :class:`GaussianSolution` (the Gaussian closure)."""

from __future__ import annotations

from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp


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
        return (self.result == diffrax.RESULTS.successful) | (
            self.result == diffrax.RESULTS.event_occurred)


__all__ = ["GaussianSolution", "Solution"]
