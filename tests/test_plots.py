"""`dateopt.plots`: curves read back from metrics.jsonl, and the PNG the main job draws."""

import json
import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from dateopt import date, plots
from dateopt.train import metrics


def _write_run(path, rows):
  path.mkdir()
  (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return str(path)


def test_metric_curve_keeps_finite_values_of_the_key_only(tmp_path):
  run = _write_run(tmp_path / "a", [{"step": 1, "eval/accuracy": 0.5},
                                    {"step": 2, "train/loss": 1.0},
                                    {"step": 3, "eval/accuracy": float("nan")},
                                    {"step": 4, "eval/accuracy": None},
                                    {"step": 5, "eval/accuracy": 0.75}])
  assert plots.metric_curve(metrics.read_metrics(run), "eval/accuracy") == ([1, 5], [0.5, 0.75])


def test_plot_eval_curves_writes_a_png(tmp_path):
  runs = {name: _write_run(tmp_path / name, [{"step": s, "eval/accuracy": s / 10}
                                             for s in range(1, 6)])
          for name in ("baseline", "adaptive")}
  path = plots.plot_eval_curves(runs, str(tmp_path / "out" / "curves.png"), title="t")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------
# plot_lr_schedules / plot_training_curves: the lines drawn are the data
# --------------------------------------------------------------------------

_BASE = date.Recipe(batch_size=32, num_examples=8000, num_epochs=30, optimizer="adam",
                    learning_rate=2e-3, warmup_epochs=0.25, decay="cosine")
_BATCHES = (32, 128, 512)


@pytest.fixture(scope="module")
def schedules_figure():
  fig = plots.plot_lr_schedules(_BASE, _BATCHES, ("legw", "linear", "sqrt"))
  yield fig
  plt.close(fig)


def _lines_by_label(ax):
  return {line.get_label(): line for line in ax.lines}


def test_lr_schedules_one_panel_per_strategy_one_line_per_batch(schedules_figure):
  titles = [ax.get_title() for ax in schedules_figure.axes]
  assert [t.split(":")[0] for t in titles] == ["LEGW", "linear", "sqrt"]
  for ax in schedules_figure.axes:
    assert list(_lines_by_label(ax)) == ["batch 32 (1x)", "batch 128 (4x)", "batch 512 (16x)"]
    assert ax.get_xlabel() == "epochs"


@pytest.mark.parametrize("panel,strategy", [(0, "legw"), (1, "linear"), (2, "sqrt")])
def test_lr_schedule_lines_are_the_planned_schedules(schedules_figure, panel, strategy):
  """Every point is the planned recipe's LR at that step, and the whole run is drawn."""
  lines = _lines_by_label(schedules_figure.axes[panel])
  for batch in _BATCHES:
    recipe = date.plan(_BASE, batch, strategy)
    epochs, lrs = lines[f"batch {batch:,} ({batch // 32}x)"].get_data()
    steps = np.rint(np.asarray(epochs) * recipe.steps_per_epoch).astype(int)
    schedule = date.build_schedule(recipe)
    np.testing.assert_allclose(lrs, [float(schedule(int(s))) for s in steps], rtol=1e-5, atol=1e-9)
    assert steps[0] == 0 and steps[-1] == recipe.total_steps
    assert recipe.warmup_steps in steps  # the peak is drawn, not sampled past


def test_lr_schedule_peaks_follow_each_rule_by_hand(schedules_figure):
  """Peaks and where they fall, from the rules themselves: LEGW √k at k·0.25 epochs,
  linear k at Goyal's 5 epochs, sqrt √k at the baseline's 0.25 epochs (k = 16)."""
  expected = {0: (2e-3 * 4, 0.25 * 16), 1: (2e-3 * 16, 5.0), 2: (2e-3 * 4, 0.25)}
  for panel, (peak, peak_epoch) in expected.items():
    epochs, lrs = _lines_by_label(schedules_figure.axes[panel])["batch 512 (16x)"].get_data()
    top = int(np.argmax(lrs))
    assert math.isclose(lrs[top], peak, rel_tol=1e-5)
    assert abs(epochs[top] - peak_epoch) <= 1 / 15  # one step of 512 in 8000 examples
    assert lrs[-1] == pytest.approx(0.0, abs=1e-9)  # cosine to 0 at epoch 30
    assert epochs[-1] == pytest.approx(30.0, abs=1 / 15)


def test_lr_schedules_saves_a_png_and_refuses_adaptive(tmp_path):
  fig = plots.plot_lr_schedules(_BASE, [32, 64], ["none"], path=str(tmp_path / "d" / "lr.png"),
                                title="t")
  plt.close(fig)
  assert (tmp_path / "d" / "lr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(ValueError, match="adaptive"):
    plots.plot_lr_schedules(_BASE, [64], ["legw", "adaptive"])


def _two_runs(tmp_path):
  a = _write_run(tmp_path / "baseline", [
      {"step": 10, "train/loss": 2.0}, {"step": 20, "train/loss": None},
      {"step": 20, "eval/accuracy": 0.5, "eval/loss": 1.5}, {"step": 30, "train/loss": 1.0},
      {"step": 40, "eval/accuracy": 0.75}])
  b = _write_run(tmp_path / "date", [
      {"step": 5, "train/loss": 1.5}, {"step": 5, "eval/accuracy": None},
      {"step": 10, "train/loss": float("nan")}, {"step": 10, "eval/accuracy": 0.625}])
  return a, b


def test_training_curves_draw_each_run_in_each_key(tmp_path):
  a, b = _two_runs(tmp_path)
  fig = plots.plot_training_curves({"baseline": a, "DATE": b}, keys=("train/loss", "eval/accuracy"),
                                   path=str(tmp_path / "curves.png"))
  loss_ax, acc_ax = fig.axes
  assert loss_ax.get_ylabel() == "train/loss" and acc_ax.get_ylabel() == "eval/accuracy (%)"
  loss, acc = _lines_by_label(loss_ax), _lines_by_label(acc_ax)
  assert list(loss) == list(acc) == ["baseline", "DATE"]
  # Null and NaN values are left out; accuracies in %.
  assert [list(v) for v in loss["baseline"].get_data()] == [[10, 30], [2.0, 1.0]]
  assert [list(v) for v in loss["DATE"].get_data()] == [[5], [1.5]]
  assert [list(v) for v in acc["baseline"].get_data()] == [[20, 40], [50.0, 75.0]]
  assert [list(v) for v in acc["DATE"].get_data()] == [[10], [62.5]]
  plt.close(fig)
  assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_curves_take_metrics_paths_and_labels(tmp_path):
  a, b = _two_runs(tmp_path)
  fig = plots.plot_training_curves([f"{a}/metrics.jsonl", b], keys=["eval/accuracy"],
                                   labels=["B=32", "B=512"])
  assert list(_lines_by_label(fig.axes[0])) == ["B=32", "B=512"]
  plt.close(fig)
  fig = plots.plot_training_curves(b, keys=["train/loss"])  # one run: labelled by its folder
  assert list(_lines_by_label(fig.axes[0])) == ["date"]
  plt.close(fig)
  with pytest.raises(ValueError, match="1 labels for 2 runs"):
    plots.plot_training_curves([a, b], labels=["x"])


def test_read_metrics_takes_a_workdir_or_its_jsonl(tmp_path):
  a, _ = _two_runs(tmp_path)
  assert metrics.read_metrics(a) == metrics.read_metrics(f"{a}/metrics.jsonl")
