"""McCandlish's law on one DATE run's own noise readings, at several step prices.

Does a grown run sit on the steps-against-examples frontier of the noise scale it
measured, and what would another `step_price` have bought? For each run folder
(a trainer workdir with `metrics.jsonl` and `recipe.json`), the profile of
B_noise over the baseline's progress that the run logged is played out by
`planner_lib.plan_predicted_budget` with the run's planned recipe at each price, beside
what the run took. The play-out climbs from the first step (no plateau), so it
is a frontier of the readings, not a replay of the run (notes/batch_growth.md).

  python research/date_grow_probe.py configs/study_mnist1d_lstm.py 32 grow 0 --workdir runs/g32
  python scripts/price_frontier.py runs/g32 --prices 0.5,0.7,1,1.4

Any trainer workdir of a DATE run will do (`research/date_grow_probe.py`'s `--workdir`, or a
study's `<outdir>/runs/<cell>`).

The law assumes a batch-free noise scale. `--readings-at` checks that assumption instead:
the B_noise each run logged nearest each given progress (in baseline steps), with the batch
it had there. Runs at different batches then show whether a larger batch reads more
(notes/batch_growth.md, "Where the grown ResNet loses its steps": the study ResNet does,
1.1-1.25x a doubling):

  python scripts/price_frontier.py docs/growth_study/runs/resnet_adaptive_*_seed0 \
      --readings-at 300,1000,3000,6000

(the run folders the growth study's command in `docs/results/growth_study.md` writes; they
are not kept in git).

`--climbs` checks it within one grown run, where the state is the same on both sides of a
climb: at each climb past step 100, the B_noise logged 40 steps into the new rung against the
one logged at the climb, divided by the run's own trend over the 40 steps before, scaled to
the progress each stretch covered (notes/batch_growth.md, "The batch trend at a climb, within
one run"):

  python scripts/price_frontier.py docs/growth_study/runs/lstm_adaptive_grow_* \
      --climbs

`--loss-against BASELINE` (with `--readings-at`) asks what the credited progress bought: each
run's training loss nearest each progress point (a median over 5 logged rows), and the
progress at which the baseline's run reached that loss (its first logged median at or below
it). A ratio above 1: the run is ahead of its credit (notes/batch_growth.md, "What the credit
buys in loss", in "two other readings of the critical batch"). Read it early in the run: once
the baseline's logged loss (one small batch's) sits at its noise floor, every later match
saturates there:

  python scripts/price_frontier.py docs/growth_study/runs/lstm_adaptive_*_seed0 \
      --readings-at 200,400,800,1600,3200 \
      --loss-against docs/growth_study/runs/lstm_baseline_1x_seed0
"""

import argparse
import math
import statistics

from dateopt.study import filled_profile, progress_profile, read_as_largest, read_run
from dateopt.study.report import LAW_POINTS
from dateopt.date import _planner as planner_lib


def _read(folder: str):
  """The run's (recipe, metric rows), or an error that says what a run folder holds."""
  run = read_run(folder)
  if run is None:
    raise FileNotFoundError(f"{folder}: needs recipe.json and metrics.jsonl (a trainer workdir).")
  return run


def run_frontier(folder: str, prices: list[float]) -> dict:
  """What the run in `folder` took, and the law's play-out of its readings at each price."""
  recipe, rows = _read(folder)
  profile = filled_profile(progress_profile(read_as_largest(rows, recipe), recipe.total_steps,
                                            quarters=LAW_POINTS)["noise_scale"])
  finished = [r for r in rows if "run/steps" in r]
  if not finished:
    raise ValueError(f"{folder}: metrics.jsonl has no run/steps summary; the run did not finish.")
  last = finished[-1]
  law = {price: planner_lib.plan_predicted_budget(recipe.replace(engine=dict(recipe.engine, step_price=price)), profile,
                                          read_at_batch_size=recipe.batch_size)
         for price in prices}
  return {"run": folder, "price": recipe.engine["step_price"], "steps": int(last["run/steps"]),
          "examples_vs_baseline": float(last["run/examples_vs_baseline"]), "law": law}


