#!/usr/bin/env python3
"""Final Polishing study: which batch-norm statistics fit clean evaluation data best?

A batch-norm ResNet is trained at a large batch (DATE-planned from a batch-32
baseline) on augmented data (configs/polish_mnist1d_resnet.py), per seed twice:
  - without polishing: evaluated as trained ("none"), then with precise BN on
    clean batches ("precise_bn_clean") and on weakly augmented ones
    ("precise_bn_weak", Merchant, Zoph & Cubuk 2020);
  - with the paper's final epochs on evaluation-style data ("final_epochs",
    Kasagi et al. HPDC 2020), then with precise BN on top ("both_clean",
    "both_weak").
Precise BN is the library's `polish_batch_stats`, applied to each run's final
weights, so the arms of one training run share their weights exactly.

Rows go to OUTDIR/runs.jsonl as each run finishes (a rerun skips finished
runs); the report (results.md, results.csv) is written at the end.

  python scripts/polish_study.py                          # 3 seeds, ~5 min on 2 CPU cores
  python scripts/polish_study.py --report-only --outdir docs/polish_study
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time

from dateopt import configs, strict_json

ARMS = ("none", "precise_bn_clean", "precise_bn_weak", "final_epochs", "both_clean",
        "both_weak")
# Each training run: (the arm as trained, the prefix of its precise-BN arms).
TRAININGS = {"none": ("none", "precise_bn"), "final_epochs": ("final_epochs", "both")}
DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs",
                              "polish_mnist1d_resnet.py")


def shrink(config) -> None:
  """--quick: a few hundred examples and two epochs, to check the script end to end."""
  config.dataset_kwargs.num_samples = 1_000
  config.baseline.num_epochs = 4
  config.batch_size = 128
  config.polish.batches = 2


def train_once(config, seed: int, training: str, workdir: str) -> list[dict]:
  """One training run and its arms: as trained, then precise BN on clean and weak data."""
  from dateopt import train
  from dateopt.train import polish

  config = config.copy_and_resolve_references()
  config.seed = seed
  config.polish.mode = training
  config.overwrite = True  # a rerun of a seed replaces its run
  started = time.perf_counter()
  result = train.train_and_evaluate(config, workdir)
  exp = train.build_experiment(config)
  eval_fn = train.make_eval_fn(exp)
  trained_as, precise_prefix = TRAININGS[training]
  common = {"seed": seed, "training": training, "steps": result.steps,
            "batch_size": result.recipe.batch_size,
            "train_loss": _number(result.train_metrics.get("loss")),
            "guard_skipped": _number(result.train_metrics.get("guard/num_skipped")),
            "before_final_epochs": _number(result.eval_metrics.get("before_polish_accuracy"))}
  rows = [dict(common, arm=trained_as, accuracy=float(result.eval_metrics["accuracy"]))]
  for bn_data in polish.BN_DATA:
    batches = polish.statistics_batches(exp.dataset, exp.microbatch_size,
                                        exp.polish["batches"], seed=seed, bn_data=bn_data)
    polished = polish.polish_batch_stats(exp.model, result.state, batches, mesh=exp.mesh)
    accuracy = float(train.evaluate(exp, polished, eval_fn)["accuracy"])
    rows.append(dict(common, arm=f"{precise_prefix}_{bn_data}", accuracy=accuracy,
                     **statistics_change(result.state.batch_stats, polished.batch_stats)))
  for row in rows:
    row["wall_seconds"] = time.perf_counter() - started
  return rows


def statistics_change(running, polished) -> dict[str, float]:
  """How far precise BN moved the running statistics: median relative change per channel.

  The mean's change is scaled by the running standard deviation (a shift in
  units of the spread), the variance's is |polished / running - 1|.
  """
  import numpy as np
  mean_shifts, var_ratios = [], []
  for old, new in zip(_layers(running), _layers(polished)):
    std = np.sqrt(np.asarray(old["var"]) + 1e-5)
    mean_shifts.append(np.abs(np.asarray(new["mean"]) - np.asarray(old["mean"])) / std)
    var_ratios.append(np.abs(np.asarray(new["var"]) / np.asarray(old["var"]) - 1.0))
  return {"bn_mean_shift": float(np.median(np.concatenate(mean_shifts))),
          "bn_var_change": float(np.median(np.concatenate(var_ratios)))}


def _layers(batch_stats):
  """Every BN layer's {"mean", "var"} in a fixed order."""
  if set(batch_stats) == {"mean", "var"}:
    return [batch_stats]
  return [layer for name in sorted(batch_stats) for layer in _layers(batch_stats[name])]


def _number(value) -> float | None:
  return None if value is None else float(value)  # metrics come as NumPy scalars


