"""The README's LR-schedule figure, drawn by `dateopt.plots` from a config's baseline recipe.

DATE plans the config's tuned baseline at each batch (LEGW, linear and sqrt scaling), and
`plots.plot_lr_schedules` draws the LR each plan follows against epochs. No training runs,
so it takes seconds.

  python scripts/make_figures.py                                   # docs/lr_schedules.png
  python scripts/make_figures.py --config configs/digits_resnet.py --multiples 1,4,16 \
      --out /tmp/digits_lr.png
"""

from __future__ import annotations

import argparse

from dateopt import plots, train
from dateopt.configs import load as load_config


def baseline_recipe(config_path: str):
  """The config's baseline `Recipe`, as the trainer builds it (its dataset's real size)."""
  return train.build_experiment(load_config(config_path)).baseline


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/mnist1d_lstm.py")
  parser.add_argument("--multiples", default="1,4,16,64",
                      help="comma-separated batch multiples of the baseline's batch")
  parser.add_argument("--strategies", default="legw,linear,sqrt")
  parser.add_argument("--out", default="docs/lr_schedules.png")
  args = parser.parse_args()

  base = baseline_recipe(args.config)
  batches = [base.batch_size * int(k) for k in args.multiples.split(",") if k]
  title = (f"{args.config}: the baseline ({base.optimizer}, batch {base.batch_size}, "
           f"LR {base.learning_rate:g}) planned by DATE")
  plots.plot_lr_schedules(base, batches, tuple(args.strategies.split(",")), path=args.out,
                          title=title)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
