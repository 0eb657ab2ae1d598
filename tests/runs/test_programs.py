"""Traced programs kept on disk (runs/programs.py, issue 24): a later call loads the program
instead of tracing it and runs the same bits; the key changes with everything tracing reads; a
damaged file is traced again; a program holding a host callback is compiled but not kept; the
experiments whose second run this is for hold no host callback."""

import os
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kept import stored_programs

from transformer_pde._checks import runtime_check
from transformer_pde.runs import programs


class _Log:  # a class is keyed by its name: the key of _program does not change as it is traced
    traced: list = []


TRACED = _Log.traced


def _program(scale, x):
    _Log.traced.append(scale)  # runs only while tracing
    return jnp.sum(jnp.sin(scale * x)), jnp.cumsum(x)


def _checked(x):
    return eqx.error_if(x, jnp.any(x < 0), "x must be >= 0")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(programs, "program_dir", lambda: tmp_path / "programs")
    monkeypatch.setattr(programs, "_LOWERED", {})
    monkeypatch.setattr(programs, "_COMPILED", {})
    TRACED.clear()
    return tmp_path / "programs"


def _new_process():
    """What a later process starts with: none of this one's lowered or compiled programs."""
    programs._LOWERED.clear()
    programs._COMPILED.clear()


def test_a_later_call_loads_the_program_instead_of_tracing_it(store):
    x = jnp.linspace(0.0, 1.0, 7)
    first = programs.lower_program(_program, (2.0,), (x,)).compile()(x)
    assert TRACED == [2.0] and len(list(store.iterdir())) == 1
    again = programs.lower_program(_program, (2.0,), (x,))
    assert again is programs.lower_program(_program, (2.0,), (x,))  # in this process: the same object
    _new_process()
    second = programs.lower_program(_program, (2.0,), (x,)).compile()(x)
    assert TRACED == [2.0]  # loaded, not traced
    for a, b in zip(first, second):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    xn = np.linspace(0.0, 1.0, 7)
    np.testing.assert_allclose(float(second[0]), np.sin(2.0 * xn).sum(), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(second[1]), np.cumsum(xn), rtol=1e-14)
    programs.lower_program(_program, (3.0,), (x,)).compile()(x)  # another static value: traced
    assert TRACED == [2.0, 3.0] and len(list(store.iterdir())) == 2


def test_the_key_changes_with_what_tracing_reads(monkeypatch):
    x = jnp.zeros(5)
    key = programs.program_key(_program, (2.0,), (x,))
    assert programs.program_key(_program, (2.0,), (x,)) == key
    assert programs.program_key(_program, (2.5,), (x,)) != key  # a static argument
    assert programs.program_key(_program, (2.0,), (jnp.zeros(6),)) != key  # a shape
    assert programs.program_key(_program, (2.0,), (x.astype(jnp.float32),)) != key  # a dtype
    with jax.enable_x64(False):  # JAX's configuration
        assert programs.program_key(_program, (2.0,), (x,)) != key
    monkeypatch.setenv("EQX_ON_ERROR", "nan")  # Equinox reads it when tracing
    assert programs.program_key(_program, (2.0,), (x,)) != key
    monkeypatch.delenv("EQX_ON_ERROR")
    monkeypatch.setattr(programs, "_source_digest", lambda: "edited")  # the package's source
    assert programs.program_key(_program, (2.0,), (x,)) != key


def test_what_cannot_be_identified_is_refused_naming_lower_program(store):
    x = jnp.zeros(3)
    with pytest.raises(ValueError, match=r"lower_program cannot key the program .*_program: cannot fingerprint "
                                         r"static\[0\] \(object\): its repr is its memory address"):
        programs.lower_program(_program, (object(),), (x,))
    with pytest.raises(ValueError, match=r"lower_program: fn must be a Python function, got builtin"):
        programs.lower_program(abs, (), (x,))


