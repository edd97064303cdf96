#!/usr/bin/env python3
"""dateopt on a Cloud TPU VM: create, copy, install, start, tail, stop, delete, run, watch.

Every subcommand is a short sequence of `gcloud` commands; `--dry-run` prints
them (one per line, shell-quoted, in order) and runs nothing, not even the
packing of the local tree. Needs only the Python standard library and, for real
runs, the Google Cloud CLI (`gcloud`). Works from a clone and from a wheel
install (`pip install dateopt`) alike.

  T="my-tpu --zone=us-central2-b --project=my-project"
  S="--accelerator-type=v4-32 --version=tpu-ubuntu2204-base"
  J="--config=configs/imagenet_resnet50_legw.py --workdir=gs://my-bucket/runs/r50"
  dateopt-tpu run $T $S $J --config.data_dir=gs://my-bucket/tensorflow_datasets
  dateopt-tpu run $T $S --spot $J --watch       # spot VM, relaunched when preempted
  dateopt-tpu run $T $S --queued --spot $J --watch  # a queued resource
  dateopt-tpu tail $T --follow
  dateopt-tpu stop $T          # SIGTERM: the trainer checkpoints, then exits
  dateopt-tpu delete $T        # add --queued for a queued resource
  dateopt-tpu --dry-run run $T $S $J             # print the gcloud commands
  dateopt-tpu run $T $S $J --wheel=dist/dateopt-0.1.0-py3-none-any.whl  # a local build

The steps of `run`, each a subcommand of its own:

* `create`: a TPU VM (`--spot` for a Spot VM), or with `--queued` a queued
  resource (`gcloud compute tpus queued-resources create ... --node-id`),
  waited on until it is ACTIVE.
* `copy`: what the workers install. From a clone (or with `--source DIR`): the
  local working tree, as it is now (uncommitted changes and new files
  included; no git remote needed), packed into a tarball and unpacked into
  ~/dateopt on every worker. In a git checkout the files are those of
  `git ls-files --cached --others --exclude-standard`; elsewhere the tree, without
  .git, .venv, runs/ and caches. The workers' ~/dateopt/.venv is kept. With
  `--wheel PATH`: that wheel or sdist, to the home directory. From a wheel
  install with neither: nothing (`install` takes the release from PyPI).
* `install`: python3 >= 3.11 and its venv package (apt, if missing) and lsof,
  then into ~/dateopt/.venv: `pip install -e '.[train,data,gcp,tpu]'` of the
  copied tree, the copied wheel, or `pip install 'dateopt[...]==VERSION'`,
  VERSION being this dateopt's own.
* `start`: ends the dateopt-train that an earlier `start` began, if it still
  runs (its process group, named by ~/dateopt_logs/dateopt-train.pid: SIGTERM,
  then SIGKILL after the grace), refuses to go on if any other process holds
  the TPU (it lists them; ending them is left to their owner), removes a stale
  /tmp/libtpu_lockfile, then starts `dateopt-train --config ... --workdir ...
  [--config.x=y ...]` in the background (setsid nohup) on every worker, each
  logging to ~/dateopt_logs/worker-<i>.log. jax.distributed joins the workers
  by itself (dateopt-train's `--jax_distributed=auto`).

No command signals a process that `start` did not begin: `stop` and `start`
signal only the process group in the pid file, and only while its leader's
command line still names dateopt-train (a pid the system reused is left alone).

`watch` (or `run --watch`) polls the resource: when a Spot VM is PREEMPTED (or
a queued resource SUSPENDED/FAILED) it deletes and re-creates it, copies,
installs and starts the same command with the same workdir, and the trainer
resumes from the newest checkpoint there. A trainer that exited with status
143 (SIGTERM, e.g. a maintenance event) or vanished with its host is started
again; status 0 or `stop` ends the watch; any other status is reported and
ends it too (restarting a crashing run would only loop).

A slice of more than one worker (beyond -8: v4-16, v5litepod-16...) must have a
gs:// workdir, and a local one is refused: each worker would checkpoint to its
own disk, which the other workers cannot read and a re-created VM does not have.

Arguments that start with `--config.` go to dateopt-train, as does everything
after a `--` (e.g. `-- --jax_distributed=on`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# The clone this module runs from (dateopt installed from source, or `scripts/tpu_vm.py`);
# None for a wheel in site-packages, which has no tree to copy (see `source_tree`).
PACKAGE_DIR = Path(__file__).resolve().parent
_PARENT = PACKAGE_DIR.parent
REPO_ROOT = _PARENT if (_PARENT / "pyproject.toml").is_file() else None
REMOTE_DIR = "~/dateopt"
REMOTE_TARBALL = "dateopt-src.tar.gz"  # in the worker's home directory
LOG_DIR = "~/dateopt_logs"
STOPPED_MARKER = f"{LOG_DIR}/stopped"  # written by `stop`, so `watch` leaves the run alone
# The pid of the trainer's shell, which `start` makes a process group leader: `stop`
# signals that group (the shell, the trainer and its children) and nothing else.
PID_FILE = f"{LOG_DIR}/dateopt-train.pid"
DEFAULT_EXTRAS = "train,data,gcp,tpu"
DEFAULT_GRACE_SECONDS = 300
# dateopt.train.workdir_lock.LOCK_NAME (this script imports nothing of dateopt).
WORKDIR_LOCK_NAME = "run.lock"
# Who holds the TPU: v2-v4 chips are /dev/accel*, v5e/v5p/v6e are /dev/vfio/*. Only
# read (sudo: lsof sees other users' processes only as root), never signalled.
TPU_HOLDER_PIDS = "ls /dev/accel* /dev/vfio/* 2>/dev/null | xargs -r sudo lsof -t 2>/dev/null"
WORKER_INDEX = ('$(curl -sf -H "Metadata-Flavor: Google" http://metadata.google.internal/'
                "computeMetadata/v1/instance/attributes/agent-worker-number || hostname)")
# Double quotes inside the remote scripts: each level of single quotes triples in a dry run.
# `ours` answers whether $pid (read from PID_FILE) is still the group that `start` began:
# a number above 1 (kill -- -1 would reach every process), not this very shell (whose
# own command line names dateopt-train), a process group leader, and one whose command
# line names dateopt-train, so that a pid the system gave to another process is left alone.
READ_PID = f'pid=$(cat {PID_FILE} 2>/dev/null | tr -cd 0-9)'
OURS = ('ours() { [ "${pid:-0}" -gt 1 ] && [ "$pid" != "$$" ] && '
        '[ "$(ps -o pgid= -p "$pid" | tr -d " ")" = "$pid" ] && '
        'tr "\\0" " " < /proc/$pid/cmdline | grep -q dateopt-train; } 2>/dev/null')
LARGE_TARBALL_MIB = 100
# A wheel or sdist of dateopt, as `pip wheel` or `python -m build` names it; only these
# characters, since the name goes into the remote shell.
WHEEL_NAME = re.compile(r"^dateopt-[A-Za-z0-9._+-]+\.(whl|tar\.gz|zip)$")
# A git URL pip recorded, as it may go into the workers' shell: no quotes, no spaces.
SAFE_GIT_URL = re.compile(r"^git\+(https|ssh)://[A-Za-z0-9._~:/@%+-]+@[0-9a-f]{7,40}$")
VERSION_LINE = re.compile(r'^__version__ = "([A-Za-z0-9.+_-]+)"$', re.M)
TREE, FILE, RELEASE = "tree", "file", "release"
EXCLUDED_NAMES = frozenset({".git", ".venv", "venv", "runs", "__pycache__", ".pytest_cache",
                            ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints", ".cache"})
ACCELERATOR_TYPE = re.compile(r"^[a-z]+[0-9]+[a-z]*-([0-9]+)$")  # v4-32, v5litepod-16, v6e-8
TPU_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

READY_STATES = {False: frozenset({"READY"}), True: frozenset({"ACTIVE"})}
LOST_STATES = {False: frozenset({"PREEMPTED", "TERMINATED"}),
               True: frozenset({"SUSPENDED", "FAILED"})}
NOT_FOUND = "NOT_FOUND"
UNKNOWN = "UNKNOWN"


class TpuVmError(Exception):
  """A failure with a message for the user (no traceback)."""


# ------------------------------------------------------------------ what to run, and where


@dataclasses.dataclass(frozen=True)
class Target:
  """The TPU: its name (also the node id of a queued resource), zone, project, kind.

  Example:
    >>> Target("my-tpu", "us-central2-b", "my-project").location_flags()
    ['--zone=us-central2-b', '--project=my-project']
  """
  name: str
  zone: str
  project: str | None = None
  queued: bool = False

  def location_flags(self) -> list[str]:
    project = [f"--project={self.project}"] if self.project else []
    return [f"--zone={self.zone}", *project]


@dataclasses.dataclass(frozen=True)
class SliceSpec:
  """What to create: accelerator type (v4-32), runtime version, Spot or not."""
  accelerator_type: str
  version: str
  spot: bool = False


@dataclasses.dataclass(frozen=True)
class TrainJob:
  """The dateopt-train command: config (relative to the repo), workdir, extra arguments."""
  config: str
  workdir: str
  args: tuple[str, ...] = ()

  def argv(self) -> list[str]:
    return [".venv/bin/dateopt-train", "--config", self.config, "--workdir", self.workdir,
            *self.args]


@dataclasses.dataclass(frozen=True)
class Package:
  """What the workers install into ~/dateopt/.venv, and from where.

  TREE: a source tree copied to ~/dateopt, installed editable (`path`: the local
  tree to pack; None when it is packed already). FILE: a wheel or sdist at
  `path`, copied to the worker's home directory. RELEASE: dateopt `version`
  from PyPI, or from `url` (the git commit this dateopt was installed from), nothing
  copied.

  Example:
    >>> Package(RELEASE, version="0.1.0").pip_argument("train,data")
    '"dateopt[train,data]==0.1.0"'
    >>> Package(FILE, Path("dist/dateopt-0.1.0-py3-none-any.whl")).pip_argument("tpu")
    '"dateopt[tpu] @ file://$HOME/dateopt-0.1.0-py3-none-any.whl"'
    >>> Package(RELEASE, version="0.1.0", url="git+https://github.com/dateopt/dateopt@3f2a"
    ...         ).pip_argument("tpu")
    '"dateopt[tpu] @ git+https://github.com/dateopt/dateopt@3f2a"'
  """
  kind: str
  path: Path | None = None
  version: str | None = None
  url: str | None = None

  def pip_argument(self, extras: str) -> str:
    """What follows `pip install` on a worker, in ~/dateopt ($HOME in double quotes expands)."""
    if self.kind == TREE:
      return f'-e ".[{extras}]"'
    if self.kind == FILE:
      return f'"dateopt[{extras}] @ file://$HOME/{self.path.name}"'
    if self.url:
      return f'"dateopt[{extras}] @ {self.url}"'
    return f'"dateopt[{extras}]=={self.version}"'

  def origin(self) -> str:
    """Where a RELEASE comes from, for the launcher's note."""
    return self.url or f"dateopt=={self.version} from PyPI"


