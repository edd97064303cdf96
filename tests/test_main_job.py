"""The README's main job (scripts/main_job.py) end to end on the tiny config, and its maths."""

import json
import math
import os
import subprocess
import sys

import pytest

from dateopt import date, study

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_effective_noise_scale_gives_the_harmonic_mean_gain():
  values = [500.0, math.inf, 100.0, 40.0]
  gains = [date.adascale_gain(v, 32, 512) for v in values]
  harmonic = len(gains) / sum(1 / g for g in gains)
  b_eff = study.effective_noise_scale(values, 32, 512)
  assert date.adascale_gain(b_eff, 32, 512) == pytest.approx(harmonic, rel=1e-9)
  assert study.effective_noise_scale([math.inf], 32, 512) == math.inf


def test_main_job_runs_baseline_static_and_adaptive_with_the_guard_on(tmp_path):
  out = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "main_job.py"), "--config",
       os.path.join(REPO, "tests", "tiny_config.py"), "--workdir", str(tmp_path), "--scales", "4",
       "--grow-to", "4", "--no-progress"], capture_output=True, text=True, timeout=600,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  runs = {r["run"]: r for r in results["runs"]}
  assert list(runs) == ["baseline", "static LEGW 4x", "DATE adaptive 4x",
                        "DATE adaptive, batch grown to 4x"]
  assert runs["baseline"]["steps"] == 120 and runs["static LEGW 4x"]["steps"] == 30
  adaptive = runs["DATE adaptive 4x"]
  assert 30 <= adaptive["steps"] < 120 and adaptive["predicted_steps"] > 0
  assert all(r["guard_skipped"] >= 0 for r in runs.values())
  grown = runs["DATE adaptive, batch grown to 4x"]
  assert grown["batch"] == 64 and 16 <= grown["largest_batch"] <= 64
  assert grown["examples"] >= grown["steps"] * 16  # every step took at least the baseline's batch
  assert grown["examples_vs_baseline"] == pytest.approx(grown["examples"] / (120 * 16))
  assert runs["DATE adaptive 4x"]["examples"] == runs["DATE adaptive 4x"]["steps"] * 64
  assert "| DATE adaptive 4x | 64 |" in (tmp_path / "results.md").read_text()
  assert "| DATE adaptive, batch grown to 4x | 16 → " in (tmp_path / "results.md").read_text()
  with open(tmp_path / "eval_accuracy.png", "rb") as f:
    assert f.read(4) == b"\x89PNG"