def _main_function(source: str):
    """``f`` as a script run as ``__main__`` (or a notebook cell) defines it."""
    namespace = {"__name__": "__main__", "jnp": jnp}
    exec(source, namespace)  # noqa: S102 - the test's own source
    return namespace["f"]


@pytest.mark.parametrize("kept", [True, False], ids=["store-on", "store-off"])
def test_functions_are_keyed_by_what_they_compute_not_their_name(store, monkeypatch, kept):
    """Two scripts' ``__main__.f`` (or a cell run again with an edit), a closure over another
    value, a static table that differs in one element hidden by NumPy's summarized repr."""
    if not kept:
        monkeypatch.setattr(programs, "program_dir", lambda: None)
    x = jnp.arange(3.0)
    one, two = _main_function("def f(x):\n    return x + 1\n"), _main_function("def f(x):\n    return x + 2\n")
    assert one.__qualname__ == two.__qualname__ and one.__module__ == two.__module__
    np.testing.assert_array_equal(np.asarray(programs.lower_program(one, (), (x,)).compile()(x)), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(programs.lower_program(two, (), (x,)).compile()(x)), [2.0, 3.0, 4.0])

    def shifted(c):
        return lambda x: x + c

    np.testing.assert_array_equal(np.asarray(programs.lower_program(shifted(5.0), (), (x,)).compile()(x)),
                                  [5.0, 6.0, 7.0])
    np.testing.assert_array_equal(np.asarray(programs.lower_program(shifted(7.0), (), (x,)).compile()(x)),
                                  [7.0, 8.0, 9.0])
    table = np.arange(5000.0)
    edited = table.copy()
    edited[2500] = -1.0
    assert repr(table) == repr(edited)  # "..." hides the difference
    assert programs.program_key(_program, (table,), (x,)) != programs.program_key(_program, (edited,), (x,))


def _kept(store, scale, x):
    programs.lower_program(_program, (scale,), (x,))
    (path,) = [p for p in store.iterdir() if programs.program_key(_program, (scale,), (x,)) in p.name]
    return path


def test_a_program_copied_over_another_keys_file_is_not_run(store):
    """The file of scale 2 copied over the file of scale 3 (the lost run of issue 37: seed 0 ran
    seed 1's program): the key inside it is not the file's, so scale 3 is traced again."""
    x = jnp.arange(4.0)
    two, three = _kept(store, 2.0, x), _kept(store, 3.0, x)
    three.write_bytes(two.read_bytes())
    _new_process()
    out = programs.lower_program(_program, (3.0,), (x,)).compile()(x)
    assert TRACED == [2.0, 3.0, 3.0]
    np.testing.assert_allclose(float(out[0]), np.sin(3.0 * np.arange(4.0)).sum(), rtol=1e-14)


def test_an_edited_payload_is_not_run(store):
    """Four bytes of the payload changed (the stored constant): its SHA-256 no longer matches."""
    x = jnp.arange(4.0)
    path = _kept(store, 2.0, x)
    data = bytearray(path.read_bytes())
    data[-40:-36] = bytes(4 - i for i in range(4)) if data[-40:-36] != bytes(4 - i for i in range(4)) else b"abcd"
    path.write_bytes(bytes(data))
    _new_process()
    programs.lower_program(_program, (2.0,), (x,))
    assert TRACED == [2.0, 2.0]


def test_a_fifo_in_the_place_of_a_program_does_not_block_the_run(store):
    x = jnp.arange(4.0)
    path = _kept(store, 2.0, x)
    path.unlink()
    os.mkfifo(path)  # opening it for reading would wait for a writer forever
    _new_process()
    out = programs.lower_program(_program, (2.0,), (x,)).compile()(x)
    assert TRACED == [2.0, 2.0] and path.is_file()  # traced again, and replaced by a regular file
    np.testing.assert_allclose(float(out[0]), np.sin(2.0 * np.arange(4.0)).sum(), rtol=1e-14)


