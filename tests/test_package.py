"""The installed package describes itself correctly: version, licence, licence files."""

from __future__ import annotations

import re
from importlib.metadata import distribution
from pathlib import Path

import awa

ROOT = Path(__file__).resolve().parent.parent


def pyproject_field(name: str) -> str:
    """A top-level string field of pyproject.toml's [project] table (no tomllib on 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    match = re.search(rf'^{name}\s*=\s*"([^"]*)"', project, re.MULTILINE)
    assert match, f"pyproject.toml has no [project] {name}"
    return match.group(1)


def test_version_is_the_distributions_and_pyprojects() -> None:
    assert isinstance(awa.__version__, str)
    assert awa.__version__ == distribution("awa-queue").version
    assert awa.__version__ == pyproject_field("version")
    assert "__version__" in awa.__all__


def test_the_wheel_declares_the_licence_and_ships_both_licence_files() -> None:
    dist = distribution("awa-queue")
    assert dist.metadata["License-Expression"] == pyproject_field("license") == "MIT OR Apache-2.0"
    shipped = {Path(str(f)).name for f in dist.files or [] if "licenses" in str(f)}
    assert {"LICENSE-MIT", "LICENSE-APACHE"} <= shipped
    for name in ("LICENSE-MIT", "LICENSE-APACHE"):
        assert (ROOT / name).is_file()
    assert "Apache License" in (ROOT / "LICENSE-APACHE").read_text()
    assert "MIT License" in (ROOT / "LICENSE-MIT").read_text()


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_example_does_its_work_on_every_run(database_url: str) -> None:
    """Run the README's first example twice against one database: both runs must send and
    audit their own email (a follow-up deduplicated against the first run's completed one
    would leave the second run silently doing nothing)."""
    import subprocess
    import sys

    example = readme_example()
    script, n = re.subn(r'AsyncClient\("[^"]*"\)', f'AsyncClient("{database_url}")', example)
    assert n == 1, "the example opens one AsyncClient"
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    for out in outputs:
        assert re.fullmatch(r"sent [0-9a-f]{32} to ada@example\.com", out), outputs
    assert outputs[0] != outputs[1]
