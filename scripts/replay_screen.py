"""Which of DATE's engine rules act at all on a set of finished adaptive runs: a replay screen.

Each run's recorded readings (`engine.jsonl`) are replayed with each rule of
`dateopt.date._progress.ENGINE_RULES` off in turn (`dateopt.train.engine_log.rules_that_act`).
A rule that never changes a decision on a run buys nothing on it, exactly, with no run to
make; one that acts needs a run with it off to say what it buys (`python -m dateopt.study
--ablate`). Every run's own replay must be exact (the engine that ran it is this one).

  python scripts/replay_screen.py runs/ablation_resnet/runs/resnet_adaptive*_64x_seed0 \
      runs/lm_scaling/runs/lm_adaptive_grow_64x_seed* > docs/engine_ablation/replay_screen.md

The output is a Markdown table: a row a run, a column a rule, and in each cell the step at
which the rule first acts ("—": never; blank: the run has no such rule, a ladder's rule on a
fixed batch).
"""

import argparse
import pathlib
import sys

from dateopt.date._progress import ENGINE_RULES
from dateopt.train import engine_log


def screen_row(workdir: pathlib.Path) -> str:
  """One run's row: its name, its steps, and where each rule first acts."""
  report = engine_log.replay_run(workdir)
  actions = {a.rule: a.step for a in engine_log.rules_that_act(workdir, report=report)}
  steps = report.steps
  cells = [("" if rule not in actions else "—" if actions[rule] is None
            else str(actions[rule])) for rule in ENGINE_RULES]
  return f"| {workdir.name} | {steps:,} | " + " | ".join(cells) + " |"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+", type=pathlib.Path)
  args = parser.parse_args(argv)
  print("| run | steps | " + " | ".join(f"`{rule}`" for rule in ENGINE_RULES) + " |")
  print("|---|---:|" + "---:|" * len(ENGINE_RULES))
  for workdir in args.workdirs:
    print(screen_row(workdir), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