COPIED_TREE = Package(TREE)  # the tree on the workers already (a relaunch, `install`)


# ------------------------------------------------------------------ gcloud commands (pure)


def _tpu_vm(verb: str, target: Target, *args: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", verb, target.name, *target.location_flags(),
          *args]


def _queued(verb: str, target: Target, *args: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "queued-resources", verb, target.name,
          *target.location_flags(), *args]


def create_command(target: Target, spec: SliceSpec) -> list[str]:
  """`gcloud` creating the TPU VM, or the queued resource whose node has the same name.

  Example:
    >>> shlex.join(create_command(Target("t", "z"), SliceSpec("v4-8", "v2-alpha-tpuv4")))
    'gcloud compute tpus tpu-vm create t --zone=z --accelerator-type=v4-8 --version=v2-alpha-tpuv4'
  """
  spot = ["--spot"] if spec.spot else []
  if target.queued:  # the queued API names the runtime --runtime-version
    return _queued("create", target, f"--node-id={target.name}",
                   f"--accelerator-type={spec.accelerator_type}",
                   f"--runtime-version={spec.version}", *spot)
  return _tpu_vm("create", target, f"--accelerator-type={spec.accelerator_type}",
                 f"--version={spec.version}", *spot)


def describe_state_command(target: Target) -> list[str]:
  """`gcloud` printing only the state: READY/PREEMPTED... (VM), ACTIVE/SUSPENDED... (queued)."""
  if target.queued:
    return _queued("describe", target, "--format=value(state.state)")
  return _tpu_vm("describe", target, "--format=value(state)")


def delete_command(target: Target) -> list[str]:
  """`gcloud` deleting the VM, or the queued resource with its node (--force), unprompted."""
  if target.queued:
    return _queued("delete", target, "--force", "--quiet")
  return _tpu_vm("delete", target, "--quiet")


