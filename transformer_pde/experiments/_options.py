"""Typed experiment options: what a config field may be, how a value is checked, and the
range checks the configs share.

A config is a frozen dataclass whose fields are the options. A field is one of

* ``bool``, ``int``, ``float``, ``str``;
* ``Literal["a", "b"]``: a string chosen among variants;
* ``tuple[int, ...]``, ``tuple[float, ...]``, ``tuple[Literal[...], ...]``: a list.

Values arrive in two forms and are checked in one place (:func:`coerce_option`): native
values (Python defaults, TOML arrays such as ``betas = [0.5, 1, 4]``, JSON lists of a saved
run) and command-line text, parsed once by :func:`parse_option_text` (``--betas 0.5,1,4``).
Errors name the option and, for a list, the bad item. Floats (options and list items)
must be finite: NaN and inf are refused wherever they come from.

Configs derive from :class:`Options`: constructing one checks every field against its type
(so a config built in Python is checked like one from the command line), then runs its
``validate()``, which keeps the checks that depend on the experiment; the shapes they share
("at least", "above", "in a range") are the helpers at the bottom.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal

# ----------------------------------------------------------------------------- field types


def _literal_choices(typ) -> tuple | None:
    return typing.get_args(typ) if typing.get_origin(typ) is Literal else None


def list_item_type(typ):
    """The item type of a ``tuple[X, ...]`` option, None for a scalar option."""
    if typing.get_origin(typ) is tuple:
        args = typing.get_args(typ)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"list options are typed tuple[X, ...], got {typ}")
        return args[0]
    return None


def type_name(typ) -> str:
    """A short name for help texts and errors: 'float', 'SA|USA', 'float,...'."""
    item = list_item_type(typ)
    if item is not None:
        return f"{type_name(item)},..."
    choices = _literal_choices(typ)
    if choices is not None:
        return "|".join(choices)
    return getattr(typ, "__name__", str(typ))


def format_value(value) -> str:
    """A value as it is written on the command line (lists comma-separated)."""
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ----------------------------------------------------------------------------- checking values


def _coerce_scalar(where: str, typ, value):
    """One scalar (or one list item) against its type; ints are accepted for floats."""
    choices = _literal_choices(typ)
    if choices is not None:
        if value not in choices or not isinstance(value, str):
            raise ValueError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
        return value
    if typ is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value  # its range: coerce_option
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        try:
            out = float(value)
        except OverflowError:  # an int beyond the float range
            raise ValueError(f"{where} must be a finite number, got {value!r}") from None
        if math.isnan(out):
            raise ValueError(f"{where} must not be NaN")
        if math.isinf(out):
            raise ValueError(f"{where} must be finite, got {value!r}")
        return out
    if typ is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported option type {typ!r}")


def coerce_option(exp_name: str | None, key: str, typ, value):
    """Check one native option value against its field type; returns the typed value.

    Lists must arrive as lists or tuples (a TOML array); comma-separated text is the
    command line's form, parsed by :func:`parse_option_text` before it gets here.
    """
    where = f"experiment '{exp_name}': option {key}" if exp_name else f"option {key}"
    item_type = list_item_type(typ)
    if item_type is None:
        out = _coerce_scalar(where, typ, value)
        if key == "seed" and not 0 <= out < 2**32:
            raise ValueError(f"{where} must be an integer in [0, 2**32), got {out}")
        if typ is int and key != "seed":
            _check_int_range(where, out)
        return out
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{where} must be a list of {type_name(item_type)} (a TOML array such as "
                         f"{key} = [...], or {key} = a,b,... on the command line), got {value!r}")
    if not value:
        raise ValueError(f"{where} must list at least one value, got an empty list")
    items = tuple(_coerce_scalar(f"{where}: item {i} ({v!r})", item_type, v)
                  for i, v in enumerate(value))
    if item_type is int:
        for i, v in enumerate(items):
            _check_int_range(f"{where}: item {i} ({v!r})", v)
    return items


INT_LIMIT = 2**31
"""Integer options (counts, sizes, steps; seeds apart) lie in [-2**31, 2**31): JAX counts in
int32, and a larger count could not be allocated or stepped through anyway."""


def _check_int_range(where: str, value: int) -> None:
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError(f"{where} must lie in [-2**31, 2**31), got {value}")


def parse_option_text(exp_name: str, key: str, typ, text: str):
    """Command-line text -> a typed value (``"0.5,1,4"`` -> ``(0.5, 1.0, 4.0)``).

    Raises ValueError naming the option and, for lists, the item that does not parse.
    """
    where = f"option {key}"
    item_type = list_item_type(typ)
    if item_type is None:
        return coerce_option(exp_name, key, typ, _parse_scalar(where, typ, text))
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(s == "" for s in items):
        raise ValueError(f"{where} must be a comma-separated list of {type_name(item_type)}, got "
                         f"{text!r}")
    choices = _literal_choices(item_type)
    if choices is not None:
        bad = [s for s in items if s not in choices]
        if bad:
            raise ValueError(f"{where} must be a comma-separated subset of ({', '.join(choices)}), "
                             f"got {text!r}: {', '.join(map(repr, bad))} is not one of them")
    values = [_parse_scalar(f"{where}: item {i} ({s!r})", item_type, s) for i, s in enumerate(items)]
    return coerce_option(exp_name, key, typ, values)


def _parse_scalar(where: str, typ, text: str):
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{where} must be an integer, got {text!r}") from None
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{where} must be a number, got {text!r}") from None
    return text  # str and Literal: checked by coerce_option


# ----------------------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of the experiment configs (frozen dataclasses whose fields are the options).

    On construction every field is checked against its annotation (:func:`coerce_option`;
    ints become floats for float fields, lists become tuples), then :meth:`validate` runs.
    """

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, coerce_option(None, f.name, hints[f.name],
                                                           getattr(self, f.name)))
        self.validate()

    def validate(self) -> None:
        """The experiment's own checks (ranges, consistency between options)."""


