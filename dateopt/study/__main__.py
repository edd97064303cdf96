"""The batch-scaling study: DATE adaptive against the static rules, B0·{1..64}, with plots.

Every run starts from the workload's frozen baseline recipe (`dateopt/configs/study_*`);
see `dateopt.study` for the grid. Finished runs are kept in
`<outdir>/cells.jsonl`, so an interrupted study resumes where it stopped (run
it again with the same arguments). Writes `<outdir>/results.csv` (every run),
`results.md` (the tables and the bar) and `<outdir>/<workload>_*.png`, for every
workload with finished runs in the outdir (a study run one `--workload` at a time
reports them all).

  python -m dateopt.study                        # both workloads, the full grid
  python -m dateopt.study --workload lstm --quick --outdir runs/study_quick
  python -m dateopt.study --report-only          # tables and plots from cells.jsonl
  python -m dateopt.study --workload lm --multiples 8,16,32,64 --static-seeds 3 \
      --strategies baseline,adaptive,adaptive_grow,legw --outdir runs/lm_scaling
                                                 # the Transformer LM's grid, 3 seeds each
  python -m dateopt.study --compare --workload lstm --outdir docs/schedule_study
                                                 # DATE against the field's batch schedules
  python -m dateopt.study --ablate all --workload lstm --outdir runs/schedule_study
                                                 # what each engine rule buys

(`python scripts/scaling_study.py` is the same command.)
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time

import jax
from absl import logging

from dateopt import configs as configs_lib
from dateopt.metrics_io import read_metrics
from dateopt.study import ablation, cells, compare, figures, report as report_lib
from dateopt.study.runner import Study

WORKLOADS = {
    "lstm": "study_mnist1d_lstm",
    "resnet": "study_mnist1d_resnet",
    "lm": "study_lm_shakespeare",
}
QUICK_MULTIPLES = (1, 4)
QUICK_BASE_STEPS = 300  # the baseline's steps in --quick (its schedule shrunk in time)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="lstm,resnet",
                      help=f"comma-separated, from {sorted(WORKLOADS)}")
  parser.add_argument("--config", action="append", default=[], metavar="NAME=PATH",
                      help="a workload's config file or packaged name (default: study_*)")
  parser.add_argument("--outdir", default="runs/scaling_study")
  parser.add_argument("--multiples", default="1,2,4,8,16,32,64")
  parser.add_argument("--seeds", type=int, default=3,
                      help="how many seeds the baseline and DATE run: 0, 1, ..., N-1")
  parser.add_argument("--static-seeds", type=int, default=1,
                      help="how many seeds the static rules (and LEGW at DATE's steps) run")
  parser.add_argument("--strategies", default=None,
                      help="comma-separated subset of the grid's strategies (default: all); "
                           "with --ablate, of DATE's: adaptive, adaptive_grow")
  parser.add_argument("--rerun", default="",
                      help="comma-separated strategies whose finished runs are dropped and run "
                           "again (after a change to DATE, say)")
  parser.add_argument("--quick", action="store_true",
                      help=f"batches B0·{QUICK_MULTIPLES}, 1 seed, a {QUICK_BASE_STEPS}-step "
                           "baseline: a smoke test of the whole pipeline")
  parser.add_argument("--compare", action="store_true",
                      help="DATE against the field's batch schedules at the largest of "
                           "--multiples (dateopt.study.compare): each method's sweep, 3 seeds "
                           "of its best run; use its own --outdir")
  parser.add_argument("--methods", default=None,
                      help="--compare: comma-separated subset of "
                           f"{','.join(compare.METHODS)} (default: all)")
  parser.add_argument("--budgets", default="1,2,3",
                      help="--compare: the swept methods' budgets, in examples × the baseline's")
  parser.add_argument("--ablate", default=None, metavar="RULES",
                      help="DATE's engine rules switched off one at a time at the largest of "
                           "--multiples, fixed and grown, --seeds seeds (dateopt.study.ablation): "
                           f"'all' or comma-separated, from {','.join(ablation.ENGINE_RULES)}; "
                           "the --compare outdir shares its runs")
  parser.add_argument("--report-only", action="store_true",
                      help="no training: tables and plots from the finished runs")
  parser.add_argument("--figures", default=None, help="also copy the PNGs to this folder")
  parser.add_argument("--no-progress", action="store_true")
  parser.add_argument("--adam-scaling", default=None,
                      help="every plan's adam_scaling (date.plan's adam_scaling: b2, eps, "
                           "weight_decay, comma-separated); use a fresh --outdir")
  return parser.parse_args(argv)


def shrink_in_time(config, base_steps: int, num_train_examples: int):
  """--quick: the same recipe over `base_steps` baseline steps (epochs and warmup scaled)."""
  epochs = float(config.baseline.num_epochs)
  factor = base_steps * config.baseline.batch_size / num_train_examples / epochs
  warmup = float(config.baseline.get("warmup_epochs", 0.0))
  config.baseline = dict(config.baseline.to_dict(), num_epochs=epochs * factor,
                         warmup_epochs=warmup * factor)  # a new dict: ConfigDict fixes types
  return config


def config_paths(args) -> dict[str, str]:
  """{workload: config file or packaged name}: the study's own, and `--config`'s."""
  paths = dict(WORKLOADS)
  for item in args.config:
    name, _, path = item.partition("=")
    if not path:
      raise SystemExit(f"--config takes NAME=PATH; got {item!r}")
    paths[name] = path
  return paths


def workload_configs(args):
  paths = config_paths(args)
  names = [w for w in args.workload.split(",") if w]
  unknown = [w for w in names if w not in paths]
  if unknown:
    raise SystemExit(f"--workload: unknown {unknown}; known: {sorted(paths)}")
  configs = {name: configs_lib.load(paths[name]) for name in names}
  if args.adam_scaling:
    for config in configs.values():
      config.plan = dict(config.plan.to_dict(),
                         adam_scaling=tuple(r for r in args.adam_scaling.split(",") if r))
  return configs


def report_study(args, runner: Study) -> Study:
  """`runner` with the configs of every workload that has finished runs in the outdir, not only
  `--workload`'s: a study run one workload at a time into one outdir reports them all. A
  workload the study has no config for is left out, with a line that says how to add it."""
  configs, paths = dict(runner.configs), config_paths(args)
  added = []
  for name in sorted({row["workload"] for row in runner.rows()} - set(configs)):
    if name not in paths:
      print(f"{name}: its runs in {runner.results_path} are not in the report "
            f"(no config: --config {name}=PATH)")
      continue
    configs[name] = configs_lib.load(paths[name])
    added.append(name)
  reported = Study(runner.outdir, configs)
  for name in added if args.quick else ():
    shrink_in_time(configs[name], QUICK_BASE_STEPS, reported.num_train_examples(name))
  return reported


def report(runner: Study, outdir: str, copy_to: str | None) -> str:
  """results.csv, results.md and the figures in `outdir` (copied to `copy_to`); the text."""
  every = [row for row in runner.rows() if row["workload"] in runner.configs
           and not ablation.is_ablation(row)]
  rows = [row for row in every if not row.get("gave_up")]
  if not rows:
    raise SystemExit(f"no finished runs in {runner.results_path}")
  summary = report_lib.summarize(rows)
  report_lib.write_csv(rows, os.path.join(outdir, "results.csv"))
  text = report_lib.markdown_report(summary)
  language_models = report_lib.language_model_report(summary)
  if language_models:
    text = "### Language models: validation loss\n\n" + language_models + "\n\n" + text
  machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
  profiles = report_lib.profile_report(runner, rows)
  if profiles:
    text += "\n\n" + profiles
  growth = report_lib.growth_report(rows)
  if growth:
    text += "\n\n### DATE adaptive, batch grown against fixed, at the same maximum\n\n" + growth
  law = report_lib.law_report(runner, rows)
  if law:
    text += ("\n\n### McCandlish's law on the noise-scale profile each strategy measured\n\n"
             + law)
  predictions = report_lib.prediction_report(runner, rows)
  if predictions:
    text += ("\n\n### DATE's predictions from the baseline's noise-scale profile, before "
             "training\n\n" + predictions)
  text += unplannable_report(runner) + gave_up_report(every)
  text += f"\n\nMachine: {machine}, JAX {jax.__version__} on {jax.devices()[0].platform}."
  with open(os.path.join(outdir, "results.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  for workload in sorted({e["workload"] for e in summary}):
    entries = [e for e in summary if e["workload"] == workload]
    paths = _quality_figures(entries, [r for r in rows if r["workload"] == workload], outdir)
    noise = next(e["noise_scale_median"] for e in entries if e["strategy"] == "baseline")
    paths.append(figures.plot_steps_vs_examples(
        entries, os.path.join(outdir, f"{workload}_tradeoff.png"), noise_scale=noise,
        title=f"{workload}: DATE's steps/examples trade-off"))
    if any(r["strategy"] == "adaptive_grow" for r in rows if r["workload"] == workload):
      paths.append(figures.plot_growth_pareto(
          [r for r in rows if r["workload"] == workload],
          os.path.join(outdir, f"{workload}_pareto.png"),
          title=f"{workload}: DATE's steps against examples, fixed and grown batches"))
    _copy_figures(paths, copy_to, prefix="study_")
  return text


def _quality_figures(entries, rows, outdir: str) -> list[str]:
  """A classifier's accuracy against batch and steps to the baseline's accuracy − 1 point; a
  language model's validation loss against batch, and its curves against steps and tokens."""
  workload = entries[0]["workload"]
  path = lambda name: os.path.join(outdir, f"{workload}_{name}.png")
  if any("loss" in e for e in entries):
    return [figures.plot_loss_vs_batch(entries, path("loss"),
                                       title=f"{workload}: validation loss vs batch"),
            figures.plot_loss_curves(rows, path("curves"), title=(
                f"{workload}: validation loss against steps and tokens (seed 0)"))]
  noise = next(e["noise_scale_median"] for e in entries if e["strategy"] == "baseline")
  return [figures.plot_accuracy_vs_batch(entries, path("accuracy"),
                                         title=f"{workload}: accuracy vs batch"),
          figures.plot_steps_to_target(entries, path("steps"), noise_scale=noise, title=(
              f"{workload}: steps to the baseline's accuracy − 1 point"))]