def test_a_damaged_file_is_traced_again_and_replaced(store):
    x = jnp.arange(4.0)
    programs.lower_program(_program, (1.0,), (x,))
    (path,) = store.iterdir()
    path.write_bytes(b"not a program")
    _new_process()
    out = programs.lower_program(_program, (1.0,), (x,)).compile()(x)
    assert TRACED == [1.0, 1.0]
    np.testing.assert_allclose(float(out[0]), np.sin(np.arange(4.0)).sum(), rtol=1e-14)
    _new_process()
    programs.lower_program(_program, (1.0,), (x,))
    assert TRACED == [1.0, 1.0]  # the replacement loads


def test_a_program_with_a_host_callback_runs_and_is_not_kept(store):
    x = jnp.arange(3.0)
    program = programs.lower_program(_checked, (), (x,)).compile()
    np.testing.assert_array_equal(np.asarray(program(x)), np.arange(3.0))
    with pytest.raises(Exception, match="x must be >= 0"):
        jax.block_until_ready(program(-x - 1))
    assert not store.exists() or not any(store.iterdir())


def _callbacks(lowered) -> int:
    return len(re.findall(r"callback", lowered.as_text()))


def test_the_experiments_programs_hold_no_host_callback():
    """What lets their programs be kept (and JAX's cache keep their executables): phase-diagram's
    grid and every normalization scheme's states, with and without the causal mask."""
    from transformer_pde.experiments import normalization, phase_diagram

    cfg = phase_diagram.PhaseDiagramConfig(batch=3, num_betas=4, t1=3.0, num_saves=4)
    rows = tuple(int(r) for r in phase_diagram.histogram_betas(np.linspace(1.0, 9.0, 4)))
    assert _callbacks(jax.jit(phase_diagram._summaries, static_argnums=(0, 1)).trace(cfg, rows).lower()) == 0
    ncfg = normalization.NormalizationConfig(seeds=2, n=5, d=3, heads=2, t1=0.3, betas=(1.0,))
    S, H, n, d = ncfg.seeds, ncfg.heads, ncfg.n, ncfg.d
    args = [jax.ShapeDtypeStruct(s, jnp.float64) for s in ((), (S, n, d), (S, H, d, d), (S, H, d, d))]
    for causal in (False, True):
        for index, name in enumerate(ncfg.schemes):
            lowered = jax.jit(normalization.scheme_states, static_argnums=(0, 1, 2)).trace(
                ncfg, index, causal, *args).lower()
            assert _callbacks(lowered) == 0, (name, causal)
    lowered = jax.jit(normalization.depth_statistics_program, static_argnums=(0, 1)).trace(
        0.1, 0.999, jax.ShapeDtypeStruct((S, 4, n, d), jnp.float64)).lower()
    assert _callbacks(lowered) == 0


