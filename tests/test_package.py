"""The package as published: one version source, the metadata a registry needs, the files it ships.

pyproject.toml states the version once; `symmerge.__version__` and `symmerge --version` read it (the
installed metadata, or the checkout's pyproject.toml when run from the source tree). The wheel itself is
built, checked and installed into a fresh environment by `.ci/check-wheel`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import symmerge

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "symmerge", *argv], capture_output=True, text=True, env=env, timeout=120)


def test_symmerge_version_prints_the_package_version():
    done = _cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"symmerge {PROJECT['version']}\n"
    assert symmerge.__version__ == PROJECT["version"]


def test_the_version_is_written_once():
    """No module states a version literal of its own; a source tree without metadata reads pyproject.toml."""
    literal = re.compile(r"""__version__\s*=\s*["']""")
    assert not [p.name for p in (ROOT / "src" / "symmerge").rglob("*.py") if literal.search(p.read_text())]
    assert PROJECT["version"] not in (ROOT / "src" / "symmerge" / "__init__.py").read_text()


def test_without_installed_metadata_the_checkout_version_is_read(monkeypatch):
    from symmerge import version

    def missing(name):
        raise version._metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version._metadata, "version", missing)
    assert version._version() == PROJECT["version"]
    # negative control: a source file away from any pyproject.toml has no version to read
    monkeypatch.setattr(version, "__file__", "/nonexistent/a/b/version.py")
    assert version._version() == "0+unknown"


def test_metadata_a_registry_shows():
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(PROJECT["urls"])
    assert PROJECT["authors"] and PROJECT["keywords"] and "Typing :: Typed" in PROJECT["classifiers"]
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]  # the SPDX expression says it
    assert (ROOT / "src" / "symmerge" / "py.typed").exists()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["symmerge"]


def test_the_changelog_covers_the_current_version():
    assert re.search(rf"^## {re.escape(PROJECT['version'])}\b", (ROOT / "CHANGELOG.md").read_text(), re.M)
