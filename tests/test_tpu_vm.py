"""dateopt-tpu (dateopt/tpu.py, and scripts/tpu_vm.py from a clone) without gcloud: the exact commands (--dry-run), the remote scripts, watch."""

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "tpu_vm.py"


from dateopt import tpu as tpu_vm  # noqa: E402

# Training runs, subprocesses or notebooks: left out of `make test-fast`.
pytestmark = pytest.mark.slow

WHERE = "--zone=us-central2-b --project=my-project"
TARGET = ["my-tpu", "--zone=us-central2-b", "--project=my-project"]
SLICE = ["--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base"]
JOB = ["--config=configs/imagenet_resnet50_legw.py", "--workdir=gs://my-bucket/runs/r50"]
SSH = f"gcloud compute tpus tpu-vm ssh my-tpu {WHERE}"
TRAINER = ("WORKER=$(curl -sf -H \"Metadata-Flavor: Google\" http://metadata.google.internal/"
           "computeMetadata/v1/instance/attributes/agent-worker-number || hostname); "
           "cd ~/dateopt && { echo \"== dateopt-train starts on worker $WORKER at $(date -u)\"; "
           "PYTHONUNBUFFERED=1 .venv/bin/dateopt-train --config configs/imagenet_resnet50_legw.py "
           "--workdir gs://my-bucket/runs/r50 --config.batch_size=16384; "
           "echo \"== dateopt-train exited with status $?\"; } "
           "2>&1 | tee -a ~/dateopt_logs/worker-$WORKER.log")
KILL_STALE = ("tmux kill-session -t dateopt 2>/dev/null || true; "
              "pkill -9 -f \"^[^ ]*python[^ ]* [^ ]*dateopt-train\" || true; "
              "ls /dev/accel* /dev/vfio/* 2>/dev/null | xargs -r sudo lsof -t 2>/dev/null "
              "| sort -u | xargs -r sudo kill -9 2>/dev/null || true; "
              "sudo rm -f /tmp/libtpu_lockfile")
LAUNCH = ("set -e; mkdir -p ~/dateopt_logs; rm -f ~/dateopt_logs/stopped; "
          f"tmux new-session -d -s dateopt {shlex.quote(TRAINER)}")


def dry_run(*args, check=True):
  """The script's stdout lines under --dry-run (a subprocess, as a user runs it)."""
  done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", *args], capture_output=True,
                        text=True, timeout=60, check=False)
  if check:
    assert done.returncode == 0, done.stderr
  return done


def lines(*args):
  return dry_run(*args).stdout.splitlines()


def ssh(script, worker="all"):
  return f"{SSH} --worker={worker} {shlex.quote('--command=' + script)}"


def remote_script(line):
  """The shell script of a printed `gcloud ... ssh --command=...` line."""
  [command] = [arg for arg in shlex.split(line) if arg.startswith("--command=")]
  return command[len("--command="):]


# ------------------------------------------------------------------ create, delete


def test_create_on_demand_spot_and_queued_commands():
  assert lines("create", *TARGET, *SLICE) == [(
      f"gcloud compute tpus tpu-vm create my-tpu {WHERE} --accelerator-type=v4-32 "
      "--version=tpu-ubuntu2204-base")]
  assert lines("create", *TARGET, *SLICE, "--spot") == [(
      f"gcloud compute tpus tpu-vm create my-tpu {WHERE} --accelerator-type=v4-32 "
      "--version=tpu-ubuntu2204-base --spot")]
  # Queued: the create, then the poll that waits until it is ACTIVE.
  assert lines("create", *TARGET, *SLICE, "--queued", "--spot") == [
      (f"gcloud compute tpus queued-resources create my-tpu {WHERE} --node-id=my-tpu "
       "--accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base --spot"),
      (f"gcloud compute tpus queued-resources describe my-tpu {WHERE} "
       "'--format=value(state.state)'")]


def test_dry_run_also_after_the_subcommand_and_project_is_optional():
  assert dry_run(check=False).returncode == 2  # a subcommand is required
  done = subprocess.run([sys.executable, str(SCRIPT), "delete", "my-tpu", "--zone=z",
                         "--dry-run"], capture_output=True, text=True, timeout=60,
                        check=False)
  assert done.returncode == 0
  assert done.stdout == "gcloud compute tpus tpu-vm delete my-tpu --zone=z --quiet\n"