def read_rows(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def summarize(rows: list[dict]) -> list[dict]:
  """Mean and spread of each arm's accuracy over seeds, and its gain over "none" per seed."""
  by_arm = {arm: {r["seed"]: r["accuracy"] for r in rows if r["arm"] == arm} for arm in ARMS}
  summary = []
  for arm in ARMS:
    accuracies = list(by_arm[arm].values())
    if not accuracies:
      continue
    gains = [acc - by_arm["none"][seed] for seed, acc in by_arm[arm].items()
             if seed in by_arm["none"]]
    summary.append({
        "arm": arm, "seeds": len(accuracies), "mean": statistics.fmean(accuracies),
        "std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
        "gain_mean": statistics.fmean(gains) if gains else float("nan"),
        "gain_min": min(gains) if gains else float("nan"),
        "gain_max": max(gains) if gains else float("nan"),
        "per_seed": [round(by_arm[arm][s], 4) for s in sorted(by_arm[arm])],
        **{key: _median_or_none([r.get(key) for r in rows if r["arm"] == arm])
           for key in ("bn_mean_shift", "bn_var_change")}})
  return summary


def _median_or_none(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def markdown(summary: list[dict], rows: list[dict]) -> str:
  lines = ["| arm | eval accuracy (mean ± std) | vs none (mean [min, max]) | per seed "
           "| BN statistics moved (mean / var) |", "| --- | --- | --- | --- | --- |"]
  for s in summary:
    gain = ("—" if s["arm"] == "none" else
            f"{100 * s['gain_mean']:+.2f} [{100 * s['gain_min']:+.2f}, {100 * s['gain_max']:+.2f}]")
    seeds = ", ".join(f"{100 * a:.2f}" for a in s["per_seed"])
    moved = ("—" if s["bn_mean_shift"] is None else
             f"{s['bn_mean_shift']:.3f} σ / {100 * s['bn_var_change']:.1f} %")
    lines.append(f"| {s['arm']} | {100 * s['mean']:.2f} ± {100 * s['std']:.2f} % | {gain} "
                 f"| {seeds} | {moved} |")
  runs = sorted({(r["seed"], r["training"]): r for r in rows}.values(),
                key=lambda r: (r["training"], r["seed"]))
  lines += ["", "| training | seed | batch | steps | final train loss | guard skips "
                "| accuracy before the final epochs |", "| --- | --- | --- | --- | --- | --- | --- |"]
  for r in runs:
    before = r.get("before_final_epochs")
    lines.append(f"| {r['training']} | {r['seed']} | {r['batch_size']} | {r['steps']} "
                 f"| {_fmt(r.get('train_loss'))} | {_fmt(r.get('guard_skipped'), '.0f')} "
                 f"| {'—' if before is None else f'{100 * before:.2f} %'} |")
  return "\n".join(lines) + "\n"


def _fmt(value, spec=".4f") -> str:
  return "—" if value is None else format(value, spec)


def write_report(rows: list[dict], outdir: str) -> str:
  summary = summarize(rows)
  with open(os.path.join(outdir, "results.csv"), "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["arm", "seeds", "mean", "std", "gain_mean", "gain_min", "gain_max"])
    for s in summary:
      writer.writerow([s[k] for k in ("arm", "seeds", "mean", "std", "gain_mean", "gain_min",
                                      "gain_max")])
  report = markdown(summary, rows)
  with open(os.path.join(outdir, "results.md"), "w", encoding="utf-8") as f:
    f.write(report)
  return report


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default=DEFAULT_CONFIG)
  parser.add_argument("--outdir", default="runs/polish_study")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--quick", action="store_true", help="a tiny end-to-end check")
  parser.add_argument("--report-only", action="store_true")
  args = parser.parse_args(argv)
  os.makedirs(args.outdir, exist_ok=True)
  rows_path = os.path.join(args.outdir, "runs.jsonl")
  rows = read_rows(rows_path)
  if not args.report_only:
    config = configs.load(args.config)
    if args.quick:
      shrink(config)
    done = {(r["seed"], r["training"]) for r in rows}
    for seed in args.seeds:
      for training in TRAININGS:
        if (seed, training) in done:
          continue
        workdir = os.path.join(args.outdir, "runs", f"{training}_seed{seed}")
        new_rows = train_once(config, seed, training, workdir)
        with open(rows_path, "a", encoding="utf-8") as f:
          f.writelines(strict_json.line(r) for r in new_rows)
        rows += new_rows
        print(f"seed {seed} {training}: " + ", ".join(
            f"{r['arm']} {100 * r['accuracy']:.2f}%" for r in new_rows), flush=True)
  print(write_report(rows, args.outdir))
  return 0


if __name__ == "__main__":
  sys.exit(main())
