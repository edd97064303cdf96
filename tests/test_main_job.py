"""The README's main job (scripts/main_job.py) end to end on the tiny config, and its maths."""

import json
import math
import os
import subprocess
import sys

import pytest

from dateopt import study
from dateopt.date import _noise as noise_lib

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_effective_noise_scale_gives_the_harmonic_mean_gain():
  values = [500.0, math.inf, 100.0, 40.0]
  gains = [noise_lib.adascale_gain(v, 32, 512) for v in values]
  harmonic = len(gains) / sum(1 / g for g in gains)
  b_eff = study.effective_noise_scale(values, 32, 512)
  assert noise_lib.adascale_gain(b_eff, 32, 512) == pytest.approx(harmonic, rel=1e-9)
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


def _main_job_module():
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("main_job", os.path.join(REPO, "scripts",
                                                                          "main_job.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _row(run, accuracy, steps, examples, grows=False, batch=512):
  return {"run": run, "batch": batch, "accuracy": accuracy, "steps": steps,
          "predicted_steps": None if run == "baseline" else steps, "grows": grows,
          "examples_vs_baseline": examples, "guard_skipped": 0}


def test_several_seeds_give_mean_and_std_and_each_bar_on_the_means(tmp_path):
  job = _main_job_module()
  per_seed = [
      {"seed": 0, "runs": [_row("baseline", 0.96, 1000, 1.0, batch=32),
                           _row("DATE adaptive 16x", 0.97, 200, 2.0),
                           _row("DATE adaptive, batch grown to 64x", 0.95, 120, 2.4, True)]},
      {"seed": 1, "runs": [_row("baseline", 0.98, 1000, 1.0, batch=32),
                           _row("DATE adaptive 16x", 0.95, 300, 2.2),
                           _row("DATE adaptive, batch grown to 64x", 0.97, 140, 2.8, True)]},
  ]
  table = job.seeds_table(per_seed)
  # Hand arithmetic: baseline 97% ± 1.41; 16x 96% ± 1.41, 250 ± 71 steps; grown 130 steps.
  assert "| baseline | 32 | 97.00 ± 1.41% | 1,000 ± 0 |" in table
  assert "| DATE adaptive 16x | 512 | 96.00 ± 1.41% | 250 ± 71 | 250 | 2.10 | 0 |" in table
  # 16x: -1.00 point, 0.250 of the steps: at both limits of the fixed-batch bar.
  assert ("- DATE adaptive 16x: -1.00 points vs the baseline, 0.250 of its steps, 2.10× its "
          "examples (bar: ≥ −1.0 point, ≤ 0.250 of the steps): met") in table
  # Grown: 0.130 > 1/8 of the steps and 2.6x > 2.5x the examples: the grown-batch bar is missed.
  assert ("- DATE adaptive, batch grown to 64x: -1.00 points vs the baseline, 0.130 of its "
          "steps, 2.60× its examples (bar: ≥ −1.0 point, ≤ 0.125 of the steps, ≤ 2.5× the "
          "examples): NOT met") in table


def _lm_row(run, loss, steps, tokens, grows=False, batch=64):
  return dict(_row(run, 0.5, steps, tokens / 100_000, grows, batch), tokens=tokens,
              eval_loss=loss, bits_per_byte=loss / math.log(2), largest_batch=batch,
              examples=tokens // 128, epochs=0.4, wall_seconds=10.0)


def test_a_language_model_job_reads_validation_loss_and_tokens_against_its_bar():
  job = _main_job_module()
  per_seed = [
      {"seed": 0, "runs": [_lm_row("baseline", 2.00, 1000, 100_000, batch=4),
                           _lm_row("DATE adaptive 16x", 2.01, 120, 190_000),
                           _lm_row("DATE adaptive, batch grown to 64x", 2.00, 100, 240_000,
                                   True, 256)]},
      {"seed": 1, "runs": [_lm_row("baseline", 2.02, 1000, 100_000, batch=4),
                           _lm_row("DATE adaptive 16x", 2.05, 130, 210_000),
                           _lm_row("DATE adaptive, batch grown to 64x", 2.01, 110, 270_000,
                                   True, 256)]},
  ]
  table = job.seeds_table(per_seed)
  # Hand arithmetic: baseline 2.01 nats; 16x 2.03 (+1.00%) in 125 steps at 2.00x the tokens.
  assert "| baseline | 4 | 2.0100 ± 0.0141 | 2.900 | 1,000 ± 0 | 1.00 | 0 |" in table
  assert ("- DATE adaptive 16x: validation loss +1.00% vs the baseline, 0.125 of its steps, "
          "2.00× its tokens (bar: ≤ +1% loss, ≤ 0.125 of the steps): met") in table
  # Grown: 2.005 (-0.25%), 0.105 of the steps, 2.55x > 2.5x the tokens: missed.
  assert ("- DATE adaptive, batch grown to 64x: validation loss -0.25% vs the baseline, 0.105 "
          "of its steps, 2.55× its tokens (bar: ≤ +1% loss, ≤ 0.125 of the steps, ≤ 2.5× the "
          "tokens): NOT met") in table
  one_seed = job.markdown_table(per_seed[0]["runs"])
  assert one_seed.splitlines()[0].startswith("| run | batch | steps | predicted steps | tokens |")
  assert "| DATE adaptive 16x | 64 | 120 | 120 | 190,000 | 1.90 | 2.0100 | 2.900 | 10 | 88.0% |" in one_seed
  assert "| DATE adaptive, batch grown to 64x | 4 → 256 (max 256) | 100 |" in one_seed


def test_a_stopped_run_is_a_row_and_misses_its_bar(tmp_path):
  job = _main_job_module()
  stopped = dict(_row("DATE adaptive, batch grown to 16x", float("nan"), 520, 0.9, True),
                 stopped="stopped: the adaptive run diverged at step 415 ...")
  per_seed = [{"seed": 0, "runs": [_row("baseline", 0.96, 1000, 1.0, batch=32), stopped]},
              {"seed": 1, "runs": [_row("baseline", 0.96, 1000, 1.0, batch=32),
                                   _row("DATE adaptive, batch grown to 16x", 0.97, 110, 2.0,
                                        True)]}]
  table = job.seeds_table(per_seed)
  assert "| DATE adaptive, batch grown to 16x | 512 | stopped (diverged) in 1 of 2 |" in table
  assert ("- DATE adaptive, batch grown to 16x: stopped by the divergence watch in 1 of 2 seeds "
          "(bar: ≥ −1.0 point, ≤ 0.125 of the steps, ≤ 2.5× the examples): NOT met"
          ) in table
  one_seed = job.markdown_table(
      [dict(per_seed[0]["runs"][0], examples=32_000, epochs=4, wall_seconds=1.0),
       dict(stopped, examples=28_800, epochs=3.6, wall_seconds=1.0, largest_batch=256)])
  assert "| 28,800 (4) | 0.90 | stopped (diverged) |" in one_seed


def test_a_seed_with_results_is_read_not_run_again(tmp_path, monkeypatch):
  job = _main_job_module()
  args = type("Args", (), {"workdir": str(tmp_path), "gain_rule": "linear"})()
  saved = {"seed": 3, "runs": []}
  (tmp_path / "linear" / "seed3").mkdir(parents=True)
  (tmp_path / "linear" / "seed3" / "results.json").write_text(json.dumps(saved))
  monkeypatch.setattr(job, "run_job", lambda *a: pytest.fail("seed 3 ran again"))
  assert job.seed_results(args, 3) == saved