def test_delete_commands():
  assert lines("delete", *TARGET) == [f"gcloud compute tpus tpu-vm delete my-tpu {WHERE} --quiet"]
  assert lines("delete", *TARGET, "--queued") == [
      f"gcloud compute tpus queued-resources delete my-tpu {WHERE} --force --quiet"]


# ------------------------------------------------------------------ copy


def test_copy_commands():
  tarball = tpu_vm.staged_tarball_path("my-tpu")
  assert lines("copy", *TARGET) == [
      f"gcloud compute tpus tpu-vm scp {tarball} my-tpu:dateopt-src.tar.gz {WHERE} --worker=all",
      ssh("set -e; rm -rf ~/dateopt.new; mkdir -p ~/dateopt.new; "
          "tar -xzf ~/dateopt-src.tar.gz -C ~/dateopt.new; "
          "if [ -d ~/dateopt/.venv ]; then mv ~/dateopt/.venv ~/dateopt.new/.venv; fi; "
          "rm -rf ~/dateopt; mv ~/dateopt.new ~/dateopt; rm -f ~/dateopt-src.tar.gz")]


def _tree(root):
  for name in ["pyproject.toml", "dateopt/a.py", "configs/c.py", "new_untracked.py",
               ".venv/bin/python", "runs/r/metrics.jsonl", "dateopt/__pycache__/a.pyc",
               "dateopt.egg-info/PKG-INFO", ".git/HEAD", "notes/x.pyc"]:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(name)


def test_source_files_without_git_skip_venv_runs_and_caches(tmp_path):
  _tree(tmp_path)
  assert tpu_vm.source_files(tmp_path) == [
      "configs/c.py", "dateopt/a.py", "new_untracked.py", "pyproject.toml"]


def test_source_files_from_git_keep_uncommitted_and_drop_deleted(tmp_path):
  _tree(tmp_path)
  listed = ["pyproject.toml", "dateopt/a.py", "new_untracked.py", "deleted_in_tree.py",
            ".venv/bin/python"]  # git lists what .gitignore misses; .venv still stays home
  assert tpu_vm.source_files(tmp_path, lister=lambda root: listed) == [
      "dateopt/a.py", "new_untracked.py", "pyproject.toml"]


def test_unpack_replaces_the_tree_and_keeps_the_venv(tmp_path):
  source, home = tmp_path / "src", tmp_path / "home"
  _tree(source)
  (home / "dateopt" / ".venv").mkdir(parents=True)
  (home / "dateopt" / ".venv" / "installed").write_text("")
  (home / "dateopt" / "removed_locally.py").write_text("")
  assert tpu_vm.write_source_tarball(source, str(home / "dateopt-src.tar.gz")) == 4
  subprocess.run(["bash", "-c", tpu_vm.unpack_script()], check=True, env={**os.environ,
                                                                          "HOME": str(home)})
  tree = sorted(p.relative_to(home / "dateopt").as_posix()
                for p in (home / "dateopt").rglob("*") if p.is_file())
  assert tree == [".venv/installed", "configs/c.py", "dateopt/a.py", "new_untracked.py",
                  "pyproject.toml"]
  assert not (home / "dateopt-src.tar.gz").exists()


def test_a_dry_run_packs_nothing(tmp_path):
  tarball = tmp_path / "t.tar.gz"
  runner = tpu_vm.Runner(dry_run=True)
  tpu_vm.copy(runner, tpu_vm.Target("t", "z"), str(tarball), source_root=tmp_path / "missing")
  assert not tarball.exists()
  with pytest.raises(tpu_vm.TpuVmError, match="not a directory"):
    tpu_vm.write_source_tarball(tmp_path / "missing", str(tarball))


# ------------------------------------------------------------------ install, start, tail, stop


def test_install_command_makes_a_venv_with_the_tpu_extras():
  [line] = lines("install", *TARGET)
  script = remote_script(line)
  assert line == ssh(script)
  assert script.startswith("set -e; cd ~/dateopt; ")
  assert 'need="$need $PY-venv"' in script  # python3-venv / python3.11-venv when missing
  assert "apt-get install -y -qq $need" in script
  assert "$PY -m venv .venv" in script
  assert script.endswith('.venv/bin/python -m pip install -q -e ".[train,data,gcp,tpu]"')
  assert remote_script(lines("install", *TARGET, "--extras=data,tpu")[0]).endswith('".[data,tpu]"')


