"""The README's main job: the tuned baseline against the static LEGW plan and DATE adaptive.

Every run starts from scratch on the same data with the same switches (the
divergence guard on everywhere, noise scale measured everywhere):

  * `baseline`: the config's tuned small-batch recipe as it is;
  * `static LEGW {k}x`: DATE's static plan (peak LR × √k, warmup × k epochs,
    the same epochs: You et al. SC'19);
  * `DATE adaptive {k}x`: the baseline's schedule walked at the gain measured
    from the gradient noise scale each step, stopping when it has covered the
    baseline's steps. Its predicted steps come from the noise-scale profile the
    baseline run logged, played out by the law as DATE reads it at its batch
    (`date._planner.plan_predicted_budget`).
  * `DATE adaptive, batch grown to {k}x`: the same, starting at the baseline's
    batch and doubling it as the measured noise scale grows, up to k·B0
    (`--grow-to`).

It prints a table, writes it with every run's numbers to
`<workdir>/results.md` and `results.json`, and draws eval accuracy against steps
to `<workdir>/eval_accuracy.png` (and `--figure`, if given).

  python scripts/main_job.py --config configs/mnist1d_lstm.py --workdir runs/mnist1d_lstm
  python scripts/main_job.py --scales 16,64 --seeds 1      # add 64x, another seed
  python scripts/main_job.py --seeds 0,1,2 --scales 16,64 --workdir runs/date_seeds

With several seeds, each seed's job runs in <workdir>/<gain rule>/seed<N> (a
seed whose results.json exists is read, not run again, so an interrupted job
resumes), then it prints and writes (`seeds.md`) the mean ± std of every run
and DATE adaptive against its bar: the fixed-batch bar (within 1.0 point of the
baseline in <= 1/4 of its steps at 16x, <= 1/10 at 64x) or the grown-batch bar
(within 1.0 point, <= 1/8 of the steps, <= 2.5x the examples).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import time

from absl import logging

from dateopt import plots, train
from dateopt.configs import load as load_config
from dateopt.study import (effective_noise_scale, filled_profile, finite_median,
                           measured_noise_scales)
from dateopt.study.report import GROWN_TOKENS_BAR, LOSS_TOLERANCE, STEP_SHARE_BAR
from dateopt.train import read_metrics

# The fixed-batch bar: DATE adaptive in at most this fraction of the baseline's steps.
FIXED_BATCH_STEP_BAR = {16: 1 / 4, 64: 1 / 10}


def variants(config_path: str, scales: list[int], seed: int, progress_bar: bool,
             gain_rule: str = "linear", grow_to: list[int] = (), eval_every_steps: int = 15):
  """(name, config) of every run: the baseline, static and adaptive per scale, then grown."""
  def config_for(batch_size, strategy, grow_batch=False):
    config = load_config(config_path)
    config.seed, config.progress_bar = seed, progress_bar
    config.checkpoint_every_steps = -1  # a comparison, not a resumable job
    config.strategy = strategy
    config.batch_size = batch_size
    if strategy == "adaptive":
      config.plan = dict(config.plan.to_dict(), gain_rule=gain_rule, grow_batch=grow_batch)
    if batch_size is not None:  # a curve without paying much for eval
      config.eval_every_steps = eval_every_steps
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


def run_one(name: str, config, workdir: str, noise_scale: float | list[float] | None
            ) -> dict:
  """Trains one variant from scratch; returns its row of the table.

  `noise_scale`: the baseline's B_noise for the plan, one number or (DATE) its profile.
  """
  shutil.rmtree(workdir, ignore_errors=True)  # a fresh run each time, not a resume
  if isinstance(noise_scale, list) or (noise_scale is not None and math.isfinite(noise_scale)):
    config.plan = dict(config.plan.to_dict(), noise_scale=noise_scale)
  start = time.perf_counter()
  try:
    result = train.train_and_evaluate(config, workdir)
  except train.DivergedError as error:  # a row of its own: the comparison goes on
    print(f"\n{name}: {error}\n", flush=True)
    return stopped_row(name, config, workdir, str(error), time.perf_counter() - start)
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
      **language_model_fields(result),
  }


def language_model_fields(result) -> dict:
  """A text workload's row fields: tokens, validation loss (nats) and bits per byte."""
  if result.tokens is None:
    return {}
  return {"tokens": result.tokens, "eval_loss": result.eval_metrics["loss"],
          "bits_per_byte": result.eval_metrics.get("bits_per_byte", float("nan"))}


