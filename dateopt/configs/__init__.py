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
  >>> config = configs.load("mnist1d_lstm")      # its get_config()
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
from typing import Any

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


def load(config: str) -> Any:
  """The `get_config()` of the config file `config` names (see `resolve`).

  A `file.py:argument` suffix is passed to `get_config` as ml_collections'
  `config_flags` does. One loader for the CLI's scripts, the study and the tests.

  Raises:
    FileNotFoundError: no such file or packaged config (see `resolve`).
  """
  path, colon, argument = resolve(config).partition(":")
  spec = importlib.util.spec_from_file_location("dateopt_loaded_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(argument) if colon else module.get_config()