def scp_command(target: Target, local_path: str, remote_path: str) -> list[str]:
  """`gcloud` copying one local file to `remote_path` on every worker."""
  return ["gcloud", "compute", "tpus", "tpu-vm", "scp", local_path,
          f"{target.name}:{remote_path}", *target.location_flags(), "--worker=all"]


def ssh_command(target: Target, script: str, worker: str = "all") -> list[str]:
  """`gcloud` running the shell `script` on one worker (0, 1, ...) or on all of them."""
  return _tpu_vm("ssh", target, f"--worker={worker}", f"--command={script}")


def remove_lock_command(workdir: str) -> list[str]:
  """`gcloud` deleting the workdir lock of a run whose VM was deleted (so it cannot be live)."""
  return ["gcloud", "storage", "rm", f"{workdir.rstrip('/')}/{WORKDIR_LOCK_NAME}"]


# ------------------------------------------------------------------ remote shell scripts (pure)


def shell(*statements: str) -> str:
  """One line of shell: the statements joined by '; ' (a dry run prints one command per line)."""
  return "; ".join(statements)


def unpack_script() -> str:
  """Replaces ~/dateopt by the uploaded tree, keeping its .venv (installs survive a copy)."""
  new = f"{REMOTE_DIR}.new"
  return shell("set -e", f"rm -rf {new}", f"mkdir -p {new}",
               f"tar -xzf ~/{REMOTE_TARBALL} -C {new}",
               f"if [ -d {REMOTE_DIR}/.venv ]; then mv {REMOTE_DIR}/.venv {new}/.venv; fi",
               f"rm -rf {REMOTE_DIR}", f"mv {new} {REMOTE_DIR}", f"rm -f ~/{REMOTE_TARBALL}")


def install_script(extras: str = DEFAULT_EXTRAS, package: Package = COPIED_TREE) -> str:
  """Python >= 3.11 with venv and lsof (apt, if missing), then dateopt into ~/dateopt/.venv.

  TPU VM images of Ubuntu 22.04 ship Python 3.10, below dateopt's 3.11: then
  apt's python3.11 is installed beside it. A wheel replaces the dateopt that
  is there (a rebuilt wheel may keep its version number).

  Example:
    >>> install_script("train", Package(RELEASE, version="0.1.0")).endswith(
    ...     '.venv/bin/python -m pip install -q "dateopt[train]==0.1.0"')
    True
  """
  find_python = ("PY=; for p in python3.13 python3.12 python3.11 python3; do "
                 "if command -v $p >/dev/null && "
                 '$p -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null; '
                 "then PY=$p; break; fi; done")
  apt = "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq"
  replace = (".venv/bin/python -m pip uninstall -q -y dateopt 2>/dev/null || true",
             ) if package.kind == FILE else ()
  return shell(
      "set -e", f"mkdir -p {REMOTE_DIR}", f"cd {REMOTE_DIR}", "need=",
      'command -v lsof >/dev/null || need="$need lsof"',  # start reads the TPU's holders
      find_python,
      'if [ -z "$PY" ]; then PY=python3.11; need="$need python3.11"; fi',
      # Debian/Ubuntu ship ensurepip (what venv needs) in python3.X-venv.
      '$PY -c "import ensurepip" 2>/dev/null || need="$need $PY-venv"',
      f'if [ -n "$need" ]; then {apt} $need; fi',
      "if [ ! -x .venv/bin/pip ]; then rm -rf .venv; $PY -m venv .venv; fi",
      ".venv/bin/python -m pip install -q --upgrade pip", *replace,
      f".venv/bin/python -m pip install -q {package.pip_argument(extras)}")


def end_ours_function(grace_seconds: int = DEFAULT_GRACE_SECONDS) -> str:
  """Shell function `end_ours`: SIGTERM to the group $pid, SIGKILL if it outlives the grace.

  Called only after `ours`. The group is polled each second (`kill -0` sends no
  signal) so that the SIGKILL follows closely enough to reach the same group.
  """
  return ("end_ours() { kill -s TERM -- -$pid; "
          f"for i in $(seq {max(1, grace_seconds)}); do "
          "kill -0 -- -$pid 2>/dev/null || return 0; sleep 1; done; "
          f'echo "dateopt-train still runs after {grace_seconds} s on $(hostname): '
          'SIGKILL to its process group $pid"; kill -s KILL -- -$pid 2>/dev/null || true; }')


def prepare_script(grace_seconds: int = DEFAULT_GRACE_SECONDS) -> str:
  """Before a start: ends the run an earlier start began, then checks that the TPU is free.

  A process that holds the TPU and is not ours is listed, and the start is
  refused (status 1): it may be someone else's work, so ending it is left to
  its owner. A libtpu that ended without cleaning up leaves
  /tmp/libtpu_lockfile behind; with no holder left it is stale.
  """
  holders = f"holders=$({TPU_HOLDER_PIDS} | sort -u | paste -sd, -)"
  return shell(
      f"mkdir -p {LOG_DIR}", READ_PID, OURS, end_ours_function(grace_seconds),
      'if ours; then echo "ending the dateopt-train that dateopt-tpu started before on '
      '$(hostname) (process group $pid)"; end_ours; fi',
      f"rm -f {PID_FILE}",
      # A process that just ended may hold the device for a moment longer.
      f'for i in $(seq 10); do {holders}; [ -z "$holders" ] && break; sleep 1; done',
      'if [ -n "$holders" ]; then '
      'echo "dateopt-tpu: the TPU of $(hostname) is in use by processes that dateopt-tpu '
      'did not start:"; ps -o pid,user,etime,args -p "$holders"; '
      'echo "dateopt-tpu: not starting dateopt-train; end those processes yourself '
      '(as their owner), then run start again"; exit 1; fi',
      "sudo rm -f /tmp/libtpu_lockfile")


def trainer_shell(job: TrainJob) -> str:
  """What runs in the background: the trainer, its output and exit status appended to its log.

  The last line `== dateopt-train exited with status N` is what `watch` reads.
  The shell catches SIGTERM (`stop` signals the whole group), so it lives on to
  write that line; its children get the default SIGTERM back (the trainer
  saves a checkpoint and exits 143).
  """
  log = f"{LOG_DIR}/worker-$WORKER.log"
  return (f"trap : TERM; WORKER={WORKER_INDEX}; cd {REMOTE_DIR} && "
          '{ echo "== dateopt-train starts on worker $WORKER at $(date -u)"; '
          f"PYTHONUNBUFFERED=1 {shlex.join(job.argv())}; "
          'echo "== dateopt-train exited with status $?"; } '
          f">> {log} 2>&1")


