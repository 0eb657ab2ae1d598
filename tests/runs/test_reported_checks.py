"""The library's runtime checks in a kept program (runs/reported_checks.py): reported as values and
raised with their exact message after the program (under vmap, in a while loop, from a loaded
program); a context variable, not a patched module, so another thread tracing at the same time
keeps its checks inside its program; the normal path is ``eqx.error_if``; another library's check
keeps a program out of the store; the one reading of checkify's error holds for this JAX."""

import threading

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kept import stored_programs
from jax.experimental import checkify

import transformer_pde as tp
from transformer_pde._checks import runtime_check
from transformer_pde.runs import programs
from transformer_pde.runs.reported_checks import _failed_and_code, collecting, reporting

NEGATIVE = "x must be >= 0 {not a format field}"
LARGE = "a row sum must be <= 10"


@pytest.fixture
def calls(tmp_path, monkeypatch):
    """An empty program store, and none of this process's programs."""
    monkeypatch.setattr(programs, "program_dir", lambda: tmp_path / "programs")
    monkeypatch.setattr(programs, "_CALLS", {})
    monkeypatch.setattr(programs, "_BY_KEY", {})
    return tmp_path / "programs"


def _new_process():
    programs._CALLS.clear()
    programs._BY_KEY.clear()


def _rows_checked(xs):
    """Each row checked under a vmap, then each row's running sum checked in a while loop."""
    xs = jax.vmap(lambda x: runtime_check(x, jnp.any(x < 0), NEGATIVE))(xs)

    def body(carry):
        i, total = carry
        total = runtime_check(total + xs[i], jnp.any(total + xs[i] > 10), LARGE)
        return i + 1, total

    _, total = jax.lax.while_loop(lambda c: c[0] < xs.shape[0], body, (0, jnp.zeros(xs.shape[1])))
    return total


def _raised(run) -> str:
    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        jax.block_until_ready(run())
    return str(info.value)


@pytest.mark.parametrize("bad, message", [([[1.0, 2.0], [-1.0, 0.0]], NEGATIVE),  # under the vmap
                                          ([[1.0, 2.0], [10.0, 0.0]], LARGE)])  # in the while loop
def test_a_failed_check_raises_its_exact_message_after_the_kept_program(calls, bad, message):
    good = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(np.asarray(programs.call_kept(_rows_checked, (good,))), [4.0, 6.0])
    assert stored_programs(calls) == [".jaxcall"]  # kept: no host callback in it
    assert _raised(lambda: programs.call_kept(_rows_checked, (jnp.asarray(bad),))) == message
    _new_process()  # the loaded program reports it too
    assert _raised(lambda: programs.call_kept(_rows_checked, (jnp.asarray(bad),))) == message
    # the normal path: eqx.error_if, raised inside the program, the same message
    assert message in _raised(lambda: eqx.filter_jit(_rows_checked)(jnp.asarray(bad)))


def _row_sums_checked(xs):
    """A check in a while loop under a vmap: each row's running sum."""

    def one(x):
        def body(carry):
            i, total = carry
            return i + 1, runtime_check(total + x[i], total + x[i] > 10, LARGE)

        return jax.lax.while_loop(lambda c: c[0] < x.shape[0], body, (0, jnp.zeros((), x.dtype)))[1]

    return jax.vmap(one)(xs)


def test_a_check_in_a_vmapped_while_loop_is_reported(calls):
    np.testing.assert_array_equal(np.asarray(programs.call_kept(_row_sums_checked, (jnp.ones((2, 3)),))), [3.0, 3.0])
    assert stored_programs(calls) == [".jaxcall"]
    assert _raised(lambda: programs.call_kept(_row_sums_checked, (jnp.array([[1.0, 1.0], [5.0, 6.0]]),))) == LARGE


def test_the_normal_path_raises_inside_jit():
    """Outside a kept program's trace a check is eqx.error_if: a host callback in the program,
    raised while it runs."""

    def f(x):
        return runtime_check(x, jnp.any(x < 0), NEGATIVE)

    assert "callback" in str(jax.make_jaxpr(f)(jnp.ones(2)))
    assert NEGATIVE in _raised(lambda: eqx.filter_jit(f)(-jnp.ones(2)))
    np.testing.assert_array_equal(np.asarray(eqx.filter_jit(f)(jnp.ones(2))), [1.0, 1.0])


