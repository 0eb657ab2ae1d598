"""An experiment's own jitted, vmapped function kept between processes (runs/kept_function.py, issue 36
item 5): traced once, loaded by a later process (0 traces), the same bits as ``eqx.filter_jit``;
keyed by what it maps (a vmap's in_axes, a closure's values); a runtime check still raises its
message, inside the block and out."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kept import stored_programs

import transformer_pde as tp
from transformer_pde._checks import runtime_check
from transformer_pde.runs import programs

class _Log:  # a class is keyed by its name: a function's key does not change as it is traced
    traced: list = []


TRACED = _Log.traced


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty program store, and none of this process's programs."""
    monkeypatch.setattr(programs, "program_dir", lambda: tmp_path / "programs")
    monkeypatch.setattr(programs, "_CALLS", {})
    monkeypatch.setattr(programs, "_BY_KEY", {})
    TRACED.clear()
    return tmp_path / "programs"


def _new_process():
    """What a later process starts with: none of this one's programs (the files stay)."""
    programs._CALLS.clear()
    programs._BY_KEY.clear()


def _batched(scale):
    def one(x):
        _Log.traced.append(scale)  # runs only while tracing
        return jnp.sum(jnp.sin(scale * x)), jnp.cumsum(x)

    def rows(xs):
        return jax.vmap(one)(xs)

    return rows


def test_a_later_process_loads_the_kept_function_instead_of_tracing_it(store):
    xs = jnp.linspace(0.0, 1.0, 12).reshape(3, 4)
    plain = eqx.filter_jit(_batched(2.0))(xs)
    TRACED.clear()
    with tp.runs.kept_programs():
        first = tp.runs.kept(_batched(2.0))(xs)
        assert len(TRACED) == 1 and stored_programs(store) == [".jaxcall"]
        _new_process()
        second = tp.runs.kept(_batched(2.0))(xs)
    assert len(TRACED) == 1  # loaded, not traced
    for a, b, c in zip(first, second, plain):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))  # the same bits as filter_jit's
    xn = np.linspace(0.0, 1.0, 12).reshape(3, 4)
    np.testing.assert_allclose(np.asarray(second[0]), np.sin(2.0 * xn).sum(axis=1), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(second[1]), np.cumsum(xn, axis=1), rtol=1e-14)


def test_a_closure_holding_another_value_is_another_program(store):
    xs = jnp.ones((2, 3))
    with tp.runs.kept_programs():
        tp.runs.kept(_batched(2.0))(xs)
        third = tp.runs.kept(_batched(3.0))(xs)
    assert TRACED == [2.0, 3.0] and len(list(store.glob("*.jaxcall"))) == 2
    np.testing.assert_allclose(np.asarray(third[0]), 3 * np.sin(3.0), rtol=1e-14)


def _mapped_over(axes):
    def f(x, y):
        return jax.vmap(lambda a, b: a * b, in_axes=axes)(x, y)

    return f


def test_how_a_function_maps_is_part_of_its_key(store):
    """The same inner function vmapped over other axes (same argument shapes) is another program."""
    x = jnp.arange(4.0).reshape(2, 2)
    with tp.runs.kept_programs():
        rows = tp.runs.kept(_mapped_over((0, 0)))(x, x)
        cols = tp.runs.kept(_mapped_over((1, 1)))(x, x)
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(x * x))
    np.testing.assert_array_equal(np.asarray(cols), np.asarray((x * x).T))
    assert len(list(store.glob("*.jaxcall"))) == 2


@pytest.mark.parametrize("wrapped", [jax.vmap(jnp.sin), jax.jit(jnp.sin), eqx.filter_jit(jnp.sin), "sin", None])
def test_a_wrapped_function_is_refused_naming_it(wrapped):
    """A jax.vmap or jit of a function would be keyed by the function it wraps, not by how it maps."""
    with pytest.raises(ValueError, match="kept: fn must be a plain function"):
        tp.runs.kept(wrapped)


def _checked(xs):
    _Log.traced.append("checked")
    return jax.vmap(lambda x: runtime_check(x, x < 0, "x must be >= 0"))(xs)


def test_a_runtime_check_still_raises_its_message(store):
    """A library check (runtime_check) in a kept function is reported as a value and raised after the
    program with its message, from a loaded program too; outside the block, as filter_jit raises it."""
    bad = jnp.array([1.0, -1.0])
    with pytest.raises(eqx.EquinoxRuntimeError, match="x must be >= 0"):
        tp.runs.kept(_checked)(bad)
    with tp.runs.kept_programs():
        with pytest.raises(eqx.EquinoxRuntimeError, match="x must be >= 0"):
            tp.runs.kept(_checked)(bad)
        assert stored_programs(store) == [".jaxcall"]
        TRACED.clear()
        _new_process()
        with pytest.raises(eqx.EquinoxRuntimeError, match="x must be >= 0"):
            tp.runs.kept(_checked)(bad)
        np.testing.assert_array_equal(np.asarray(tp.runs.kept(_checked)(jnp.ones(2))), [1.0, 1.0])
    assert TRACED == []  # loaded, not traced


def test_under_a_callers_jit_it_is_inlined_and_checks_raise(store):
    with tp.runs.kept_programs():
        out = jax.jit(lambda xs: tp.runs.kept(_batched(2.0))(xs)[1])(jnp.ones((2, 2)))
        np.testing.assert_array_equal(np.asarray(out), [[1.0, 2.0], [1.0, 2.0]])
        with pytest.raises(Exception, match="x must be >= 0"):
            jax.block_until_ready(eqx.filter_jit(lambda xs: tp.runs.kept(_checked)(xs))(-jnp.ones(2)))
    assert not store.exists()  # traced arguments: nothing kept


def _logged(f):
    @functools.wraps(f)
    def wrapper(*args):
        return f(*args)

    return wrapper


def test_a_decorated_function_is_kept_as_what_it_computes(store):
    """A decorator that is no JAX transform (a type checker's wrapper) is accepted; its key holds
    what it wraps, so another wrapped function is another program."""
    x = jnp.ones((2, 2))
    with tp.runs.kept_programs():
        np.testing.assert_array_equal(np.asarray(tp.runs.kept(_logged(_batched(2.0)))(x)[1]), [[1.0, 2.0]] * 2)
        third = tp.runs.kept(_logged(_batched(3.0)))(x)
    assert TRACED == [2.0, 3.0] and len(list(store.glob("*.jaxcall"))) == 2
    np.testing.assert_allclose(np.asarray(third[0]), 2 * np.sin(3.0), rtol=1e-14)


def _draws(keys):
    return jax.vmap(lambda k: jax.random.normal(k, (3,)))(keys)


def test_typed_prng_keys_are_kept_arguments(store):
    """A typed key array (``jax.random.key``) is a jax.Array without a ``weak_type`` attribute of
    its own: kept, loaded by a later process, the same draws as filter_jit's."""
    keys = jax.random.split(jax.random.key(3), 4)
    plain = eqx.filter_jit(_draws)(keys)
    with tp.runs.kept_programs():
        first = tp.runs.kept(_draws)(keys)
        _new_process()
        second = tp.runs.kept(_draws)(keys)
    assert stored_programs(store) == [".jaxcall"]
    np.testing.assert_array_equal(np.asarray(first), np.asarray(plain))
    np.testing.assert_array_equal(np.asarray(second), np.asarray(plain))
