"""The optional dependencies (extras) and a clear error when one is missing.

`pip install dateopt` gives the optax-level API (jax, optax, chex, numpy). The rest
comes with extras: `train` (the trainer and `dateopt-train`), `data` (datasets),
`plots`, `gcp`, `tpu`, `cuda12`, `prepare`. Code that needs an extra imports its
module through `require`, so a missing one is one line naming what to install; a
subpackage that needs one throughout (`dateopt.train`, `dateopt.models`,
`dateopt.plots`) calls `require_extra` before its other imports.

Example:
  >>> mnist1d = require("mnist1d", extra="data")  # MissingExtraError without the extra
  >>> require_extra("dateopt.plots", extra="plots", modules=PLOTS_MODULES)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

# What `dateopt[train]` installs, as the modules the trainer imports.
TRAIN_MODULES = ("absl", "ml_collections", "flax", "orbax.checkpoint", "tensorboardX", "tqdm",
                 "etils.epath")
# The reference models need Flax alone (it comes with the `train` extra).
MODELS_MODULES = ("flax",)
PLOTS_MODULES = ("matplotlib",)


class MissingExtraError(ModuleNotFoundError):
  """A module of an extra that is not installed; the message says what to install.

  A ModuleNotFoundError, as the bare import's error would have been.
  """


def require(module: str, *, extra: str) -> ModuleType:
  """`importlib.import_module(module)`, or MissingExtraError naming `dateopt[extra]`."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as error:
    raise MissingExtraError(
        f"{module} is not installed: it comes with the {extra!r} extra, "
        f"pip install 'dateopt[{extra}]' (missing module {error.name!r}).",
        name=error.name) from error


def require_extra(package: str, *, extra: str, modules: tuple[str, ...]) -> None:
  """Raises MissingExtraError, one line naming `extra`, unless all of `modules` are installed.

  Called at the top of `package`, before the imports that need the extra: they
  would fail deep inside it, naming a module and no extra. Nothing is imported
  (`importlib.util.find_spec`; a dotted name imports its parent package only).
  """
  absent = [module for module in modules if not installed(module)]
  if absent:
    raise MissingExtraError(
        f"{package} needs the {extra!r} extra: pip install 'dateopt[{extra}]' "
        f"(missing: {', '.join(absent)})", name=absent[0])


def installed(module: str) -> bool:
  """Whether `module` can be imported, found without importing it."""
  if module in sys.modules:  # a loaded module's spec may be None (find_spec would raise)
    return True
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # a missing parent package (`orbax` of `orbax.checkpoint`)
    return False


def missing(modules: tuple[str, ...], *, extra: str) -> str | None:
  """The message of the first of `modules` that cannot be imported, or None."""
  for module in modules:
    try:
      require(module, extra=extra)
    except MissingExtraError as error:
      return str(error)
  return None