def stopped_row(name: str, config, workdir: str, reason: str, seconds: float) -> dict:
  """The row of a run the divergence watch stopped, from its metrics: its last logged step,
  the examples it had read, no accuracy (its model is the diverged one)."""
  rows = read_metrics(workdir)
  logged = [r for r in rows if "examples_seen" in r]
  last = logged[-1] if logged else {"step": 0, "examples_seen": 0}
  last = {k.removeprefix("train/"): v for k, v in last.items()}
  batches = [r["train/batch_size"] for r in rows if "train/batch_size" in r]
  return {
      "run": name, "workdir": workdir, "batch": config.batch_size, "steps": last["step"],
      "predicted_steps": None, "examples": last["examples_seen"],
      "largest_batch": max(batches, default=config.batch_size),
      "grows": bool(config.plan.get("grow_batch", False)), "epochs": float("nan"),
      "examples_vs_baseline": float("nan"),  # set against the baseline's row by run_job
      "accuracy": float("nan"), "wall_seconds": seconds, "guard_skipped": 0,
      "guard_lr_multiplier": 1.0, "steps_per_second": float("nan"), "stopped": reason,
      **({"tokens": last["tokens_seen"], "eval_loss": float("nan"),
          "bits_per_byte": float("nan")} if "tokens_seen" in last else {})}


def _stopped_count(rows: list[dict]) -> int:
  return sum(bool(r.get("stopped")) for r in rows)


def _accuracy_cell(row: dict) -> str:
  return "stopped (diverged)" if row.get("stopped") else f"{100 * row['accuracy']:.2f}%"


def is_language_model(rows: list[dict]) -> bool:
  """Whether the job's runs are a text workload's (their data counted in tokens)."""
  return "tokens" in rows[0]


def markdown_table(rows: list[dict]) -> str:
  if is_language_model(rows):
    return language_model_table(rows)
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
        f"| {_accuracy_cell(r)} "
        f"| {r['wall_seconds']:.0f} | {saved} | {r['guard_skipped']} |")
  return "\n".join(lines)


