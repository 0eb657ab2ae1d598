"""The README's Quick start and .ci/run must not drift apart."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quick_start_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_quick_start_has_exactly_two_commands():
    cmds = _quick_start_commands()
    assert len(cmds) == 2 and all("\n" not in c for c in cmds)
    assert "transformer-pde run clustering" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    assert _quick_start_commands()[1] in (ROOT / ".ci" / "run").read_text()


def test_ci_builds_the_docs_site_the_readme_names():
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[docs]" && mkdocs serve' in readme
    assert 'pip install -e ".[docs]" && mkdocs build --strict' in ci
    assert "docs/check_site.py" in readme and "docs/check_site.py" in ci
