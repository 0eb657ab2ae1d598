"""A run never removes a file it did not write (issue 37 item 2): ``--out`` into a directory
holding someone else's files and no run is refused; over a run of ours, only the files that
run wrote (or its metadata lists) are removed, and only temporaries named after them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from transformer_pde.experiments import Experiment, Result
from transformer_pde.experiments._options import Options
from transformer_pde.runs import run_experiment


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