class _Sync:  # a class is keyed by its name: the program's key does not see the events
    inside = threading.Event()
    done = threading.Event()


def _slow(x):
    _Sync.inside.set()
    assert _Sync.done.wait(60)  # hold the reporting trace open while the other thread traces
    return runtime_check(x, jnp.any(x < 0), NEGATIVE)


def test_a_thread_tracing_meanwhile_keeps_its_checks_inside(calls):
    """While one thread traces a program reporting its checks, another traces plainly: its check is
    still eqx.error_if (raised inside its program), and the first's is still reported."""
    _Sync.inside.clear()
    _Sync.done.clear()
    seen = {}

    def plain():
        try:
            assert _Sync.inside.wait(60)
            f = eqx.filter_jit(lambda x: runtime_check(2 * x, jnp.any(x < 0), LARGE))
            seen["jaxpr"] = str(jax.make_jaxpr(f)(jnp.ones(2)))
            seen["message"] = _raised(lambda: f(-jnp.ones(2)))
        finally:
            _Sync.done.set()

    other = threading.Thread(target=plain)
    other.start()
    out = programs.call_kept(_slow, (jnp.ones(2),))
    other.join()
    assert "callback" in seen["jaxpr"] and LARGE in seen["message"]
    np.testing.assert_array_equal(np.asarray(out), [1.0, 1.0])
    assert stored_programs(calls) == [".jaxcall"]
    assert _raised(lambda: programs.call_kept(_slow, (-jnp.ones(2),))) == NEGATIVE


def _third_party_checked(x):
    return eqx.error_if(x, jnp.any(x < 0), "another library's check")


def test_another_librarys_check_keeps_the_program_out_and_raises_inside(calls):
    """An eqx.error_if not of this library is a host callback: the program is refused (marked) and
    a kept function runs it under eqx.filter_jit, the check raising inside as before."""
    assert programs.call_kept(_third_party_checked, (jnp.ones(2),)) is None
    assert [p.suffix for p in calls.iterdir()] == [".refused"]
    with tp.runs.kept_programs():
        assert "another library's check" in _raised(lambda: tp.runs.kept(_third_party_checked)(-jnp.ones(2)))


def _stopped_early(x0):
    sol = tp.solve(tp.SoftmaxAttention.identity(2, 1.0), x0, t1=1.0, dt0=0.1, max_steps=2,
                   saveat=diffrax.SaveAt(t1=True))
    return sol.xs


def test_diffrax_result_code_is_reported_with_diffraxs_message(calls):
    """A solve inside a kept function (under its jit) that runs out of steps: diffrax's message for
    its result code, after the kept program, as inside the plain one."""
    x0 = jnp.array([[1.0, 0.0], [0.0, 0.6], [0.3, 0.3]])
    message = diffrax.RESULTS[diffrax.RESULTS.max_steps_reached]
    assert "max_steps" in message
    assert _raised(lambda: programs.call_kept(_stopped_early, (x0,))) == message
    assert stored_programs(calls) == [".jaxcall"]
    assert message in _raised(lambda: eqx.filter_jit(_stopped_early)(x0))


def test_checkify_errors_are_read_as_this_module_assumes():
    """The one assumption on checkify (its error's bool leaf is the flag, our uint32 payload the
    code), checked against checkify's public ``Error.get``: a JAX that changes it fails here, and
    ``reporting`` then refuses programs (NotImplementedError) rather than misread them."""

    def f(x):
        checkify.check(jnp.all(x > 0), "{}", jnp.asarray(3, jnp.uint32))
        checkify.check(jnp.all(x > -5), "{}", jnp.asarray(7, jnp.uint32))
        return x

    for x, code in ((-1.0, 3), (-9.0, 3), (1.0, None)):
        error, _ = jax.jit(checkify.checkify(f))(jnp.asarray(x))
        failed, read = jax.jit(lambda v: _failed_and_code(checkify.checkify(f)(v)[0]))(jnp.asarray(x))
        assert bool(failed) == (error.get() is not None)
        if code is not None:
            assert error.get().startswith(f"{code} ") and int(read) == code
    program, messages = reporting(lambda x: [runtime_check(x, x < 0, NEGATIVE)])
    out = jax.jit(program)(jnp.asarray(-2.0))
    assert messages == [NEGATIVE] and bool(out[1]) and int(out[2]) == 0


