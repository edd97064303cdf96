"""The console scripts, `dateopt-train`, `dateopt-replay` and `dateopt-tpu`: each checks its
extra first.

A pip user without the `train` extra gets one line naming it, with status 2, rather
than a traceback from the first missing import.
"""

from __future__ import annotations

import sys

from dateopt import extras


def train() -> int:
  """`dateopt-train` (dateopt.cli), once the `train` extra is known to be there."""
  if _without_train_extra("dateopt-train"):
    return 2
  from dateopt import cli  # pylint: disable=g-import-not-at-top  (needs the train extra)
  return cli.main()


def replay() -> int:
  """`dateopt-replay WORKDIR` (`dateopt.train.engine_log.main`), with the `train` extra."""
  if _without_train_extra("dateopt-replay"):
    return 2
  from dateopt.train import engine_log  # pylint: disable=g-import-not-at-top
  return engine_log.main()


def _without_train_extra(program: str) -> bool:
  """Whether the `train` extra is missing; if so, says which on stderr as `program`."""
  message = extras.missing(extras.TRAIN_MODULES, extra="train")
  if message is not None:
    print(f"{program}: error: {message}", file=sys.stderr, flush=True)
  return message is not None