def test_start_kills_the_stale_process_then_launches_in_tmux_with_per_worker_logs():
  assert lines("start", *TARGET, *JOB, "--config.batch_size=16384") == [
      ssh(KILL_STALE), ssh(LAUNCH)]


def test_trainer_shell_logs_per_worker_with_the_exit_status(tmp_path):
  """The tmux pane's command, run here with a fake metadata server and a fake trainer."""
  home, bin_dir = tmp_path / "home", tmp_path / "bin"
  (home / "dateopt" / ".venv" / "bin").mkdir(parents=True)
  (home / "dateopt_logs").mkdir()
  bin_dir.mkdir()
  (bin_dir / "curl").write_text("#!/bin/sh\necho 3\n")
  trainer = home / "dateopt" / ".venv" / "bin" / "dateopt-train"
  trainer.write_text('#!/bin/sh\necho "args: $*"\necho "unbuffered=$PYTHONUNBUFFERED" >&2\n'
                     "exit 143\n")
  for path in (bin_dir / "curl", trainer):
    path.chmod(0o755)
  job = tpu_vm.TrainJob("configs/x.py", "gs://b/r", ("--config.name=a b",))
  env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
  subprocess.run(["sh", "-c", tpu_vm.trainer_shell(job)], check=True, env=env,
                 capture_output=True)
  log = (home / "dateopt_logs" / "worker-3.log").read_text().splitlines()
  assert log[0].startswith("== dateopt-train starts on worker 3 at ")
  assert log[1:] == ["args: --config configs/x.py --workdir gs://b/r --config.name=a b",
                     "unbuffered=1", "== dateopt-train exited with status 143"]
  assert tpu_vm.parse_run_status("\n".join(log)) == tpu_vm.RunStatus("exited", 143)


def test_every_remote_script_is_valid_shell():
  job = tpu_vm.TrainJob("configs/x.py", "gs://b/r", ("--config.s='q'",))
  scripts = [tpu_vm.unpack_script(), tpu_vm.install_script(), tpu_vm.kill_stale_script(),
             tpu_vm.launch_script(job), tpu_vm.trainer_shell(job), tpu_vm.stop_script(),
             tpu_vm.tail_script(follow=True), tpu_vm.run_status_script()]
  for script in scripts:
    done = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, (script, done.stderr)


def test_trainer_pattern_matches_the_trainer_not_the_shells_that_start_it():
  pattern = re.compile(tpu_vm.TRAINER_PATTERN)
  job = tpu_vm.TrainJob("configs/x.py", "gs://b/r")
  trainer = ("/home/u/dateopt/.venv/bin/python3.11 .venv/bin/dateopt-train --config "
             "configs/x.py --workdir gs://b/r")
  assert pattern.search(trainer)
  for script in (tpu_vm.trainer_shell(job), tpu_vm.launch_script(job),
                 tpu_vm.kill_stale_script(), tpu_vm.stop_script()):
    for shell in ("bash -c ", "sh -c ", "-bash -c "):
      assert not pattern.search(shell + script)


def test_tail_and_stop_commands():
  assert lines("tail", *TARGET) == [ssh("tail -v -n 100 ~/dateopt_logs/worker-*.log")]
  assert lines("tail", *TARGET, "--worker=2", "--lines=20", "--follow") == [
      ssh("tail -v -n 20 -F ~/dateopt_logs/worker-*.log", worker="2")]
  match = '"^[^ ]*python[^ ]* [^ ]*dateopt-train"'
  assert lines("stop", *TARGET, "--grace-seconds=60") == [ssh(
      f"mkdir -p ~/dateopt_logs; touch ~/dateopt_logs/stopped; pkill -TERM -f {match} || true; "
      f"for i in $(seq 12); do pgrep -f {match} >/dev/null || break; sleep 5; done; "
      f"if pgrep -f {match} >/dev/null; then echo \"dateopt-train still runs after 60 s on "
      f"$(hostname): killed\"; pkill -9 -f {match}; fi; "
      "tmux kill-session -t dateopt 2>/dev/null || true")]