# A solve and a statistic computed in a while loop (cluster_count, as sweep-phase saves it) under
# a vmap: the loop's condition is vmapped, which checkify cannot pass (JAX 0.10:
# "checkify-of-vmap-of-while"; diffrax's own loop un-vmaps its condition); the program collects its
# checks instead (collecting, carry_checks): kept, a failed check raised after it with its message.
X0 = jnp.array([[[1.0, 0.0], [0.0, 0.6], [0.3, 0.3]], [[0.5, 0.5], [0.2, -0.4], [-1.0, 0.1]]])
NONFINITE_X0 = "x0 must be finite (found NaN or inf)"


def _solve_one(x0):
    sol = tp.solve(tp.SoftmaxAttention.identity(2, 1.0), x0, t1=1.0, dt0=0.1, saveat=diffrax.SaveAt(t1=True))
    return sol.xs[-1], tp.diagnostics.cluster_count(sol.xs[-1], 0.9)


def _solves(x0s):
    return tp.runs.carry_checks(jax.vmap, _solve_one)(x0s)


def _solves_plain(x0s):
    return jax.vmap(_solve_one)(x0s)


def _kept_files(calls) -> list:
    return stored_programs(calls)


def test_a_vmapped_solve_is_kept_and_its_failed_check_raises_as_the_plain_path(calls, monkeypatch):
    good = eqx.filter_jit(_solves_plain)(X0)
    jax.tree.map(np.testing.assert_array_equal, programs.call_kept(_solves, (X0,)), good)
    assert _kept_files(calls) == [".jaxcall"]  # kept, no .refused mark
    bad = X0.at[1, 2, 0].set(jnp.nan)  # the second element only
    assert _raised(lambda: programs.call_kept(_solves, (bad,))) == NONFINITE_X0
    assert NONFINITE_X0 in _raised(lambda: eqx.filter_jit(_solves_plain)(bad))  # the plain path's message
    # checkify alone cannot keep it: the reason the collecting way exists
    program, _ = reporting(lambda x: [_solves(x)])
    with pytest.raises(ValueError, match="checkify-of-vmap-of-while"):
        jax.export.export(jax.jit(program))(X0)
    _new_process()  # a later process loads the program: nothing traced or exported again

    def no_export(*args):
        raise AssertionError("the kept program was traced again")

    monkeypatch.setattr(programs, "_export_call", no_export)
    jax.tree.map(np.testing.assert_array_equal, programs.call_kept(_solves, (X0,)), good)
    assert _raised(lambda: programs.call_kept(_solves, (bad,))) == NONFINITE_X0


FIRST = "x must be >= 0"
SECOND = "the loop's total less x must be <= 11.5"


def _two_checks(x):
    """A check, a while loop whose condition is vmapped under a vmap, a check after it."""
    x = runtime_check(x, x < 0, FIRST)
    total = jax.lax.while_loop(lambda s: s < 10 + x, lambda s: s + 3.0, jnp.zeros_like(x))
    return runtime_check(total, total - x > 11.5, SECOND)  # x = 0: 12


@pytest.mark.parametrize("bad, message", [([-1.0, 0.0, 0.5], FIRST),  # the second element fails SECOND
                                          ([0.0, 0.5, -1.0], FIRST),  # the first check, whichever element
                                          ([0.5, 1.0, 0.0], SECOND),  # the last element only
                                          ([1.0, 1.5, 0.5], None)])
def test_collected_checks_raise_the_first_in_program_order_as_the_plain_path(calls, bad, message):
    def kept(xs):
        return tp.runs.carry_checks(jax.vmap, _two_checks)(xs)

    def plain(xs):
        return jax.vmap(_two_checks)(xs)

    xs = jnp.asarray(bad)
    if message is None:
        expected = np.asarray(eqx.filter_jit(plain)(xs))
        np.testing.assert_array_equal(np.asarray(programs.call_kept(kept, (xs,))), expected)
    else:
        assert _raised(lambda: programs.call_kept(kept, (xs,))) == message
        assert message in _raised(lambda: eqx.filter_jit(plain)(xs))
    assert _kept_files(calls) == [".jaxcall"]


