"""DATE's plans vs the tuned MLPerf ResNet-50 recipes (docs/papers.md §4).

Plans from the MLPerf 8,192 recipe (LARS, peak 17, 5 warmup epochs, momentum
0.9, 42 epochs) to every larger batch in that table with the default strategy
(LEGW), and prints planned vs tuned peak LR, warmup epochs and momentum, with
planned/tuned ratios. Momentum is shown as planned by default (unchanged) and
with Smith et al.'s rule (`momentum_scaling=True`). A report, not a test.

Usage:
  python research/date_vs_mlperf.py
"""

from __future__ import annotations

from typing import NamedTuple

from dateopt import date

IMAGENET_TRAIN_EXAMPLES = 1_281_167


class TunedRecipe(NamedTuple):
  """One row of docs/papers.md §4."""

  batch_size: int
  peak_lr: float
  warmup_epochs: float
  momentum: float


MLPERF_BASELINE = date.Recipe(
    batch_size=8192, num_examples=IMAGENET_TRAIN_EXAMPLES, num_epochs=42,
    learning_rate=17.0, optimizer="lars", momentum=0.9, weight_decay=2e-4,
    warmup_epochs=5, decay="polynomial", power=2.0, end_value=1e-4,
    label_smoothing=0.1)

MLPERF_TUNED = (
    TunedRecipe(32_768, 29.0, 18, 0.929),
    TunedRecipe(32_768, 27.5, 16, 0.9321),
    TunedRecipe(34_560, 21.6, 17, 0.94),
    TunedRecipe(55_296, 25.67, 29, 0.94053),
    TunedRecipe(65_536, 24.699, 31, 0.951807),
    TunedRecipe(65_536, 23.081, 33, 0.95372),
)

HEADER = ("| batch | peak LR plan | tuned | ratio | warmup ep. plan | tuned | ratio "
          "| warmup steps plan | tuned | momentum plan | Smith | tuned | ratio (Smith) |")


def comparison_row(tuned: TunedRecipe) -> str:
  """One markdown row: planned (LEGW) vs tuned, and planned/tuned ratios."""
  planned = date.plan(MLPERF_BASELINE, tuned.batch_size)
  smith = date.plan(MLPERF_BASELINE, tuned.batch_size, momentum_scaling=True)
  tuned_warmup_steps = planned.epochs_to_steps(tuned.warmup_epochs)
  cells = (
      f"{tuned.batch_size:,}",
      f"{planned.learning_rate:.2f}", f"{tuned.peak_lr:g}",
      f"{planned.learning_rate / tuned.peak_lr:.2f}",
      f"{planned.warmup_epochs:.2f}", f"{tuned.warmup_epochs:g}",
      f"{planned.warmup_epochs / tuned.warmup_epochs:.2f}",
      f"{planned.warmup_steps}", f"{tuned_warmup_steps}",
      f"{planned.momentum:.4f}", f"{smith.momentum:.4f}", f"{tuned.momentum:g}",
      f"{planned.momentum / tuned.momentum:.3f} ({smith.momentum / tuned.momentum:.3f})",
  )
  return "| " + " | ".join(cells) + " |"


def main() -> None:
  base = MLPERF_BASELINE
  print(f"Baseline: MLPerf batch {base.batch_size:,}, LARS, peak {base.learning_rate:g}, "
        f"{base.warmup_epochs:g} warmup epochs ({base.warmup_steps} steps), momentum "
        f"{base.momentum:g}, {base.num_epochs:g} epochs; strategy 'legw'.\n")
  print(HEADER)
  print("|" + "---:|" * (HEADER.count("|") - 1))
  for tuned in MLPERF_TUNED:
    print(comparison_row(tuned))
  print("\nratio = planned / tuned. 'momentum plan' is the default plan (no momentum "
        "scaling);\n'Smith' is plan(..., momentum_scaling=True), 1 − m' = (1 − m)/k. "
        "Tuned runs trained\n59–92 epochs; LEGW keeps the baseline's 42.")


if __name__ == "__main__":
  main()
