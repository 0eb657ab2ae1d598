"""Every labelled grid of an experiment says what its numbers are (issue 37 item 11): each
``grid(...)`` call of ``transformer_pde/experiments`` passes ``describe=``, checked statically
(no experiment runs here), and the attributes survive ``results.nc``. That every variable and
coordinate of a tiny run's grids is described is checked on the saved runs
(``test_registry.py``, slow)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import transformer_pde.experiments as experiments
from transformer_pde.runs.result import grid, load_grids, save_grids

EXPERIMENTS = Path(experiments.__file__).parent


def grid_calls(source: str) -> list[ast.Call]:
    """The calls of the library's ``grid`` in ``source``: ``grid(...)`` (imported from
    ``runs.result``) or ``runs.grid(...)`` / ``result.grid(...)``; matplotlib's ``ax.grid`` is not one."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "grid":
            calls.append(node)
        elif isinstance(f, ast.Attribute) and f.attr == "grid" and (
                (isinstance(f.value, ast.Attribute) and f.value.attr in ("runs", "result"))
                or (isinstance(f.value, ast.Name) and f.value.id in ("runs", "result"))):
            calls.append(node)
    return calls


def undescribed(source: str) -> list[int]:
    """Line numbers of the grid calls of ``source`` without a ``describe`` keyword."""
    return [c.lineno for c in grid_calls(source) if not any(k.arg == "describe" for k in c.keywords)]


def test_the_check_finds_grid_calls_and_skips_matplotlib():
    src = ("ds = grid({'t': ts}, x=(('t',), x))\n"
           "ds2 = tp.runs.grid({'t': ts}, x=(('t',), x), describe={'t': ('time', '')})\n"
           "ax.grid(alpha=0.3)\n")
    assert [c.lineno for c in grid_calls(src)] == [1, 2]
    assert undescribed(src) == [1]


def test_every_grid_call_of_the_experiments_describes_its_numbers():
    files = sorted(EXPERIMENTS.glob("*.py"))
    counts = {f.name: len(grid_calls(f.read_text())) for f in files}
    # every module that imports grid calls it (so a call the check cannot see would show here)
    for f in files:
        text = f.read_text()
        if "import Result, grid" in text or "runs.grid(" in text:
            assert counts[f.name] > 0, f.name
    assert sum(counts.values()) >= 19  # the calls of issue 37 item 11
    missing = {f.name: lines for f in files if (lines := undescribed(f.read_text()))}
    assert not missing, f"grid(...) without describe= (file: lines): {missing}"


def literal_keys(node) -> set[str] | None:
    """The keys of a dict display of string constants (None for anything else)."""
    if not isinstance(node, ast.Dict) or not all(isinstance(k, ast.Constant) for k in node.keys):
        return None
    return {k.value for k in node.keys}


def test_describe_covers_every_variable_and_coordinate_where_the_call_spells_them_out():
    """Where the coordinates and variables are written out in the call (a dict display and
    keywords, no ``**``), ``describe`` names exactly them: grid raises on a name it does not
    hold, and an undescribed one would be saved bare."""
    checked = 0
    for f in sorted(EXPERIMENTS.glob("*.py")):
        for call in grid_calls(f.read_text()):
            coords = literal_keys(call.args[0]) if call.args else None
            describe = next((literal_keys(k.value) for k in call.keywords if k.arg == "describe"), None)
            if coords is None or describe is None or any(k.arg is None for k in call.keywords):
                continue
            held = coords | {k.arg for k in call.keywords if k.arg != "describe"}
            assert describe == held, (f.name, call.lineno, sorted(describe ^ held))
            checked += 1
    assert checked >= 15


def test_descriptions_are_written_to_results_nc_and_read_back(tmp_path):
    ds = grid({"beta": np.array([1.0, 2.0]), "t": np.array([0.0, 0.5, 1.0])},
              angle=(("beta", "t"), np.arange(6.0).reshape(2, 3)),
              describe={"beta": ("inverse temperature β", ""), "t": ("time t", ""),
                        "angle": ("angle of a token", "rad")})
    other = grid({"t": np.array([0.0, 1.0])}, x=(("t",), np.array([3.0, 4.0])),
                 describe={"t": ("time t", ""), "x": ("a number", "")})
    for grids in ({"one": ds}, {"one": ds, "two": other}):  # root-stored, and netCDF groups
        path = tmp_path / f"results{len(grids)}.nc"
        save_grids(path, grids)
        back = load_grids(path)
        assert back["one"]["angle"].attrs == {"description": "angle of a token", "units": "rad"}
        assert back["one"]["beta"].attrs == {"description": "inverse temperature β", "units": ""}
        assert back["one"]["t"].attrs == {"description": "time t", "units": ""}
        np.testing.assert_array_equal(back["one"]["angle"].values, ds["angle"].values)


def test_describe_names_only_what_the_grid_holds():
    with pytest.raises(ValueError, match="'tau'"):
        grid({"t": np.array([0.0])}, x=(("t",), np.array([1.0])), describe={"tau": ("time", "")})
