"""The README's main job: the tuned baseline against the static LEGW plan and DATE adaptive.

Every run starts from scratch on the same data with the same switches (the
divergence guard on everywhere, noise scale measured everywhere):

  * `baseline`: the config's tuned small-batch recipe as it is;
  * `static LEGW {k}x`: DATE's static plan (peak LR × √k, warmup × k epochs,
    the same epochs: You et al. SC'19);
  * `DATE adaptive {k}x`: the baseline's schedule walked at the gain measured
    from the gradient noise scale each step, stopping when it has covered the
    baseline's steps. Its predicted steps come from the noise scale the
    baseline run measured: the law's steps, Σ 1/r over the baseline's logged
    noise scales (`effective_noise_scale`).
  * `DATE adaptive, batch grown to {k}x`: the same, starting at the baseline's
    batch and doubling it as the measured noise scale grows, up to k·B0
    (`--grow-to`).

It prints a table, writes it with every run's numbers to
`<workdir>/results.md` and `results.json`, and draws eval accuracy against steps
to `<workdir>/eval_accuracy.png` (and `--figure`, if given).

  python scripts/main_job.py --config configs/mnist1d_lstm.py --workdir runs/mnist1d_lstm
  python scripts/main_job.py --scales 16,64 --seed 1       # add 64x, another seed
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time

from absl import logging

from dateopt.configs import load as load_config
from dateopt.study import effective_noise_scale, finite_median, measured_noise_scales


def variants(config_path: str, scales: list[int], seed: int, progress_bar: bool,
             gain_rule: str = "linear", grow_to: list[int] = ()):
  """(name, config) of every run: the baseline, static and adaptive per scale, then grown."""
  def config_for(batch_size, strategy, grow_batch=False):
    config = load_config(config_path)
    config.seed, config.progress_bar = seed, progress_bar
    config.checkpoint_every_steps = -1  # a comparison, not a resumable job
    config.strategy = strategy
    config.batch_size = batch_size
    if strategy == "adaptive":
      config.plan = dict(config.plan.to_dict(), gain_rule=gain_rule, grow_batch=grow_batch)
    if batch_size is not None:  # ~1 eval per 15 steps: a curve without paying for eval
      config.eval_every_steps = 15
    return config

  base_batch = load_config(config_path).baseline.batch_size
  out = [("baseline", config_for(None, "legw"))]
  suffix = "" if gain_rule == "linear" else f" ({gain_rule} gain)"
  for k in scales:
    out.append((f"static LEGW {k}x", config_for(base_batch * k, "legw")))
    out.append((f"DATE adaptive {k}x{suffix}", config_for(base_batch * k, "adaptive")))
  for k in grow_to:
    out.append((f"DATE adaptive, batch grown to {k}x{suffix}",
                config_for(base_batch * k, "adaptive", grow_batch=True)))
  return out


def run_one(name: str, config, workdir: str, noise_scale: float | None) -> dict:
  """Trains one variant from scratch; returns its row of the table."""
  from dateopt import train
  shutil.rmtree(workdir, ignore_errors=True)  # a fresh run each time, not a resume
  if noise_scale is not None and math.isfinite(noise_scale):
    config.plan = dict(config.plan.to_dict(), noise_scale=float(noise_scale))
  start = time.perf_counter()
  result = train.train_and_evaluate(config, workdir)
  seconds = time.perf_counter() - start
  metrics = result.train_metrics
  recipe = result.recipe
  return {
      "run": name, "workdir": workdir, "batch": recipe.batch_size, "steps": result.steps,
      "predicted_steps": result.predicted_steps,
      "examples": result.examples, "largest_batch": result.largest_batch_size,
      "grows": recipe.grow_batch,
      "epochs": result.examples / recipe.num_examples,
      "examples_vs_baseline": result.examples / (result.baseline.total_steps
                                                 * result.baseline.batch_size),
      "accuracy": result.eval_metrics["accuracy"], "wall_seconds": seconds,
      "guard_skipped": int(metrics.get("guard/num_skipped", 0)),
      "guard_lr_multiplier": float(metrics.get("guard/lr_multiplier", 1.0)),
      "steps_per_second": result.steps_per_second,
  }


def markdown_table(rows: list[dict]) -> str:
  baseline = rows[0]
  lines = ["| run | batch | steps | predicted steps | examples (epochs) | examples × baseline "
           "| eval accuracy | wall s | steps saved vs baseline | guard skips |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    predicted = "" if r["predicted_steps"] is None else f"{r['predicted_steps']:,}"
    saved = "" if r is baseline else f"{1 - r['steps'] / baseline['steps']:.1%}"
    batch = (f"{baseline['batch']:,} → {r['largest_batch']:,} (max {r['batch']:,})"
             if r["grows"] else f"{r['batch']:,}")
    lines.append(
        f"| {r['run']} | {batch} | {r['steps']:,} | {predicted} "
        f"| {r['examples']:,} ({r['epochs']:.0f}) | {r['examples_vs_baseline']:.2f} "
        f"| {100 * r['accuracy']:.2f}% "
        f"| {r['wall_seconds']:.0f} | {saved} | {r['guard_skipped']} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/mnist1d_lstm.py")
  parser.add_argument("--workdir", default="runs/mnist1d_lstm")
  parser.add_argument("--scales", default="16",
                      help="comma-separated batch multiples of the baseline, e.g. 16,64")
  parser.add_argument("--grow-to", default="64",
                      help="comma-separated maxima (multiples of the baseline) of DATE runs "
                           "whose batch grows with the noise scale; '' for none")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--gain-rule", default="linear", choices=["linear", "sqrt"],
                      help="DATE adaptive's LR rule: × r_t or × √r_t")
  parser.add_argument("--figure", default=None, help="also save the PNG here")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)

  scales = [int(s) for s in args.scales.split(",") if s]
  started = time.perf_counter()
  rows, measured = [], []
  grow_to = [int(s) for s in args.grow_to.split(",") if s]
  for name, config in variants(args.config, scales, args.seed, not args.no_progress,
                               args.gain_rule, grow_to):
    workdir = os.path.join(args.workdir, name.replace(" ", "_"))
    noise = None
    if measured and config.batch_size is not None:
      noise = effective_noise_scale(measured, config.baseline.batch_size, config.batch_size)
    rows.append(run_one(name, config, workdir, noise))
    if name == "baseline":
      from dateopt.train.metrics import read_metrics
      measured = measured_noise_scales(read_metrics(workdir))
      print(f"\nbaseline: measured noise scale B_noise median {finite_median(measured):,.0f} "
            f"examples ({sum(map(math.isinf, measured))} of {len(measured)} logs: signal ≤ 0)\n",
            flush=True)
  total = time.perf_counter() - started
  noise = finite_median(measured)

  table = markdown_table(rows)
  summary = (f"{table}\n\nseed {args.seed}; baseline B_noise median {noise:,.0f} (predictions use "
             f"the harmonic-mean gain over the baseline's logged B_noise); whole job {total:.0f} s")
  print("\n" + summary)
  os.makedirs(args.workdir, exist_ok=True)
  with open(os.path.join(args.workdir, "results.md"), "w", encoding="utf-8") as f:
    f.write(summary + "\n")
  with open(os.path.join(args.workdir, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"seed": args.seed, "noise_scale": noise, "seconds": total, "runs": rows}, f,
              indent=2)

  from dateopt import plots
  curves = {r["run"]: r["workdir"] for r in rows}
  title = f"{os.path.basename(args.config)}: eval accuracy (seed {args.seed})"
  for path in filter(None, [os.path.join(args.workdir, "eval_accuracy.png"), args.figure]):
    plots.plot_eval_curves(curves, path, title=title)
    print(f"wrote {path}")


if __name__ == "__main__":
  main()