@pytest.mark.slow
@pytest.mark.parametrize("args, absent", [
    (["phase-diagram", "--batch", "4", "--num-betas", "2", "--t1", "3", "--num-saves", "4"], ("equinox",)),
    (["krause", "--n", "20", "--radii", "0.1,0.4", "--t1", "4"], ("equinox",)),
    (["kde-modes", "--n", "300", "--betas", "100,300", "--runs", "1", "--n-dynamics", "100",
      "--betas-dynamics", "30,100", "--t-dynamics", "2", "--dt", "0.25"], ("diffrax", "equinox")),
])
def test_a_second_cli_run_loads_its_program(tmp_path, args, absent):
    """Two tiny runs in fresh processes sharing a cache: the second traces nothing (it never
    imports equinox, which every trace of a model does, or diffrax, which every solve's trace does)
    and saves the same bits. Neither imports another experiment's options module (a run looks up
    its own name; only help and errors list them all)."""
    import os
    import subprocess
    import sys

    other = "transformer_pde.experiments.configs.lost_in_the_middle"
    code = ("import sys; from transformer_pde import cli; cli.main(sys.argv[1:]); "
            f"print('OTHER' if {other!r} in sys.modules else "
            f"'TRACED' if any(m in sys.modules for m in {absent!r}) else 'LOADED')")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TRANSFORMER_PDE_"))}
    out = []
    for i in range(2):
        cmd = [sys.executable, "-c", code, "run", *args, "--no-progress", "--out", str(tmp_path / f"run{i}"),
               "--compile-cache", str(tmp_path / "cache")]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr
        out.append(res.stdout.split()[-1])
    assert out == ["TRACED", "LOADED"]
    if args[0] != "kde-modes":  # the program and its executable (kde-modes keeps its KDE blocks' too)
        kept = sorted(p.suffix for p in (tmp_path / "cache" / "programs").iterdir())
        assert kept == [".jaxexe", ".jaxexport", ".jaxlink"]
    a, b = (np.load(tmp_path / f"run{i}" / "data.npz") for i in range(2))
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.slow
def test_a_second_large_n_run_loads_its_nufft_program(tmp_path):
    """large-n's solve holds jax-finufft's calls: kept by the first tiny run, loaded by the second
    (a fresh process, which registers the calls before running it), the same bits."""
    pytest.importorskip("jax_finufft")
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TRANSFORMER_PDE_"))}
    for i in range(2):
        cmd = [sys.executable, "-m", "transformer_pde.cli", "run", "large-n", "--n", "256", "--t1", "2",
               "--num-saves", "3", "--num-plotted", "20", "--no-progress", "--out", str(tmp_path / f"run{i}"),
               "--compile-cache", str(tmp_path / "cache")]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr
    kept = sorted(p.suffix for p in (tmp_path / "cache" / "programs").iterdir())
    # the solve's and the cluster counts', none refused; only the counts' has an executable (the
    # solve's holds jax-finufft's calls)
    assert kept == [".jaxcall", ".jaxcall", ".jaxexe", ".jaxlink"]
    a, b = (np.load(tmp_path / f"run{i}" / "data.npz") for i in range(2))
    assert bool(a["fast_kernel"]) and sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])

# -- every concrete solve's program kept (issue 36 item 5): runs.programs.kept_programs / call_kept


@pytest.fixture
def calls(store, monkeypatch):
    """``call_kept``'s store, empty, and no program of this process's."""
    monkeypatch.setattr(programs, "_CALLS", {})
    monkeypatch.setattr(programs, "_BY_KEY", {})
    return store


def _new_call_process():
    """What a later process starts with: none of this one's programs (the files stay)."""
    programs._CALLS.clear()
    programs._BY_KEY.clear()


def _mean_square(t, x, args):
    _Log.traced.append("statistic")  # runs only while tracing
    return jnp.mean(x**2)


def _a_solve():
    import transformer_pde as tp

    x0 = jnp.array([[1.0, 0.0], [0.0, 0.6], [0.3, 0.3]])
    import diffrax

    return tp.solve(tp.SoftmaxAttention.identity(2, 1.7), x0, t1=0.7, dt0=0.1,
                    saveat=diffrax.SaveAt(ts=jnp.linspace(0, 0.7, 3), fn=_mean_square))


def _compiles(run) -> int:
    """How many XLA compilations ``run()`` makes."""
    compiled = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return len(compiled)


