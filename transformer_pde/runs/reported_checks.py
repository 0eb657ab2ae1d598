"""Runtime checks reported as values, so that a program holding them can be kept.

Every ``eqx.error_if`` traced into a program is a host callback, and ``jax.export`` (and JAX's
persistent compilation cache) refuses a program holding one. The library's own runtime checks go
through one function, :func:`transformer_pde._checks.runtime_check`, which is ``eqx.error_if``
except while :func:`reporting` traces a program: a context variable
(:data:`~transformer_pde._programs.CHECK_REPORTER`; thread-safe, no module of another library
touched) then makes each check whose predicate is traced a ``checkify.check``, predicate and
message unchanged, its payload the message's index. The program returns, after its own outputs,
whether a check failed and which one (the first in program order, the one that would have raised
first; across a vmap, the first failing element's), and :func:`raise_reported` raises
``eqx.EquinoxRuntimeError`` with that check's message once the program has run. (Equinox is
imported only when a check fails: a run that loads its programs traces nothing and needs none.)
No check is dropped or weakened: a failed check raises the message it raised before, after the
program instead of inside it.

A program ``checkify`` cannot carry (a while loop under a ``vmap``) is traced again with its checks
collected instead (:func:`collecting`): from its top level and from the bodies of the library's
transforms, which hand theirs out (:func:`~transformer_pde._checks.carry_checks`).

Checks of other libraries traced into a program (diffrax's, optimistix's, Equinox's own) stay
``eqx.error_if`` host callbacks: ``jax.export`` refuses such a program, which then runs as before,
not kept. Checks an ``EQX_ON_ERROR`` other than ``raise`` asks for, and checks resolved at trace
time, are left to Equinox too.

Jitted functions traced inside (a solve's own ``eqx.filter_jit``) are cached apart while this
runs (a JAX user context is part of their cache key), so a later plain call of them still holds
its ``eqx.error_if`` checks; and apart for each program traced, whose message indices their
checks hold (another program's trace of the same jit is not reused).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp

from .._checks import CheckCollector, prepare_skipping
from .._programs import CHECK_REPORTER

_CODE = jnp.uint32
"""The dtype of a reported check's payload (its message's index): no other leaf of a checkify
error of this module's checks has it (:func:`_failed_and_code`)."""


@functools.cache
def _reporting_context():
    """A JAX user context: jit caches keep the traces made while reporting apart from the others."""
    return jax.make_user_context(False)


_TRACES = itertools.count()


def _apart(mode: str):
    """The user context of one program's trace, its own: a jit traced in it (a solve's) holds the
    indices of this program's messages, so another program tracing it again must not reuse it."""
    return _reporting_context()((mode, next(_TRACES)))


def prepare_reporting() -> None:
    """Make the user context :func:`reporting` uses now: making one changes every jit cache key
    of the process, so this process's programs compile again once. Done on entering
    ``kept_programs``, before a run computes, not in the middle of one; the user context of the
    solve's skipped checks (:func:`~transformer_pde._checks.prepare_skipping`) is made at the same
    moment, so the keys change once (Equinox still unimported)."""
    prepare_skipping()
    _reporting_context()


def reporting(flat):
    """``(program, messages)``: ``program(*arrays)`` is ``flat(*arrays)`` (a list of arrays) followed
    by ``failed`` (bool) and ``code`` (uint32, the failed check's index in ``messages``), every
    :func:`~transformer_pde._checks.runtime_check` in it reported this way; ``messages`` fills while
    ``program`` is traced. Tracing raises NotImplementedError where this JAX's checkify error
    cannot be read (:func:`_failed_and_code`): the program is then not kept."""
    from jax.experimental import checkify

    messages: list[str] = []

    def report(x, pred, index, msgs):
        for j, message in enumerate(msgs):
            failing = jnp.any(jnp.asarray(pred) & (jnp.asarray(index) == j))
            checkify.check(~failing, "{}", jnp.asarray(len(messages), _CODE))
            messages.append(message)
        return x

    def program(*arrays):
        token = CHECK_REPORTER.set(report)
        try:
            with _apart("checkify"):
                error, outputs = checkify.checkify(flat)(*arrays)
        finally:
            CHECK_REPORTER.reset(token)
        return [*outputs, *_failed_and_code(error)]

    return program, messages


def collecting(flat):
    """``(program, messages)`` as :func:`reporting` gives them, with no ``checkify``: each
    :func:`~transformer_pde._checks.runtime_check` traced at the program's top level, or in the
    body of a transform run through :func:`~transformer_pde._checks.carry_checks` (the library's
    vmaps, a sweep's chunks, a solve's jit), is collected as a value
    (:class:`~transformer_pde._checks.CheckCollector`) and the first failed one returned.

    For programs ``checkify`` refuses: it cannot pass a while loop whose condition is vmapped
    ("checkify-of-vmap-of-while"), even one holding no check (a vmapped cluster count or Sinkhorn
    divergence: diffrax's own loop un-vmaps its condition), and JAX 0.10 cannot vmap a checkified
    one either (its ``dce_sink`` has no batching rule that returns no value). A check traced in
    another body (a while loop's, a caller's own ``vmap`` or ``jit``, another library's jit) cannot
    leave it: tracing raises (JAX refuses the escaped value) and the program is not kept."""
    messages: list[str] = []

    def program(*arrays):
        top = CheckCollector(messages)
        token = CHECK_REPORTER.set(top)
        try:
            with _apart("collect"):
                outputs = flat(*arrays)
        finally:
            CHECK_REPORTER.reset(token)
        failed, _, code = top.outcome()
        return [*outputs, failed, code]

    return program, messages


def _failed_and_code(error) -> tuple:
    """``(failed, code)`` of a checkify ``error`` of :func:`reporting`'s checks, traced.

    Read through public tree functions only: a checkify ``Error`` is a pytree (it leaves a jitted
    function so), whose leaves carry whether a check failed (its one bool leaf) and the failed
    check's format arguments (our code: its one uint32 leaf). That layout is this module's one
    assumption about checkify (JAX 0.10); where it no longer holds this raises NotImplementedError
    (the program is then refused and runs under ``eqx.filter_jit``, its checks raising inside), and
    ``tests/runs/test_reported_checks.py`` fails."""
    leaves = [jnp.asarray(v) for v in jax.tree.leaves(error)]
    if not leaves:  # no check traced
        return jnp.asarray(False), jnp.asarray(0, _CODE)
    flags = [v for v in leaves if v.dtype == jnp.bool_]
    codes = [v for v in leaves if v.dtype == _CODE]
    if len(flags) != 1 or len(codes) != 1 or flags[0].shape != () or codes[0].shape != ():
        raise NotImplementedError(f"reporting: this JAX's checkify error holds {[str(v.dtype) for v in leaves]}, "
                                  f"not one bool flag and one {jnp.dtype(_CODE)} code")
    return flags[0], codes[0]


def raise_reported(failed, code, messages) -> None:
    """Raise ``eqx.EquinoxRuntimeError`` with the message of the check a :func:`reporting` program
    reported as failed (nothing if none did)."""
    if bool(failed):
        import equinox as eqx

        raise eqx.EquinoxRuntimeError(messages[int(code)])