def launch_script(job: TrainJob) -> str:
  """Starts `trainer_shell(job)` in the background, as the leader of a new process group.

  setsid makes the shell the leader (its pid is the group's id) and detaches it
  from the ssh connection; nohup and the redirections keep it from the
  connection's hangup and streams. `$!` is that shell's pid, kept in PID_FILE.
  """
  return shell("set -e", f"mkdir -p {LOG_DIR}", f"rm -f {STOPPED_MARKER}",
               f"setsid nohup bash -c {shlex.quote(trainer_shell(job))} "
               f"</dev/null >/dev/null 2>&1 & echo $! > {PID_FILE}")


def stop_script(grace_seconds: int = DEFAULT_GRACE_SECONDS) -> str:
  """SIGTERM to the group `start` began (the trainer saves a checkpoint and exits 143),
  then SIGKILL after the grace; nothing when the pid file names no process of ours."""
  return shell(
      f"mkdir -p {LOG_DIR}", f"touch {STOPPED_MARKER}", READ_PID, OURS,
      end_ours_function(grace_seconds),
      'if ours; then end_ours; '
      'else echo "no dateopt-train started by dateopt-tpu runs on $(hostname)"; fi',
      f"rm -f {PID_FILE}")


def tail_script(lines: int = 100, follow: bool = False) -> str:
  """Shows the end of each worker's log, headed by its file name (worker-<i>.log)."""
  return f"tail -v -n {lines}{' -F' if follow else ''} {LOG_DIR}/worker-*.log"


def run_status_script() -> str:
  """Prints `stopped`, `running`, or the last line of the log (its exit status, if it ended)."""
  return shell(READ_PID, OURS,
               f"if [ -e {STOPPED_MARKER} ]; then echo stopped; "
               "elif ours; then echo running; "
               f"else tail -n 1 {LOG_DIR}/worker-*.log 2>/dev/null || true; fi")


# ------------------------------------------------------------------ command sequences (pure)


def copy_commands(target: Target, tarball: str) -> list[list[str]]:
  return [scp_command(target, tarball, REMOTE_TARBALL), ssh_command(target, unpack_script())]


def upload_commands(target: Target, package: Package, tarball: str) -> list[list[str]]:
  """The tree (packed in `tarball`), or the wheel into the home directory; none for a release."""
  if package.kind == TREE:
    return copy_commands(target, tarball)
  if package.kind == FILE:
    return [scp_command(target, str(package.path), package.path.name)]
  return []


def install_commands(target: Target, extras: str = DEFAULT_EXTRAS,
                     package: Package = COPIED_TREE) -> list[list[str]]:
  return [ssh_command(target, install_script(extras, package))]


def start_commands(target: Target, job: TrainJob) -> list[list[str]]:
  # Two ssh calls: every worker is checked (TPU free) before any of them starts.
  return [ssh_command(target, prepare_script()), ssh_command(target, launch_script(job))]


def stop_commands(target: Target,
                  grace_seconds: int = DEFAULT_GRACE_SECONDS) -> list[list[str]]:
  return [ssh_command(target, stop_script(grace_seconds))]


def tail_commands(target: Target, *, worker: str = "all", lines: int = 100,
                  follow: bool = False) -> list[list[str]]:
  return [ssh_command(target, tail_script(lines, follow), worker=worker)]


# ------------------------------------------------------------------ checks


def slice_workers(accelerator_type: str) -> int | None:
  """1 for a single-host slice, None (several) beyond: every generation's one-host maximum is -8.

  v2-8, v3-8, v4-8, v5p-8, v5litepod-8 and v6e-8 are one host; v4-16 is two,
  v5litepod-16 four. The exact count is not needed here, only "more than one".
  """
  match = ACCELERATOR_TYPE.match(accelerator_type)
  if match is None:
    raise TpuVmError(f"--accelerator-type must look like v4-32, v5litepod-16 or v6e-8 "
                     f"(generation-size), not {accelerator_type!r}")
  return 1 if int(match.group(1)) <= 8 else None


def check_name(name: str) -> None:
  if not TPU_NAME.match(name) or len(name) > 63:
    raise TpuVmError(f"TPU name {name!r}: lowercase letters, digits and hyphens, starting "
                     "with a letter (at most 63 characters)")


def check_workdir(workdir: str, accelerator_type: str | None, ephemeral: bool) -> str | None:
  """Refuses a local workdir on a multi-worker slice; returns a warning where it is risky.

  Each worker would write its checkpoints to its own disk, where no other
  worker and no re-created VM can read them: orbax needs one directory that
  every process sees, and a resumed run needs it to outlive the VM.
  """
  if workdir.startswith("gs://"):
    return None
  if accelerator_type is not None and slice_workers(accelerator_type) is None:
    raise TpuVmError(
        f"--workdir {workdir!r}: {accelerator_type} has several workers, and each would write "
        "its checkpoints to its own disk where the others cannot read them; use a bucket, "
        "--workdir=gs://BUCKET/RUN")
  if ephemeral:
    return (f"--workdir {workdir!r} is on the VM's disk, deleted with the VM when it is "
            "preempted and re-created: the relaunched run would start from step 0; use "
            "--workdir=gs://BUCKET/RUN")
  if accelerator_type is None:
    return (f"--workdir {workdir!r} is not gs://: fine on a single-host slice, but on a "
            "multi-worker slice each worker would checkpoint to its own disk")
  return None


def source_tree() -> Path | None:
  """The clone this module runs from, sent to the workers by default; None for a wheel install.

  Example:
    >>> source_tree() in (REPO_ROOT, None)
    True
  """
  return REPO_ROOT


def package_version() -> str:
  """This dateopt's version: `dateopt.__version__`, read from its file (no import needed).

  Example:
    >>> import dateopt
    >>> package_version() == dateopt.__version__
    True
  """
  match = VERSION_LINE.search((PACKAGE_DIR / "__init__.py").read_text())
  if match is None:
    raise TpuVmError(f"no __version__ in {PACKAGE_DIR / '__init__.py'}")
  return match.group(1)


def check_wheel(path: Path) -> Path:
  """A local dateopt wheel or sdist, whose name is safe in the workers' shell."""
  if not WHEEL_NAME.match(path.name):
    raise TpuVmError(f"--wheel {path}: not a dateopt wheel or sdist (dateopt-VERSION-...whl "
                     "or dateopt-VERSION.tar.gz, as `pip wheel --no-deps .` or "
                     "`python -m build` names them)")
  if not path.is_file():
    raise TpuVmError(f"--wheel {path}: no such file")
  return path


