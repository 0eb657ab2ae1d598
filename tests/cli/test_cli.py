"""The command line end to end: the main job at small size, list, plot, and errors."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.cli import main


def test_list_names_the_experiments(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "clustering" in out


def test_run_clustering_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "clustering", "--out", str(out), "--n", "24", "--t1", "8", "--dt", "0.2",
                 "--num-saves", "5", "--seed", "3", "--models", "SA,USA", "--no-progress"])
    assert code == 0
    data = np.load(out / "data.npz")
    x0 = np.asarray(tp.uniform_sphere(jax.random.key(3), 24, 3))  # --seed 3 reached the start
    for model in ("SA", "USA"):
        assert data[f"xs_{model}"].shape == (5, 24, 3)
        np.testing.assert_allclose(data[f"xs_{model}"][0], x0, rtol=0, atol=1e-15)
        clusters = data[f"clusters_{model}"]
        assert clusters[0] == 24 and clusters[-1] == 1  # d = 3: one cluster
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["config"]["n"] == 24 and meta["config"]["seed"] == 3
    assert meta["config"]["models"] == ["SA", "USA"]
    assert meta["wall_time_s"] > 0 and meta["versions"]["jax"]
    assert (out / "clustering.png").stat().st_size > 10_000
    assert (out / "clustering.gif").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "figure:" in printed and "grids:" not in printed  # clustering has no grids

    # plot redraws the figures in place from the saved data
    png = (out / "clustering.png").read_bytes()
    (out / "clustering.png").unlink()
    assert main(["plot", str(out)]) == 0
    assert (out / "clustering.png").read_bytes() == png
    assert f"figure:   {out / 'clustering.png'}" in capsys.readouterr().out

    # info says what the directory holds; tp.Result loads it
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "experiment:  clustering" in info and "status:      complete" in info
    assert "n=24 " in info and "seed=3 " in info and "models=SA,USA " in info
    assert f"jax {meta['versions']['jax']}" in info and f"JAX backend {meta['jax_backend']}" in info
    assert meta["git_commit"] is None or f"git commit {meta['git_commit']}" in info
    assert "xs_SA (5, 24, 3) float64" in info and "clustering.png, clustering.gif" in info
    assert "results.nc" not in info
    res = tp.Result.load(out)
    assert list(res) == list(data.files) and not res.grids
    np.testing.assert_array_equal(res["xs_SA"], data["xs_SA"])


def test_info_of_an_unfinished_run_and_of_no_run(tmp_path, capsys):
    (tmp_path / "metadata.json").write_text(json.dumps(
        {"experiment": "clustering", "status": "failed", "config": {"n": 8}, "error": "OSError: disk full"}))
    assert main(["info", str(tmp_path)]) == 0
    info = capsys.readouterr().out
    assert "status:      failed" in info and "error:       OSError: disk full" in info
    assert f"transformer-pde run --resume {tmp_path}" in info and "n=8" in info
    with pytest.raises(SystemExit) as e:
        main(["info", str(tmp_path / "none")])
    assert e.value.code == 2 and "holds no run (metadata.json is missing" in capsys.readouterr().err


def test_run_help_shows_list_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "equiangular", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--betas FLOAT,..." in out and "(default 0.5,1.0,4.0)" in " ".join(out.split())
    # the option's docstring is its help text
    main_help = " ".join(out.split())
    assert "--rho0 FLOAT" in out and "Common initial inner product" in main_help, main_help
    # one spelling per option, in kebab case
    assert "--num-saves INT" in out and "--num_saves" not in out


def test_options_have_one_spelling(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "clustering", "--num_saves", "5"])
    assert e.value.code == 2 and "unrecognized arguments: --num_saves 5" in capsys.readouterr().err


def test_unknown_experiment_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "no-such-thing"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown experiment 'no-such-thing'" in err and "clustering" in err


def test_bad_option_value_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "clustering", "--n", "0"])
    assert e.value.code == 2
    assert "n=0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "clustering", "--beta", "hot"])
    assert "invalid float value: 'hot'" in capsys.readouterr().err


_HEAVY = ("jax", "jaxlib", "diffrax", "equinox", "optax", "ott", "matplotlib", "xarray", "h5netcdf", "scipy", "tqdm")


@pytest.mark.parametrize("argv", [["list"], ["run", "clustering", "--help"], ["run", "--help"], ["info", "{run}"]],
                         ids=["list", "run-help", "run-no-name-help", "info"])
def test_text_commands_import_no_heavy_library(argv, tmp_path):
    """list, --help and info answer at once: they print text without importing JAX, diffrax,
    matplotlib or xarray (checked in a fresh process, not timed)."""
    (tmp_path / "metadata.json").write_text(json.dumps({"experiment": "clustering", "status": "running",
                                                        "config": {"n": 8}}))
    argv = [a.replace("{run}", str(tmp_path)) for a in argv]
    code = (f"import sys\nfrom transformer_pde.cli import main\ntry:\n    main({argv!r})\n"
            f"except SystemExit:\n    pass\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {_HEAVY!r}), file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip(), res.stderr
    assert res.stderr.strip().splitlines()[-1] == "[]", res.stderr[-2000:]


def test_console_script_entry_point():
    res = subprocess.run([sys.executable, "-m", "transformer_pde.cli", "list"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "clustering" in res.stdout


def test_the_command_collects_fully_less_often_and_restores_the_thresholds(monkeypatch, capsys):
    import gc

    from transformer_pde import cli

    seen = []
    monkeypatch.setattr(cli, "_main", lambda argv: seen.append(gc.get_threshold()) or 0)
    before = gc.get_threshold()
    assert main(["list"]) == 0
    assert seen == [cli.GC_THRESHOLDS] and gc.get_threshold() == before
    monkeypatch.setattr(cli, "_main", lambda argv: 1 / 0)
    with pytest.raises(SystemExit):
        main(["list"])
    assert gc.get_threshold() == before
