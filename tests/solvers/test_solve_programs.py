"""A solve's program holds no host callback (issue 36, item 5): its checks are values — diffrax's
result code, the blow-up time, a statistic's flag — raised after the program with the messages
they had inside it, so JAX's persistent compilation cache keeps the program."""

import importlib
import logging
import re

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

import transformer_pde as tp
solve_module = importlib.import_module("transformer_pde.solvers.solve")

STEPS = "The maximum number of solver steps was reached"


@pytest.fixture
def programs(monkeypatch):
    """The arguments of every program ``tp.solve`` runs, to lower them again."""
    calls, inner = [], solve_module._solve
    jitted = eqx.filter_jit(solve_module._solve_program)  # _solve's program (_solve: carry_checks of it)

    def record(*args):
        calls.append(args)
        return inner(*args)

    monkeypatch.setattr(solve_module, "_solve", record)
    return lambda: [jitted.lower(*args) for args in calls]


def _callbacks(lowered) -> int:
    return len(re.findall("callback", lowered.as_text()))


def test_the_programs_of_a_solve_hold_no_host_callback(programs):
    """Particles in R^d and on the sphere, noise (grid and tree paths), a statistic saved, the
    watch at the saves, a Gaussian; the count is what JAX reads when it refuses to cache."""
    x0 = tp.uniform_sphere(jax.random.key(0), 16, 3)
    attn = tp.SoftmaxAttention.identity(3, 1.0)
    sphere, ts = tp.Sphere(attn), jnp.linspace(0, 1, 3)
    count = lambda t, x, a: tp.diagnostics.cluster_count(x)  # noqa: E731 - checks its input when traced
    tp.solve(sphere, x0, t1=1.0, dt0=0.1, saveat=ts)
    tp.solve(attn, x0, t1=1.0, dt0=0.1, saveat=ts, noise=tp.Noise(0.3), key=jax.random.key(1))
    tp.solve(sphere, x0, t1=1.0, dt0=0.1, saveat=ts, noise=tp.Noise(0.3, path=tp.BrownianTree()),
             key=jax.random.key(1))
    tp.solve(sphere, x0, t1=1.0, dt0=0.1, saveat=diffrax.SaveAt(ts=ts, fn=count))
    tp.solve(sphere, x0, t1=1.0, dt0=0.1, saveat=diffrax.SaveAt(ts=ts, fn=count), event=tp.BlowUpAtSaves())
    tp.solve(attn, tp.Gaussian(jnp.zeros(3), jnp.eye(3)), t1=1.0, dt0=0.1)
    lowered = programs()
    assert len(lowered) == 6 and [_callbacks(p) for p in lowered] == [0] * 6
    # the count sees a callback where there is one: a σ(t) function is checked inside the program
    tp.solve(attn, x0, t1=1.0, dt0=0.1, noise=tp.Noise(lambda t: 0.3 + t), key=jax.random.key(1))
    assert _callbacks(programs()[-1]) > 0