def readings_at(folder: str, points: list[float]) -> list[tuple[float, int] | None]:
  """(B_noise, batch) of the logged row nearest each progress point; None: nothing measured."""
  measured = [r for r in _read(folder)[1] if "train/date/progress" in r
              and math.isfinite(float(r.get("train/date/noise_scale") or math.nan))]
  if not measured:
    return [None] * len(points)
  nearest = [min(measured, key=lambda r, p=p: abs(float(r["train/date/progress"]) - p))
             for p in points]
  return [(float(r["train/date/noise_scale"]), int(r["train/batch_size"])) for r in nearest]


def readings_markdown(folders: list[str], points: list[float]) -> str:
  """One row per run: B_noise@batch nearest each progress point."""
  lines = ["| run | " + " | ".join(f"τ {p:,g}" for p in points) + " |",
           "|---|" + "---|" * len(points)]
  for folder in folders:
    cells = [f"{r[0]:,.0f}@{r[1]:,}" if r else "" for r in readings_at(folder, points)]
    lines.append(f"| {folder} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


# Climbs earlier than this are the plateau's early ones, on readings that are not resolved.
CLIMB_FROM_STEP = 100


def climb_excesses(folder: str) -> list[tuple[int, int, int, float]]:
  """(step, from batch, to batch, excess) for each climb of the run past `CLIMB_FROM_STEP`.

  The excess is the reading's jump across the climb (the old rung's last log to the new
  rung's second) over the run's trend in the two logs before it (40 steps, the study's
  cadence), scaled to the progress each stretch covered: the batch's own share of the jump,
  1 where the batch changes nothing the run reads.
  """
  rows = [r for r in _read(folder)[1] if "train/date/progress" in r and "train/batch_size" in r]
  out = []
  for i in range(3, len(rows) - 1):
    before, old, new, after = rows[i - 3], rows[i - 1], rows[i], rows[i + 1]
    if new["train/batch_size"] <= old["train/batch_size"] or old["step"] < CLIMB_FROM_STEP:
      continue
    noise = [r.get("train/date/noise_scale") for r in (before, old, after)]
    if after["train/batch_size"] != new["train/batch_size"] or not all(noise):
      continue
    tau = [float(r["train/date/progress"]) for r in (before, old, after)]
    trend, jump = noise[1] / noise[0], noise[2] / noise[1]
    excess = jump / trend ** ((tau[2] - tau[1]) / (tau[1] - tau[0]))
    out.append((int(new["step"]), int(old["train/batch_size"]), int(new["train/batch_size"]),
                excess))
  return out


def climbs_markdown(folders: list[str]) -> str:
  """One row per climb, and the median excess over all of them."""
  lines = ["| run | step | batch | excess |", "|---|---:|---|---:|"]
  excesses = []
  for folder in folders:
    for step, old, new, excess in climb_excesses(folder):
      lines.append(f"| {folder} | {step:,} | {old:,} → {new:,} | {excess:.2f} |")
      excesses.append(excess)
  if excesses:
    lines.append(f"\n{len(excesses)} climbs, median excess {statistics.median(excesses):.2f} "
                 f"(range {min(excesses):.2f}-{max(excesses):.2f})")
  return "\n".join(lines)


# The loss is logged every 20 steps (the study's cadence), each row one step's batch: the median
# over this many rows, centred on a row, smooths it.
LOSS_WINDOW = 5


def smoothed_losses(rows: list[dict]) -> list[tuple[float, float, int]]:
  """(progress, median loss over the window centred there, batch) of each logged training row.

  Progress is the DATE run's `train/date/progress`, or the step for a run that has none (the
  baseline).
  """
  logged = [r for r in rows if "train/loss" in r]
  half = LOSS_WINDOW // 2
  return [(float(r.get("train/date/progress", r["step"])),
           statistics.median(float(x["train/loss"]) for x in logged[max(0, i - half):i + half + 1]),
           int(r.get("train/batch_size", 0))) for i, r in enumerate(logged)]


def loss_matched(folder: str, baseline: str, points: list[float]
                 ) -> list[tuple[float, float, float, int] | None]:
  """(progress, loss, the baseline's progress at that loss, batch) nearest each point.

  The baseline's progress is that of its first smoothed row at or below the loss (inf: it
  never got there); None: the run logged no loss.
  """
  base = smoothed_losses(_read(baseline)[1])
  run = smoothed_losses(_read(folder)[1])
  out = []
  for point in points:
    if not run:
      out.append(None)
      continue
    tau, loss, batch = min(run, key=lambda r: abs(r[0] - point))
    reached = next((t for t, base_loss, _ in base if base_loss <= loss), math.inf)
    out.append((tau, loss, reached, batch))
  return out


def loss_matched_markdown(folders: list[str], baseline: str, points: list[float]) -> str:
  """One row per run: loss → the baseline's progress at it (× the run's credited progress)."""
  lines = ["| run | " + " | ".join(f"τ {p:,g}" for p in points) + " |",
           "|---|" + "---|" * len(points)]
  for folder in folders:
    cells = [f"{m[1]:.3f}@{m[3]:,} → {m[2]:,.0f} ({m[2] / m[0]:.2f}x)" if m else ""
             for m in loss_matched(folder, baseline, points)]
    lines.append(f"| {folder} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _numbers(parser, flag: str, text: str) -> list[float]:
  """The comma-separated numbers > 0 of `flag`, or the parser's error."""
  try:
    values = [float(v) for v in text.split(",") if v]
  except ValueError:
    values = []
  if not values or any(not v > 0 for v in values):
    parser.error(f"{flag} must be numbers > 0; got {text!r}")
  return values


def markdown(results: list[dict], prices: list[float]) -> str:
  """One row per run: its price, what it took, the law at each price (steps, examples ×)."""
  head = "| run | its price | took | " + " | ".join(f"law at price {p:g}" for p in prices) + " |"
  lines = [head, "|---|---:|---|" + "---|" * len(prices)]
  for r in results:
    law = " | ".join(f"{r['law'][p]['steps']:,}, {r['law'][p]['examples_vs_baseline']:.2f}x"
                     for p in prices)
    lines.append(f"| {r['run']} | {r['price']:g} | {r['steps']:,}, "
                 f"{r['examples_vs_baseline']:.2f}x | {law} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="trainer workdirs of DATE adaptive runs")
  parser.add_argument("--prices", default="0.5,0.7,1,1.4,2",
                      help="comma-separated step prices to play out (each > 0)")
  parser.add_argument("--readings-at", default=None,
                      help="comma-separated progress points (baseline steps, each > 0): print "
                           "each run's B_noise@batch nearest them instead of the law")
  parser.add_argument("--climbs", action="store_true",
                      help="print each climb's batch share of the B_noise jump (grown runs) "
                           "instead of the law")
  parser.add_argument("--loss-against", default=None, metavar="BASELINE",
                      help="with --readings-at: each run's loss at the points, and the "
                           "progress at which the baseline run BASELINE reached it")
  args = parser.parse_args()
  if args.loss_against is not None:
    if args.readings_at is None:
      parser.error("--loss-against needs --readings-at (the progress points to read)")
    points = _numbers(parser, "--readings-at", args.readings_at)
    print(loss_matched_markdown(args.runs, args.loss_against, points))
    return
  if args.climbs:
    print(climbs_markdown(args.runs))
    return
  if args.readings_at is not None:
    print(readings_markdown(args.runs, _numbers(parser, "--readings-at", args.readings_at)))
    return
  prices = _numbers(parser, "--prices", args.prices)
  print(markdown([run_frontier(folder, prices) for folder in args.runs], prices))


if __name__ == "__main__":
  main()
