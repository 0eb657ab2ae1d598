"""Every registered experiment, parametrized over the registry (a new experiment is tested
without edits): its tiny run writes data, grids, metadata and figures, and
``transformer-pde plot`` redraws the same figures from the saved result alone. The typed
options (lists, variants) are checked here too, on the command line and in TOML.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import numpy as np
import pytest
from _runs import tiny_run
from annotated_types import Ge, Gt, Interval, MultipleOf

from transformer_pde import cli
from transformer_pde.experiments import REGISTRY, Experiment, Result, get
from transformer_pde.experiments._base import config_to_toml, load_toml
from transformer_pde.experiments._options import (
    COMMON_HELP,
    Options,
    option_bounds,
    option_docs,
)
from transformer_pde.runs import run_info


def _no_compute(*args, **kwargs):
    raise AssertionError("plot must not recompute")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_tiny_run_draws_and_plot_redraws_from_saved_data(name, tmp_path_factory, tmp_path, monkeypatch):
    result, cfg, run_dir = tiny_run(name, tmp_path_factory)
    exp = get(name)
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["experiment"] == name
    assert meta["resumable"] is exp.resumable
    assert exp.config_from_mapping(meta["config"]) == cfg == exp.make_config(**exp.tiny)
    assert load_toml(run_dir / "config.toml") == {"experiment": name, **json.loads(
        (run_dir / "config.json").read_text())}
    figures = [Path(f) for f in meta["figures"]]
    assert figures, "an experiment draws at least one figure"
    for f in figures:
        assert f.parent == run_dir and f.stat().st_size > 1000, f

    # the saved result: every array of data.npz, and the labelled grids of results.nc
    with np.load(run_dir / "data.npz") as data:
        assert list(data.files) == list(result)
    assert isinstance(result, Result)
    assert (run_dir / "results.nc").exists() == bool(result.grids) == ("grids" in meta)
    for gname, ds in result.grids.items():
        assert ds.sizes and all(ds[v].size for v in ds.data_vars), gname
        for dim in ds.dims:  # every swept axis is named and, where it has values, labelled
            if dim in ds.coords:
                assert ds[dim].size == ds.sizes[dim]
        for v in ds.variables:  # and says what its numbers are (grid's describe=), as saved
            assert ds[v].attrs.get("description") and isinstance(ds[v].attrs.get("units"), str), (gname, v)
    info = run_info(run_dir)  # transformer-pde info names the grids and how to open them
    assert all(repr(g) in info for g in result.grids)
    assert ("group=NAME" in info) == (len(result.grids) > 1)
    if result.grids:  # opened without a group, results.nc is the one grid, or lists the groups
        import xarray as xr

        with xr.open_dataset(run_dir / "results.nc", engine="h5netcdf") as root:
            if len(result.grids) == 1:
                (only,) = result.grids.values()
                assert root.attrs["grid"] == meta["grid_names"][0] and set(root.data_vars) == set(only.data_vars)
            else:
                assert list(root["grids"].values) == list(result.grids) == meta["grid_names"]
                assert "group=NAME" in root.attrs["description"]

    # redraw from disk into another directory, with compute disabled: the same files, byte for byte
    monkeypatch.setitem(REGISTRY, name, dataclasses.replace(exp, compute=_no_compute))
    assert cli.main(["plot", str(run_dir), "--out", str(tmp_path)]) == 0
    redrawn = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".png", ".gif"))
    assert redrawn == sorted(f.name for f in figures)
    for f in figures:
        if f.suffix == ".png":
            assert (tmp_path / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.slow
def test_grids_hold_the_saved_arrays(tmp_path_factory):
    """results.nc is a labelled view of the same numbers as data.npz (sweep-phase: d × beta × seed × t)."""
    import xarray as xr

    result, cfg, run_dir = tiny_run("sweep-phase", tmp_path_factory)
    ds = xr.open_dataset(run_dir / "results.nc", engine="h5netcdf")  # the run's one grid, "sweep"
    try:
        assert ds["clusters"].dims == ("d", "beta", "seed", "t")
        np.testing.assert_array_equal(ds["clusters"].values, result["clusters"])
        np.testing.assert_array_equal(ds["d"].values, list(cfg.dims))
        np.testing.assert_array_equal(ds["beta"].values, result["betas"])
        d3 = ds["t_one"].sel(d=3).values
        np.testing.assert_array_equal(d3, result["t_one"][list(cfg.dims).index(3)])
    finally:
        ds.close()


def test_plot_refuses_what_is_not_a_complete_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plot", str(tmp_path / "nothing")])
    assert e.value.code == 2 and "metadata.json is missing" in capsys.readouterr().err
    (tmp_path / "metadata.json").write_text(json.dumps({"experiment": "clustering", "status": "running",
                                                        "config": {}}))
    with pytest.raises(SystemExit):
        cli.main(["plot", str(tmp_path)])
    assert "is not complete (status 'running')" in capsys.readouterr().err


# --- what an experiment declares --------------------------------------------------------------

@pytest.mark.package_errors
def test_resumability_is_declared():
    assert get("clustering").resumable is True
    assert not any(e.resumable for n, e in REGISTRY.items() if n != "clustering")
    exp = get("clustering")
    with pytest.raises(ValueError, match="resumable must be True or False"):
        dataclasses.replace(exp, resumable="yes")

    @dataclasses.dataclass(frozen=True)
    class Plain:
        n: int = 1

    with pytest.raises(ValueError, match="deriving from Options"):
        Experiment("x", "x", Plain, exp.compute, exp.figures)
    with pytest.raises(ValueError, match="tiny overrides"):
        dataclasses.replace(exp, tiny={"nope": 1})


def test_compute_must_return_a_result(tmp_path):
    from transformer_pde.runs import FailedRun, run_experiment

    exp = dataclasses.replace(get("kde-modes"), compute=lambda cfg, progress: {"a": np.zeros(2)})
    with pytest.raises(FailedRun) as failed:  # the run had started: a failed run, by type
        run_experiment(exp, exp.make_config(), tmp_path, progress=False)
    assert failed.value.run_dir == tmp_path and isinstance(failed.value.cause, ValueError)
    assert "compute must return a Result, got dict" in str(failed.value.cause)
    assert json.loads((tmp_path / "metadata.json").read_text())["status"] == "failed"


def test_result_rejects_object_arrays_and_round_trips_without_grids(tmp_path):
    with pytest.raises(ValueError, match="not a numeric array"):
        Result({"bad": np.array([{}, 1], dtype=object)})
    with pytest.raises(ValueError, match="must be an xarray.Dataset"):
        Result({"a": np.zeros(1)}, {"g": np.zeros(1)})
    r = Result({"a": np.arange(3), "s": np.asarray(["x", "yz"]), "z": 1.5})
    (tmp_path / "results.nc").write_bytes(b"stale")
    r.save(tmp_path)
    assert (tmp_path / "results.nc").read_bytes() == b"stale"  # save did not write it: not removed (issue 37)
    with pytest.raises(ValueError, match=r"results.nc is unreadable"):  # no metadata says it is not the result
        Result.load(tmp_path)
    (tmp_path / "results.nc").unlink()
    back = Result.load(tmp_path)
    assert list(back) == ["a", "s", "z"] and back.grids == {}
    np.testing.assert_array_equal(back["s"], ["x", "yz"])
    assert back["z"].shape == () and float(back["z"]) == 1.5


# --- typed options ---------------------------------------------------------------------------

def _parse(name, *argv):
    return vars(cli._option_parser(get(name)).parse_args(list(argv)))


def test_list_options_parse_once_on_the_command_line(capsys):
    opts = _parse("equiangular", "--betas", "0.5,1,4", "--n", "6")
    assert opts["betas"] == (0.5, 1.0, 4.0) and opts["n"] == 6
    assert _parse("perceptron", "--ns", "24, 72")["ns"] == (24, 72)
    assert _parse("clustering", "--models", "USA")["models"] == ("USA",)
    cases = [
        ("equiangular", ["--betas", "1,x"], r"option betas: item 1 \('x'\) must be a number, got 'x'"),
        ("equiangular", ["--betas", "1,nan"], r"option betas: item 1 \(nan\) must not be NaN"),
        ("equiangular", ["--betas", "1,inf"], r"option betas: item 1 \(inf\) must be finite"),
        ("equiangular", ["--betas", "1,,2"], r"option betas must be a comma-separated list of float"),
        ("perceptron", ["--ns", "24,7.5"], r"option ns: item 1 \('7.5'\) must be an integer"),
        ("clustering", ["--models", "SA,XYZ"],
         r"option models must be a comma-separated subset of \(SA, USA\), got 'SA,XYZ': 'XYZ' is not one"),
        ("phase-diagram", ["--scheme", "rk4"], r"option scheme must be one of post-ln, projected, got 'rk4'"),
    ]
    import re

    for name, argv, pattern in cases:
        with pytest.raises(SystemExit) as e:
            _parse(name, *argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert re.search(pattern, err), (argv, err)


def test_list_options_are_toml_arrays_both_ways(tmp_path):
    exp = get("kde-modes")
    path = tmp_path / "c.toml"
    path.write_text('experiment = "kde-modes"\nbetas = [300, 1e3, 3000.5]\nbetas_dynamics = [100]\n')
    cfg = exp.config_from_mapping(load_toml(path))
    assert cfg.betas == (300.0, 1000.0, 3000.5) and all(type(b) is float for b in cfg.betas)
    assert cfg.betas_dynamics == (100.0,)
    text = config_to_toml(exp, cfg)
    assert "betas = [300.0, 1000.0, 3000.5]" in text and "betas_dynamics = [100.0]" in text
    path.write_text(text)
    assert exp.config_from_mapping(load_toml(path)) == cfg
    for bad, pattern in [('betas = "300,1000"', r"option betas must be a list of float"),
                         ("betas = []", "at least one value"),
                         ("betas = [300, nan]", r"item 1 \(nan\) must not be NaN"),
                         ("betas = [300, true]", r"item 1 \(True\) must be a number"),
                         ("betas = [300, 1]", r"need betas > 1; got betas=300.0,1.0")]:
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match=pattern):
            exp.config_from_mapping(load_toml(path))


@pytest.mark.package_errors
def test_configs_check_their_types_when_built_in_python():
    from transformer_pde.experiments.clustering import ClusteringConfig
    from transformer_pde.experiments.stability import StabilityConfig

    assert issubclass(ClusteringConfig, Options)
    assert ClusteringConfig(models=["USA"]).models == ("USA",)  # lists become tuples
    assert StabilityConfig(radius=2).radius == 2.0 and type(StabilityConfig(radius=2).radius) is float
    with pytest.raises(ValueError, match=r"option models: item 0 \('XYZ'\) must be one of SA, USA"):
        ClusteringConfig(models=("XYZ",))
    with pytest.raises(ValueError, match="option n must be an integer, got 2.5"):
        ClusteringConfig(n=2.5)
    with pytest.raises(ValueError, match=r"need deltas > 0.*got .*deltas=0.1,-1.0"):
        StabilityConfig(deltas=(0.1, -1.0))


def test_ranges_are_declared_with_the_options_and_checked_together():
    """A field's range lives in its annotation, in annotated-types' vocabulary
    (``Annotated[int, Ge(2)]``): every failing option is named with its value, list items
    included, and ``--help`` shows the range."""
    @dataclasses.dataclass(frozen=True)
    class Cfg(Options):
        n: Annotated[int, Ge(2)] = 4
        """Tokens."""
        t1: Annotated[float, Gt(0)] = 1.0
        ratios: Annotated[tuple[float, ...], Interval(gt=0, le=1)] = (0.5,)
        seed: int = 0

    assert option_bounds(Cfg) == {"n": (Ge(2),), "t1": (Gt(0),), "ratios": tuple(Interval(gt=0, le=1))}
    docs = option_docs(Cfg)  # the docstring under a field, else the shared help of common options
    assert docs["n"] == "Tokens." and docs["seed"] == COMMON_HELP["seed"] and "ratios" not in docs
    assert Cfg(n=2, t1=1e-9, ratios=(1.0, 1e-9)).n == 2  # the bounds themselves: >= and (0, 1]
    with pytest.raises(ValueError, match=r"^need n >= 2, t1 > 0; got n=1, t1=0.0$"):
        Cfg(n=1, t1=0.0)
    with pytest.raises(ValueError, match=r"need ratios in \(0, 1\]; got ratios=0.5,0.0"):
        Cfg(ratios=(0.5, 0.0))
    with pytest.raises(ValueError, match=r"ratios in \(0, 1\]"):
        Cfg(ratios=(1.5,))

    @dataclasses.dataclass(frozen=True)
    class Unsupported(Options):
        n: Annotated[int, MultipleOf(2)] = 4

    with pytest.raises(TypeError, match=r"option ranges are Ge, Gt, Le, Lt or Interval, got MultipleOf"):
        Unsupported()  # a constraint the options would not check is refused, never ignored


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_option_has_help(name):
    """``run NAME --help`` explains every option: its docstring, or the shared help of a common one."""
    exp = get(name)
    docs = option_docs(exp.config)
    assert not [f.name for f in dataclasses.fields(exp.config) if not docs.get(f.name)]


def test_end_modules_import_while_compiling_and_failures_are_left_to_the_main_thread():
    """import_end_modules_meanwhile imports the end-of-run modules in a thread while the main
    thread compiles (the program computes); one that fails to import there is not left in
    sys.modules, so the main thread's own import raises its error (fresh process)."""
    import subprocess
    import sys

    code = "\n".join([
        "import sys, threading, jax, jax.numpy as jnp",
        "from transformer_pde.experiments import _common",
        "_common.END_MODULES = ('colorsys', 'no_such_module_here')",
        "_common.import_end_modules_meanwhile()",
        "program = jax.jit(lambda x: 2 * x).trace(jnp.ones(3)).lower().compile()",
        "print(program(jnp.arange(3.0)).tolist())",
        "[t.join(60) for t in threading.enumerate() if t.name == 'transformer-pde-end-imports']",
        "print('colorsys' in sys.modules, 'no_such_module_here' in sys.modules)",
        "import no_such_module_here",
    ])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.split("\n")[:2] == ["[0.0, 2.0, 4.0]", "True False"], res.stderr[-2000:]
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in res.stderr


def test_one_lookup_imports_one_entry_and_listing_imports_all():
    """A run of one experiment imports its entry only (configs/<name>.py); a name whose entry is
    another module's (convergence-moving, in configs/convergence.py) and any listing import all."""
    import subprocess
    import sys

    code = ("import sys, pkgutil; import transformer_pde.experiments as ex, transformer_pde.experiments.configs as c\n"
            "loaded = lambda: sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith(c.__name__ + '.'))\n"
            "print(loaded()); print(ex.get('kde-modes').name, loaded())\n"
            "print('convergence-moving' in ex.REGISTRY, len(loaded()) == len(list(pkgutil.iter_modules(c.__path__))))\n"
            "print('nope' in ex.REGISTRY, len(ex.REGISTRY))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.splitlines() == ["[]", "kde-modes ['kde_modes']", "True True", f"False {len(REGISTRY)}"]


def test_register_refuses_a_taken_name():
    with pytest.raises(ValueError, match="experiment 'krause' is registered twice"):
        from transformer_pde.experiments import register

        register(get("krause"))
