"""The command line, fuzzed (issue 25): for every experiment and every option of its Config,
generated bad text (NaN, inf, a non-number, a number beyond a normal float32 (the runs' dtype),
an empty item, a non-integer for an integer, a value just outside the declared ``Annotated``
range, an overflowing number, an unknown variant, a duplicated list item) is refused by the
option parsing, in-process: exit status 2, one line on stderr naming the option, and no run
directory made. Nothing is run: ``run_experiment`` is
replaced by a stub that fails the test if parsing ever lets a bad value through.
"""

from __future__ import annotations

import dataclasses
import typing

import annotated_types as at
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transformer_pde.runs as runs_pkg
import transformer_pde.runs.compile_cache as compile_cache
from transformer_pde import cli
from transformer_pde.experiments import REGISTRY
from transformer_pde.experiments._options import list_item_type, option_bounds

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


class RanAnyway(Exception):
    pass


def _outside(bounds) -> list[float]:
    """Values just outside each declared bound."""
    out = []
    for b in bounds:
        if isinstance(b, at.Ge):
            out.append(b.ge - 1)
        elif isinstance(b, at.Gt):
            out.append(b.gt)
        elif isinstance(b, at.Le):
            out.append(b.le + 1)
        elif isinstance(b, at.Lt):
            out.append(b.lt)
    return out


def _fmt(v, item) -> str:
    return str(int(v)) if item is int and float(v).is_integer() else repr(float(v))


def bad_texts(exp, name: str) -> list[str]:
    """Bad command-line texts for one option, from its type and its declared range."""
    typ = exp.option_types()[name]
    bounds = option_bounds(exp.config).get(name, ())
    item = list_item_type(typ)
    scalar = item if item is not None else typ
    if scalar is bool:
        return []
    choices = typing.get_args(scalar) if typing.get_origin(scalar) is typing.Literal else None
    if choices is not None:
        texts = ["XYZ", ""]
    elif scalar is int:
        big = 2**32 if "seed" in name else 2**31  # seeds lie in [0, 2**32), other integers in int32
        texts = ["nan", "inf", "2.5", "abc", "", "1e3", str(big), str(-(2**31) - 1)]
        texts += [_fmt(v, int) for v in _outside(bounds)]
    elif scalar is float:
        texts = ["nan", "inf", "-inf", "abc", "", "1e400", "0x", "1e39", "1e-40"]  # the last two: not float32
        texts += [_fmt(v, float) for v in _outside(bounds)]
    else:  # free text: no bad value of its own
        return []
    if item is not None:
        default = getattr(exp.config(), name)
        if default:
            first = str(default[0])
            texts += [f"{first},{first}", f"{first},,{first}", f"{first},nan" if choices is None else f"{first},XYZ"]
    return [t for t in texts if t is not None]


def _options():
    for exp in sorted(REGISTRY.values(), key=lambda e: e.name):
        for f in dataclasses.fields(exp.config):
            if bad_texts(exp, f.name):
                yield exp, f.name


OPTIONS = list(_options())


@pytest.fixture
def no_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise RanAnyway("option parsing let a bad value through and the experiment would run")

    monkeypatch.setattr(runs_pkg, "run_experiment", refuse)
    monkeypatch.setattr(compile_cache, "enable_compile_cache", lambda *a, **k: None)


def check_refused(exp, name: str, text: str, out, capsys) -> str:
    flag = cli.option_flag(name)
    capsys.readouterr()
    try:
        cli.main(["run", exp.name, f"{flag}={text}", "--out", str(out), "--no-progress"])
    except SystemExit as e:
        err = capsys.readouterr().err
        if "RanAnyway" in err:
            pytest.fail(f"run {exp.name} {flag}={text!r} was accepted")
        assert e.code == 2, (exp.name, flag, text, e.code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (exp.name, flag, text, err)
        assert name in lines[0] or flag in lines[0], (exp.name, flag, text, err)
        assert not out.exists(), (exp.name, flag, text, "a run directory was made")
        return lines[0]
    except RanAnyway:
        pytest.fail(f"run {exp.name} {flag}={text!r} was accepted")
    pytest.fail(f"run {exp.name} {flag}={text!r} returned")


def test_every_experiment_has_fuzzed_options():
    names = {exp.name for exp, _ in OPTIONS}
    assert names == set(REGISTRY), set(REGISTRY) - names


@pytest.mark.parametrize("exp", sorted(REGISTRY.values(), key=lambda e: e.name), ids=lambda e: e.name)
def test_bad_option_values_are_refused_before_the_run(exp, tmp_path, capsys, no_run):
    options = [name for e, name in OPTIONS if e is exp]

    @SETTINGS
    @given(data=st.data())
    def run(data):
        name = data.draw(st.sampled_from(options))
        text = data.draw(st.sampled_from(bad_texts(exp, name)))
        check_refused(exp, name, text, tmp_path / "out", capsys)

    run()