def _copy_figures(paths, copy_to: str | None, *, prefix: str) -> None:
  """--figures: the PNGs copied there, each name with `prefix`."""
  if not copy_to:
    return
  os.makedirs(copy_to, exist_ok=True)
  for path in paths:
    shutil.copy(path, os.path.join(copy_to, prefix + os.path.basename(path)))


def compare_report(runner: Study, outdir: str, copy_to: str | None) -> str:
  """--compare: results.csv, results.md and one frontier figure per workload; the text."""
  every = [_with_health(runner, row) for row in runner.rows()
           if row["workload"] in runner.configs and not ablation.is_ablation(row)]
  rows = [row for row in every if not row.get("gave_up")]
  if not rows:
    raise SystemExit(f"no finished runs in {runner.results_path}")
  report_lib.write_csv(rows, os.path.join(outdir, "results.csv"),
                       columns=cells.CSV_COLUMNS[:4] + ("setting", "budget")
                       + cells.CSV_COLUMNS[4:])
  multiple = max((r["multiple"] for r in rows), default=1)
  entries = compare.summarize_comparison(rows, multiple)
  text = compare.comparison_report(entries) + gave_up_report(every)
  health = compare.health_report(rows)
  text += "\n\n#### Each run's log: guard skips, peak LR applied, the loss's trend at the end\n\n"
  text += health
  text += unplannable_report(runner)
  machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
  text += f"\n\nMachine: {machine}, JAX {jax.__version__} on {jax.devices()[0].platform}."
  with open(os.path.join(outdir, "results.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  for workload in sorted({r["workload"] for r in rows}):
    mine = [r for r in rows if r["workload"] == workload]
    bar = compare.quality_bar(rows, workload)
    what = "validation loss ≤ baseline + 1%" if "final_loss" in mine[0] else (
        "accuracy ≥ baseline − 1 point")
    paths = [figures.plot_schedule_frontiers(
        mine, os.path.join(outdir, f"{workload}_frontiers.png"), bar=bar,
        title=f"{workload}: steps against examples, every method (filled: {what})")]
    best = [r["key"] for r in mine if r["strategy"] in ("baseline", "adaptive_grow")
            and r["seed"] == 0]
    best += [b["key"] for b in (compare.best_run(rows, workload, m) for m in compare.SWEEPS)
             if b is not None]
    paths.append(figures.plot_best_run_curves(
        mine, best, os.path.join(outdir, f"{workload}_curves.png"),
        title=f"{workload}: each method's best run, evaluated along the way"))
    _copy_figures(paths, copy_to, prefix="compare_")
  return text


def gave_up_report(rows) -> str:
  """The runs DATE's watch gave up (`cells.gave_up_row`): listed with where they stopped and
  why, and left out of every table and figure above, which count finished runs."""
  stopped = sorted((r for r in rows if r.get("gave_up")), key=lambda r: r["key"])
  if not stopped:
    return ""
  lines = [f"- `{r['key']}`: given up after {r['steps']:,} steps: {r['stopped']}"
           for r in stopped]
  return "\n\n#### Runs the watch gave up (not in the tables above)\n\n" + "\n".join(lines)


def unplannable_report(runner: Study) -> str:
  """The cells whose rule has no recipe at their batch, each with the planner's reason."""
  refused = [r for r in runner.unplannable() if r["workload"] in runner.configs]
  if not refused:
    return ""
  lines = [f"- `{r['key']}` (budget {r['budget']:g}×): {r['reason']}"
           for r in sorted(refused, key=lambda r: r["key"])]
  return ("\n\n#### Cells the rule cannot plan (not run, not counted)\n\n"
          + "\n".join(lines))


def _with_health(runner: Study, row: dict) -> dict:
  """`row` with its run's health (`cells.run_health`), read from its workdir's metrics where
  the row predates those fields and the workdir is still there."""
  if "peak_lr" in row:
    return row
  cell = cells.Cell(row["workload"], row["strategy"], row["multiple"], row["seed"],
                    row.get("setting", ""), float(row.get("budget", 1.0)))
  metrics = os.path.join(runner.workdir(cell), "metrics.jsonl")
  if not os.path.exists(metrics):
    return row
  return dict(row, **cells.run_health(read_metrics(metrics)))


def run_comparison(args, configs, runner: Study) -> None:
  """--compare: the sweep, then the other seeds of each method's best run."""
  methods = args.methods.split(",") if args.methods else compare.METHODS
  unknown = sorted(set(methods) - set(compare.METHODS))
  if unknown:
    raise SystemExit(f"--methods: unknown {unknown}; known: {', '.join(compare.METHODS)}")
  multiple = max(int(k) for k in args.multiples.split(","))
  seeds = tuple(range(max(args.seeds, 1)))
  budgets = tuple(float(b) for b in args.budgets.split(","))
  runner.run(compare.comparison_grid(list(configs), multiple=multiple, seeds=seeds,
                                     budgets=budgets, methods=methods),
             progress=not args.no_progress)
  extra = [c for c in compare.reseeded(runner.rows(), seeds=seeds[1:])
           if c.workload in configs and c.strategy in methods]
  runner.run(extra, progress=not args.no_progress)


def run_ablation(args, configs, runner: Study) -> str:
  """--ablate: the grid (`dateopt.study.ablation`), then its table in `ablation.md`."""
  rules = ablation.ENGINE_RULES if args.ablate == "all" else tuple(
      r for r in args.ablate.split(",") if r)
  unknown = sorted(set(rules) - set(ablation.ENGINE_RULES))
  if unknown:
    raise SystemExit(f"--ablate: unknown {unknown}; known: all, "
                     f"{', '.join(ablation.ENGINE_RULES)}")
  multiple = max(int(k) for k in args.multiples.split(","))
  if not args.report_only:
    methods = (tuple(m for m in args.strategies.split(",") if m) if args.strategies
               else ablation.DATE_METHODS)
    try:
      grid = ablation.ablation_grid(list(configs), rules=rules, multiple=multiple,
                                    seeds=tuple(range(max(args.seeds, 1))), methods=methods)
    except ValueError as error:
      raise SystemExit(f"--ablate with --strategies: {error}") from error
    runner.run(grid, progress=not args.no_progress)
  rows = [row for row in runner.rows() if row["workload"] in configs]
  text = ablation.ablation_report(ablation.summarize_ablation(rows, multiple)) or (
      f"no ablation runs in {runner.results_path} yet: run --ablate without --report-only")
  with open(os.path.join(args.outdir, "ablation.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  return text


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  configs = workload_configs(args)
  multiples = QUICK_MULTIPLES if args.quick else tuple(int(k) for k in args.multiples.split(","))
  seeds = (0,) if args.quick else tuple(range(args.seeds))
  runner = Study(args.outdir, configs)
  if args.quick:
    for name, config in configs.items():
      shrink_in_time(config, QUICK_BASE_STEPS, runner.num_train_examples(name))
  if args.rerun:
    dropped = runner.forget([s for s in args.rerun.split(",") if s])
    print(f"dropped {dropped} finished runs of {args.rerun} (kept in cells.jsonl.bak)")
  started = time.perf_counter()
  if args.ablate:
    print("\n" + run_ablation(args, configs, runner))
    return 0
  if args.compare:
    if not args.report_only:
      run_comparison(args, configs, runner)
    text = compare_report(report_study(args, runner), args.outdir, args.figures)
    print("\n" + text)
    return 0
  if not args.report_only:
    strategies = args.strategies.split(",") if args.strategies else cells.DEFAULT_STRATEGIES
    if args.static_seeds < 1:
      raise SystemExit(f"--static-seeds must be >= 1; got {args.static_seeds}")
    todo = cells.grid(list(configs), multiples=multiples, seeds=seeds, strategies=strategies,
                      static_seeds=tuple(range(args.static_seeds)))
    runner.run(todo, progress=not args.no_progress)
  text = report(report_study(args, runner), args.outdir, args.figures)
  print("\n" + text)
  print(f"\n{args.outdir}: results.csv, results.md, PNGs ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
  sys.exit(main())