def resolve_package(source: Path | None, wheel: Path | None) -> Package:
  """--wheel, else --source or this clone's tree, else (a wheel install) this version's release.

  Example:
    >>> resolve_package(Path("."), None).kind
    'tree'
  """
  if wheel is not None:
    if source is not None:
      raise TpuVmError("give --source or --wheel, not both")
    return Package(FILE, check_wheel(wheel))
  source = source if source is not None else source_tree()
  if source is not None:
    return Package(TREE, source)
  return Package(RELEASE, version=package_version(), url=installed_git_commit())


def installed_git_commit() -> str | None:
  """`git+URL@COMMIT` when this dateopt was pip-installed from a git repository (pip's
  direct_url.json, PEP 610), so that the workers install the very same commit; else None.

  Example:
    >>> installed_git_commit() is None or installed_git_commit().startswith("git+")
    True
  """
  try:
    record = importlib.metadata.distribution("dateopt").read_text("direct_url.json")
  except importlib.metadata.PackageNotFoundError:
    return None
  try:
    direct = json.loads(record or "null") or {}
  except ValueError:
    return None
  vcs = direct.get("vcs_info") or {}
  url = f"git+{direct.get('url', '')}@{vcs.get('commit_id', '')}"
  if vcs.get("vcs") != "git" or not SAFE_GIT_URL.match(url):
    return None
  return url


def check_config(config: str, package: Package) -> str:
  """The config as a path relative to the copied tree (the workers run from ~/dateopt),
  or a packaged config's name as it is (dateopt-train resolves it on the workers).

  Without a copied tree only a packaged config can run: nothing else reaches the workers.
  """
  source_root = package.path if package.kind == TREE else None
  configs = (source_root / "dateopt" if source_root else PACKAGE_DIR) / "configs"
  path = Path(config)
  if not path.suffix and "/" not in config and (configs / f"{config}.py").is_file():
    return config
  if source_root is None:
    raise TpuVmError(f"--config {config}: not a packaged config ({', '.join(packaged_configs())}"
                     "); a config file needs its source tree on the workers: "
                     "--source <a clone of dateopt>")
  if path.is_absolute():
    try:
      path = path.relative_to(source_root)
    except ValueError:
      raise TpuVmError(f"--config {config}: not inside {source_root}, the tree copied to the "
                       "workers") from None
  if not (source_root / path).is_file():
    raise TpuVmError(f"--config {config}: no such file in {source_root}")
  return path.as_posix()


def packaged_configs() -> list[str]:
  """The names `--config` takes without a source tree (dateopt/configs/*.py)."""
  return sorted(path.stem for path in (PACKAGE_DIR / "configs").glob("*.py")
                if not path.name.startswith("_"))


def split_trainer_args(extra: Sequence[str]) -> tuple[str, ...]:
  """The arguments for dateopt-train that argparse did not know: only `--config.x=y`."""
  bad = [arg for arg in extra if not (arg.startswith("--config.") and "=" in arg)]
  if bad:
    raise TpuVmError(f"unknown arguments {bad}: dateopt-train's overrides are written "
                     "--config.field=value; put other dateopt-train flags after `--`")
  return tuple(extra)


# ------------------------------------------------------------------ the local tree


def is_excluded(relative_path: str) -> bool:
  """Whether a file stays home: virtualenvs, runs/, VCS data, caches, compiled Python."""
  parts = relative_path.split("/")
  return (any(part in EXCLUDED_NAMES or part.endswith(".egg-info") for part in parts)
          or relative_path.endswith(".pyc"))


def git_listed_files(root: Path) -> list[str] | None:
  """Tracked and untracked-but-not-ignored files (working-tree versions); None if not git."""
  if not (root / ".git").exists() or shutil.which("git") is None:
    return None
  listing = subprocess.run(
      ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
      capture_output=True, check=False)
  if listing.returncode != 0:
    return None
  return [name for name in listing.stdout.decode().split("\0") if name]


def walked_files(root: Path) -> list[str]:
  """Every file under `root` outside the excluded directories (no git needed)."""
  found = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = [d for d in subdirs if not is_excluded(d)]
    relative_dir = Path(directory).relative_to(root)
    found.extend((relative_dir / name).as_posix() for name in files)
  return found


def source_files(root: Path,
                 lister: Callable[[Path], list[str] | None] = git_listed_files) -> list[str]:
  """The files `copy` sends: git's view of the tree if there is one, else a walk; sorted.

  Example:
    >>> "dateopt/tpu.py" in source_files(REPO_ROOT)
    True
  """
  listed = lister(root)
  names = walked_files(root) if listed is None else listed
  # A tracked file deleted in the working tree is still listed by git.
  return sorted(name for name in set(names)
                if not is_excluded(name) and (root / name).is_file())


def write_source_tarball(root: Path, tarball: str,
                         lister: Callable[[Path], list[str] | None] = git_listed_files) -> int:
  """Packs `source_files(root)` into a .tar.gz; returns the number of files."""
  if not root.is_dir():
    raise TpuVmError(f"--source {root}: not a directory")
  names = source_files(root, lister)
  if not names:
    raise TpuVmError(f"nothing to copy from {root}")
  with tarfile.open(tarball, "w:gz") as archive:
    for name in names:
      archive.add(root / name, arcname=name, recursive=False)
  return len(names)


def staged_tarball_path(name: str) -> str:
  """Where the local tree is packed before the upload (one tarball per TPU)."""
  return os.path.join(tempfile.gettempdir(), f"dateopt-src-{name}.tar.gz")


# ------------------------------------------------------------------ running commands


@dataclasses.dataclass(frozen=True)
class Answer:
  """What a query command returned."""
  returncode: int
  stdout: str
  stderr: str


def _execute(argv: Sequence[str], capture: bool) -> Answer:
  try:
    done = subprocess.run(list(argv), capture_output=capture, text=True, check=False)
  except FileNotFoundError:
    raise TpuVmError(f"{argv[0]} not found: install the Google Cloud CLI "
                     "(https://cloud.google.com/sdk/docs/install), or use --dry-run") from None
  return Answer(done.returncode, done.stdout or "", done.stderr or "")


def say(message: str) -> None:
  """Progress and warnings go to stderr: stdout of a dry run is only commands."""
  print(f"dateopt-tpu: {message}", file=sys.stderr, flush=True)