# ------------------------------------------------------------------ run, watch


def test_run_creates_copies_installs_and_starts_in_order():
  out = lines("run", *TARGET, *SLICE, *JOB, "--config.batch_size=16384")
  tarball = tpu_vm.staged_tarball_path("my-tpu")
  assert out[:3] == [
      f"gcloud compute tpus tpu-vm describe my-tpu {WHERE} '--format=value(state)'",
      (f"gcloud compute tpus tpu-vm create my-tpu {WHERE} --accelerator-type=v4-32 "
       "--version=tpu-ubuntu2204-base"),
      f"gcloud compute tpus tpu-vm scp {tarball} my-tpu:dateopt-src.tar.gz {WHERE} --worker=all"]
  assert out[3] == ssh(tpu_vm.unpack_script())
  assert out[4] == ssh(tpu_vm.install_script())
  assert out[5:] == [ssh(KILL_STALE), ssh(LAUNCH)]


def test_run_watch_dry_run_shows_one_relaunch_with_the_same_workdir():
  out = lines("run", *TARGET, *SLICE, "--queued", "--spot", *JOB, "--watch",
              "--config.batch_size=16384")
  queued = "gcloud compute tpus queued-resources"
  describe = f"{queued} describe my-tpu {WHERE} '--format=value(state.state)'"
  create = (f"{queued} create my-tpu {WHERE} --node-id=my-tpu --accelerator-type=v4-32 "
            "--runtime-version=tpu-ubuntu2204-base --spot")
  launch = [ssh(KILL_STALE), ssh(LAUNCH)]
  copy_install = out[3:6]
  assert out[:3] == [describe, create, describe]
  assert out[6:8] == launch
  assert out[8:] == [
      describe, ssh(tpu_vm.run_status_script(), worker="0"),
      f"{queued} delete my-tpu {WHERE} --force --quiet", create, describe,
      "gcloud storage rm gs://my-bucket/runs/r50/run.lock", *copy_install, *launch]


class FakeGcloud:
  """Answers `describe` and worker 0's status from scripted sequences; records every command."""

  def __init__(self, states, statuses=()):
    self.states, self.statuses, self.commands = list(states), list(statuses), []

  def __call__(self, argv, capture):
    self.commands.append(shlex.join(argv))
    if "describe" in argv:
      return tpu_vm.Answer(0, self.states.pop(0) + "\n", "")
    if "--worker=0" in argv:
      return tpu_vm.Answer(0, self.statuses.pop(0) + "\n", "")
    return tpu_vm.Answer(0, "", "")


def _watch(fake, queued=False, **kwargs):
  target = tpu_vm.Target("my-tpu", "us-central2-b", "my-project", queued=queued)
  spec = tpu_vm.SliceSpec("v4-32", "tpu-ubuntu2204-base", spot=True)
  job = tpu_vm.TrainJob("configs/x.py", "gs://b/r")
  sleeps = []
  reason = tpu_vm.watch(tpu_vm.Runner(False, fake), target, spec, job=job,
                        tarball="/tmp/src.tar.gz", sleep=sleeps.append, poll_seconds=60, **kwargs)
  return reason, sleeps, target, spec, job


def test_watch_relaunches_a_preempted_spot_vm_and_ends_when_the_run_finishes():
  fake = FakeGcloud(states=["READY", "PREEMPTED", "READY", "READY"],
                    statuses=["running", "running", "== dateopt-train exited with status 0"])
  reason, sleeps, target, spec, job = _watch(fake)
  assert reason == "dateopt-train finished (status 0)"
  join = lambda commands: [shlex.join(c) for c in commands]
  status = shlex.join(tpu_vm.ssh_command(target, tpu_vm.run_status_script(), worker="0"))
  describe = shlex.join(tpu_vm.describe_state_command(target))
  assert fake.commands == [
      describe, status,
      describe,  # PREEMPTED: no status asked; delete, create, same workdir, copy, install, start
      shlex.join(tpu_vm.delete_command(target)), shlex.join(tpu_vm.create_command(target, spec)),
      "gcloud storage rm gs://b/r/run.lock",
      *join(tpu_vm.copy_commands(target, "/tmp/src.tar.gz")),
      *join(tpu_vm.install_commands(target)), *join(tpu_vm.start_commands(target, job)),
      describe, status, describe, status]
  assert sleeps == [60, 60, 60]