# ----------------------------------------------------------------------------- shared range checks


def _values(cfg, name) -> tuple:
    v = getattr(cfg, name)
    return v if isinstance(v, tuple) else (v,)


def _check(cfg, bounds: dict[str, Any], ok, relation: str) -> None:
    bad = [k for k, b in bounds.items() if not all(ok(v, b) for v in _values(cfg, k))]
    if bad:  # name the options that fail, with their values (all items of a list)
        need = ", ".join(f"{k} {relation} {bounds[k]}" for k in bad)
        got = ", ".join(f"{k}={format_value(getattr(cfg, k))}" for k in bad)
        raise ValueError(f"need {need}; got {got}")


def require_at_least(cfg, **bounds) -> None:
    """Every value of each named option (each item of a list) is >= its bound:
    ``require_at_least(self, n=2, seeds=1)`` -> "need n >= 2; got n=1" (the failing ones)."""
    _check(cfg, bounds, lambda v, b: v >= b, ">=")


def require_above(cfg, **bounds) -> None:
    """Every value of each named option is > its bound (``require_above(self, t1=0, dt=0)``)."""
    _check(cfg, bounds, lambda v, b: v > b, ">")


def require_between(cfg, name: str, low, high, *, closed: str = "[]", why: str = "") -> None:
    """``low <= value <= high`` for every value of ``name`` (``closed`` "[)" etc. opens an end)."""
    lo_ok = (lambda v: v >= low) if closed[0] == "[" else (lambda v: v > low)
    hi_ok = (lambda v: v <= high) if closed[1] == "]" else (lambda v: v < high)
    if not all(lo_ok(v) and hi_ok(v) for v in _values(cfg, name)):
        raise ValueError(f"{name} must lie in {closed[0]}{low:g}, {high:g}{closed[1]}"
                         f"{f' ({why})' if why else ''}, got {format_value(getattr(cfg, name))}")


__all__ = ["Options", "coerce_option", "format_value", "list_item_type", "parse_option_text", "require_above",
           "require_at_least", "require_between", "type_name"]
