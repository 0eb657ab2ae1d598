"""Input validation shared by every public entry point.

Three layers (see STYLE.md): a ``ValueError`` naming the bad value when it is concrete
(outside ``jit``), ``eqx.error_if`` when it is traced, and ``throw=`` switches on long runs.
Every runtime check of the library goes through :func:`runtime_check` (:func:`runtime_checks`
for one of several messages), so that a program kept between processes can report its checks as
values (``runs/reported_checks.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import math
import os
import threading
import weakref

import numpy as np

# equinox on first use (a check traced under jit): a run whose programs are loaded, not traced
# (runs/programs.py), never imports it
from ._lazy import eqx, jax, jnp


class NonFiniteStateError(FloatingPointError):
    """A run produced NaN or inf; the message names the time it first appeared."""


_SKIPPED: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("transformer_pde_skipped_checks",
                                                                           default=())
_FILTER_LOCK = threading.Lock()
EQUINOX_CHECK_HOOK = "branched_error_if_impl_jit"
"""The private function of ``equinox._errors`` through which every traced ``eqx.error_if`` passes
(equinox 0.13): :func:`install_check_filter` wraps it, once.
``tests/solvers/test_solve_programs.py`` fails if it is gone."""


def install_check_filter() -> bool:
    """Wrap Equinox's traced ``error_if`` once per process (idempotent, thread-safe), so that it
    leaves out the checks :func:`skipping_checks` names in the current context, and nothing
    elsewhere (there it calls Equinox's own). Done when ``tp.solve`` is imported, before anything
    is traced: it also makes the JAX user context that keeps traces made while skipping apart
    (making one changes every jit cache key). False where this Equinox has no such function
    (every check then stays: correct, only not cached)."""
    errors = importlib.import_module("equinox._errors")
    with _FILTER_LOCK:
        checked = vars(errors).get(EQUINOX_CHECK_HOOK)
        if checked is None:
            return False
        if getattr(checked, "_transformer_pde_filter", False):
            return True
        _skipping_context()

        def check(x, pred, index, msgs, *, on_error):
            skipped = _SKIPPED.get()
            if skipped and all(str(m).startswith(skipped) for m in msgs):
                return x
            return checked(x, pred, index, msgs, on_error=on_error)

        check._transformer_pde_filter = True
        setattr(errors, EQUINOX_CHECK_HOOK, check)
        return True


@contextlib.contextmanager
def skipping_checks(messages: tuple[str, ...]):
    """While tracing inside this block (in this thread or task), leave out another library's
    ``eqx.error_if`` checks whose messages start with one of ``messages``: checks the caller made
    before the program, or made impossible. Each is a host callback, and JAX's persistent
    compilation cache (and ``jax.export``) keeps no program holding one.

    Only for checks that no public way avoids (``tp.solve``: diffrax's checks of the save times and
    its virtual Brownian tree's checks of its times, on traced values). Equinox routes every traced
    ``error_if`` through one private function, wrapped once per process
    (:func:`install_check_filter`, not swapped during a trace); the wrapper reads a context
    variable, so another thread tracing at the same time keeps its checks. A jitted function traced
    inside the block is cached apart (a JAX user context), so a call of it outside still holds its
    checks."""
    if not install_check_filter():
        yield
        return
    token = _SKIPPED.set(_SKIPPED.get() + tuple(messages))
    try:
        with _skipping_context()(True):
            yield
    finally:
        _SKIPPED.reset(token)


@functools.cache
def _skipping_context():
    """A JAX user context: jit caches keep traces made inside :func:`skipping_checks` apart."""
    return jax.make_user_context(False)


def prepare_skipping() -> None:
    """Make the user context of :func:`skipping_checks` now (JAX only; making one changes every jit
    cache key, so what was traced before is traced again once): the runs layer does it with its
    own before a run computes, so the keys change once."""
    _skipping_context()


def runtime_check(x, pred, msg: str):
    """``eqx.error_if(x, pred, msg)``: the library's runtime check of a traced value (returns
    ``x``, which the caller must use). While the runs layer traces a program to keep
    (:data:`~transformer_pde._programs.CHECK_REPORTER` set), a check whose predicate is traced is
    made a value of that program instead, raised with the same message after it runs
    (:mod:`transformer_pde.runs.reported_checks`)."""
    return runtime_checks(x, pred, 0, (msg,))


def runtime_checks(x, pred, index, msgs):
    """``eqx.branched_error_if(x, pred, index, msgs)`` (the message ``msgs[index]``), reported as a
    value as :func:`runtime_check` says. A predicate known at trace time, or an ``EQX_ON_ERROR``
    other than ``raise``, is left to Equinox."""
    from ._programs import CHECK_REPORTER

    report = CHECK_REPORTER.get()
    if (report is None or os.environ.get("EQX_ON_ERROR", "raise") != "raise"
            or not any(isinstance(v, jax.core.Tracer) for v in (pred, index))):
        if len(msgs) == 1 and isinstance(index, int) and index == 0:
            return eqx.error_if(x, pred, msgs[0])
        return eqx.branched_error_if(x, pred, index, msgs)
    return report(x, pred, index, tuple(str(m) for m in msgs))


class CheckCollector:
    """The checks traced at one level of a program the runs layer keeps without ``checkify``
    (:func:`transformer_pde.runs.reported_checks.collecting`), as values: the program's top, or
    the body of a transform run through :func:`carry_checks` (a vmapped element, a mapped chunk, a
    jitted call). ``checkify`` cannot carry a check out of a program holding a vmapped while loop
    (a vmapped cluster count or Sinkhorn divergence), and a value traced in a transform's body
    cannot leave it but as its output: each level collects its own checks, and
    :func:`carry_checks` hands a body's to the level
    around it. A check traced in any other body (a while loop's, a caller's own ``vmap``) would
    leave it as a value of a finished trace: JAX refuses that, and the program is not kept.

    ``messages`` is the program's list of messages (shared by its levels): a failed check's code
    is its message's index there. Called as the check reporter
    (:data:`~transformer_pde._programs.CHECK_REPORTER`)."""

    def __init__(self, messages: list):
        self.messages = messages
        self.entries: list = []  # (failed, code), in program order

    def __call__(self, x, pred, index, msgs):
        pred = jnp.asarray(pred)
        if pred.size == 0:
            return x
        where = jnp.argmax(jnp.ravel(pred))  # the first failing position: its message index
        index = jnp.ravel(jnp.broadcast_to(jnp.asarray(index), pred.shape))[where]
        self.add(jnp.any(pred), (len(self.messages) + index).astype(jnp.uint32))
        self.messages.extend(msgs)
        return x

    def add(self, failed, code) -> None:
        """A check of this level: ``failed`` (bool) and the failed message's ``code`` (uint32)."""
        self.entries.append((failed, code))

    def outcome(self) -> tuple:
        """``(failed, rank, code)``: whether a check of this level failed, the rank (in program
        order) of the first that did (the number of checks when none did), and its code."""
        failed = jnp.asarray(False)
        rank = jnp.asarray(len(self.entries), jnp.int32)
        code = jnp.asarray(0, jnp.uint32)
        for i in reversed(range(len(self.entries))):
            f, c = self.entries[i]
            failed, rank, code = failed | f, jnp.where(f, i, rank), jnp.where(f, c, code)
        return failed, rank, code


def _collector():
    """The current check reporter when it is a :class:`CheckCollector`, else None."""
    from ._programs import CHECK_REPORTER

    report = CHECK_REPORTER.get()
    return report if isinstance(report, CheckCollector) else None


def carry_checks(transform, fn):
    """``transform(fn)`` (``jax.vmap``, ``jax.jit``, ``lax.map`` as ``partial(lax.map, ...)``: a
    transform whose function's outputs come back as its outputs), with the library's runtime checks
    traced in ``fn`` carried out of it while the runs layer keeps a program without ``checkify``
    (:class:`CheckCollector`): ``fn`` then also returns its checks' outcome, and the failed check
    reported after the transform is the first in program order, of the first element that failed
    it (as ``checkify`` orders them). Otherwise exactly ``transform(fn)``: a plain run, and a kept
    program ``checkify`` can carry, trace the same program as before."""
    for name, value in (("transform", transform), ("fn", fn)):
        if not callable(value):
            raise ValueError(f"carry_checks: {name} must be callable (e.g. carry_checks(jax.vmap, f)), got "
                             f"{type(value).__name__} {value!r}"[:300])
    plain = transform(fn)
    carrying = []

    def outcome_too(*args, **kwargs):
        from ._programs import CHECK_REPORTER

        inner = CheckCollector(_collector().messages)
        token = CHECK_REPORTER.set(inner)
        try:
            out = fn(*args, **kwargs)
        finally:
            CHECK_REPORTER.reset(token)
        return out, inner.outcome()

    def run(*args, **kwargs):
        outer = _collector()
        if outer is None:
            return plain(*args, **kwargs)
        if not carrying:
            carrying.append(transform(outcome_too))
        out, (failed, rank, code) = carrying[0](*args, **kwargs)
        first = jnp.argmin(jnp.ravel(rank))  # the first check in program order, then the first element
        outer.add(jnp.any(failed), jnp.ravel(code)[first])
        return out

    return run


def is_concrete(x) -> bool:
    """True when ``x`` holds values (not a tracer inside ``jit``/``vmap``/``grad``)."""
    return not isinstance(x, jax.core.Tracer)


class _Marks:
    """Traced arrays known to hold one property, so that its runtime check (an ``eqx.error_if``,
    a host callback: a program holding one cannot be kept in JAX's persistent compilation cache)
    is not traced again. Keyed by id, held weakly: an entry dies with its array, so a later array
    with the same id is not in it. An array derived from a marked one (a slice, a product) is not
    marked."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def mark(self, arrays) -> None:
        for a in arrays:
            if not is_concrete(a):
                key = id(a)
                self._refs[key] = weakref.ref(a, lambda ref, key=key: self._refs.get(key) is ref
                                              and self._refs.pop(key))

    def holds(self, x) -> bool:
        ref = self._refs.get(id(x))
        return ref is not None and ref() is x


# Traced arrays whose NaN or inf is already reported: the output of a finiteness check (its
# values are the checked ones), tokens a blow-up watch flags (tp.solve's and tp.layers' saves,
# tp.layers' start). Checking them again would add tracing and a runtime callback, and under a
# watch a vaguer message.
_FINITENESS_REPORTED = _Marks()
# Traced tokens that are unit rows by construction (a normalization's output): the sphere's
# start check |x_i| = 1 has nothing to find in them.
_UNIT_ROWS = _Marks()


def cover_finiteness(arrays) -> None:
    """Mark these traced arrays as ones whose NaN or inf something already reports:
    :func:`check_finite` passes them through. An array derived from them (a slice, a product)
    is checked as usual."""
    _FINITENESS_REPORTED.mark(arrays)


def is_covered(x) -> bool:
    """Whether the traced ``x`` is marked by :func:`cover_finiteness`."""
    return _FINITENESS_REPORTED.holds(x)


def mark_unit_rows(x):
    """Mark traced tokens ``x`` as unit rows by construction (``x/|x|`` row by row): the sphere's
    runtime check of |x_i| = 1 passes them through (a NaN row is the finiteness check's). Returns
    ``x``."""
    _UNIT_ROWS.mark([x])
    return x


def has_unit_rows(x) -> bool:
    """Whether the traced ``x`` is marked by :func:`mark_unit_rows`."""
    return _UNIT_ROWS.holds(x)


def _first_bad(mask: np.ndarray) -> tuple:
    idx = np.argwhere(mask)[0]
    return tuple(int(i) for i in idx)


def as_float_array(x, name: str):
    """Convert to a floating JAX array (ints are promoted to the default float dtype)."""
    if isinstance(x, (list, tuple)):
        try:
            x = np.asarray(x)
        except ValueError:
            raise ValueError(f"{name} must be a rectangular array (every row the same length), got "
                             f"a ragged {type(x).__name__}") from None
    if not isinstance(x, (np.ndarray, np.generic, jax.Array)):
        try:
            x = np.asarray(x)
        except Exception as e:  # pragma: no cover - defensive
            raise ValueError(f"{name} must be an array, got {type(x).__name__}") from e
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
            or x.dtype == bool):
        raise ValueError(f"{name} must be a real floating array, got dtype {x.dtype}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = jnp.asarray(x, dtype=jnp.result_type(float))
    return jnp.asarray(x)


def check_finite(x, name: str):
    """Reject NaN/inf: ValueError with the first bad index when concrete, error_if when traced."""
    if is_concrete(x):
        bad = ~np.isfinite(np.asarray(x))
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"{name} must be finite, but {name}[{', '.join(map(str, i))}] = "
                             f"{np.asarray(x)[i]}")
        return x
    if is_covered(x):
        return x
    x = runtime_check(x, ~jnp.all(jnp.isfinite(x)), f"{name} must be finite (found NaN or inf)")
    cover_finiteness([x])
    return x


def check_points(x, name: str = "x", dim: int | None = None):
    """Validate a token array of shape ``(n, d)``: floating, finite, n >= 1, matching ``dim``."""
    x = as_float_array(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d) (tokens are rows), got shape {x.shape}")
    n, d = x.shape
    if n < 1 or d < 1:
        raise ValueError(f"{name} must hold at least one token of dimension >= 1, got shape {x.shape}")
    if dim is not None and d != dim:
        raise ValueError(f"{name} has dimension d={d} but the dynamics act on d={dim} "
                         f"(shape {x.shape})")
    return check_finite(x, name)


def unit_tolerance(dtype) -> float:
    """How far |x| may be from 1 for unit tokens of ``dtype``: 1e-6 in float64, 1e-3 in float32,
    8 machine epsilons in half precision (7.8e-3 float16, 6.3e-2 bfloat16)."""
    eps = float(jnp.finfo(dtype).eps)
    return 1e-6 if eps < 1e-10 else max(1e-3, 8 * eps)


def weight_tolerance(dtype, n: int = 1) -> float:
    """How far from 1 the sum of ``n`` weights stored in ``dtype`` may be (and the relative
    rounding :func:`check_covariance` allows): 4√eps in float32 and float64, room for weights
    normalized in float32 and long sums. In half precision 4√eps would be 0.125 (float16) and
    0.35 (bfloat16), so weights off by 12% passed; there it is eps·(4 + log2 n): each stored
    weight rounds by eps/2 and a normalization w/Σw in that dtype adds a pairwise sum's error
    (float16: 3.9e-3 for one weight, 1.3e-2 for a thousand)."""
    eps = float(jnp.finfo(dtype).eps)  # jnp: NumPy's finfo knows no bfloat16
    if eps <= 2.0**-20:
        return float(np.sqrt(eps)) * 4
    return eps * (4 + math.log2(max(int(n), 1)))


def check_covariance(cov, name: str, *, definite: bool = False):
    """A symmetric covariance ``(..., d, d)`` with finite entries, positive definite (``definite``:
    its inverse is taken) or semi-definite, up to rounding in its dtype, each matrix of a batch
    on its own scale: |Σ − Σᵀ| <= 4√eps·max(1, |Σ|_max); λ_min > d·eps·|λ|_max (definite) or
    λ_min >= −4√eps·max(1, |λ|_max). ValueError naming the value when concrete, ``eqx.error_if``
    under jit."""
    d = cov.shape[-1]
    if d == 0:
        return cov
    eps, tol = float(np.finfo(np.dtype(cov.dtype)).eps), weight_tolerance(cov.dtype, d)
    kind = "positive definite" if definite else "positive semi-definite"
    xp = np if is_concrete(cov) else jnp
    a = np.asarray(cov, np.float64) if xp is np else cov
    if xp is np and not np.isfinite(a).all():
        raise ValueError(f"{name} must be a finite covariance, got non-finite entries")
    at = xp.swapaxes(a, -1, -2)
    asym = xp.max(xp.abs(a - at), axis=(-2, -1))
    symmetric = asym <= tol * xp.maximum(1.0, xp.max(xp.abs(a), axis=(-2, -1)))
    lam = xp.linalg.eigvalsh(0.5 * (a + at))
    low, high = lam[..., 0], xp.max(xp.abs(lam), axis=-1)
    need = d * eps * high if definite else -tol * xp.maximum(1.0, high)
    ok = low > need if definite else low >= need
    if xp is jnp:
        cov = runtime_check(cov, ~(jnp.all(jnp.isfinite(cov)) & jnp.all(symmetric)),
                            f"{name} must be symmetric and finite (a covariance)")
        return runtime_check(cov, ~jnp.all(ok), f"{name} must be {kind} (a covariance)")
    if not symmetric.all():
        raise ValueError(f"{name} must be symmetric, but max|cov - cov.T| = {float(asym[~symmetric].max()):.3g}")
    if not ok.all():
        i = np.unravel_index(np.argmin(np.where(ok, np.inf, low - need)), np.shape(ok))
        raise ValueError(f"{name} must be {kind}, but its smallest eigenvalue is {float(low[i]):.6g} (needs "
                         f"{'>' if definite else '>='} {float(need[i]):.3g}, relative to the largest "
                         f"|eigenvalue| {float(high[i]):.6g})")
    return cov


def check_weights(weights, n: int, dtype, name: str = "weights", tolerance_dtype=None):
    """Uniform weights when ``None``; otherwise shape (n,), non-negative, summing to one (to the
    tolerance of ``tolerance_dtype``, default ``dtype``)."""
    if weights is None:
        return jnp.full((n,), 1.0 / n, dtype=dtype)
    w = as_float_array(weights, name).astype(dtype)
    if w.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match {n} tokens, got shape {w.shape}")
    tol = weight_tolerance(dtype if tolerance_dtype is None else tolerance_dtype, n)
    if is_concrete(w):
        wn = np.asarray(w)
        if not np.isfinite(wn).all():
            i = _first_bad(~np.isfinite(wn))
            raise ValueError(f"{name} must be finite, but {name}[{i[0]}] = {wn[i]}")
        if (wn < 0).any():
            i = _first_bad(wn < 0)
            raise ValueError(f"{name} must be non-negative, but {name}[{i[0]}] = {wn[i]}")
        s = float(wn.sum(dtype=np.float64))  # the stored weights' sum, not a half-precision one
        if abs(s - 1.0) > tol:
            raise ValueError(f"{name} must sum to 1 (a probability measure), but they sum to {s!r}")
        return w
    w = runtime_check(w, jnp.any(w < 0) | ~jnp.all(jnp.isfinite(w)),
                      f"{name} must be finite and non-negative")
    total = jnp.sum(w, dtype=jnp.promote_types(w.dtype, jnp.float32))  # not summed in half precision
    return runtime_check(w, jnp.abs(total - 1.0) > tol, f"{name} must sum to 1")


def check_weights_of(weights, x_dtype, n: int, name: str = "weights"):
    """:func:`check_weights` for weights used in their own dtype (not cast to the tokens'): the
    sum is checked to the looser tolerance of the two dtypes."""
    w = as_float_array(weights, name)
    loose = max((np.dtype(w.dtype), np.dtype(x_dtype)), key=lambda t: weight_tolerance(t, n))
    return check_weights(w, n, w.dtype, name, tolerance_dtype=loose)


def check_scalar(value, name: str, *, positive: bool = False, nonnegative: bool = False):
    """A real scalar, finite (and positive or non-negative where asked): a concrete value is
    checked now (ValueError naming ``name``); a traced one (jit, vmap, grad) through
    ``eqx.error_if`` with the same condition, so the caller must keep the returned value."""
    if is_concrete(value):
        arr = np.asarray(value)
        if arr.ndim != 0:
            raise ValueError(f"{name} must be a scalar, got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise ValueError(f"{name} must be a real number, got {value!r}")
        v = float(arr)
        if not np.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
        if positive and not v > 0:
            raise ValueError(f"{name} must be > 0, got {v}")
        if nonnegative and not v >= 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
        return value
    if jnp.ndim(value) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}")
    # traced (jit, vmap, grad): the same conditions through eqx.error_if; use the returned value
    if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
        return value
    return check_real(value, name, positive=positive, nonnegative=nonnegative)


INT_LIMIT = 2**31 - 1
"""The largest count or size :func:`check_int` takes by default: JAX indexes and counts in int32,
and a larger static size aborts XLA (the process dies, ``overflow in static extent product``)."""


def check_int(value, name: str, *, minimum: int | None = None, maximum: int | None = INT_LIMIT):
    """A Python/NumPy integer (not bool), optionally ``>= minimum``, and ``<= maximum`` (default
    2**31 - 1, :data:`INT_LIMIT`; ``None``: unbounded)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        limit = "2**31 - 1, JAX counts in int32" if maximum == INT_LIMIT else f"{maximum}"
        raise ValueError(f"{name} must be <= {maximum} ({limit}), got {value}")
    return int(value)


def check_block_size(block_size, name: str):
    """``None`` (automatic) or a positive integer number of keys per block."""
    if block_size is None:
        return None
    return check_int(block_size, name, minimum=1)


def _condition(low, high, low_open, high_open) -> str:
    """'be > 0', 'be <= 1', 'lie in [-1, 1)'."""
    if low is not None and high is not None:
        return f"lie in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"be {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"be {'<' if high_open else '<='} {high:g}"
    return "be finite"


def check_in_range(value, name: str, *, low=None, high=None, low_open: bool = False,
                   high_open: bool = False, meaning: str = ""):
    """A finite real scalar in the interval [low, high] (ends open where asked, ``None``
    unbounded): ValueError naming ``name``, the interval and the value when concrete; the same
    message through ``eqx.error_if`` when traced (use the returned value). ``meaning`` says why
    (e.g. "a cosine")."""
    check_scalar(value, name)
    why = f" ({meaning})" if meaning else ""
    where = f"{name} must {_condition(low, high, low_open, high_open)}{why}"
    if is_concrete(value):
        v = float(np.asarray(value))
        bad = (low is not None and (v <= low if low_open else v < low)) or (
            high is not None and (v >= high if high_open else v > high))
        if bad:
            raise ValueError(f"{where}, got {v!r}")
        return value
    v = jnp.asarray(value)
    bad = ~jnp.isfinite(v)
    if low is not None:
        bad = bad | ((v <= low) if low_open else (v < low))
    if high is not None:
        bad = bad | ((v >= high) if high_open else (v > high))
    return runtime_check(v, bad, f"{where}, and be finite")


def check_count(value, name: str, *, minimum: int | None = None, maximum: int | None = INT_LIMIT) -> int:
    """An integer count given as an int or an integral float (10.0 is 10); a non-integer (10.7),
    NaN, inf or bool is refused naming ``name`` -- never truncated."""
    if isinstance(value, (float, np.floating)) and not isinstance(value, bool):
        if not np.isfinite(value) or float(value) != int(value):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        value = int(value)
    if isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0 and is_concrete(value) and \
            jnp.issubdtype(value.dtype, jnp.integer):
        value = int(value)
    return check_int(value, name, minimum=minimum, maximum=maximum)


def check_real(x, name: str, *, positive: bool = False, nonnegative: bool = False,
               integer: bool = False):
    """A real scalar or array whose every element is finite (and > 0, >= 0 or integral where
    asked): ValueError naming ``name`` and the first bad element when concrete (``x`` returned
    unchanged), ``eqx.error_if`` when traced (use the returned value)."""
    cond = " and > 0" if positive else " and >= 0" if nonnegative else ""
    cond += " and integral" if integer else ""
    if is_concrete(x):
        try:
            a = np.asarray(x)
        except (ValueError, TypeError):
            raise ValueError(f"{name} must be a real number or a rectangular array of them, got a "
                             f"{type(x).__name__}") from None
        if a.dtype == bool or not (jnp.issubdtype(a.dtype, jnp.floating) or jnp.issubdtype(a.dtype, jnp.integer)):
            raise ValueError(f"{name} must be real (a number or an array of numbers), got dtype "
                             f"{a.dtype}: {x!r}"[:300])
        bad = ~np.isfinite(a)
        if positive:
            bad = bad | ~(a > 0)
        elif nonnegative:
            bad = bad | ~(a >= 0)
        if integer:
            bad = bad | (np.where(np.isfinite(a), a, 0) != np.round(np.where(np.isfinite(a), a, 0)))
        if bad.any():
            if a.ndim == 0:
                raise ValueError(f"{name} must be finite{cond}, got {a.item()!r}")
            i = _first_bad(bad)
            raise ValueError(f"{name} must be finite{cond}, but {name}[{', '.join(map(str, i))}] = "
                             f"{a[i]!r}")
        return x
    if not (positive or nonnegative or integer) and is_covered(x):
        return x  # its NaN or inf is reported elsewhere (cover_finiteness)
    v = jnp.asarray(x)
    if not jnp.issubdtype(v.dtype, jnp.floating):
        bad = jnp.asarray(False)
    else:
        bad = ~jnp.isfinite(v)
        if integer:
            bad = bad | (v != jnp.round(v))
    if positive:
        bad = bad | ~(v > 0)
    elif nonnegative:
        bad = bad | ~(v >= 0)
    return runtime_check(v, jnp.any(bad), f"{name} must be finite{cond}")


def check_key(key, name: str = "key"):
    """A JAX random key: ``jax.random.key(s)`` (typed) or ``jax.random.PRNGKey(s)`` (raw uint32
    pair); ValueError naming ``name`` otherwise (None, an int seed, another array)."""
    if isinstance(key, jax.Array) and (jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) or (
            key.shape == (2,) and key.dtype == jnp.uint32)):
        return key
    raise ValueError(f"{name} must be a JAX random key such as jax.random.key(0), got "
                     f"{type(key).__name__} {key!r}"[:300])
