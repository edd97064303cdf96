"""The main job over several seeds: mean ± std of every run, against issue 8's bar.

Runs `scripts/main_job.py`'s comparison once per seed (a seed whose
`results.json` exists is not run again, so an interrupted study resumes), then
prints, per run, the mean ± std of eval accuracy and steps, and checks DATE
adaptive against the bar: within 1.0 point of the baseline's mean accuracy, in
≤ 1/4 of its steps at 16x and ≤ 1/10 at 64x.

  python scripts/date_seeds.py --seeds 0,1,2 --scales 16,64 --workdir runs/date_seeds
  python scripts/date_seeds.py --gain-rule sqrt      # the same with lr × √r_t
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_BAR = {16: 1 / 4, 64: 1 / 10}  # issue 8: the largest fraction of the baseline's steps


def run_seed(seed: int, args) -> dict:
  workdir = os.path.join(args.workdir, args.gain_rule, f"seed{seed}")
  results = os.path.join(workdir, "results.json")
  if not os.path.exists(results):
    subprocess.run([sys.executable, os.path.join(HERE, "main_job.py"), "--config", args.config,
                    "--workdir", workdir, "--scales", args.scales, "--seed", str(seed),
                    "--gain-rule", args.gain_rule, "--no-progress"], check=True)
  with open(results, encoding="utf-8") as f:
    return json.load(f)


def mean_std(values: list[float]) -> tuple[float, float]:
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/mnist1d_lstm.py")
  parser.add_argument("--workdir", default="runs/date_seeds")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--scales", default="16,64")
  parser.add_argument("--gain-rule", default="linear", choices=["linear", "sqrt"])
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  per_seed = [run_seed(seed, args) for seed in seeds]

  names = [r["run"] for r in per_seed[0]["runs"]]
  by_name = {n: [next(r for r in s["runs"] if r["run"] == n) for s in per_seed] for n in names}
  lines = [f"| run ({len(seeds)} seeds: {args.seeds}) | batch | eval accuracy | steps "
           f"| predicted steps | guard skips (total) |", "|---|---:|---:|---:|---:|---:|"]
  for name, rows in by_name.items():
    acc, acc_sd = mean_std([100 * r["accuracy"] for r in rows])
    steps, steps_sd = mean_std([r["steps"] for r in rows])
    predicted = [r["predicted_steps"] for r in rows if r["predicted_steps"] is not None]
    shown = f"{statistics.mean(predicted):,.0f}" if predicted else ""
    lines.append(f"| {name} | {rows[0]['batch']:,} | {acc:.2f} ± {acc_sd:.2f}% "
                 f"| {steps:,.0f} ± {steps_sd:,.0f} | {shown} "
                 f"| {sum(r['guard_skipped'] for r in rows)} |")
  print("\n".join(lines) + "\n")

  base_acc = statistics.mean(100 * r["accuracy"] for r in by_name["baseline"])
  base_steps = statistics.mean(r["steps"] for r in by_name["baseline"])
  for name, rows in by_name.items():
    if not name.startswith("DATE adaptive"):
      continue
    k = int(re.search(r"(\d+)x", name).group(1))
    acc = statistics.mean(100 * r["accuracy"] for r in rows)
    fraction = statistics.mean(r["steps"] for r in rows) / base_steps
    bar = STEP_BAR.get(k)
    verdict = ("met" if acc >= base_acc - 1.0 and (bar is None or fraction <= bar)
               else "NOT met")
    print(f"- {name}: {acc - base_acc:+.2f} points vs the baseline, {fraction:.3f} of its steps"
          f" (bar: ≥ −1.0 point{'' if bar is None else f', ≤ {bar:.3f} of the steps'}): "
          f"{verdict}")


if __name__ == "__main__":
  main()
