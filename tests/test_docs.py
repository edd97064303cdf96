"""The README and the documentation as a user meets them: every Python block runs as written,
the core install runs the optax snippet, names of packaged configs resolve, extras are named.

Python blocks run in order, one namespace per page (a page's later blocks may use its earlier
ones). Shell blocks are commands for a terminal; the `dateopt-tpu` ones run with --dry-run.
"""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from dateopt import configs, extras
from dateopt import tpu as tpu_launcher
from import_isolation import blocking  # tests/import_isolation.py

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts and not {"growth_study", "scaling_study",
                                                                 "polish_study"} & set(p.parts)]
# What the core install lacks: the modules that come only with an extra (absl-py and etils
# come with optax itself).
EXTRA_MODULES = ("flax", "orbax", "tensorboardX", "ml_collections", "tqdm", "tensorflow_datasets",
                 "grain", "mnist1d", "sklearn", "matplotlib")


def python_blocks(page: pathlib.Path) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def shell_lines(page: pathlib.Path) -> list[str]:
  """The commands of a page's ```bash blocks, continuations joined, comments dropped."""
  lines = []
  for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
    lines += [line.strip() for line in re.sub(r"\\\n\s*", "", block).splitlines()]
  return [line for line in lines if line and not line.startswith("#")]


def _at_xla_defaults(page: pathlib.Path):
  """A page that replays a recorded run bit for bit runs at XLA's defaults (tests/conftest.py)."""
  replays = any("replay_run(" in block for block in python_blocks(page))
  return pytest.param(page, marks=pytest.mark.xla_defaults) if replays else page


@pytest.mark.parametrize("page", [_at_xla_defaults(p) for p in PAGES if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_python_block_runs_as_written(page, capsys):
  namespace = {"__name__": "__docs__"}
  for number, block in enumerate(python_blocks(page)):
    exec(compile(block, f"{page.name}, python block {number}", "exec"), namespace)  # noqa: S102
  capsys.readouterr()


def test_the_readme_is_a_front_page():
  readme = (REPO / "README.md").read_text()
  assert len(readme.splitlines()) <= 220
  assert len(python_blocks(REPO / "README.md")) >= 3
  assert "](docs/" not in readme  # images and links that survive outside the clone


def test_the_core_install_imports_dateopt_and_runs_the_optax_snippet():
  """`pip install dateopt` without extras: their modules cannot be imported here."""
  snippet = python_blocks(REPO / "README.md")[0]
  blocker = blocking(EXTRA_MODULES)
  check = ("import dateopt\n"
           "plan = dateopt.date.plan(dateopt.date.Recipe(batch_size=32, num_examples=6400,\n"
           "    num_epochs=2, learning_rate=0.1), 512)\n"
           "print(dateopt.date.explain(plan, plan).splitlines()[0])\n"
           "loaded = [m for m in sys.modules if m.split('.')[0] in "
           f"{EXTRA_MODULES!r}]\n"
           "assert not loaded, loaded\n")
  done = subprocess.run([sys.executable, "-c", blocker + snippet + check], capture_output=True,
                        text=True, timeout=300, cwd="/")
  assert done.returncode == 0, done.stderr[-3000:]
  assert "loss" in done.stdout


def test_a_missing_extra_is_one_line_naming_it():
  with pytest.raises(extras.MissingExtraError,
                     match=r"no_such_module is not installed: it comes with the 'data' extra, "
                           r"pip install 'dateopt\[data\]'"):
    extras.require("no_such_module", extra="data")
  blocker = blocking(["flax"]) + "from dateopt import console\nsys.exit(console.train())\n"
  done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 2
  assert done.stderr.strip() == ("dateopt-train: error: flax is not installed: it comes with the "
                                 "'train' extra, pip install 'dateopt[train]' (missing module "
                                 "'flax').")


def test_packaged_configs_resolve_by_name_from_any_directory(tmp_path):
  assert "mnist1d_lstm" in configs.names()
  assert configs.resolve("mnist1d_lstm") == str(configs.DIRECTORY / "mnist1d_lstm.py")
  assert configs.resolve("configs/mnist1d_lstm.py").endswith("mnist1d_lstm.py")
  with pytest.raises(FileNotFoundError, match="packaged configs: digits_resnet, "):
    configs.resolve("no_such_config")
  done = subprocess.run([sys.executable, "-m", "dateopt.cli", "--config", "no_such_config",
                         "--workdir", str(tmp_path / "run")], capture_output=True, text=True,
                        timeout=120, cwd=tmp_path)
  assert done.returncode == 2
  assert done.stderr.strip().startswith("dateopt-train: error: FileNotFoundError: config "
                                        "'no_such_config' is neither a file nor a packaged")


def test_help_shows_the_config_and_workdir_flags():
  done = subprocess.run([sys.executable, "-m", "dateopt.cli", "--help"], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0
  assert "--config: A packaged config's name" in done.stdout and "--workdir" in done.stdout
  assert "--config.strategy=adaptive" in done.stdout


def test_every_documented_tpu_command_runs_dry(capsys):
  commands = [shlex.split(line, comments=True)[1:] for page in PAGES
              for line in shell_lines(page) if line.startswith("dateopt-tpu ")]
  assert {c[0] for c in commands} >= {"run", "create", "copy", "install", "start", "tail",
                                      "stop", "delete", "watch"}
  for args in commands:
    assert tpu_launcher.main(["--dry-run", *args]) == 0, args
    out = [line for line in capsys.readouterr().out.splitlines() if line]
    assert out and all(line.startswith("gcloud ") for line in out), args
