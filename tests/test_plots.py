"""`dateopt.plots`: curves read back from metrics.jsonl, and the PNG the main job draws."""

import json

from dateopt import plots


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
  assert plots.metric_curve(plots.read_metrics(run), "eval/accuracy") == ([1, 5], [0.5, 0.75])


def test_plot_eval_curves_writes_a_png(tmp_path):
  runs = {name: _write_run(tmp_path / name, [{"step": s, "eval/accuracy": s / 10}
                                             for s in range(1, 6)])
          for name in ("baseline", "adaptive")}
  path = plots.plot_eval_curves(runs, str(tmp_path / "out" / "curves.png"), title="t")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