def language_model_table(rows: list[dict]) -> str:
  """The text workload's table: steps, tokens, validation loss and bits per byte, wall time."""
  baseline = rows[0]
  lines = ["| run | batch | steps | predicted steps | tokens | tokens × baseline "
           "| validation loss (nats) | bits per byte | wall s | steps saved vs baseline "
           "| guard skips |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    predicted = "" if r["predicted_steps"] is None else f"{r['predicted_steps']:,}"
    saved = "" if r is baseline else f"{1 - r['steps'] / baseline['steps']:.1%}"
    batch = (f"{baseline['batch']:,} → {r['largest_batch']:,} (max {r['batch']:,})"
             if r["grows"] else f"{r['batch']:,}")
    quality = ("stopped (diverged) | " if r.get("stopped")
               else f"{r['eval_loss']:.4f} | {r['bits_per_byte']:.3f}")
    lines.append(
        f"| {r['run']} | {batch} | {r['steps']:,} | {predicted} | {r['tokens']:,} "
        f"| {r['tokens'] / baseline['tokens']:.2f} | {quality} | {r['wall_seconds']:.0f} "
        f"| {saved} | {r['guard_skipped']} |")
  return "\n".join(lines)


def run_job(args, seed: int, workdir: str) -> dict:
  """Every run of the comparison for one seed in `workdir`; its results (also written there)."""
  scales = [int(s) for s in args.scales.split(",") if s]
  grow_to = [int(s) for s in args.grow_to.split(",") if s]
  started = time.perf_counter()
  rows, measured = [], []
  for name, config in variants(args.config, scales, seed, not args.no_progress,
                               args.gain_rule, grow_to, args.eval_every_steps):
    run_dir = os.path.join(workdir, name.replace(" ", "_"))
    noise = None
    if measured and config.strategy == "adaptive":  # DATE predicts from the whole profile
      noise = filled_profile(measured)
    elif measured and config.batch_size is not None:
      noise = effective_noise_scale(measured, config.baseline.batch_size, config.batch_size)
    rows.append(run_one(name, config, run_dir, noise))
    if rows[-1].get("stopped"):
      rows[-1]["examples_vs_baseline"] = rows[-1]["examples"] / rows[0]["examples"]
      rows[-1]["epochs"] = rows[-1]["examples"] / rows[0]["examples"] * rows[0]["epochs"]
    if name == "baseline":
      measured = measured_noise_scales(read_metrics(run_dir))
      print(f"\nbaseline: measured noise scale B_noise median {finite_median(measured):,.0f} "
            f"examples ({sum(map(math.isinf, measured))} of {len(measured)} logs: signal ≤ 0)\n",
            flush=True)
  total = time.perf_counter() - started
  noise = finite_median(measured)
  summary = (f"{markdown_table(rows)}\n\nseed {seed}; baseline B_noise median {noise:,.0f} "
             f"(DATE's predictions: the law on the baseline's logged B_noise profile, read "
             f"× (B/B0)^α at each batch B); "
             f"whole job {total:.0f} s")
  print("\n" + summary)
  results = {"seed": seed, "noise_scale": noise, "seconds": total, "runs": rows}
  _write(os.path.join(workdir, "results.md"), summary + "\n")
  _write(os.path.join(workdir, "results.json"), json.dumps(results, indent=2))
  curves = {r["run"]: r["workdir"] for r in rows}
  if is_language_model(rows):  # validation loss against steps and against tokens
    title = f"{os.path.basename(args.config)}: validation loss (seed {seed})"
    figure = dict(key="eval/loss", x=("step", "eval/tokens_seen"))
    name = "eval_loss.png"
  else:
    title = f"{os.path.basename(args.config)}: eval accuracy (seed {seed})"
    figure, name = {}, "eval_accuracy.png"
  for path in filter(None, [os.path.join(workdir, name), args.figure]):
    plots.plot_eval_curves(curves, path, title=title, **figure)
    print(f"wrote {path}")
  return results


def _write(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def seed_results(args, seed: int) -> dict:
  """One seed of a multi-seed job (in <workdir>/<gain rule>/seed<N>), or its saved results:
  an interrupted multi-seed job resumes at the first seed without `results.json`."""
  workdir = os.path.join(args.workdir, args.gain_rule, f"seed{seed}")
  path = os.path.join(workdir, "results.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  return run_job(args, seed, workdir)


def _mean_std(values: list[float]) -> tuple[float, float]:
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def seeds_table(per_seed: list[dict]) -> str:
  """Mean ± std over seeds of every run's accuracy, steps and examples, and the bars."""
  seeds = ",".join(str(s["seed"]) for s in per_seed)
  names = [r["run"] for r in per_seed[0]["runs"]]
  by_name = {n: [next(r for r in s["runs"] if r["run"] == n) for s in per_seed] for n in names}
  if is_language_model(per_seed[0]["runs"]):
    return language_model_seeds_table(by_name, seeds)
  lines = [f"| run ({len(per_seed)} seeds: {seeds}) | batch | eval accuracy | steps "
           f"| predicted steps | examples × baseline | guard skips (total) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for name, rows in by_name.items():
    stopped = _stopped_count(rows)
    accuracy = f"stopped (diverged) in {stopped} of {len(rows)}"
    if not stopped:
      accuracy = "{:.2f} ± {:.2f}%".format(*_mean_std([100 * r["accuracy"] for r in rows]))
    steps, steps_sd = _mean_std([r["steps"] for r in rows])
    predicted = [r["predicted_steps"] for r in rows if r["predicted_steps"] is not None]
    shown = f"{statistics.mean(predicted):,.0f}" if predicted else ""
    examples = statistics.mean(r["examples_vs_baseline"] for r in rows)
    lines.append(f"| {name} | {rows[0]['batch']:,} | {accuracy} "
                 f"| {steps:,.0f} ± {steps_sd:,.0f} | {shown} | {examples:.2f} "
                 f"| {sum(r['guard_skipped'] for r in rows)} |")
  return "\n".join(lines + [""] + bar_lines(by_name))


def language_model_seeds_table(by_name: dict[str, list[dict]], seeds: str) -> str:
  """Mean ± std over seeds of the validation loss, steps and tokens, and the LM bars."""
  count = len(next(iter(by_name.values())))
  lines = [f"| run ({count} seeds: {seeds}) | batch | validation loss (nats) | bits per byte "
           f"| steps | tokens × baseline | guard skips (total) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  base_tokens = statistics.mean(r["tokens"] for r in by_name["baseline"])
  for name, rows in by_name.items():
    stopped = _stopped_count(rows)
    quality = f"stopped (diverged) in {stopped} of {len(rows)} | "
    if not stopped:
      quality = "{:.4f} ± {:.4f} | ".format(*_mean_std([r["eval_loss"] for r in rows]))
      quality += f"{statistics.mean(r['bits_per_byte'] for r in rows):.3f}"
    steps, steps_sd = _mean_std([r["steps"] for r in rows])
    tokens = statistics.mean(r["tokens"] for r in rows) / base_tokens
    lines.append(f"| {name} | {rows[0]['batch']:,} | {quality} | {steps:,.0f} ± {steps_sd:,.0f} "
                 f"| {tokens:.2f} | {sum(r['guard_skipped'] for r in rows)} |")
  return "\n".join(lines + [""] + language_model_bar_lines(by_name))


def language_model_bar_lines(by_name: dict[str, list[dict]]) -> list[str]:
  """DATE's runs against the text workload's bar, on the means over seeds: validation loss
  within 1% of the baseline's (or lower), ≤ 1/8 of its steps, a grown batch ≤ 2.5× its tokens."""
  base_loss = statistics.mean(r["eval_loss"] for r in by_name["baseline"])
  base_steps = statistics.mean(r["steps"] for r in by_name["baseline"])
  base_tokens = statistics.mean(r["tokens"] for r in by_name["baseline"])
  lines = []
  for name, rows in by_name.items():
    if not name.startswith("DATE adaptive"):
      continue
    bar = (f"≤ +{LOSS_TOLERANCE:.0%} loss, ≤ {STEP_SHARE_BAR:.3f} of the steps"
           + (f", ≤ {GROWN_TOKENS_BAR}× the tokens" if rows[0]["grows"] else ""))
    if _stopped_count(rows):
      lines.append(f"- {name}: stopped by the divergence watch in {_stopped_count(rows)} of "
                   f"{len(rows)} seeds (bar: {bar}): NOT met")
      continue
    loss = statistics.mean(r["eval_loss"] for r in rows) / base_loss - 1
    fraction = statistics.mean(r["steps"] for r in rows) / base_steps
    tokens = statistics.mean(r["tokens"] for r in rows) / base_tokens
    met = (loss <= LOSS_TOLERANCE and fraction <= STEP_SHARE_BAR
           and (tokens <= GROWN_TOKENS_BAR or not rows[0]["grows"]))
    lines.append(f"- {name}: validation loss {loss:+.2%} vs the baseline, {fraction:.3f} of its "
                 f"steps, {tokens:.2f}× its tokens (bar: {bar}): {'met' if met else 'NOT met'}")
  return lines


def bar_lines(by_name: dict[str, list[dict]]) -> list[str]:
  """DATE adaptive's runs against their bars, on the means over seeds.

  Fixed batch: within 1.0 point of the baseline, in <= 1/4 of its
  steps at 16x and <= 1/10 at 64x. Grown batch: within 1.0 point,
  <= 1/8 of the steps and <= 2.5x the examples.
  """
  base_acc = statistics.mean(100 * r["accuracy"] for r in by_name["baseline"])
  base_steps = statistics.mean(r["steps"] for r in by_name["baseline"])
  lines = []
  for name, rows in by_name.items():
    if not name.startswith("DATE adaptive"):
      continue
    acc = statistics.mean(100 * r["accuracy"] for r in rows) - base_acc
    fraction = statistics.mean(r["steps"] for r in rows) / base_steps
    examples = statistics.mean(r["examples_vs_baseline"] for r in rows)
    if rows[0]["grows"]:
      bar = "≤ 0.125 of the steps, ≤ 2.5× the examples"
      met = fraction <= 1 / 8 and examples <= 2.5
    else:
      step_bar = FIXED_BATCH_STEP_BAR.get(int(re.search(r"(\d+)x", name).group(1)))
      bar = "" if step_bar is None else f"≤ {step_bar:.3f} of the steps"
      met = step_bar is None or fraction <= step_bar
    verdict = "met" if met and acc >= -1.0 else "NOT met"
    bar = f"≥ −1.0 point, {bar}" if bar else "≥ −1.0 point"
    stopped = _stopped_count(rows)
    if stopped:  # a stopped seed has no accuracy: the bar is missed, whatever the others did
      lines.append(f"- {name}: stopped by the divergence watch in {stopped} of {len(rows)} "
                   f"seeds (bar: {bar}): NOT met")
      continue
    lines.append(f"- {name}: {acc:+.2f} points vs the baseline, {fraction:.3f} of its steps, "
                 f"{examples:.2f}× its examples (bar: {bar}): {verdict}")
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/mnist1d_lstm.py")
  parser.add_argument("--workdir", default="runs/mnist1d_lstm")
  parser.add_argument("--scales", default="16",
                      help="comma-separated batch multiples of the baseline, e.g. 16,64")
  parser.add_argument("--grow-to", default="64",
                      help="comma-separated maxima (multiples of the baseline) of DATE runs "
                           "whose batch grows with the noise scale; '' for none")
  parser.add_argument("--seeds", "--seed", default="0",
                      help="a seed, or comma-separated seeds: each runs in "
                           "<workdir>/<gain rule>/seed<N>, then mean ± std and the bars")
  parser.add_argument("--gain-rule", default="linear", choices=["linear", "sqrt"],
                      help="DATE adaptive's LR rule: × r_t or × √r_t")
  parser.add_argument("--eval-every-steps", type=int, default=15,
                      help="the large-batch runs' eval cadence (the baseline keeps its config's)")
  parser.add_argument("--figure", default=None, help="also save the PNG here")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  try:
    seeds = [int(s) for s in args.seeds.split(",")]
  except ValueError:
    parser.error(f"--seeds must be comma-separated ints; got {args.seeds!r}")
  if len(seeds) == 1:
    run_job(args, seeds[0], args.workdir)
    return
  table = seeds_table([seed_results(args, seed) for seed in seeds])
  print("\n" + table)
  _write(os.path.join(args.workdir, args.gain_rule, "seeds.md"), table + "\n")


if __name__ == "__main__":
  main()
