"""Workdirs as `etils.epath` paths: a local directory or a bucket (`gs://bucket/run`) alike.

Checkpoints, `recipe.json`, `metrics.jsonl`, TensorBoard events, `run.lock`
and `final_metrics.json` all go through these paths. A local path is made
absolute (orbax needs it so); a URL is kept as it is: `os.path` would turn
`gs://bucket/run` into the local directory `./gs:/bucket/run`. Without
TensorFlow, epath reaches `gs://` through fsspec and gcsfs; orbax writes
the arrays through tensorstore's own GCS driver; tensorboardX writes its
events through google-cloud-storage: the `dateopt[gcp]` extra installs both
packages.

Example:
  >>> path = as_path("gs://bucket/run")        # ValueError for a scheme epath lacks
  >>> require_packages(path)                   # ModuleNotFoundError naming dateopt[gcp]
  >>> write_atomically(path / "recipe.txt", "...")
"""

from __future__ import annotations

import os
import re
import uuid

from etils import epath

from dateopt import extras

# `scheme://`, as URLs spell it; a local path never starts so.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

# The modules each scheme needs beyond etils (module: its package), and the extra
# that installs them: gcsfs for epath's fsspec backend, google-cloud-storage for tensorboardX.
_SCHEME_MODULES = {"gs": {"gcsfs": "gcsfs", "google.cloud.storage": "google-cloud-storage"}}
_SCHEME_EXTRAS = {"gs": "gcp"}


def scheme(workdir: str | os.PathLike) -> str | None:
  """The URL scheme of `workdir` (`"gs"`), or None for a local path."""
  found = _URL.match(os.fspath(workdir))
  return found.group(1) if found else None


def is_local(workdir: str | os.PathLike) -> bool:
  """Whether `workdir` is a local path (not `scheme://...`)."""
  return scheme(workdir) is None


def as_path(workdir: str | os.PathLike) -> epath.Path:
  """`workdir` as an `epath.Path`: a local one absolute, a URL as it is.

  Raises:
    ValueError: `workdir` is empty (an unset `$WORKDIR`: it would train in the
      current directory), or a URL of another scheme than gs:// (`s3://x`).
  """
  if not os.fspath(workdir).strip():
    raise ValueError("the workdir is empty (an unset $WORKDIR?): give a directory or "
                     "gs://bucket/run; the current directory is never used by default.")
  url_scheme = scheme(workdir)
  if url_scheme is None:
    return epath.Path(workdir).resolve()  # epath's resolve is os.path.abspath, symlinks kept
  if url_scheme not in _SCHEME_MODULES:
    raise ValueError(f"workdir {os.fspath(workdir)}: {url_scheme}:// is not supported; use a "
                     f"local path or gs://bucket/run.")
  try:
    path = epath.Path(workdir)
  except KeyError:  # epath's registry of URL prefixes lacks it
    path = None
  if path is None or not os.fspath(path).startswith(f"{url_scheme}://"):
    raise ValueError(f"workdir {os.fspath(workdir)}: etils.epath has no filesystem for "
                     f"{url_scheme}:// (use a local path or gs://bucket/...).")
  return path


def require_packages(workdir: str | os.PathLike) -> None:
  """Raises ModuleNotFoundError, naming the extra to install, if `workdir`'s scheme needs it."""
  url_scheme = scheme(workdir)
  needed = _SCHEME_MODULES.get(url_scheme, {})
  missing = [package for module, package in needed.items() if not extras.installed(module)]
  if missing:
    extra = _SCHEME_EXTRAS[url_scheme]
    raise ModuleNotFoundError(
        f"a {url_scheme}:// workdir needs {' and '.join(missing)}: "
        f"pip install 'dateopt[{extra}]'.")


def write_atomically(path: epath.Path, text: str) -> None:
  """Writes `text` to `path` so that a reader sees the old content or the new, never half.

  Locally through a staged file and a rename; an object store (GCS) already
  makes an object appear whole when its upload ends, and its rename is a copy.
  """
  if not is_local(path):
    path.write_text(text, encoding="utf-8")
    return
  staged = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
  staged.write_text(text, encoding="utf-8")
  os.replace(staged, path)