def test_a_failure_is_raised_after_the_program_with_diffrax_message():
    """Too few steps: the same EquinoxRuntimeError and message diffrax raised inside the program;
    throw=False hands back the code; under the user's jit, throw=True still raises inside."""
    x0 = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    attn = tp.SoftmaxAttention.identity(2, 1.0)
    with pytest.raises(eqx.EquinoxRuntimeError, match=STEPS):
        tp.solve(attn, x0, t1=1.0, dt0=0.1, max_steps=3)
    sol = tp.solve(attn, x0, t1=1.0, dt0=0.1, max_steps=3, throw=False)
    assert sol.result == diffrax.RESULTS.max_steps_reached
    with pytest.raises((eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match=STEPS):
        jax.block_until_ready(jax.jit(lambda x: tp.solve(attn, x, t1=1.0, dt0=0.1, max_steps=3).xs)(x0))
    with pytest.raises(eqx.EquinoxRuntimeError, match=STEPS):  # vmapped: one failing run is enough
        jax.vmap(lambda t1: tp.solve(attn, x0, t1=t1, dt0=0.1, max_steps=16).xs)(jnp.array([1.0, 3.0]))


def test_traced_times_are_still_checked_inside_the_users_jit():
    """diffrax's checks of the save times are left out of the program; traced ones are checked by
    solve with diffrax's messages."""
    x0 = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    attn = tp.SoftmaxAttention.identity(2, 1.0)
    run = jax.jit(lambda ts: tp.solve(attn, x0, t1=1.0, dt0=0.1, saveat=ts).xs)
    with pytest.raises((eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="must lie between t0 and t1"):
        jax.block_until_ready(run(jnp.array([0.5, 2.0])))
    with pytest.raises((eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="increasing or decreasing"):
        jax.block_until_ready(run(jnp.array([0.5, 0.2])))
    np.testing.assert_allclose(run(jnp.array([0.2, 0.5])),  # another program (x0 a constant): rounding
                               tp.solve(attn, x0, t1=1.0, dt0=0.1, saveat=jnp.array([0.2, 0.5])).xs, rtol=1e-14)


def test_a_solve_inside_the_users_jit_saving_at_t1_holds_no_host_callback():
    """The default save ([t1], saveat None) is in range and in order by construction: unchecked, so
    a solve traced inside a caller's jit (finite start, throw=False) holds no host callback; given
    save times are checked there (the control: the count sees them)."""
    attn = tp.SoftmaxAttention.identity(2, 1.0)

    def run(x0, saveat=None):
        tp.runs.finite_by_construction([x0])
        return tp.solve(attn, x0, t1=1.0, dt0=0.1, saveat=saveat, throw=False).xs

    x0 = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    assert _callbacks(jax.jit(run).lower(x0)) == 0
    assert _callbacks(jax.jit(lambda x: run(x, jnp.array([0.5, 1.0]))).lower(x0)) > 0


def test_a_blown_up_statistic_is_reported_not_counted():
    """x' = e^{|x|²}x blows up at T = E1(|x0|²)/2 ≈ 0.11 (|x0| = 1): the statistic's input is
    flagged (it checked it itself, a host callback, before), its saves from there on are inf and
    the run reports the blow-up, as one that saves the states does."""
    usa = tp.UnnormalizedAttention.identity(2, 1.0)
    x0 = jnp.ones((3, 2)) / np.sqrt(2.0)
    mean = lambda t, x, a: jnp.mean(x)  # noqa: E731
    ts = jnp.linspace(0, 0.5, 11)
    with pytest.raises(tp.NonFiniteStateError, match="became non-finite"):
        tp.solve(usa, x0, t1=0.5, dt0=0.01, saveat=diffrax.SaveAt(ts=ts, fn=mean))
    sol = tp.solve(usa, x0, t1=0.5, dt0=0.01, saveat=diffrax.SaveAt(ts=ts, fn=mean), throw=False)
    states = tp.solve(usa, x0, t1=0.5, dt0=0.01, saveat=ts, throw=False)
    assert 0.1097 < float(sol.nonfinite_time) < 0.13 and sol.nonfinite_time == states.nonfinite_time
    finite = np.isfinite(np.asarray(sol.stats))
    np.testing.assert_array_equal(finite, np.isfinite(np.asarray(states.xs)).all(axis=(1, 2)))
    np.testing.assert_allclose(np.asarray(sol.stats)[finite], np.asarray(states.xs).mean(axis=(1, 2))[finite],
                               rtol=1e-14)


@pytest.fixture
def persistent_cache(tmp_path):
    """JAX's persistent compilation cache in a fresh directory, its refusals logged."""
    before = {k: jax.config.values[k] for k in ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                                                "jax_persistent_cache_min_entry_size_bytes", "jax_explain_cache_misses")}
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_explain_cache_misses", True)
    compilation_cache.reset_cache()
    yield tmp_path
    for k, v in before.items():
        jax.config.update(k, v)
    compilation_cache.reset_cache()


def test_the_persistent_cache_keeps_a_solve_program(persistent_cache, caplog):
    """JAX writes the solve's executable and logs no refusal; a program holding eqx.error_if is
    refused, naming host callbacks (the control)."""
    x0 = jnp.array([[1.0, 0.0], [0.0, 0.6], [0.3, 0.3]])
    attn = tp.SoftmaxAttention.identity(2, 1.7)
    entries = lambda: {p.name for p in persistent_cache.iterdir() if p.name.endswith("-cache")}  # noqa: E731
    with caplog.at_level(logging.DEBUG, logger="jax._src.compiler"):
        tp.solve(attn, x0, t1=0.7, dt0=0.1, saveat=jnp.linspace(0, 0.7, 3))
        assert len([e for e in entries() if e.startswith("jit__solve_program-")]) == 1
        assert "host callbacks" not in caplog.text
        x = jnp.arange(3.0)
        seen = entries()
        jax.jit(lambda x: eqx.error_if(x, jnp.any(x < 0), "x must be >= 0")).lower(x).compile()
        assert entries() == seen and "because it uses host callbacks" in caplog.text


def test_the_check_filter_wraps_equinox_once_and_skips_only_where_asked():
    """The filter is installed once, on Equinox's private hook (this fails loudly when a new
    Equinox renames it: the solve programs would then hold diffrax's checks, correct but never
    kept). Outside ``skipping_checks``, in another thread while one skips, and in a jitted function
    traced inside the block then called outside, diffrax's checks stay."""
    import threading

    from transformer_pde import _checks

    errors = importlib.import_module("equinox._errors")
    assert _checks.install_check_filter()
    hook = getattr(errors, _checks.EQUINOX_CHECK_HOOK)
    assert hook._transformer_pde_filter and _checks.install_check_filter()
    assert getattr(errors, _checks.EQUINOX_CHECK_HOOK) is hook  # not wrapped twice

    message = "Cannot evaluate VirtualBrownianTree outside of its range [t0, t1]."
    tree = diffrax.VirtualBrownianTree(0.0, 1.0, tol=0.25, shape=(2,), key=jax.random.key(0))
    evaluate = jax.jit(lambda t: tree.evaluate(t))
    with _checks.skipping_checks((message,)):
        assert _callbacks(evaluate.lower(0.5)) == 0
        seen = []
        elsewhere = lambda: seen.append(_callbacks(jax.jit(lambda t: tree.evaluate(t)).lower(0.5)))  # noqa: E731
        other = threading.Thread(target=elsewhere)
        other.start()
        other.join()
        assert seen[0] > 0  # another thread keeps its checks
    assert _callbacks(evaluate.lower(0.5)) > 0
    with pytest.raises((eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError), match="outside of its range"):
        jax.block_until_ready(evaluate(2.0))


def test_bad_times_of_a_traced_solve_still_raise_clear_errors():
    """diffrax's checks of dt0, the save times and the Brownian interval are not in the program:
    solve's own say the same under a caller's jit (and before the program when concrete)."""
    x0 = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    attn = tp.SoftmaxAttention.identity(2, 1.0)
    errors = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)
    with pytest.raises(errors, match="dt0 must be .*> 0"):
        jax.block_until_ready(jax.jit(lambda dt: tp.solve(attn, x0, t1=1.0, dt0=dt, max_steps=64).xs)(-0.1))
    with pytest.raises(errors, match="t1 > t0"):
        jax.block_until_ready(jax.jit(lambda t1: tp.solve(attn, x0, t1=t1, dt0=0.1, max_steps=64).xs)(-1.0))
    noisy = jax.jit(lambda T1: tp.solve(attn, x0, t1=1.0, dt0=0.1, noise=tp.Noise(0.3),
                                        key=jax.random.key(0), brownian_interval=(0.0, T1)).xs)
    with pytest.raises(errors, match="brownian_interval must contain"):
        jax.block_until_ready(noisy(0.5))
    with pytest.raises(ValueError, match="dt0 must be > 0"):
        tp.solve(attn, x0, t1=1.0, dt0=-0.1)
