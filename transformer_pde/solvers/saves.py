"""What a solve saves and when: the save times and statistics of ``saveat`` parsed and checked,
and the helpers that fill a stopped run's later saves with inf."""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_scalar, is_concrete

__all__ = ["as_time", "check_times", "inf_from", "parse_saveat", "saved_array", "several_saves"]


def as_time(value, name, dtype):
    """A finite time as a scalar array (traced: the check through eqx.error_if)."""
    return jnp.asarray(check_scalar(value, name), dtype=dtype)


def times_known(ts, t0, t1) -> bool:
    """Whether the save times ``ts`` and the span (t0, t1) hold values now (none traced), so that
    :func:`check_times` checks them before any program."""
    return is_concrete(ts) and is_concrete(t0) and is_concrete(t1)


def check_times(t0, t1, dt0, ts, dtype):
    """Check (t0, t1, dt0) and the save times ``ts`` (None: ``[t1]``); returns ``ts`` as an array."""
    check_scalar(t0, "t0")
    check_scalar(t1, "t1")
    if is_concrete(t0) and is_concrete(t1) and not float(t1) > float(t0):
        raise ValueError(f"Must have t1 > t0, got t0={float(t0)} and t1={float(t1)}")
    if dt0 is not None:
        check_scalar(dt0, "dt0", positive=True)
    if ts is None:
        return jnp.asarray([t1], dtype=dtype)
    ts_given = ts
    try:
        kind = ts.dtype if isinstance(ts, (np.ndarray, jax.Array)) else jnp.asarray(ts).dtype
    except (TypeError, ValueError):
        raise ValueError(f"saveat must be an array of real times, got {ts!r}"[:300]) from None
    if np.dtype(kind) == np.dtype(bool) or not (jnp.issubdtype(kind, jnp.floating)
                                                or jnp.issubdtype(kind, jnp.integer)):
        raise ValueError(f"saveat times must be real numbers, got dtype {kind}: {ts!r}"[:300])
    # values known now (given as numbers, even under a caller's trace, where the conversion below
    # is traced) are checked now: the program then holds no runtime check of them
    known = times_known(ts, t0, t1)
    ts = jnp.asarray(ts, dtype=dtype)
    if ts.ndim != 1 or ts.shape[0] < 1:
        raise ValueError(f"saveat must be a non-empty 1-D array of times, got shape {ts.shape}")
    if known:
        a = np.asarray(ts_given, dtype=dtype)
        if not np.isfinite(a).all():
            raise ValueError(f"saveat must be finite, got {a}")
        if np.any(np.diff(a) < 0):
            raise ValueError(f"saveat times must be non-decreasing, got {a}")
        slack = 1e-6 * max(1.0, abs(float(t1)))
        if a[0] < float(t0) - slack or a[-1] > float(t1) + slack:
            raise ValueError(f"saveat times must lie in [t0, t1] = [{float(t0)}, {float(t1)}], "
                             f"got [{a[0]}, {a[-1]}]")
        ts = jnp.clip(ts, t0, t1)
    return ts


_SAVE_Y = diffrax.SaveAt(t1=True).subs.fn


def several_saves(saveat) -> bool:
    """Whether ``saveat`` holds several saves (``SaveAt(subs=[...])``): tuples in the Solution."""
    return isinstance(saveat, diffrax.SaveAt) and not isinstance(saveat.subs, diffrax.SubSaveAt)


def parse_saveat(saveat) -> tuple:
    """The saves of ``saveat``, a tuple of ``(ts or None, fn or None)``: None (save at t1), an
    array of times, a ``diffrax.SaveAt(ts=..., fn=...)`` / ``diffrax.SaveAt(t1=True, fn=...)``
    (one save), or ``diffrax.SaveAt(subs=[SubSaveAt(...), ...])`` (one save per sub).

    ``fn(t, y, args)`` is diffrax's statistic signature; None means the states themselves.
    """
    if saveat is None:
        return ((None, None),)
    if not isinstance(saveat, diffrax.SaveAt):
        return ((saveat, None),)
    subs = saveat.subs if several_saves(saveat) else [saveat.subs]
    if saveat.dense or not isinstance(subs, (list, tuple)) or not subs:
        raise ValueError(f"{_SAVES}, got {saveat}")
    return tuple(_parse_sub(sub, saveat) for sub in subs)


_SAVES = ("solve takes diffrax.SaveAt(ts=..., fn=...), diffrax.SaveAt(t1=True, fn=...) or several of "
          "them as diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=..., fn=...), ...]) (each one of ts, t1; no "
          "t0, steps or dense)")


def _parse_sub(sub, saveat):
    if not isinstance(sub, diffrax.SubSaveAt) or sub.t0 or sub.steps or (
            sub.ts is None) == (not sub.t1) or (sub.ts is not None and sub.t1):
        raise ValueError(f"{_SAVES}, got {saveat}")
    if not callable(sub.fn):
        raise ValueError(f"SaveAt fn must be a callable fn(t, y, args), got {sub.fn!r}")
    return sub.ts, None if sub.fn is _SAVE_Y else sub.fn


def inf_from(stop_time, times, saved):
    """``saved`` with every floating entry at a time ≥ ``stop_time`` set to inf (as diffrax pads
    the saves after an event)."""
    def mask(a):
        if not jnp.issubdtype(a.dtype, jnp.inexact):
            return a
        after = (times >= stop_time).reshape(times.shape + (1,) * (a.ndim - 1))
        return jnp.where(after, jnp.asarray(jnp.inf, a.dtype), a)

    return jax.tree.map(mask, saved)


def saved_array(value, owner: str = "SaveAt fn"):
    """A leaf of a statistic (``SaveAt(fn=...)``'s, or ``owner``'s) as an array (a Python number
    becomes one)."""
    if isinstance(value, (bool, int, float, np.ndarray, np.generic, jax.Array)) and not (
            isinstance(value, (np.ndarray, np.generic)) and value.dtype == object):
        return jnp.asarray(value)
    raise ValueError(f"{owner} must return arrays (or a pytree of them), got a "
                     f"{type(value).__name__}: {value!r}"[:300])
