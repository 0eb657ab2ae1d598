"""The residual layer as a step rule of ``tp.solve`` (:class:`ResidualLayer`): one Euler step and the
dynamics' retraction per layer, in a ``lax.scan``; :func:`transformer_pde.layers` calls it."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import NonFiniteStateError, check_scalar, cover_finiteness, is_concrete, runtime_check
from ..models.base import AbstractDynamics, retract_step, step_velocity
from .noise import AbstractNoise, check_key
from .saves import as_time, inf_from, saved_array
from .solution import Solution
from .states import Particles, as_state


class ResidualLayer(eqx.Module):
    """The residual layer as a step rule of ``tp.solve``: x ← R(x + h v(t_l, x) + σ√h g(x, ξ_l)),
    h = dt0, t_l = t0 + l·h (docs: math/attention.md#conventions), R the dynamics' retraction.

    ``tp.solve(dynamics, x0, t1=t0 + L·h, dt0=h, solver=tp.ResidualLayer(), saveat=ts)`` with ts
    every s layers from t0 to t1 (s dividing L; ``saveat=None``: t0 and t1): :func:`layers` is
    this. It is the step of ``diffrax.Euler()`` with the dynamics' retraction, written as a
    ``lax.scan`` over layers because that traces and compiles in half the time at the
    phase-diagram's settings (commit 99c8bd6: whole process 4.01 → 3.38 s) and keeps layer times
    t0 + l·h exact (diffrax accumulates its steps); the noise increment is solve's
    (:meth:`AbstractNoise.increment`). Particles only; saves are watched (as
    :class:`~transformer_pde.BlowUpAtSaves`); the step-size controller, adjoint, step cap and
    progress meter of diffrax do not apply.
    """

    def run(self, dynamics, x0, *, t0, t1, dt0, saves, several, noise, key, throw, diffrax_options):
        """The layers of one ``tp.solve`` call (its arguments, checked here)."""
        for name, value in diffrax_options.items():
            if value is not None:
                raise ValueError(f"solver=tp.ResidualLayer() steps by dt0 in a scan of layers: {name} does "
                                 f"not apply, got {value!r}")
        if several:
            raise ValueError("solver=tp.ResidualLayer() takes one save (times every s layers), not "
                             "SaveAt(subs=[...])")
        (save_ts, fn), = saves
        if dt0 is None or not all(is_concrete(v) for v in (t0, t1, dt0)):
            raise ValueError("solver=tp.ResidualLayer() counts its layers before the run: pass concrete "
                             "t0, t1 and dt0 (the layer step h)")
        check_scalar(dt0, "dt0", positive=True)
        span, h = float(t1) - float(t0), float(dt0)
        num_layers = int(round(span / h))
        if num_layers < 1 or abs(span / h - num_layers) > 1e-9 * max(1, num_layers):
            raise ValueError(f"solver=tp.ResidualLayer(): t1 - t0 = {span:g} must be a whole number of "
                             f"layers of dt0 = {h:g}")
        every = num_layers if save_ts is None else _save_step(save_ts, float(t0), h, num_layers)
        return _run(dynamics, x0, num_layers, dt0, t0, every, fn, noise, key, throw)


def _save_step(save_ts, t0, h, num_layers) -> int:
    """s for saves at t0 + k·s·h, k = 0 .. L/s (what the scan of blocks of s layers saves)."""
    if not is_concrete(save_ts):
        raise ValueError("solver=tp.ResidualLayer() needs concrete save times")
    k = (np.asarray(save_ts, np.float64) - t0) / h
    s = int(round(k[1])) if k.size > 1 else num_layers
    want = np.arange(0, num_layers + 1, max(s, 1))
    if s < 1 or num_layers % s or k.shape != want.shape or np.max(np.abs(k - want)) > 1e-6:
        raise ValueError(f"solver=tp.ResidualLayer() saves every s layers from t0 to t1 (s dividing "
                         f"the {num_layers} layers): saveat = t0 + dt0·[0, s, 2s, ..., {num_layers}], got "
                         f"layers {np.round(k, 6).tolist()[:12]}")
    return s


def _run(dynamics, x0, num_layers, step, t0, save_every, fn, noise, key, throw) -> Solution:
    if isinstance(x0, jax.Array) and not is_concrete(x0):
        cover_finiteness([x0])  # the watch flags the start (save 0): no check of its own to trace
    state = as_state(dynamics, x0)
    if not isinstance(state, Particles):
        raise ValueError(f"layers moves tokens: pass an (n, d) array or tp.Particles, got "
                         f"{type(state).__name__}")
    state = state.prepare(dynamics)
    x0, w = state.x, state.weights
    h = jnp.asarray(step, x0.dtype)
    t0 = as_time(t0, "t0", x0.dtype)
    if isinstance(dynamics, AbstractDynamics):  # a field defined from some time on (LNScaling) names its start
        dynamics.check_time(t0, "t0")
    if noise is None and key is not None:
        raise ValueError("key is for noisy layers: pass noise=tp.Noise(sigma) too")
    if noise is not None:
        if not isinstance(noise, AbstractNoise):
            raise ValueError(f"noise must be tp.Noise(sigma), tp.CommonNoise(...) or None, got {noise!r}")
        check_key(key)
        noise.check(state, dynamics, t0, x0.dtype)
    saved, flags = _layers(dynamics, state, x0, w, h, t0, int(num_layers), int(save_every), fn, noise, key)
    ts = t0 + h * jnp.arange(0, int(num_layers) + 1, int(save_every), dtype=x0.dtype)
    nonfinite_time = jnp.min(jnp.where(flags, ts, jnp.inf))
    if not throw:
        saved = inf_from(nonfinite_time, ts, saved)
    elif is_concrete(flags):
        bad = np.asarray(flags)
        if bad.any():
            k = int(np.argmax(bad))
            raise NonFiniteStateError(
                f"layers: the tokens became non-finite (NaN or inf) by layer {k * int(save_every)} "
                f"(t = {float(ts[k]):.6g}); the step or the parameters are too large")
    else:
        saved = runtime_check(saved, jnp.any(flags), "layers: the tokens became non-finite (NaN or inf; "
                              "the start is save 0); call it outside jit/vmap for the first such layer")
    xs, stats = (saved, None) if fn is None else (None, saved)
    return Solution(ts=ts, xs=xs, stats=stats, weights=w, num_steps=jnp.asarray(int(num_layers)),
                    result=diffrax.RESULTS.successful, nonfinite_time=nonfinite_time)


@eqx.filter_jit
def _layers(dynamics, state, x0, w, h, t0, num_layers, save_every, fn, noise, key):
    """The saves (states, or ``fn`` of them) after every ``save_every`` layers, layer 0 included,
    and per save whether its tokens held a NaN or inf."""
    def layer(x, l):
        t = t0 + l * h
        v = step_velocity(dynamics, x, w, t, t + h).astype(x.dtype)
        if noise is None:
            return retract_step(dynamics, x + h * v, t, t + h), None
        sigma = noise.at(t, x.dtype)
        drift = noise.drift(state, dynamics, t, x, sigma)
        x1 = x + h * (v if drift is None else v + drift)
        xi = _draw(jax.random.fold_in(key, l), noise.brownian_shape(state, dynamics))
        at = None if noise.additive(state, dynamics) else x
        x1 = x1 + noise.increment(state, dynamics, t, at, xi, sigma * jnp.sqrt(h))
        return retract_step(dynamics, x1, t, t + h), None

    def save(x, k):
        flag = ~jnp.all(jnp.isfinite(x))
        if fn is None:
            return x, flag
        cover_finiteness([x])  # the flag reports these tokens' NaN: fn's own check would repeat it
        return jax.tree.map(lambda v: saved_array(v, "layers fn"), fn(t0 + h * (k * save_every), x, None)), flag

    def block(x, b):
        x, _ = jax.lax.scan(layer, x, b * save_every + jnp.arange(save_every))
        return x, save(x, b + 1)

    _, later = jax.lax.scan(block, x0, jnp.arange(num_layers // save_every))
    return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b], axis=0), save(x0, 0), later)


def _draw(key, shape):
    """ξ ~ N(0, I) of the Brownian shape (a pytree of ShapeDtypeStruct); one leaf takes ``key``."""
    leaves, treedef = jax.tree.flatten(shape)
    keys = [key] if len(leaves) == 1 else [jax.random.fold_in(key, i) for i in range(len(leaves))]
    return jax.tree.unflatten(treedef, [jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)])


__all__ = ["ResidualLayer"]
