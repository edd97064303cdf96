"""The optional dependencies (extras) and a clear error when one is missing.

`pip install dateopt` gives the optax-level API (jax, optax, chex, numpy). The rest
comes with extras: `train` (the trainer and `dateopt-train`), `data` (datasets),
`plots`, `gcp`, `tpu`, `cuda12`, `prepare`. Code that needs an extra imports its
module through `require`, so a missing one is one line naming what to install.

Example:
  >>> mnist1d = require("mnist1d", extra="data")  # MissingExtraError without the extra
"""

from __future__ import annotations

import importlib
from types import ModuleType

# What `dateopt[train]` installs, as the modules the trainer imports.
TRAIN_MODULES = ("absl", "ml_collections", "flax", "orbax.checkpoint", "tensorboardX", "tqdm",
                 "etils.epath")


class MissingExtraError(ImportError):
  """A module of an extra that is not installed; the message says what to install."""


def require(module: str, *, extra: str) -> ModuleType:
  """`importlib.import_module(module)`, or MissingExtraError naming `dateopt[extra]`."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as error:
    raise MissingExtraError(
        f"{module} is not installed: it comes with the {extra!r} extra, "
        f"pip install 'dateopt[{extra}]' (missing module {error.name!r}).") from error


def missing(modules: tuple[str, ...], *, extra: str) -> str | None:
  """The message of the first of `modules` that cannot be imported, or None."""
  for module in modules:
    try:
      require(module, extra=extra)
    except MissingExtraError as error:
      return str(error)
  return None
