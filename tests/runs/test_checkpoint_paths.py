"""A checkpoint directory where a file is in the way (issue 37 part 10): a ValueError naming the
file, not mkdir's bare FileExistsError."""

from __future__ import annotations

import pytest

from transformer_pde.runs import Checkpoint


def test_checkpoint_on_a_file_names_it(tmp_path):
    f = tmp_path / "ckpt"
    f.write_text("not a directory")
    with pytest.raises(ValueError, match=rf"checkpoint directory {f}: {f} is a file, not a directory"):
        Checkpoint(f, every=2)
    with pytest.raises(ValueError, match=rf"checkpoint directory {f / 'below'}: {f} is a file"):
        Checkpoint(f / "below", every=2)  # a parent in the way
    assert f.read_text() == "not a directory"


def test_checkpoint_stage_on_a_file_names_it(tmp_path):
    ckpt = Checkpoint(tmp_path / "run", every=2)
    (tmp_path / "run" / "solve").write_text("x")
    with pytest.raises(ValueError, match=r"checkpoint stage directory .*solve is a file"):
        ckpt.write_chunk("solve", 0, {}, {"run": "r"})


@pytest.mark.parametrize("directory", [None, "", 3.5])
def test_checkpoint_directory_must_be_a_path(directory):
    with pytest.raises(ValueError, match="checkpoint directory must be a non-empty path"):
        Checkpoint(directory, every=2)
