"""Installs without some extras: each subpackage that needs one says so in one line, and
`dateopt.plots` works with the `plots` extra alone."""

import json
import os
import textwrap

import pytest

from dateopt import extras, metrics_io, plots, train
from import_isolation import run_without  # tests/import_isolation.py

# What the train and data extras bring beyond the core (absl and etils come with optax).
TRAIN_ONLY = ("flax", "ml_collections", "orbax", "tensorboardX", "tqdm")
DATA_ONLY = ("tensorflow_datasets", "grain", "mnist1d", "sklearn", "simplejpeg", "cv2")


def _needs(package: str, extra: str, missing: str) -> str:
  return (f"{package} needs the {extra!r} extra: pip install 'dateopt[{extra}]' "
          f"(missing: {missing})")


def test_require_extra_names_every_missing_module_without_importing_any():
  extras.require_extra("dateopt.x", extra="x", modules=("json", "email.mime"))  # all there
  with pytest.raises(ModuleNotFoundError) as raised:  # as the bare import's error was
    extras.require_extra("dateopt.x", extra="x",
                         modules=("json", "no_such_module", "no_such_package.sub"))
  assert isinstance(raised.value, extras.MissingExtraError)
  assert str(raised.value) == _needs("dateopt.x", "x", "no_such_module, no_such_package.sub")
  assert raised.value.name == "no_such_module"


def test_the_trainer_and_plots_read_metrics_with_one_reader():
  assert train.read_metrics is metrics_io.read_metrics
  assert plots.metric_curve is metrics_io.metric_curve
  with pytest.raises(ValueError, match="the path is empty"):  # never the current directory's
    metrics_io.read_metrics(" ")


@pytest.mark.slow
@pytest.mark.parametrize("statement, blocked, message", [
    ("from dateopt import train", ("ml_collections",),
     _needs("dateopt.train", "train", "ml_collections")),
    ("import dateopt.train", TRAIN_ONLY,
     _needs("dateopt.train", "train", "ml_collections, flax, orbax.checkpoint, tensorboardX, tqdm")),
    ("from dateopt import models", ("flax",), _needs("dateopt.models", "train", "flax")),
    ("from dateopt.models import create_model", TRAIN_ONLY,
     _needs("dateopt.models", "train", "flax")),
    ("from dateopt import plots", ("matplotlib",), _needs("dateopt.plots", "plots", "matplotlib")),
], ids=["train", "train-none", "models", "models-none", "plots"])
def test_a_subpackage_without_its_extra_fails_in_one_line_naming_it(statement, blocked, message):
  done = run_without(blocked, statement + "\n")
  assert done.returncode == 1
  assert done.stderr.splitlines()[-1] == f"dateopt.extras.MissingExtraError: {message}"
  assert "No module named" not in done.stderr, done.stderr  # no chained bare import error


@pytest.mark.slow
def test_plots_draws_a_run_with_the_plots_extra_alone(tmp_path):
  rows = [{"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  code = textwrap.dedent(f"""
      from dateopt import plots
      path = plots.plot_eval_curves({{"run": {str(tmp_path)!r}}}, {str(tmp_path / "a.png")!r},
                                    key="train/loss")
      loaded = [m for m in sys.modules if m.split(".")[0] in {TRAIN_ONLY + DATA_ONLY!r}
                or m.startswith("dateopt.train")]
      assert not loaded, loaded
      """)
  done = run_without(TRAIN_ONLY + DATA_ONLY, code, env={**os.environ, "MPLBACKEND": "Agg"})
  assert done.returncode == 0, done.stderr[-3000:]
  assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_trainer_and_the_study_need_neither_the_data_nor_the_plots_extra():
  """Why `dateopt.data` has no import-time check: the trainer imports it without the extra."""
  done = run_without(DATA_ONLY + ("matplotlib",), "from dateopt import data, study, train\n")
  assert done.returncode == 0, done.stderr[-3000:]