def test_watch_recreates_a_suspended_queued_resource_and_waits_until_active():
  fake = FakeGcloud(states=["SUSPENDED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE",
                            "ACTIVE"], statuses=["stopped"])
  reason, sleeps, target, spec, _ = _watch(fake, queued=True)
  assert reason == "the run was stopped with `dateopt-tpu stop`"
  assert fake.commands[1:3] == [shlex.join(tpu_vm.delete_command(target)),
                                shlex.join(tpu_vm.create_command(target, spec))]
  assert "--force" in fake.commands[1] and "queued-resources create" in fake.commands[2]
  assert sleeps == [60, 60, 60]  # two polls while queued, one after the relaunch


def test_watch_restarts_a_terminated_trainer_on_the_same_vm_and_stops_on_a_crash():
  fake = FakeGcloud(states=["READY", "READY"],
                    statuses=["== dateopt-train exited with status 143",
                              "Traceback ...\n== dateopt-train exited with status 2"])
  with pytest.raises(tpu_vm.TpuVmError, match="failed with status 2"):
    _watch(fake)
  starts = [c for c in fake.commands if "tmux new-session" in c or "kill-session" in c]
  assert len(starts) == 2 and not any(" delete " in c for c in fake.commands)


def test_a_relaunch_tries_again_when_the_new_vm_does_not_answer_yet():
  fake = FakeGcloud(states=["PREEMPTED", "READY"],
                    statuses=["== dateopt-train exited with status 0"])
  failures = iter([255])  # the first scp fails (ssh not up yet), everything else succeeds

  def flaky(argv, capture):
    answer = fake(argv, capture)
    return tpu_vm.Answer(next(failures, 0), "", "") if "scp" in argv else answer

  reason, sleeps, *_ = _watch(flaky)
  assert reason == "dateopt-train finished (status 0)"
  assert sum(" scp " in c for c in fake.commands) == 2
  assert sum("tmux new-session" in c for c in fake.commands) == 1
  assert sleeps == [60, 60]  # the retry's wait, then the poll


def test_watch_gives_up_after_max_relaunches():
  fake = FakeGcloud(states=["PREEMPTED", "PREEMPTED"])
  with pytest.raises(tpu_vm.TpuVmError, match="1 relaunches"):
    _watch(fake, max_relaunches=1)


@pytest.mark.parametrize("queued, state, status, action", [
    (False, "PREEMPTED", None, "recreate"),
    (False, "TERMINATED", None, "recreate"),
    (True, "SUSPENDED", None, "recreate"),
    (True, "FAILED", None, "recreate"),
    (True, "SUSPENDING", None, "wait"),
    (False, "CREATING", None, "wait"),
    (False, "NOT_FOUND", None, "fail"),
    (False, "READY", None, "wait"),  # worker 0 did not answer
    (False, "READY", ("running", None), "wait"),
    (True, "ACTIVE", ("exited", 0), "done"),
    (False, "READY", ("stopped", None), "done"),
    (False, "READY", ("exited", 143), "restart"),
    (False, "READY", ("vanished", None), "restart"),
    (False, "READY", ("exited", 1), "fail"),
    (False, "READY", ("exited", 2), "fail"),
])
def test_next_action(queued, state, status, action):
  status = None if status is None else tpu_vm.RunStatus(*status)
  assert tpu_vm.next_action(queued, state, status).action == action


def test_parse_run_status():
  assert tpu_vm.parse_run_status("running\n") == tpu_vm.RunStatus("running")
  assert tpu_vm.parse_run_status("stopped") == tpu_vm.RunStatus("stopped")
  assert tpu_vm.parse_run_status("step 10 loss 2.3\n") == tpu_vm.RunStatus("vanished")
  assert tpu_vm.parse_run_status("") == tpu_vm.RunStatus("vanished")


def test_resource_state_reads_not_found_and_gcloud_failures():
  def answers(answer):
    return tpu_vm.Runner(False, lambda argv, capture: answer)
  target = tpu_vm.Target("t", "z")
  not_found = tpu_vm.Answer(1, "", "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: x")
  assert tpu_vm.resource_state(answers(not_found), target) == "NOT_FOUND"
  assert tpu_vm.resource_state(answers(tpu_vm.Answer(1, "", "network")), target) == "UNKNOWN"
  assert tpu_vm.resource_state(answers(tpu_vm.Answer(0, "ready\n", "")), target) == "READY"


