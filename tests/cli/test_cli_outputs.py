"""Outputs that do not lie (issue 25 cause 7): an empty ``--out`` is refused, a figure of NaN
data is an error (not an empty picture with status 0), a complete run of other options is not
silently replaced, and a finished run leaves no ``.lock``."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import cli
from transformer_pde.experiments import REGISTRY, Experiment, Result
from transformer_pde.experiments._options import Options


@dataclasses.dataclass(frozen=True)
class _Config(Options):
    x: float = 1.0
    seed: int = 0


def _compute(cfg, progress):
    y = np.full(5, cfg.x)
    if cfg.seed == 1:
        y[0] = np.nan  # a value the run means to be undefined (drawn as a gap)
    return Result({"y": y, "seed": np.asarray(cfg.seed)})


def _figures(res, cfg, out):
    fig, ax = plt.subplots()
    ax.plot(np.arange(5), res["y"])
    return [tp.plot.save_figure(fig, out / "y.png")]


PLOTTER = Experiment("plotter-exp", "draws its data", _Config, _compute, _figures)


@pytest.fixture
def plotter(monkeypatch):
    monkeypatch.setitem(REGISTRY, PLOTTER.name, PLOTTER)


def test_empty_out_is_refused(plotter, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (["run", "plotter-exp", "--out", ""], ["plot", ""], ["info", " "]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        assert "expected a directory, got" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_nan_data_is_not_drawn_as_an_empty_figure(plotter, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "plotter-exp", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no .lock left
    np.savez(out / "data.npz", y=np.full(5, np.nan), seed=np.asarray(0))
    (out / "y.png").unlink()
    with pytest.raises(SystemExit) as e:
        cli.main(["plot", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "its saved data hold NaN or inf values the run did not save, in y (5 of 5)" in err
    assert not (out / "y.png").exists()


def test_plot_names_the_nonfinite_arrays(plotter, tmp_path, capsys):
    """The NaN a run saved are drawn (a gap); more NaN than the run recorded are refused naming
    the array, exit 2; a run saved without the record is refused by its figure, naming the array
    too (issue 37 part 10: a plot of NaN data drew empty figures and exited 0)."""
    import json

    out = tmp_path / "run"
    assert cli.main(["run", "plotter-exp", "--out", str(out), "--seed", "1"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["nonfinite_values"] == {"y": 1}
    assert cli.main(["plot", str(out)]) == 0  # the run's own NaN: drawn
    y = np.load(out / "data.npz")["y"]
    y[1:3] = np.inf
    np.savez(out / "data.npz", y=y, seed=np.asarray(1))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(["plot", str(out)])
    assert e.value.code == 2
    assert "values the run did not save, in y (3 of 5) (the run recorded 1 such values)" in capsys.readouterr().err
    del meta["nonfinite_values"]  # a run saved before the record: its figures decide
    (out / "metadata.json").write_text(json.dumps(meta))
    np.savez(out / "data.npz", y=np.full(5, np.nan), seed=np.asarray(1))
    with pytest.raises(SystemExit) as e:
        cli.main(["plot", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "its saved data hold NaN or inf in y (5 of 5)" in err and "every series it draws" in err


def test_a_figure_with_some_finite_data_is_drawn(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [np.nan, 1.0, np.inf])
    assert tp.plot.save_figure(fig, tmp_path / "f.png").exists()
    fig, ax = plt.subplots()
    ax.scatter([np.nan], [np.nan])
    ax.imshow(np.full((2, 2), np.nan))
    with pytest.raises(ValueError, match="every series it draws is NaN or inf"):
        tp.plot.save_figure(fig, tmp_path / "g.png")


def test_plain_log_labels_keep_the_ticks_and_drop_the_mathtext():
    """The same major and minor ticks as matplotlib's default log axis, labelled by their values
    (1, 10, 100 and 0.1 as 1e-01), with no mathtext."""
    def labelled(plain):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [0.5, 4.0, 120.0])
        ax.set_yscale("log")
        if plain:
            tp.plot.plain_log_labels(ax.yaxis)
        fig.canvas.draw()
        out = [(t.get_loc(), t.label1.get_text()) for t in ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()]
        plt.close(fig)
        return out

    default, plain = labelled(False), labelled(True)
    assert [loc for loc, _ in plain] == [loc for loc, _ in default]
    assert [bool(text) for _, text in plain] == [bool(text) for _, text in default]  # the same ticks labelled
    assert all("$" in text for _, text in default if text) and not any("$" in text for _, text in plain)
    for loc, text in plain:
        if text:
            assert float(text.replace("\u2212", "-")) == pytest.approx(loc)
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match=r"plain_log_labels: axis must be a matplotlib Axis .*, got Axes"):
        tp.plot.plain_log_labels(ax)  # the axes, not one of its axes
    with pytest.raises(ValueError, match=r"axis must be a matplotlib Axis .*, got str 'y'"):
        tp.plot.plain_log_labels("y")
    plt.close(fig)


def test_a_complete_run_of_other_options_is_refused_naming_them(plotter, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "plotter-exp", "--out", str(out), "--x", "2"]) == 0
    assert cli.main(["run", "plotter-exp", "--out", str(out), "--x", "2"]) == 0  # same options: rerun
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "plotter-exp", "--out", str(out), "--x", "3", "--seed", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "x=2.0 there, 3.0 here" in err and "seed=0 there, 1 here" in err and "--replace" in err
    assert float(np.load(out / "data.npz")["y"][0]) == 2.0  # untouched
    assert cli.main(["run", "plotter-exp", "--out", str(out), "--x", "3", "--replace"]) == 0
    assert float(np.load(out / "data.npz")["y"][0]) == 3.0
    assert not (out / ".lock").exists()