class Runner:
  """Runs commands, or with `dry_run` prints them shell-quoted, one per line, and runs nothing.

  `query` answers None in a dry run: callers then take the path of a first
  launch (resource absent, queued resource ACTIVE at once).

  Example:
    >>> Runner(dry_run=True).run(["gcloud", "compute", "tpus", "tpu-vm", "list", "--zone=z"])
    gcloud compute tpus tpu-vm list --zone=z
  """

  def __init__(self, dry_run: bool,
               execute: Callable[[Sequence[str], bool], Answer] = _execute):
    self.dry_run = dry_run
    self._execute = execute

  def run(self, argv: Sequence[str]) -> None:
    """Runs one command, its output to the terminal; TpuVmError if it fails."""
    if self.dry_run:
      print(shlex.join(argv), flush=True)
      return
    say(f"+ {shlex.join(argv)}")
    answer = self._execute(argv, False)
    if answer.returncode != 0:
      raise TpuVmError(f"status {answer.returncode} from: {shlex.join(argv)}")

  def run_all(self, commands: Sequence[Sequence[str]]) -> None:
    for argv in commands:
      self.run(argv)

  def query(self, argv: Sequence[str]) -> Answer | None:
    """Runs a command that only reads, capturing its output; a failure is returned, not raised."""
    if self.dry_run:
      print(shlex.join(argv), flush=True)
      return None
    return self._execute(argv, True)


# ------------------------------------------------------------------ state and decisions


def resource_state(runner: Runner, target: Target) -> str | None:
  """READY, PREEMPTED, ACTIVE, SUSPENDED... NOT_FOUND, UNKNOWN (gcloud failed); None: dry run."""
  answer = runner.query(describe_state_command(target))
  if answer is None:
    return None
  if answer.returncode == 0:
    return answer.stdout.strip().upper() or UNKNOWN
  if "NOT_FOUND" in answer.stderr or "not found" in answer.stderr.lower():
    return NOT_FOUND
  return UNKNOWN


@dataclasses.dataclass(frozen=True)
class RunStatus:
  """The trainer on worker 0: running, stopped (by `stop`), exited (with a code), vanished."""
  state: str
  exit_code: int | None = None


RUNNING, STOPPED, EXITED, VANISHED = "running", "stopped", "exited", "vanished"
EXIT_LINE = re.compile(r"== dateopt-train exited with status (\d+)")


def parse_run_status(text: str) -> RunStatus:
  """Reads `run_status_script`'s output: no exit line means the trainer died with its host.

  Example:
    >>> parse_run_status("== dateopt-train exited with status 143\\n")
    RunStatus(state='exited', exit_code=143)
  """
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  last = lines[-1] if lines else ""
  if last in (RUNNING, STOPPED):
    return RunStatus(last)
  match = EXIT_LINE.search(last)
  if match:
    return RunStatus(EXITED, int(match.group(1)))
  return RunStatus(VANISHED)


def run_status(runner: Runner, target: Target) -> RunStatus | None:
  """The trainer's status on worker 0; None if ssh failed (try again later) or a dry run."""
  answer = runner.query(ssh_command(target, run_status_script(), worker="0"))
  if answer is None or answer.returncode != 0:
    return None
  return parse_run_status(answer.stdout)


WAIT, RECREATE, RESTART, DONE, FAIL = "wait", "recreate", "restart", "done", "fail"
SIGTERM_STATUS = 143  # dateopt-train's status after a SIGTERM, once its checkpoint is saved


@dataclasses.dataclass(frozen=True)
class Decision:
  action: str
  reason: str


def next_action(queued: bool, state: str, status: RunStatus | None) -> Decision:
  """What `watch` does next, from the resource's state and the trainer's status.

  Example:
    >>> next_action(False, "PREEMPTED", None).action
    'recreate'
    >>> next_action(True, "ACTIVE", RunStatus("exited", 0)).action
    'done'
  """
  kind = "queued resource" if queued else "TPU VM"
  if state in LOST_STATES[queued]:
    return Decision(RECREATE, f"the {kind} is {state}: deleting and re-creating it")
  if state == NOT_FOUND:
    return Decision(FAIL, f"the {kind} is gone; watch re-creates a preempted one, not one that "
                          "was deleted")
  if state not in READY_STATES[queued]:
    return Decision(WAIT, f"the {kind} is {state}")
  if status is None or status.state == RUNNING:
    return Decision(WAIT, "dateopt-train is running" if status else "no answer from worker 0")
  if status.state == STOPPED:
    return Decision(DONE, "the run was stopped with `dateopt-tpu stop`")
  if status.state == VANISHED:
    return Decision(RESTART, "dateopt-train is gone without an exit status (host restarted?): "
                             "starting it again")
  if status.exit_code == 0:
    return Decision(DONE, "dateopt-train finished (status 0)")
  if status.exit_code == SIGTERM_STATUS:
    return Decision(RESTART, "dateopt-train was terminated (status 143) after saving: starting "
                             "it again")
  return Decision(FAIL, f"dateopt-train failed with status {status.exit_code}; see "
                        "`dateopt-tpu tail`")


# ------------------------------------------------------------------ the subcommands' steps


def wait_until_ready(runner: Runner, target: Target, *, poll_seconds: float = 30,
                     sleep: Callable[[float], None] = time.sleep) -> None:
  """Polls the resource until READY (VM) or ACTIVE (queued); TpuVmError if it fails or vanishes."""
  last = None
  while True:
    state = resource_state(runner, target)
    if state is None or state in READY_STATES[target.queued]:
      return
    if state in LOST_STATES[target.queued] or state == NOT_FOUND:
      raise TpuVmError(f"{target.name} is {state} while waiting for it")
    if state != last:
      say(f"{target.name} is {state}; waiting")
      last = state
    sleep(poll_seconds)


def create(runner: Runner, target: Target, spec: SliceSpec, *, poll_seconds: float = 30,
           sleep: Callable[[float], None] = time.sleep) -> None:
  """Creates the resource; a queued one is waited on until ACTIVE (the VM create blocks itself)."""
  runner.run(create_command(target, spec))
  if target.queued:
    wait_until_ready(runner, target, poll_seconds=poll_seconds, sleep=sleep)


def ensure_created(runner: Runner, target: Target, spec: SliceSpec, *,
                   poll_seconds: float = 30,
                   sleep: Callable[[float], None] = time.sleep) -> None:
  """Creates the resource if absent, re-creates it if preempted, waits if it is on its way."""
  state = resource_state(runner, target)
  if state is None or state == NOT_FOUND:
    create(runner, target, spec, poll_seconds=poll_seconds, sleep=sleep)
  elif state in LOST_STATES[target.queued]:
    say(f"{target.name} is {state}: re-creating it")
    runner.run(delete_command(target))
    create(runner, target, spec, poll_seconds=poll_seconds, sleep=sleep)
  elif state in READY_STATES[target.queued]:
    say(f"{target.name} exists ({state})")
  elif state == UNKNOWN:  # auth, API or network: waiting would hide it
    raise TpuVmError(f"cannot read the state of {target.name}; see why with: "
                     f"{shlex.join(describe_state_command(target))}")
  else:
    wait_until_ready(runner, target, poll_seconds=poll_seconds, sleep=sleep)


