"""Runtime checks reported as values, so that a program holding them can be kept.

Every ``eqx.error_if`` traced into a program is a host callback, and ``jax.export`` (and JAX's
persistent compilation cache) refuses a program holding one. :func:`reporting` traces a program
with each such check, predicate and message unchanged, made a ``checkify`` check instead: the
program returns, after its own outputs, whether a check failed and which one (the first in
program order, the one that would have raised first; across a vmap, the first failing element's),
and :func:`raise_reported` raises ``eqx.EquinoxRuntimeError`` with that check's message once the
program has run. (Equinox is imported only when a check fails: a run that loads its programs
traces nothing and needs none.) No check is dropped or weakened: a failed check raises the message it raised
before, after the program instead of inside it.

Jitted functions traced inside (a solve's own ``eqx.filter_jit``) are cached apart while this
runs (a JAX user context is part of their cache key), so a later plain call of them still holds
its ``eqx.error_if`` checks. Checks an ``EQX_ON_ERROR`` other than ``raise`` asks for, and checks
resolved at trace time, are left to Equinox.
"""

from __future__ import annotations

import contextlib
import functools
import importlib

import jax
import jax.numpy as jnp


@functools.cache
def _reporting_context():
    """A JAX user context: jit caches keep the traces made while reporting apart from the others."""
    return jax.make_user_context(False)


def prepare_reporting() -> None:
    """Make the user context :func:`reporting` uses now: making one changes every jit cache key
    of the process, so this process's programs compile again once. Done on entering
    ``kept_programs``, before a run computes, not in the middle of one."""
    _reporting_context()


def reporting(flat):
    """``(program, messages)``: ``program(*arrays)`` is ``flat(*arrays)`` (a list of arrays) followed
    by ``failed`` (bool) and ``code`` (int32, the failed check's index in ``messages``), every
    ``eqx.error_if`` in it reported this way; ``messages`` fills while ``program`` is traced.
    Tracing raises NotImplementedError where this Equinox offers no way to report its checks."""
    from jax.experimental import checkify

    messages: list[str] = []

    def program(*arrays):
        with _checks_as_values(messages), _reporting_context()(True):
            error, outputs = checkify.checkify(flat)(*arrays)
        found = list(error._pred.items())  # one kind of check: a message's code, int32
        if not found:
            return [*outputs, jnp.asarray(False), jnp.asarray(0, jnp.int32)]
        if len(found) != 1:
            raise NotImplementedError("reporting: checks of another kind than eqx.error_if's")
        (kind, failed), = found
        code, = error._payload[kind]
        return [*outputs, failed, code]

    return program, messages


def raise_reported(failed, code, messages) -> None:
    """Raise ``eqx.EquinoxRuntimeError`` with the message of the check a :func:`reporting` program
    reported as failed (nothing if none did)."""
    if bool(failed):
        import equinox as eqx

        raise eqx.EquinoxRuntimeError(messages[int(code)])


@contextlib.contextmanager
def _checks_as_values(messages: list):
    """While tracing in this block, each ``eqx.error_if`` with a traced predicate is a checkify
    check whose payload is its message's index in ``messages``."""
    from jax.experimental import checkify

    errors = importlib.import_module("equinox._errors")
    plain = vars(errors).get("branched_error_if_impl_jit")
    if plain is None:
        raise NotImplementedError("reporting: this Equinox has no branched_error_if_impl_jit to report through")
    mode = vars(errors).get("EQX_ON_ERROR", "raise")

    def as_value(x, pred, index, msgs, *, on_error):
        resolved = mode if on_error == "default" else on_error
        traced = isinstance(pred, jax.core.Tracer) or isinstance(index, jax.core.Tracer)
        if resolved != "raise" or not traced:  # Equinox's own: no host callback, or one asked for
            return plain(x, pred, index, msgs, on_error=on_error)
        for j, message in enumerate(msgs):
            checkify.check(~jnp.any(jnp.asarray(pred) & (jnp.asarray(index) == j)), "{}",
                           jnp.asarray(len(messages), jnp.int32))
            messages.append(str(message))
        return x

    errors.branched_error_if_impl_jit = as_value
    try:
        yield
    finally:
        errors.branched_error_if_impl_jit = plain
