"""The notebooks in notebooks/: each runs top to bottom, and the saved copies are complete.

Each notebook is executed with nbclient at its small settings
(DATEOPT_NOTEBOOK_SMALL=1, a few steps per run), from a temporary copy so
that the committed file keeps the outputs of its full run, with the kernel's
working directory in notebooks/ so that relative paths resolve as they do for
a user. Its workdirs go to a temporary folder (DATEOPT_NOTEBOOK_WORKDIR).
The saved notebooks must hold those full-run outputs (figures included) and
a Colab badge that opens the notebook itself.
"""

import asyncio
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import conftest  # tests/conftest.py: the XLA flags of the suite's child processes

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = ("quickstart.ipynb", "large_batch_mnist1d.ipynb", "resnet50_tpu.ipynb",
             "transformer_lm_shakespeare.ipynb")
CELL_TIMEOUT_S = 300  # per cell: a compile on a loaded 2-core machine, with room to spare
COLAB_URL = re.compile(r"https://colab\.research\.google\.com/github/"
                       r"(?P<repo>[\w.-]+/[\w.-]+)/blob/main/(?P<path>notebooks/[\w.-]+\.ipynb)")


def _read(name):
  return nbformat.read(NOTEBOOKS_DIR / name, as_version=4)


def _code_cells(nb):
  return [c for c in nb.cells if c.cell_type == "code"]


def _outputs(nb):
  return [o for c in _code_cells(nb) for o in c.get("outputs", [])]


def _images(nb):
  return [o for o in _outputs(nb) if "image/png" in o.get("data", {})]


def _badge_repo(nb, name):
  """The repository the first cell's Colab badge opens; asserts it opens `name`."""
  first = nb.cells[0]
  assert first.cell_type == "markdown" and "colab-badge.svg" in first.source
  match = COLAB_URL.search(first.source)
  assert match, f"{name}: no Colab URL in the first cell"
  assert match["path"] == f"notebooks/{name}"
  return match["repo"]


def test_every_notebook_is_tested():
  assert sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("source, requirement", [
    ("", "dateopt[train,data,plots]"),
    ("git+https://github.com/dateopt/dateopt@main",
     "dateopt[train,data,plots] @ git+https://github.com/dateopt/dateopt@main"),
    ("/src/dateopt", "/src/dateopt[train,data,plots]"),
])
def test_the_install_cell_installs_by_name_or_from_dateopt_source(monkeypatch, source,
                                                                   requirement):
  import dateopt  # pylint: disable=import-outside-toplevel
  installed = []

  def pip(command):  # the install "succeeds": dateopt is importable again
    installed.append(command[-1])
    monkeypatch.setitem(sys.modules, "dateopt", dateopt)

  monkeypatch.setattr(subprocess, "check_call", pip)
  monkeypatch.setattr(glob, "glob", lambda pattern: [])  # no TPU
  monkeypatch.setenv("DATEOPT_SOURCE", source)
  for name in NOTEBOOKS:
    installed.clear()
    monkeypatch.setitem(sys.modules, "dateopt", None)  # `import dateopt` raises ImportError
    exec(_code_cells(_read(name))[0].source, {})  # noqa: S102
    assert installed == [requirement], name


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_saved_notebook_has_its_badge_and_full_run_outputs(name):
  nb = _read(name)
  nbformat.validate(nb)
  assert nb.nbformat == 4 and nb.metadata.kernelspec.name == "python3"
  repo = _badge_repo(nb, name)
  install = _code_cells(nb)[0].source
  assert f"git+https://github.com/{repo}@main" in install  # the badge's repository, named
  assert "DATEOPT_SOURCE" in install and "invalidate_caches()" in install
  assert '"-e"' not in install
  switch = _code_cells(nb)[1].source
  assert 'os.environ.get("DATEOPT_NOTEBOOK_SMALL") == "1"' in switch
  assert "DATEOPT_NOTEBOOK_WORKDIR" in switch
  # Saved from a full run: every code cell ran, none failed, figures kept as PNGs.
  assert all(c.execution_count is not None for c in _code_cells(nb))
  assert not [o for o in _outputs(nb) if o.output_type == "error"]
  assert _images(nb), f"{name}: no image/png output saved"
  printed = "".join(o.get("text", "") for o in _outputs(nb) if o.output_type == "stream")
  assert "SMALL=False" in printed


LOCAL_PATH = re.compile(r"(?<![\w.~])/(?:tmp|root|home|work|Users|private)/")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_saved_outputs_show_no_local_path_and_no_warning(name):
  texts = [o.get("text", "") if o.output_type == "stream"
           else str(o.get("data", {}).get("text/plain", "")) for o in _outputs(_read(name))]
  assert not [t for t in texts if LOCAL_PATH.search(t)], f"{name}: a local path in an output"
  assert not [t for t in texts if "Warning:" in t], f"{name}: a warning in an output"


def test_notebooks_share_one_repository():
  assert len({_badge_repo(_read(name), name) for name in NOTEBOOKS}) == 1


def _kernel_env(workdir: Path, no_imagenet: Path) -> dict[str, str]:
  """This process's environment with the notebooks' small switch and temporary folders."""
  env = dict(os.environ, DATEOPT_NOTEBOOK_SMALL="1", DATEOPT_NOTEBOOK_WORKDIR=str(workdir),
             DATEOPT_IMAGENET_DATA_DIR=str(no_imagenet), JAX_PLATFORMS="cpu")
  # One CPU device, as in a Colab CPU runtime (conftest's 8 simulated devices are for
  # this process's own tests), compiled as conftest's other child processes are.
  env["XLA_FLAGS"] = conftest.CHILD_FLAG
  return env


async def _execute(name: str, root: Path):
  """Runs a temporary copy of notebook `name` at its small settings; (notebook, workdir, error)."""
  copy, workdir = root / name, root / name.replace(".ipynb", "_workdirs")
  shutil.copy(NOTEBOOKS_DIR / name, copy)
  nb = nbformat.read(copy, as_version=4)
  client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                          resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
  try:
    await client.async_execute(env=_kernel_env(workdir, root / "no_imagenet"))
  except Exception as error:  # reported by the notebook's own test
    return nb, workdir, error
  return nb, workdir, None


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
  """Every notebook executed at its small settings, concurrently: one kernel each, so
  that their compilations share the cores."""
  root = tmp_path_factory.mktemp("notebooks")
  repo_files = sorted(os.listdir(NOTEBOOKS_DIR))

  async def run_all():
    return await asyncio.gather(*(_execute(name, root) for name in NOTEBOOKS))

  runs = dict(zip(NOTEBOOKS, asyncio.run(run_all())))
  assert sorted(os.listdir(NOTEBOOKS_DIR)) == repo_files  # nothing written into the repo
  return runs


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_at_small_settings(name, small_runs):
  nb, workdir, error = small_runs[name]
  assert error is None, f"{name} failed:\n{error}"
  assert not [o for o in _outputs(nb) if o.output_type == "error"]
  assert _images(nb), "the small run draws its figures too"
  printed = "".join(o.get("text", "") for o in _outputs(nb) if o.output_type == "stream")
  assert "SMALL=True" in printed
  assert list(workdir.rglob("metrics.jsonl")), "the runs write under DATEOPT_NOTEBOOK_WORKDIR"