def copy(runner: Runner, target: Target, tarball: str, *, package: Package) -> None:
  """Sends what `package` installs to every worker: a tree (packed into `tarball` first,
  unless its path is None: packed already), a wheel, or nothing for a release.

  A dry run packs nothing.
  """
  if package.kind == TREE and package.path is not None and not runner.dry_run:
    count = write_source_tarball(package.path, tarball)
    mebibytes = os.path.getsize(tarball) / 2**20
    say(f"packed {count} files of {package.path} into {tarball} ({mebibytes:.1f} MiB)")
    if mebibytes > LARGE_TARBALL_MIB:  # data or outputs inside the tree, probably
      say(f"warning: {mebibytes:.0f} MiB goes to every worker; keep data and runs in a "
          "bucket, or outside the tree (or in .gitignore)")
  if package.kind == RELEASE:
    say(f"no source tree here: the workers install {package.origin()} "
        "(--wheel PATH sends a local build instead)")
  runner.run_all(upload_commands(target, package, tarball))


def packed(package: Package) -> Package:
  """The package once `copy` has run: a tree is not packed again (relaunches send the same)."""
  return COPIED_TREE if package.kind == TREE else package


def relaunch(runner: Runner, target: Target, spec: SliceSpec, *, job: TrainJob, tarball: str,
             extras: str, package: Package, poll_seconds: float,
             sleep: Callable[[float], None]) -> None:
  """After a preemption: a new resource with the same name, code, packages, command and workdir."""
  runner.run(delete_command(target))
  create(runner, target, spec, poll_seconds=poll_seconds, sleep=sleep)
  if job.workdir.startswith("gs://"):  # its holder died with the deleted VM
    say("removing the workdir lock of the preempted run (its host is gone)")
    runner.query(remove_lock_command(job.workdir))

  def copy_install_start():
    copy(runner, target, tarball, package=packed(package))
    runner.run_all(install_commands(target, extras, package))
    runner.run_all(start_commands(target, job))

  with_retries(copy_install_start, sleep=sleep)


def with_retries(step: Callable[[], None], *, sleep: Callable[[float], None], attempts: int = 3,
                 wait_seconds: float = 60) -> None:
  """Runs `step` again after a failure: a fresh VM's ssh may not answer at once.

  Every step of a relaunch can run twice (copy, install and start are idempotent).
  """
  for attempt in range(1, attempts + 1):
    try:
      return step()
    except TpuVmError as error:
      if attempt == attempts:
        raise
      say(f"{error}; trying again in {wait_seconds:.0f} s")
      sleep(wait_seconds)


def watch(runner: Runner, target: Target, spec: SliceSpec, *, job: TrainJob, tarball: str,
          extras: str = DEFAULT_EXTRAS, package: Package = COPIED_TREE,
          poll_seconds: float = 60, max_relaunches: int = 20,
          sleep: Callable[[float], None] = time.sleep) -> str:
  """Polls until the run ends; relaunches it after a preemption. Returns the last reason.

  A relaunch installs `package` again (a tree from `tarball`, packed already).
  A dry run prints one poll and the commands of one relaunch after a preemption.
  """
  relaunches, last_reason = 0, None
  while True:
    state = resource_state(runner, target)
    ready = state is None or state in READY_STATES[target.queued]
    status = run_status(runner, target) if ready else None
    if runner.dry_run:
      decision = Decision(RECREATE, "dry run: the commands of a relaunch after a preemption")
    else:
      decision = next_action(target.queued, state, status)
    if decision.reason != last_reason:  # a state change, not every poll
      say(decision.reason)
      last_reason = decision.reason
    if decision.action == DONE:
      return decision.reason
    if decision.action == FAIL:
      raise TpuVmError(decision.reason)
    if decision.action in (RECREATE, RESTART):
      if relaunches >= max_relaunches:
        raise TpuVmError(f"{decision.reason}, but {max_relaunches} relaunches were already "
                         "made (--max-relaunches)")
      relaunches += 1
      if decision.action == RECREATE:
        relaunch(runner, target, spec, job=job, tarball=tarball, extras=extras,
                 package=package, poll_seconds=poll_seconds, sleep=sleep)
      else:
        runner.run_all(start_commands(target, job))
      if runner.dry_run:
        return decision.reason
    sleep(poll_seconds)


# ------------------------------------------------------------------ command line


def _add_target(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("name", help="TPU name (and node id of a queued resource)")
  parser.add_argument("--zone", required=True, help="e.g. us-central2-b")
  parser.add_argument("--project", default=None, help="default: gcloud's configured project")
  parser.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS,
                      help="print the gcloud commands, run nothing")


def _add_kind(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--queued", action="store_true",
                      help="a queued resource (gcloud compute tpus queued-resources)")