def test_run_for_real_with_a_fake_gcloud_packs_the_given_tree(tmp_path, monkeypatch):
  monkeypatch.setattr(tpu_vm.tempfile, "gettempdir", lambda: str(tmp_path))
  _tree(tmp_path)
  fake = FakeGcloud(states=["READY"])
  args = tpu_vm.parse_args(["run", *TARGET, *SLICE, "--config=configs/c.py",
                            "--workdir=gs://b/r", f"--source={tmp_path}"])
  tpu_vm.dispatch(args, tpu_vm.Runner(False, fake))
  assert len(fake.commands) == 6 and " create " not in " ".join(fake.commands)  # it exists
  with tarfile.open(tpu_vm.staged_tarball_path("my-tpu")) as archive:
    assert sorted(archive.getnames()) == ["configs/c.py", "dateopt/a.py", "new_untracked.py",
                                          "pyproject.toml"]


def test_run_refuses_to_go_on_when_the_state_cannot_be_read():
  runner = tpu_vm.Runner(False, lambda argv, capture: tpu_vm.Answer(1, "", "PERMISSION_DENIED"))
  spec = tpu_vm.SliceSpec("v4-8", "v")
  with pytest.raises(tpu_vm.TpuVmError, match="cannot read the state of t; see why with: gcloud"):
    tpu_vm.ensure_created(runner, tpu_vm.Target("t", "z"), spec)


def test_a_failing_gcloud_command_is_one_error_line():
  runner = tpu_vm.Runner(False, lambda argv, capture: tpu_vm.Answer(1, "", ""))
  with pytest.raises(tpu_vm.TpuVmError, match="status 1 from: gcloud compute tpus tpu-vm delete"):
    runner.run(tpu_vm.delete_command(tpu_vm.Target("t", "z")))


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("args, message", [
    (["create", "my-tpu", "--zone=z"], "required: --accelerator-type, --version"),
    (["create", "my-tpu", *SLICE], "required: --zone"),
    (["create", "my-tpu", "--zone=z", "--accelerator-type=v4_32", "--version=v"],
     "--accelerator-type must look like v4-32"),
    (["create", "My_TPU", "--zone=z", *SLICE], "lowercase letters"),
    (["start", "my-tpu", "--zone=z", "--workdir=gs://b/r"], "required: --config"),
    (["start", "my-tpu", "--zone=z", "--config=configs/nope.py", "--workdir=gs://b/r"],
     "no such file"),
    (["start", "my-tpu", "--zone=z", "--accelerator-type=v4-32", JOB[0], "--workdir=runs/r"],
     "several workers"),
    (["run", "my-tpu", "--zone=z", *SLICE, *JOB, "--batch_size=8"], "--config.field=value"),
    (["tail", "my-tpu", "--zone=z", "--worker=first"], "worker index or all"),
    (["install", "my-tpu", "--zone=z", "--extras=data]; rm -rf ~"], "comma-separated"),
])
def test_clear_errors(args, message):
  done = dry_run(*args, check=False)
  assert done.returncode == 2 and done.stdout == ""
  assert message in done.stderr, done.stderr


def test_local_workdir_on_one_host_with_spot_is_a_warning():
  done = dry_run("run", *TARGET, "--accelerator-type=v4-8", "--version=v", "--spot", JOB[0],
                 "--workdir=runs/r")
  assert "warning: --workdir 'runs/r' is on the VM's disk" in done.stderr
  assert lines("start", *TARGET, "--accelerator-type=v4-8", JOB[0], "--workdir=runs/r")


def test_trainer_flags_after_double_dash_are_passed_through():
  out = lines("start", *TARGET, *JOB, "--", "--jax_distributed=on")
  assert "--workdir gs://my-bucket/runs/r50 --jax_distributed=on;" in remote_script(out[1])


def test_lock_name_is_the_trainers():
  tree = ast.parse((REPO / "dateopt" / "train" / "workdir_lock.py").read_text())
  [value] = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
             and [t.id for t in node.targets] == ["LOCK_NAME"]]
  assert tpu_vm.WORKDIR_LOCK_NAME == value


