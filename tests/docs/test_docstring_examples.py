"""The API pages' example code runs (issue 37, item 11: "the API pages have no example code").

The most-used public objects carry an ``Example:`` section with a fenced python block in their
docstring (rendered on their API page); each block is extracted from the docstring and executed
as written, in a fresh namespace. Compiling them is fast; running them compiles JAX programs
(5–15 s each here), so the runs are in the slow set.
"""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest

import transformer_pde as tp

EXAMPLED = {
    "tp.solve": tp.solve, "tp.layers": tp.layers, "tp.SoftmaxAttention": tp.SoftmaxAttention,
    "tp.Sphere": tp.Sphere, "tp.Noise": tp.Noise, "tp.Gaussian": tp.Gaussian, "tp.Particles": tp.Particles,
    "tp.sweep": tp.sweep, "tp.fit": tp.fit, "tp.runs.solve_checkpointed": tp.runs.solve_checkpointed,
    "tp.CircleDensity": tp.CircleDensity, "tp.solve_density": tp.solve_density,
    "tp.SphereDensity": tp.SphereDensity,
    "tp.AffineFeedForward": tp.AffineFeedForward,
}
"""The objects whose docstrings must show an example."""

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples(obj) -> list[str]:
    """The fenced python blocks of ``obj``'s docstring (dedented as its page shows them)."""
    doc = inspect.getdoc(obj) or ""
    section = re.search(r"^Example:\n((?:[ \t]+.*\n?|\n)+)", doc, re.M)
    if section is None:
        return []
    return _BLOCK.findall(textwrap.dedent(section.group(1)))


def test_example_extraction():
    def f():
        """Doc.

        Example:
            ```python
            y = 1 + 1
            ```
        """
    assert examples(f) == ["y = 1 + 1\n"]
    assert examples(lambda: None) == []


@pytest.mark.parametrize("name", sorted(EXAMPLED))
def test_the_object_shows_an_example_that_compiles(name):
    blocks = examples(EXAMPLED[name])
    assert blocks, f"{name}'s docstring has no Example: section with a ```python block"
    for src in blocks:
        compile(src, f"<{name} example>", "exec")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLED))
def test_the_example_runs(name):
    for src in examples(EXAMPLED[name]):
        exec(compile(src, f"<{name} example>", "exec"), {})
