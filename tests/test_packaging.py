"""What the wheel and the sdist ship: the PEP 561 marker, the packaged configs, the changelog."""

import pathlib
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

import dateopt

REPO = pathlib.Path(__file__).resolve().parent.parent
# What a build reads: the package and the files pyproject.toml and MANIFEST.in name.
BUILD_INPUTS = ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md")


def test_the_typed_marker_and_the_changelog_are_declared():
  assert (REPO / "dateopt" / "py.typed").read_bytes() == b""
  setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
  assert "py.typed" in setuptools["package-data"]["dateopt"]
  assert "include CHANGELOG.md" in (REPO / "MANIFEST.in").read_text().splitlines()
  changelog = (REPO / "CHANGELOG.md").read_text()
  assert "## [Unreleased]" in changelog
  assert f"## [{dateopt.__version__}]" in changelog  # the declared version's entry


def test_only_the_package_is_packaged_and_the_scripts_and_research_probes_stay_out():
  """The wheel takes `dateopt*` only; the sdist prunes scripts/ (tools) and research/ (probes)."""
  setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
  assert setuptools["packages"]["find"]["include"] == ["dateopt*"]
  manifest = (REPO / "MANIFEST.in").read_text().splitlines()
  assert {"prune scripts", "prune research"} <= set(manifest)
  assert not (REPO / "research" / "__init__.py").exists()
  assert not (REPO / "scripts" / "__init__.py").exists()


@pytest.mark.slow
def test_the_wheel_ships_py_typed_and_the_sdist_the_changelog(tmp_path):
  source = tmp_path / "source"
  shutil.copytree(REPO / "dateopt", source / "dateopt",
                  ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  for name in BUILD_INPUTS:
    shutil.copy(REPO / name, source / name)
  for folder in ("scripts", "research"):  # beside the package, as in a clone
    shutil.copytree(REPO / folder, source / folder,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                         str(tmp_path / "dist"), str(source)],
                        capture_output=True, text=True, timeout=300)
  if done.returncode and "No matching distribution found for setuptools" in done.stderr:
    pytest.skip("the build backend (setuptools>=77) cannot be installed here: no index")
  assert done.returncode == 0, done.stderr[-3000:]
  [wheel] = (tmp_path / "dist").glob("dateopt-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert "dateopt/py.typed" in names
  assert "dateopt/configs/mnist1d_lstm.py" in names
  assert not [name for name in names if not name.startswith(("dateopt/", "dateopt-"))]
  # The sdist's file list, as setuptools computed it from MANIFEST.in during the build.
  sdist = (source / "dateopt.egg-info" / "SOURCES.txt").read_text().splitlines()
  assert {"CHANGELOG.md", "README.md", "LICENSE", "dateopt/py.typed"} <= set(sdist)
  assert not [name for name in sdist
              if name.startswith(("tests/", "docs/", "notes/", "scripts/", "research/"))]
