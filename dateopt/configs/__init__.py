"""The reference configs, shipped inside the package.

`dateopt-train --config mnist1d_lstm` finds `dateopt/configs/mnist1d_lstm.py` from any
directory; a path to a config file of your own works as well. In a clone, `configs/`
is a link to this folder.

Example:
  >>> from dateopt import configs
  >>> "mnist1d_lstm" in configs.names()
  True
  >>> configs.resolve("mnist1d_lstm").endswith("mnist1d_lstm.py")
  True
"""

from __future__ import annotations

import os
import pathlib

DIRECTORY = pathlib.Path(__file__).resolve().parent


def names() -> list[str]:
  """The packaged configs' names (`dateopt-train --config <name>`)."""
  return sorted(p.stem for p in DIRECTORY.glob("*.py") if not p.stem.startswith("_"))


def resolve(config: str) -> str:
  """The config file `config` names: a path that exists, else a packaged config's name
  (with or without `.py` or a leading `configs/`); a `:argument` suffix is kept.

  Raises:
    FileNotFoundError: neither; the message lists the packaged names.
  """
  if os.path.isfile(config):
    return config
  path, colon, argument = config.partition(":")  # ml_collections' `file.py:argument`
  if colon:
    return resolve(path) + colon + argument
  name = os.path.basename(config)
  name = name[:-3] if name.endswith(".py") else name
  if name in names():
    return str(DIRECTORY / f"{name}.py")
  raise FileNotFoundError(
      f"config {config!r} is neither a file nor a packaged config; packaged configs: "
      f"{', '.join(names())} (or give the path of a config file).")