def _add_slice(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--accelerator-type", required=True, help="e.g. v4-8, v4-32, v5litepod-16")
  parser.add_argument("--version", required=True,
                      help="TPU runtime, e.g. tpu-ubuntu2204-base (v4), v2-alpha-tpuv5-lite "
                           "(v5e), v2-alpha-tpuv6e (v6e)")
  parser.add_argument("--spot", action="store_true",
                      help="a Spot TPU: cheaper, preemptible (see watch)")


def _add_copy(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--source", type=Path, default=None,
                      help="the local tree to copy and install editable (default: this "
                           "clone; from a wheel install, none)")
  parser.add_argument("--wheel", type=Path, default=None,
                      help="a local dateopt wheel or sdist to copy and install instead of a "
                           "tree (default without a tree: this version from PyPI)")


def _add_install(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--extras", default=DEFAULT_EXTRAS, help="dateopt's pip extras")


def _add_job(parser: argparse.ArgumentParser, has_source: bool = False) -> None:
  parser.add_argument("--config", required=True,
                      help="a packaged config's name (imagenet_resnet50_legw) or a config file "
                           "in the tree copied to the workers")
  parser.add_argument("--workdir", required=True,
                      help="gs://BUCKET/RUN (checkpoints, metrics, TensorBoard)")
  if not has_source:  # the config is checked against the tree that `copy` sends
    parser.add_argument("--source", type=Path, default=None, help=argparse.SUPPRESS)


def _add_watch(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--poll-seconds", type=float, default=60,
                      help="watch: seconds between two looks at the resource")
  parser.add_argument("--max-relaunches", type=int, default=20,
                      help="watch: give up after this many relaunches")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="dateopt-tpu", description=__doc__.splitlines()[0], allow_abbrev=False,
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="\n".join(__doc__.splitlines()[2:]))
  parser.add_argument("--dry-run", action="store_true",
                      help="print the gcloud commands (one per line), run nothing")
  commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  def command(name: str, help_text: str) -> argparse.ArgumentParser:
    sub = commands.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
    _add_target(sub)
    return sub

  sub = command("create", "create the TPU VM (or --queued resource, waited on until ACTIVE)")
  _add_kind(sub)
  _add_slice(sub)
  sub = command("copy", "copy the local working tree (or --wheel) to every worker")
  _add_copy(sub)
  sub = command("install", "install dateopt into ~/dateopt/.venv on every worker")
  _add_copy(sub)
  _add_install(sub)
  sub = command("start", "start dateopt-train on every worker, in the background, after "
                         "ending the one an earlier start began")
  _add_job(sub)
  sub.add_argument("--accelerator-type", default=None,
                   help="checks that a multi-worker slice gets a gs:// workdir")
  sub = command("tail", "show the end of the workers' logs")
  sub.add_argument("--worker", default="all", help="a worker index, or all (default)")
  sub.add_argument("--lines", type=int, default=100)
  sub.add_argument("--follow", action="store_true", help="keep printing new lines (tail -F)")
  sub = command("stop", "SIGTERM the dateopt-train that start began on every worker (it "
                        "checkpoints)")
  sub.add_argument("--grace-seconds", type=int, default=DEFAULT_GRACE_SECONDS,
                   help="SIGKILL a trainer still running after this long")
  sub = command("delete", "delete the TPU VM (or --queued resource, with its node)")
  _add_kind(sub)
  for name, help_text in (("run", "create if absent, copy, install, start (and --watch)"),
                          ("watch", "relaunch the run after each preemption until it ends")):
    sub = command(name, help_text)
    _add_kind(sub)
    _add_slice(sub)
    _add_copy(sub)
    _add_install(sub)
    _add_job(sub, has_source=True)
    _add_watch(sub)
    if name == "run":
      sub.add_argument("--watch", action="store_true", help="then watch (see the watch command)")
  parser.subcommand_parsers = commands.choices  # for errors with the subcommand's usage
  return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  """Parses argv; `--config.x=y` and everything after `--` become `args.trainer_args`."""
  argv = list(argv)
  after_dashes = argv.index("--") if "--" in argv else len(argv)
  parser = build_parser()
  args, unknown = parser.parse_known_args(argv[:after_dashes])
  try:
    args.trainer_args = split_trainer_args(unknown) + tuple(argv[after_dashes + 1:])
    check_name(args.name)
    if getattr(args, "accelerator_type", None):
      slice_workers(args.accelerator_type)
    if not re.fullmatch(r"[a-z0-9_,-]+", getattr(args, "extras", DEFAULT_EXTRAS)):
      raise TpuVmError(f"--extras must be comma-separated extra names, not {args.extras!r}")
    if getattr(args, "worker", "all") != "all" and not args.worker.isdigit():
      raise TpuVmError(f"--worker must be a worker index or all, not {args.worker!r}")
    if hasattr(args, "source"):
      args.package = resolve_package(args.source, getattr(args, "wheel", None))
    if args.command == "copy" and args.package.kind == RELEASE:
      raise TpuVmError("nothing to copy: no source tree here (a wheel install) and no --wheel; "
                       f"`install` installs {args.package.origin()} as it is")
    if hasattr(args, "config"):
      args.config = check_config(args.config, args.package)
      ephemeral = args.command in ("run", "watch") and (
          args.spot or args.queued or args.command == "watch" or args.watch)
      warning = check_workdir(args.workdir, args.accelerator_type, ephemeral)
      if warning:
        say(f"warning: {warning}")
  except TpuVmError as error:
    parser.subcommand_parsers[args.command].error(str(error))
  return args


def _target(args: argparse.Namespace) -> Target:
  return Target(args.name, args.zone, args.project, getattr(args, "queued", False))


def _slice(args: argparse.Namespace) -> SliceSpec:
  return SliceSpec(args.accelerator_type, args.version, args.spot)


def _job(args: argparse.Namespace) -> TrainJob:
  return TrainJob(args.config, args.workdir, args.trainer_args)


def dispatch(args: argparse.Namespace, runner: Runner) -> None:
  """Runs one subcommand."""
  target = _target(args)
  tarball = staged_tarball_path(target.name)
  if args.command == "create":
    create(runner, target, _slice(args))
  elif args.command == "copy":
    copy(runner, target, tarball, package=args.package)
  elif args.command == "install":
    runner.run_all(install_commands(target, args.extras, args.package))
  elif args.command == "start":
    runner.run_all(start_commands(target, _job(args)))
  elif args.command == "tail":
    runner.run_all(tail_commands(target, worker=args.worker, lines=args.lines,
                                        follow=args.follow))
  elif args.command == "stop":
    runner.run_all(stop_commands(target, args.grace_seconds))
  elif args.command == "delete":
    runner.run(delete_command(target))
  elif args.command == "run":
    ensure_created(runner, target, _slice(args))
    copy(runner, target, tarball, package=args.package)
    runner.run_all(install_commands(target, args.extras, args.package))
    runner.run_all(start_commands(target, _job(args)))
    if args.watch:
      _watch(args, runner, target, tarball)
  elif args.command == "watch":
    if args.package.kind == TREE and not runner.dry_run:  # relaunches copy it as it is now
      write_source_tarball(args.package.path, tarball)
    _watch(args, runner, target, tarball)


def _watch(args: argparse.Namespace, runner: Runner, target: Target, tarball: str) -> str:
  return watch(runner, target, _slice(args), job=_job(args), tarball=tarball,
               extras=args.extras, package=args.package, poll_seconds=args.poll_seconds,
               max_relaunches=args.max_relaunches)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    dispatch(args, Runner(args.dry_run))
  except TpuVmError as error:
    say(f"error: {error}")
    return 1
  except KeyboardInterrupt:
    say("interrupted; what runs on the TPU VM goes on (`dateopt-tpu stop` ends it)")
    return 130
  return 0


if __name__ == "__main__":
  sys.exit(main())
