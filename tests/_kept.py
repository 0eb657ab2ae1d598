"""What a program store (``tp.runs`` kept programs) holds, as the tests compare it."""

from __future__ import annotations


def stored_programs(store) -> list[str]:
    """The suffixes of the files in ``store``, sorted, executables (``.jaxexe``) and links to them
    (``.jaxlink``) left out: one is kept only where XLA compiled the program in that process (or an
    earlier one), which a test process sharing JAX's compilation cache with earlier tests cannot
    promise (``tests/runs/test_programs.py`` checks executables in fresh processes)."""
    return sorted(p.suffix for p in store.iterdir() if p.suffix not in (".jaxexe", ".jaxlink"))
