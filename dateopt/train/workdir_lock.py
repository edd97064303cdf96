"""One live run per workdir: a lock file naming the process and host that hold it.

Two runs writing the same checkpoints and `metrics.jsonl` corrupt each other
without a word. Process 0 of a run takes `<workdir>/run.lock` and removes it
when the run ends, however it ends; a second run on the workdir is refused
with the PID and host of the first. A lock left by a run that died without
releasing it (SIGKILL, a crashed host) names a PID that no longer exists on
this host: it is cleared with a warning. The PIDs of another host cannot be
checked from here, so its lock is refused; the message says which file to
delete once that run is known to be gone.

Example:
  >>> check_writable("/tmp/run")
  >>> lock = acquire("/tmp/run")      # WorkdirInUseError if a live run holds it
  >>> try:
  ...   train()
  ... finally:
  ...   release(lock)
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import uuid
from typing import Any

from absl import logging

LOCK_NAME = "run.lock"


class WorkdirInUseError(RuntimeError):
  """Another live run holds the workdir's lock."""


def check_writable(workdir: str) -> None:
  """Creates `workdir` if needed; raises OSError unless files can be written in it."""
  os.makedirs(workdir, exist_ok=True)
  with tempfile.TemporaryFile(dir=workdir):
    pass


def acquire(workdir: str) -> dict[str, Any]:
  """Takes `workdir`'s lock; returns what `release` needs.

  Raises:
    WorkdirInUseError: naming the workdir and the PID and host of the live
      run holding it.
  """
  path = os.path.join(workdir, LOCK_NAME)
  owner = {"pid": os.getpid(), "host": socket.gethostname(), "token": uuid.uuid4().hex,
           "since": time.strftime("%Y-%m-%d %H:%M:%S"), "path": path}
  for _ in range(2):  # the second try follows the clearing of a stale lock
    if _create(path, owner):
      return owner
    holder = _read(path)
    if holder is None and not os.path.exists(path):  # released meanwhile
      continue
    if _alive(holder):
      raise WorkdirInUseError(_in_use_message(workdir, path, holder))
    logging.warning("workdir %s: clearing the stale lock %s of a run that is gone (%s).",
                    workdir, path, _describe(holder))
    _remove_if_held_by(path, holder)
  raise WorkdirInUseError(_in_use_message(workdir, path, _read(path)))


def release(owner: dict[str, Any] | None) -> None:
  """Removes the lock `acquire` returned, if it is still ours (None: nothing to do)."""
  if owner is not None:
    _remove_if_held_by(owner["path"], owner)


def _create(path: str, owner: dict[str, Any]) -> bool:
  """Creates the lock file with its content in one atomic step; False if it exists."""
  content = json.dumps({k: v for k, v in owner.items() if k != "path"})
  staged = f"{path}.{owner['token']}"
  with open(staged, "w", encoding="utf-8") as f:
    f.write(content)
  try:
    os.link(staged, path)  # fails if `path` exists; never shows a half-written lock
    return True
  except FileExistsError:
    return False
  except OSError:  # a filesystem without hard links: create it exclusively instead
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(content)
    return True
  finally:
    os.remove(staged)


def _read(path: str) -> dict[str, Any] | None:
  """The lock's holder; None if the file is gone or unreadable."""
  try:
    with open(path, encoding="utf-8") as f:
      holder = json.load(f)
    return holder if isinstance(holder, dict) and "pid" in holder else None
  except (OSError, ValueError):
    return None


def _alive(holder: dict[str, Any] | None) -> bool:
  """Whether the holder may still be running (unknowable for another host: assume so)."""
  if holder is None:  # unreadable: `_create` never writes such a file, so no run holds it
    return False
  if holder.get("host") != socket.gethostname():
    return True
  try:
    os.kill(int(holder["pid"]), 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    return True
  return True


def _remove_if_held_by(path: str, holder: dict[str, Any] | None) -> None:
  current = _read(path)
  same = (current is None if holder is None
          else current is not None and current.get("token") == holder.get("token"))
  if same:
    try:
      os.remove(path)
    except FileNotFoundError:
      pass


def _describe(holder: dict[str, Any] | None) -> str:
  if holder is None:
    return "unreadable lock file"
  return f"PID {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"


def _in_use_message(workdir: str, path: str, holder: dict[str, Any] | None) -> str:
  return (f"workdir {workdir} is in use by another run ({_describe(holder)}); stop that run "
          f"or use another --workdir (if that run is gone, delete {path}).")