def test_a_kept_solve_is_traced_once_per_process_and_loaded_by_a_later_one(calls):
    plain = _a_solve()
    TRACED.clear()
    with programs.kept_programs():
        first = _a_solve()
        traced = len(TRACED)  # diffrax traces a statistic a few times in one trace of the program
        assert traced > 0 and stored_programs(calls) == [".jaxcall"]
        assert _compiles(_a_solve) == 0 and len(TRACED) == traced  # this process: the same program
        _new_call_process()
        second = _a_solve()
    assert len(TRACED) == traced  # loaded, not traced
    for sol in (first, second):
        assert type(sol) is type(plain) and jax.tree.structure(sol) == jax.tree.structure(plain)
        for a, b in zip(jax.tree.leaves(sol), jax.tree.leaves(plain)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the same bits as the solve's own jit


def test_a_kept_solve_leaves_the_solves_own_jit_cache_alone(calls):
    """A solve outside the block after one inside compiles nothing again (the kept route neither
    replaces nor clears ``eqx.filter_jit``'s programs), and outside the block nothing is kept."""
    _a_solve()
    with programs.kept_programs():
        _a_solve()
    assert _compiles(_a_solve) == 0
    assert len(list(calls.glob("*.jaxcall"))) == 1


def test_nothing_is_kept_with_the_compile_cache_off(calls, monkeypatch):
    monkeypatch.setattr(programs, "program_dir", lambda: None)
    with programs.kept_programs():
        _a_solve()
    assert not calls.exists()


def _printed_logged(x):
    _Log.traced.append("printed")
    jax.debug.callback(lambda v: None, x)  # a host callback that is no check
    return x


def test_a_program_with_a_host_callback_is_marked_and_left_to_the_caller(calls):
    """``call_kept`` runs nothing and returns None (the caller runs it under its own jit); the mark
    it leaves spares a later process the export's trace."""
    x = jnp.arange(3.0)
    assert programs.call_kept(_printed_logged, (x,)) is None
    assert TRACED == ["printed"] and [p.suffix for p in calls.iterdir()] == [".refused"]
    assert programs.call_kept(_printed_logged, (x,)) is None and TRACED == ["printed"]
    _new_call_process()
    assert programs.call_kept(_printed_logged, (x,)) is None and TRACED == ["printed"]


def _checked_logged(x):
    _Log.traced.append("checked")
    y = runtime_check(x, jnp.any(x < 0), "x must be >= 0")
    return jax.vmap(lambda r: runtime_check(2 * r, r > 10, "x must be <= 10 {here}"))(y)


def test_a_program_with_runtime_checks_is_kept_and_raises_their_messages_after_it(calls):
    """The library's checks (runtime_check, eqx.error_if) are reported as values: the program is kept (loaded by a later
    process, no trace), its numbers are filter_jit's, and a failed check raises its own message,
    the first that fails, also from the loaded program."""
    x = jnp.arange(3.0)
    plain = eqx.filter_jit(_checked_logged)(x)
    TRACED.clear()
    first = programs.call_kept(_checked_logged, (x,))
    assert stored_programs(calls) == [".jaxcall"] and TRACED == ["checked"]
    _new_call_process()
    second = programs.call_kept(_checked_logged, (x,))
    assert TRACED == ["checked"]  # loaded, not traced
    np.testing.assert_array_equal(np.asarray(first), np.asarray(plain))
    np.testing.assert_array_equal(np.asarray(second), [0.0, 2.0, 4.0])
    for bad, message in (([-1.0, 11.0, 0.0], "x must be >= 0"), ([1.0, 11.0, 0.0], "x must be <= 10 {here}")):
        with pytest.raises(eqx.EquinoxRuntimeError, match=re.escape(message)):
            eqx.filter_jit(_checked_logged)(jnp.asarray(bad))
        with pytest.raises(eqx.EquinoxRuntimeError, match=re.escape(message)):
            programs.call_kept(_checked_logged, (jnp.asarray(bad),))
    assert TRACED == ["checked"]


def test_checks_reported_inside_leave_the_plain_programs_checks(calls):
    """A jitted function traced while a program's checks are reported (its own trace cached apart)
    still raises through its own check when called plainly afterwards."""
    inner = eqx.filter_jit(lambda x: runtime_check(x, jnp.any(x < 0), "inner: x must be >= 0"))
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(np.asarray(programs.call_kept(lambda v: inner(v) + 1, (x,))), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(inner(x)), [0.0, 1.0, 2.0])
    with pytest.raises(eqx.EquinoxRuntimeError, match="inner: x must be >= 0"):
        inner(-x - 1)


def _scaled_by(c):
    def scaled(x):
        _Log.traced.append(c)
        return c * x

    scaled.__module__ = "transformer_pde.experiments.example"  # named as the package's own
    return scaled


def test_a_library_closure_is_keyed_by_what_it_holds(calls):
    """A closure made by the package (an experiment's statistic capturing a sample) is another
    program when it captures another value, though its name is the same."""
    x = jnp.arange(3.0)
    two, three = _scaled_by(2.0), _scaled_by(3.0)
    np.testing.assert_array_equal(np.asarray(programs.call_kept(two, (x,))), [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(np.asarray(programs.call_kept(three, (x,))), [0.0, 3.0, 6.0])
    assert TRACED == [2.0, 3.0] and len(list(calls.glob("*.jaxcall"))) == 2
    _new_call_process()
    np.testing.assert_array_equal(np.asarray(programs.call_kept(_scaled_by(3.0), (x,))), [0.0, 3.0, 6.0])
    assert TRACED == [2.0, 3.0]  # the same key as `three`: loaded


def test_call_kept_keeps_what_it_cannot_identify_out(calls):
    """A static argument known only by its address: run by the caller, nothing written."""
    x = jnp.arange(3.0)

    class Opaque:
        pass

    assert programs.call_kept(lambda o, x: x, (Opaque(), x)) is None
    assert not calls.exists()


def test_call_kept_traces_what_filter_jit_traces():
    """call_kept splits its arguments into traced and static leaves as ``eqx.filter_jit`` does
    (without importing Equinox): the same verdict as ``eqx.is_array`` on every kind of leaf."""
    leaves = [np.float32(1.0), np.int64(2), np.ones(2), np.bool_(True), jnp.ones(2), jnp.float32(3.0),
              jax.device_put(np.ones(3)), 1.0, 2, True, "a", None, (1.0,), jax.ShapeDtypeStruct((2,), jnp.float32)]
    assert [programs._is_array(v) for v in leaves] == [eqx.is_array(v) for v in leaves]


# -- a program holding jax-finufft's NUFFT (the fast kernel: large-n) is kept too


def _nufft_modes(x, c):
    from jax_finufft import nufft1

    _Log.traced.append("nufft")
    return nufft1((8,), c, x, eps=1e-12)


def _held_calls(path) -> set:
    """The custom calls a kept program's file allows (``jax.export``'s disabled checks)."""
    payload = programs._read(path, path.stem.rsplit("-", 1)[1])
    size, _, rest = payload.partition(b"\n")
    exported = jax.export.deserialize(bytearray(rest[int(size):]))
    return {check.is_custom_call() for check in exported.disabled_safety_checks}


def test_a_program_calling_the_nufft_is_kept_and_its_calls_registered_when_loaded(calls, monkeypatch):
    pytest.importorskip("jax_finufft")
    from transformer_pde.kernels import platforms

    x = jnp.linspace(-3.0, 3.0, 11)
    c = jnp.exp(1j * jnp.arange(11.0))
    first = programs.call_kept(_nufft_modes, (x, c))
    kept = list(calls.iterdir())
    assert [p.suffix for p in kept] == [".jaxcall"] and TRACED == ["nufft"]
    assert _held_calls(kept[0]) == {"nufft1d1"}  # the calls it holds, not every one allowed
    # the type-1 sum f_k = sum_j c_j e^{i k x_j}, k = -4..3, written plainly
    xn, cn = np.asarray(x), np.asarray(c)
    direct = np.array([np.sum(cn * np.exp(1j * k * xn)) for k in range(-4, 4)])
    np.testing.assert_allclose(np.asarray(first), direct, rtol=1e-10, atol=1e-10)
    registered = []
    monkeypatch.setattr(platforms, "register_finufft_calls", lambda: registered.append(1) or True)
    _new_call_process()
    second = programs.call_kept(_nufft_modes, (x, c))
    assert TRACED == ["nufft"] and registered == [1]  # loaded, its calls registered first
    np.testing.assert_array_equal(np.asarray(second), np.asarray(first))
    # a program without them, exported in a process that imported jax-finufft, allows none
    programs.call_kept(_scaled_by(2.0), (x,))
    plain = [p for p in calls.glob("*.jaxcall") if p.name.startswith("scaled")]
    assert len(plain) == 1 and _held_calls(plain[0]) == set()


def test_a_kept_program_allowing_another_custom_call_is_not_trusted(calls, monkeypatch):
    """Only jax-finufft's calls (kernels.platforms.FINUFFT_CUSTOM_CALLS) are allowed: a file whose
    program allows another one is traced again; so is one whose jax-finufft is not installed."""
    import dataclasses

    from transformer_pde.kernels import platforms

    x = jnp.arange(3.0)
    exported = jax.export.export(jax.jit(lambda v: 2 * v))(x)
    assert programs._deserialize(exported.serialize()) is not None
    other = dataclasses.replace(exported, disabled_safety_checks=(
        jax.export.DisabledSafetyCheck.custom_call("not_finufft"),))
    assert programs._deserialize(other.serialize()) is None
    finufft = dataclasses.replace(exported, disabled_safety_checks=(
        jax.export.DisabledSafetyCheck.custom_call("nufft2d1"),))
    assert programs._deserialize(finufft.serialize()) is not None or not platforms.register_finufft_calls()
    monkeypatch.setattr(platforms, "register_finufft_calls", lambda: False)
    assert programs._deserialize(finufft.serialize()) is None


# -- a kept program's executable: a later process on this host loads it, neither lowering nor compiling

_EXECUTABLES = """
import sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from transformer_pde.runs import programs

store, host = Path(sys.argv[1]), sys.argv[2]
programs.program_dir = lambda: store  # the store without JAX's compilation cache: XLA compiles each program
if host != "this":
    programs._host = lambda: host
called = set()
for name in ("_deserialize", "_compile_kept", "_lower"):  # recorded, still made
    def record(*args, _name=name, _real=getattr(programs, name), **kwargs):
        called.add(_name)
        return _real(*args, **kwargs)
    setattr(programs, name, record)

def tripled_sine(x):
    return 3 * jnp.sin(x)

def scaled_sums(scale, x):
    return jnp.cumsum(scale * x)

x = jnp.linspace(0.0, 1.0, 5)
a = np.asarray(programs.call_kept(tripled_sine, (x,)))
b = np.asarray(programs.compile_program(scaled_sums, (2.0,), (x,))(x))
np.testing.assert_allclose(a, 3 * np.sin(np.linspace(0.0, 1.0, 5)), rtol=1e-6)
np.testing.assert_allclose(b, np.cumsum(2 * np.linspace(0.0, 1.0, 5)), rtol=1e-6)
print(a.tobytes().hex() + b.tobytes().hex())
print(",".join(sorted(called)))
print(",".join(sorted(p.suffix for p in store.iterdir())))
"""


def _executables_process(store, host="this") -> tuple[str, str, str]:
    """A fresh process computing a kept call and a compiled program (``_EXECUTABLES``): their
    outputs' bytes, which of reading a program, lowering it or compiling it it did, the store's
    files."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TRANSFORMER_PDE_"))}
    res = subprocess.run([sys.executable, "-c", _EXECUTABLES, str(store), host], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return tuple(res.stdout.split("\n")[:3])


def test_a_later_process_loads_the_executables_instead_of_the_programs(tmp_path):
    """The first process traces, keeps and compiles (a kept call's and compile_program's programs,
    each with its executable); a later one on this host loads the executables: it neither reads
    the programs nor lowers nor compiles them, and its outputs are the first's bytes."""
    out, did, files = _executables_process(tmp_path)
    assert did == "_compile_kept,_lower" and files == ".jaxcall,.jaxexe,.jaxexe,.jaxexport,.jaxlink,.jaxlink"
    assert _executables_process(tmp_path) == (out, "", files)


def test_an_executable_of_another_host_or_damaged_is_not_loaded(tmp_path):
    """Executables are kept under the host (backend, devices, processor flags): another host's
    process compiles the programs from their exports and keeps its own beside them; a damaged
    executable fails its hash and is compiled again and replaced; the outputs never change."""
    out, _, _ = _executables_process(tmp_path)
    mine = sorted(tmp_path.glob("*.jaxexe"))
    assert _executables_process(tmp_path, "another machine") == (
        out, "_compile_kept,_deserialize,_lower",
        ".jaxcall,.jaxexe,.jaxexe,.jaxexe,.jaxexe,.jaxexport,.jaxlink,.jaxlink,.jaxlink,.jaxlink")
    for exe in mine:
        data = bytearray(exe.read_bytes())
        data[-100] ^= 0xFF
        exe.write_bytes(bytes(data))
    assert _executables_process(tmp_path)[:2] == (out, "_compile_kept,_deserialize,_lower")
    assert _executables_process(tmp_path)[:2] == (out, "")  # replaced: loaded


_SERVED_BY_THE_CACHE = """
import sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from transformer_pde.runs import compile_cache, programs

cache, edited = Path(sys.argv[1]), sys.argv[2] == "edited"
compile_cache.enable_compile_cache(cache)
if edited:  # the package edited elsewhere: every program key changes, this program's module does not
    programs._source_digest = lambda: "edited"
lowered = []  # calls of _compile_kept: the program lowered (and compiled), not its executable loaded
real_compile_kept = programs._compile_kept
programs._compile_kept = lambda *a, **k: lowered.append(1) or real_compile_kept(*a, **k)

def doubled_sine(x):
    return 2 * jnp.sin(x) + jnp.arange(x.shape[0])

out = programs.call_kept(doubled_sine, (jnp.linspace(0.0, 1.0, 5),))
np.testing.assert_allclose(np.asarray(out), 2 * np.sin(np.linspace(0.0, 1.0, 5)) + np.arange(5), rtol=1e-6)
print(sorted(p.suffix for p in (cache / "programs").iterdir()), "lowered" if lowered else "loaded")
"""


def test_an_executable_served_by_jaxs_cache_is_linked_not_kept(tmp_path):
    """JAX's persistent cache loads an executable that, serialized again, lacks its kernels on a
    CPU (the copy loaded later fails: "NOT_FOUND: Function ... not found"). A process whose compile
    the cache served writes no executable: it links its program to the one an earlier compile of the
    same module kept (after an edit of the package, which changes every program's key), or to none;
    a later process loads the linked executable (fresh processes)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TRANSFORMER_PDE_"))}

    def process(edited=""):
        res = subprocess.run([sys.executable, "-c", _SERVED_BY_THE_CACHE, str(tmp_path), edited],
                             capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout.split("\n")[-2]

    kept = "['.jaxcall', '.jaxexe', '.jaxlink']"
    assert process() == f"{kept} lowered"  # XLA compiled it: kept
    assert process() == f"{kept} loaded"
    edited = "['.jaxcall', '.jaxcall', '.jaxexe', '.jaxlink', '.jaxlink']"
    assert process("edited") == f"{edited} lowered"  # a new key, JAX's cache served it: linked
    assert process("edited") == f"{edited} loaded"
    for exe in (tmp_path / "programs").glob("*.jaxexe"):
        exe.unlink()
    # lowered from the kept program, compiled by JAX's cache: nothing to link to, nothing kept
    assert process("edited") == "['.jaxcall', '.jaxcall', '.jaxlink', '.jaxlink'] lowered"
    assert process() == "['.jaxcall', '.jaxcall', '.jaxlink', '.jaxlink'] lowered"  # and runs again
