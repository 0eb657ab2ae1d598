"""The discrete residual Transformer: one Euler step and the dynamics' retraction per layer."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import NonFiniteStateError, check_int, check_scalar, cover_finiteness, is_concrete
from ..models.base import retract_step, step_velocity
from .noise import AbstractNoise, check_key
from .solution import Solution
from .solve import as_time, inf_from, saved_array
from .states import Particles, as_state


def layers(dynamics, x0, num_layers: int, step, *, t0=0.0, save_every: int = 1, fn=None,
           noise: AbstractNoise | None = None, key=None, throw: bool = True) -> Solution:
    """The discrete residual Transformer: x ← retract(x + h · v(t_l, x)), t_l = t0 + l·h.

    This is explicit Euler with step ``h``; on the sphere it is followed by layer
    normalization x ← x/|x| (docs: math/attention.md#conventions). ``x0`` is an ``(n, d)`` array or
    ``tp.Particles(x, weights)``. Returns states after every ``save_every`` layers, including
    the input (layer 0); with ``fn(t, x, args)`` (a statistic, as in ``diffrax.SaveAt(fn=...)``;
    ``args`` is None) its value there instead, in ``Solution.stats``, and no state is kept.

    Every save is watched: a NaN or inf raises :class:`~transformer_pde.NonFiniteStateError` naming
    the first such layer when the call is concrete, ``eqx.error_if`` under ``jit``/``vmap``;
    with ``throw=False`` nothing is raised, ``Solution.nonfinite_time`` is its time (inf when the
    run stayed finite) and the floating saves from it on are inf, as ``tp.solve``'s (say, which
    β of a vmapped sweep blow up). A statistic's own NaN check of the tokens it is handed is left
    to this watch, and so is a traced start's (a concrete one is checked first): under
    ``throw=False`` a NaN start is ``nonfinite_time = t0``. A traced call whose dynamics are built
    from concrete values, whose start is a normalization (``tp.uniform_sphere``, ``tp.normalize``)
    and with ``throw=False`` holds no host callback, so its program can be kept in JAX's
    persistent compilation cache.

    With ``noise=tp.Noise(σ)`` and a ``key``, the noisy residual layer (docs: math/noise.md#independent-noise):
    x ← R(x + h v(t_l, x) + σ(t_l)√h g(x, ξ_l)), ξ_l ~ N(0, I) i.i.d. per token and layer
    (``fold_in(key, l)``), g the dynamics' :meth:`~transformer_pde.models.AbstractDynamics.diffusion`
    (ξ itself; its tangent part on :class:`~transformer_pde.Sphere`): Euler–Maruyama, then the
    layer's normalization. Any noise of the family works the same way, with the increment
    ``tp.solve`` applies (:meth:`~transformer_pde.solvers.AbstractNoise.increment`; common noise,
    ``tp.CommonNoise(g)``: one ξ_l of g's shape for all tokens, and its drift a(x) in the step).

    This is ``tp.solve(dynamics, x0, t1=t0 + L·h, dt0=h, solver=diffrax.Euler(), noise=...)``
    step for step, written as a ``lax.scan`` over layers because that traces and compiles in
    half the time at the phase-diagram's settings (commit 99c8bd6: whole process 4.01 → 3.38 s)
    and keeps layer times t0 + l·h exact (diffrax accumulates its steps).

    Example:
        ```python
        import jax.random as jr, transformer_pde as tp

        x0 = tp.uniform_sphere(jr.key(0), n=32, d=3)
        model = tp.Sphere(tp.SoftmaxAttention.identity(d=3, beta=1.0))   # layer normalization after each layer
        sol = tp.layers(model, x0, num_layers=10, step=0.1, save_every=5)
        sol.xs.shape                                            # (3, 32, 3): layers 0, 5 and 10
        ```
    """
    if isinstance(x0, jax.Array) and not is_concrete(x0):
        cover_finiteness([x0])  # the watch flags the start (save 0): no check of its own to trace
    state = as_state(dynamics, x0)
    if not isinstance(state, Particles):
        raise ValueError(f"layers moves tokens: pass an (n, d) array or tp.Particles, got "
                         f"{type(state).__name__}")
    state = state.prepare(dynamics)
    num_layers = check_int(num_layers, "num_layers", minimum=1)
    save_every = check_int(save_every, "save_every", minimum=1)
    if int(num_layers) % int(save_every):
        raise ValueError(f"save_every={save_every} must be >= 1 and divide num_layers={num_layers}")
    check_scalar(step, "step", positive=True)
    if fn is not None and not callable(fn):
        raise ValueError(f"fn must be a statistic fn(t, x, args) or None, got {fn!r}")
    x0, w = state.x, state.weights
    h = jnp.asarray(step, x0.dtype)
    t0 = as_time(t0, "t0", x0.dtype)
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
        saved = eqx.error_if(saved, jnp.any(flags), "layers: the tokens became non-finite (NaN or inf; "
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


__all__ = ["layers"]
