"""A run never removes a file it did not write (issue 37 item 2): ``--out`` into a directory
holding someone else's files and no run is refused; over a run of ours, only the files that
run wrote (or its metadata lists) are removed, and only temporaries named after them."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from transformer_pde.experiments import Experiment, Result
from transformer_pde.experiments._options import Options
from transformer_pde.runs import run_experiment, run_info


@dataclasses.dataclass(frozen=True)
class _Config(Options):
    x: float = 1.0


def _compute(cfg, progress, checkpoint=None):
    if checkpoint is not None:
        checkpoint.write_chunk("stage", 0, {"state": np.zeros(2), "num_steps": np.asarray(1)}, {"run": "r"})
    return Result({"x": np.full(3, cfg.x)})


def _figures(result, cfg, out):
    (out / "figure.txt").write_text(str(result["x"][0]))
    return [out / "figure.txt"]


PLAIN = Experiment("dir-test", "directory rules", _Config, _compute, _figures)
RESUMABLE = Experiment("dir-test-r", "directory rules, resumable", _Config, _compute, _figures, resumable=True)


def _user_files(out):
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "model.bin").write_bytes(b"weights")
    (out / ".draft.tmp").write_text("draft")
    (out / "notes.txt").write_text("notes")


@pytest.mark.parametrize("content", ["checkpoints/model.bin", ".draft.tmp"])
def test_a_directory_holding_no_run_and_other_files_is_refused_and_left_as_it_was(tmp_path, content):
    out = tmp_path / "P"
    (out / content).parent.mkdir(parents=True, exist_ok=True)
    (out / content).write_bytes(b"the user's")
    with pytest.raises(ValueError, match=r"output directory \(--out\) .* is not empty and holds no run "
                                         r"\(metadata.json is missing; it holds (checkpoints|\.draft\.tmp)\)"):
        run_experiment(RESUMABLE, _Config(), out, progress=False)
    assert (out / content).read_bytes() == b"the user's"
    assert sorted(p.name for p in out.iterdir()) == [content.split("/")[0]]


def test_an_empty_directory_and_one_left_by_a_kill_before_the_metadata_are_used(tmp_path):
    out = tmp_path / "P"
    out.mkdir()
    (out / ".metadata.json.abcd1234.tmp").write_text("{")  # a run killed writing its first file
    run_experiment(PLAIN, _Config(), out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "config.toml", "data.npz", "figure.txt",
                                                     "metadata.json"]


@pytest.mark.parametrize("exp", [PLAIN, RESUMABLE], ids=["plain", "resumable"])
def test_replacing_a_run_removes_only_what_that_run_wrote(tmp_path, exp):
    out = tmp_path / "P"
    run_experiment(exp, _Config(), out, progress=False)
    _user_files(out)
    (out / "checkpoints" / "stage").mkdir()
    (out / "checkpoints" / "stage" / "chunk_000000.npz").write_bytes(b"ours by name")
    (out / "checkpoints" / "stage" / "mine.npz").write_bytes(b"the user's")
    (out / ".data.npz.abcd1234.tmp").write_bytes(b"a temporary of ours")
    (out / ".figure.txt.abcd1234.tmp").write_bytes(b"a temporary of a listed figure")
    run_experiment(exp, _Config(x=2.0), out, progress=False, replace=True)
    assert np.load(out / "data.npz")["x"].tolist() == [2.0] * 3
    assert json.loads((out / "metadata.json").read_text())["config"] == {"x": 2.0}
    assert (out / "checkpoints" / "model.bin").read_bytes() == b"weights"
    assert (out / "checkpoints" / "stage" / "mine.npz").read_bytes() == b"the user's"
    assert not (out / "checkpoints" / "stage" / "chunk_000000.npz").exists()
    assert (out / ".draft.tmp").read_text() == "draft" and (out / "notes.txt").read_text() == "notes"
    assert not (out / ".data.npz.abcd1234.tmp").exists() and not (out / ".figure.txt.abcd1234.tmp").exists()


def test_a_complete_run_leaves_no_checkpoint_directory_of_its_own(tmp_path):
    out = tmp_path / "P"
    run_experiment(RESUMABLE, _Config(), out, progress=False)
    assert not (out / "checkpoints").exists()


# --- readers do not trust the files (issue 37 item 3) -------------------------------------------


def _grids_compute(cfg, progress):
    from transformer_pde.runs import grid

    return Result({"x": np.full(3, cfg.x)}, {"g": grid({"i": np.arange(3)}, x=(("i",), np.full(3, cfg.x)))})


GRIDDED = Experiment("dir-test-g", "directory rules, grids", _Config, _grids_compute, lambda r, c, o: [])


def _edit_metadata(out, **changes):
    meta = json.loads((out / "metadata.json").read_text())
    (out / "metadata.json").write_text(json.dumps({**meta, **changes}))


@pytest.mark.parametrize("status", ["failed", "running", "interrupted"])
def test_result_load_refuses_a_run_that_is_not_complete(tmp_path, status):
    out = tmp_path / "P"
    run_experiment(PLAIN, _Config(), out, progress=False)
    _edit_metadata(out, status=status)
    with pytest.raises(ValueError, match=rf"the run in .* is not complete \(status '{status}'\): its files are not "
                                         rf"its result; finish it with transformer-pde run --resume"):
        Result.load(out)


@pytest.mark.parametrize("damage, file, match", [
    ("garbage", "data.npz", r"data.npz is unreadable \(ValueError: not an archive of arrays"),
    ("folder", "data.npz", r"data.npz is not a file"),
    ("garbage", "results.nc", r"results.nc is unreadable \("),
    ("folder", "results.nc", r"results.nc is not a file"),
    ("absent", "results.nc", r"results.nc is missing"),
])
def test_result_load_names_a_damaged_file(tmp_path, damage, file, match):
    out = tmp_path / "P"
    run_experiment(GRIDDED, _Config(), out, progress=False)
    (out / file).unlink()
    if damage == "garbage":
        (out / file).write_bytes(b"\x89HDF\r\n\x1a\n not really")
    elif damage == "folder":
        (out / file).mkdir()
    with pytest.raises(ValueError, match=match):
        Result.load(out)


def test_result_load_reads_grids_only_where_the_metadata_lists_them(tmp_path):
    out = tmp_path / "P"
    run_experiment(GRIDDED, _Config(x=3.0), out, progress=False)
    grids = (out / "results.nc").read_bytes()
    run_experiment(PLAIN, _Config(), out, progress=False, replace=True)
    (out / "results.nc").write_bytes(grids)  # someone else's file: not this run's result
    assert Result.load(out).grids == {}
    assert "not listed in the metadata" in run_info(out)


@pytest.mark.parametrize("changes, match", [
    ({"versions": ["jax", "0.4"]}, r"provenance:  versions unreadable \(a list, not a table\)"),
    ({"devices": "cpu:0", "jax_backend": "cpu"}, r"devices cpu:0"),
    ({"figures": "figure.txt"}, r"outputs:"),
])
def test_info_reads_metadata_of_unexpected_types(tmp_path, changes, match):
    out = tmp_path / "P"
    run_experiment(PLAIN, _Config(), out, progress=False)
    _edit_metadata(out, **changes)
    assert re.search(match, run_info(out))


def test_info_and_load_refuse_deeply_nested_metadata(tmp_path):
    out = tmp_path / "P"
    run_experiment(PLAIN, _Config(), out, progress=False)
    meta = (out / "metadata.json").read_text()
    for depth in (40, 100_000):  # one json reads, one it cannot (RecursionError before)
        (out / "metadata.json").write_text(meta[:-2] + ', "deep": ' + "[" * depth + "]" * depth + "}\n")
        with pytest.raises(ValueError, match=r"metadata.json is unreadable \(ValueError: nested more than 16 "
                                             r"levels deep\)|metadata.json is unreadable \(RecursionError"):
            run_info(out)
        with pytest.raises(ValueError, match=r"metadata.json is unreadable"):
            Result.load(out)


@pytest.mark.parametrize("damage, line", [
    ("data-folder", r"data.npz    unreadable \(not a file\)"),
    ("data-absent", r"data.npz    missing, though the run is complete"),
    ("grids-garbage", r"results.nc  unreadable \(not a netCDF-4/HDF5 file\)"),
    ("grids-folder", r"results.nc  unreadable \(not a file\)"),
    ("grids-absent", r"results.nc  missing, though the metadata lists grids"),
])
def test_info_looks_at_the_outputs(tmp_path, damage, line):
    out = tmp_path / "P"
    run_experiment(GRIDDED, _Config(), out, progress=False)
    file = out / ("data.npz" if damage.startswith("data") else "results.nc")
    file.unlink()
    if damage.endswith("folder"):
        file.mkdir()
    elif damage.endswith("garbage"):
        file.write_bytes(b"not hdf5")
    assert re.search(line, run_info(out))


@pytest.mark.package_errors
@pytest.mark.parametrize("args, match", [
    (dict(exp=object(), config=_Config()), r"run_experiment: exp must be an experiment"),
    (dict(exp=PLAIN, config={"x": 1.0}), r"run_experiment: config must be the options of 'dir-test', a _Config"),
    (dict(exp=PLAIN, config=_Config(), progress="no"), r"run_experiment: progress must be True or False"),
])
def test_run_experiment_checks_its_arguments_before_making_the_directory(tmp_path, args, match):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=match):
        run_experiment(out_dir=out, **{"progress": False, **args})
    assert not out.exists()


# --- the same command again; labelled grids (issue 37 item 11) ----------------------------------


def test_the_same_run_again_over_a_complete_one_computes_nothing_unless_replace(tmp_path, capsys):
    out = tmp_path / "P"
    calls = []
    exp = dataclasses.replace(PLAIN, compute=lambda cfg, progress: calls.append(cfg) or _compute(cfg, progress))
    run_experiment(exp, _Config(), out, progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = run_experiment(exp, _Config(), out, progress=False)
    assert len(calls) == 1 and again["already_complete"] and again["results"]["x"].tolist() == [1.0] * 3
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing written
    assert "already holds a complete run of these options: nothing computed (pass --replace" in capsys.readouterr().err
    replaced = run_experiment(exp, _Config(), out, progress=False, replace=True)
    assert len(calls) == 2 and "already_complete" not in replaced


def test_a_damaged_complete_run_of_the_same_options_is_refused_not_returned(tmp_path):
    out = tmp_path / "P"
    run_experiment(PLAIN, _Config(), out, progress=False)
    (out / "data.npz").write_bytes(b"damaged")
    with pytest.raises(ValueError, match=r"holds a complete run of these options whose result is damaged .*"
                                         r"pass --replace to compute it again"):
        run_experiment(PLAIN, _Config(), out, progress=False)


def test_grid_variables_carry_a_description_and_units_into_the_netcdf_file(tmp_path):
    from transformer_pde.runs import grid

    ds = grid({"t": np.arange(3.0)}, describe={"x": ("P(clustered pair)", ""), "t": ("time", "layers x h")},
              x=(("t",), np.ones(3)))
    Result({"x": np.ones(3)}, {"g": ds}).save(tmp_path)
    back = Result.load(tmp_path).grids["g"]
    assert back["x"].attrs == {"description": "P(clustered pair)", "units": ""}
    assert back["t"].attrs == {"description": "time", "units": "layers x h"}
    with pytest.raises(ValueError, match=r"grid: describe names 'y', which is neither a variable nor a coordinate"):
        grid({"t": np.arange(3.0)}, describe={"y": ("", "")}, x=(("t",), np.ones(3)))


@pytest.mark.package_errors
def test_grid_names_a_description_that_is_not_a_pair():
    from transformer_pde.runs import grid

    with pytest.raises(ValueError, match=r"grid: describe\['x'\] must be \(description, units\)"):
        grid({"t": np.arange(3.0)}, describe={"x": "time"}, x=(("t",), np.ones(3)))