def test_a_check_a_vmap_does_not_carry_keeps_the_program_out(calls):
    """A check in a caller's own vmap of a solve (no carry_checks) cannot leave it as a value:
    the program is refused (its mark says why) and runs as before, its check raising inside."""
    assert programs.call_kept(_solves_plain, (X0,)) is None
    assert _kept_files(calls) == [".refused"]
    reason = next(calls.iterdir()).read_bytes()
    assert b"checkify-of-vmap-of-while" in reason and b"collecting:" in reason
    with tp.runs.kept_programs():
        assert NONFINITE_X0 in _raised(lambda: tp.runs.kept(_solves_plain)(X0.at[0, 0, 0].set(jnp.inf)))


def test_a_sweeps_chunks_are_kept_and_raise_the_plain_sweeps_message(calls):
    """tp.sweep's chunks (a lax.map of a vmap of solves) carry their checks: a non-finite β in one
    point raises the attention's message after the kept program, as the plain sweep does."""
    def run(beta):
        x = tp.solve(tp.SoftmaxAttention.identity(2, beta), X0[0], t1=1.0, dt0=0.1).xs[-1]
        return {"sum": jnp.sum(x), "clusters": tp.diagnostics.cluster_count(x, 0.9)}

    betas = {"beta": jnp.array([0.5, 1.0, 2.0])}
    plain = tp.sweep(run, betas, chunk_size=2)
    with tp.runs.kept_programs():
        kept = tp.sweep(run, betas, chunk_size=2)
        assert _kept_files(calls) == [".jaxcall"]
        for k in plain:
            np.testing.assert_array_equal(kept[k].values, plain[k].values)
        bad = {"beta": jnp.array([0.5, 1.0, jnp.nan])}
        message = _raised(lambda: tp.sweep(run, bad, chunk_size=2))
    assert "beta must be finite" in message
    assert message in _raised(lambda: tp.sweep(run, bad, chunk_size=2))


def test_carry_checks_is_the_transform_outside_a_collecting_program():
    f = tp.runs.carry_checks(jax.vmap, lambda x: runtime_check(2 * x, x < 0, NEGATIVE))
    assert str(jax.make_jaxpr(f)(jnp.ones(2))) == str(jax.make_jaxpr(jax.vmap(
        lambda x: runtime_check(2 * x, x < 0, NEGATIVE)))(jnp.ones(2)))
    with pytest.raises(ValueError, match=r"carry_checks: fn must be callable .*, got int 3$"):
        tp.runs.carry_checks(jax.vmap, 3)
    with pytest.raises(ValueError, match=r"carry_checks: transform must be callable .*, got str 'vmap'$"):
        tp.runs.carry_checks("vmap", jnp.sin)


INNER = "the inner check"


def _inner(x):
    return runtime_check(2 * x, jnp.any(x > 5), INNER)


_INNER_JIT = tp.runs.carry_checks(eqx.filter_jit, _inner)  # one jit, traced once per shape


def _loop_then_inner(x):  # a vmapped while loop: collected, not checkified
    return tp.runs.carry_checks(jax.vmap, lambda v: jax.lax.while_loop(lambda s: s < v, lambda s: s + 1.0, v))(
        _INNER_JIT(x))


@pytest.mark.parametrize("build, then", [(collecting, _loop_then_inner), (reporting, _INNER_JIT)])
def test_a_jit_shared_by_two_kept_programs_reports_its_own_message_in_each(build, then):
    """The same jit (same shapes) in two programs traced to keep, the second with a check before
    it: each program's trace traces the jit again, so its check's message index is the second
    program's (a cached trace would hold the first's index)."""
    first, _ = build(lambda x: [then(x)])
    jax.jit(first)(jnp.ones(3))
    second, messages = build(lambda x: [then(runtime_check(x, jnp.any(x < -100), NEGATIVE))])
    out = jax.jit(second)(jnp.array([1.0, 9.0, 1.0]))
    assert bool(out[-2]) and messages[int(out[-1])] == INNER
