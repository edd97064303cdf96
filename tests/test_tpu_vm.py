"""dateopt-tpu (dateopt/tpu.py, and scripts/tpu_vm.py from a clone) without gcloud: the exact commands (--dry-run), the remote scripts, watch."""

import ast
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path

import pytest

import dateopt

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
TRAINER = ("trap : TERM; "
           "WORKER=$(curl -sf -H \"Metadata-Flavor: Google\" http://metadata.google.internal/"
           "computeMetadata/v1/instance/attributes/agent-worker-number || hostname); "
           "cd ~/dateopt && { echo \"== dateopt-train starts on worker $WORKER at $(date -u)\"; "
           "PYTHONUNBUFFERED=1 .venv/bin/dateopt-train --config configs/imagenet_resnet50_legw.py "
           "--workdir gs://my-bucket/runs/r50 --config.batch_size=16384; "
           "echo \"== dateopt-train exited with status $?\"; } "
           ">> ~/dateopt_logs/worker-$WORKER.log 2>&1")
# The pid file's group, and only while its leader is still the trainer's shell.
PID = "pid=$(cat ~/dateopt_logs/dateopt-train.pid 2>/dev/null | tr -cd 0-9); "
OURS = ('ours() { [ "${pid:-0}" -gt 1 ] && [ "$pid" != "$$" ] && '
        '[ "$(ps -o pgid= -p "$pid" | tr -d " ")" = "$pid" ] && '
        'tr "\\0" " " < /proc/$pid/cmdline | grep -q dateopt-train; } 2>/dev/null; ')


def end_ours(grace):
  return ("end_ours() { kill -s TERM -- -$pid; "
          f"for i in $(seq {grace}); do kill -0 -- -$pid 2>/dev/null || return 0; sleep 1; done; "
          f"echo \"dateopt-train still runs after {grace} s on $(hostname): SIGKILL to its "
          "process group $pid\"; kill -s KILL -- -$pid 2>/dev/null || true; }; ")


PREPARE = ("mkdir -p ~/dateopt_logs; " + PID + OURS + end_ours(300)
           + "if ours; then echo \"ending the dateopt-train that dateopt-tpu started before on "
           "$(hostname) (process group $pid)\"; end_ours; fi; "
           "rm -f ~/dateopt_logs/dateopt-train.pid; "
           "for i in $(seq 10); do holders=$(ls /dev/accel* /dev/vfio/* 2>/dev/null "
           "| xargs -r sudo lsof -t 2>/dev/null | sort -u | paste -sd, -); "
           "[ -z \"$holders\" ] && break; sleep 1; done; "
           "if [ -n \"$holders\" ]; then echo \"dateopt-tpu: the TPU of $(hostname) is in use by "
           "processes that dateopt-tpu did not start:\"; ps -o pid,user,etime,args -p "
           "\"$holders\"; echo \"dateopt-tpu: not starting dateopt-train; end those processes "
           "yourself (as their owner), then run start again\"; exit 1; fi; "
           "sudo rm -f /tmp/libtpu_lockfile")
LAUNCH = ("set -e; mkdir -p ~/dateopt_logs; rm -f ~/dateopt_logs/stopped; "
          f"setsid nohup bash -c {shlex.quote(TRAINER)} </dev/null >/dev/null 2>&1 "
          "& echo $! > ~/dateopt_logs/dateopt-train.pid")
# The same with a packaged config (all a wheel install can send), and no override.
PACKAGED_JOB = ["--config=imagenet_resnet50_legw", JOB[1]]
PACKAGED_LAUNCH = LAUNCH.replace("configs/imagenet_resnet50_legw.py", "imagenet_resnet50_legw",
                                 1).replace(" --config.batch_size=16384", "", 1)
# What no printed command may hold: a kill of processes that dateopt-tpu did not start.
FOREIGN_KILLS = ("pkill", "killall", "kill -9", "sudo kill", "xargs -r kill", "tmux kill")


def dry_run(*args, check=True):
  """The launcher under --dry-run, called in this process as `scripts/tpu_vm.py` calls it
  (`tpu.main`; a Python start a call would cost seconds): its status, stdout and stderr.
  `test_the_script_runs_as_a_user_runs_it` runs the script itself."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      status = tpu_vm.main(["--dry-run", *args])
    except SystemExit as stop:  # argparse's refusals
      status = stop.code
  done = subprocess.CompletedProcess(["dateopt-tpu", "--dry-run", *args], status, out.getvalue(),
                                     err.getvalue())
  if check:
    assert done.returncode == 0, done.stderr
  return done


def test_the_script_runs_as_a_user_runs_it():
  args = ["run", *TARGET, *SLICE, *JOB]
  done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", *args], capture_output=True,
                        text=True, timeout=60, check=False)
  assert done.returncode == 0, done.stderr
  assert done.stdout == dry_run(*args).stdout and done.stdout.count("\n") > 3


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
  tpu_vm.copy(runner, tpu_vm.Target("t", "z"), str(tarball),
              package=tpu_vm.Package(tpu_vm.TREE, tmp_path / "missing"))
  assert not tarball.exists()
  with pytest.raises(tpu_vm.TpuVmError, match="not a directory"):
    tpu_vm.write_source_tarball(tmp_path / "missing", str(tarball))


# ------------------------------------------------------------------ install, start, tail, stop


def test_install_command_makes_a_venv_with_the_tpu_extras():
  [line] = lines("install", *TARGET)
  script = remote_script(line)
  assert line == ssh(script)
  assert script.startswith("set -e; mkdir -p ~/dateopt; cd ~/dateopt; ")
  assert 'need="$need $PY-venv"' in script  # python3-venv / python3.11-venv when missing
  assert "apt-get install -y -qq $need" in script
  assert "$PY -m venv .venv" in script
  assert script.endswith('.venv/bin/python -m pip install -q -e ".[train,data,gcp,tpu]"')
  assert remote_script(lines("install", *TARGET, "--extras=data,tpu")[0]).endswith('".[data,tpu]"')


def test_start_checks_the_tpu_then_launches_in_the_background_with_a_pid_file():
  assert lines("start", *TARGET, *JOB, "--config.batch_size=16384") == [
      ssh(PREPARE), ssh(LAUNCH)]


def test_trainer_shell_logs_per_worker_with_the_exit_status(tmp_path):
  """The background shell's command, run here with a fake metadata server and trainer."""
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
  wheel = tpu_vm.Package(tpu_vm.FILE, Path("dist/dateopt-0.1.0-py3-none-any.whl"))
  release = tpu_vm.Package(tpu_vm.RELEASE, version="0.1.0")
  scripts = [tpu_vm.unpack_script(), tpu_vm.install_script(), tpu_vm.prepare_script(),
             tpu_vm.install_script(package=wheel), tpu_vm.install_script(package=release),
             tpu_vm.launch_script(job), tpu_vm.trainer_shell(job), tpu_vm.stop_script(),
             tpu_vm.tail_script(follow=True), tpu_vm.run_status_script()]
  for script in scripts:
    done = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, (script, done.stderr)


def test_tail_and_stop_commands():
  assert lines("tail", *TARGET) == [ssh("tail -v -n 100 ~/dateopt_logs/worker-*.log")]
  assert lines("tail", *TARGET, "--worker=2", "--lines=20", "--follow") == [
      ssh("tail -v -n 20 -F ~/dateopt_logs/worker-*.log", worker="2")]
  # Only the pid file's process group, after the check that it is still ours.
  assert lines("stop", *TARGET, "--grace-seconds=60") == [ssh(
      "mkdir -p ~/dateopt_logs; touch ~/dateopt_logs/stopped; " + PID + OURS + end_ours(60)
      + "if ours; then end_ours; else echo \"no dateopt-train started by dateopt-tpu runs on "
      "$(hostname)\"; fi; rm -f ~/dateopt_logs/dateopt-train.pid")]


# ------------------------------------------------------------------ a wheel install, --wheel


def wheel_install(tmp_path):
  """site-packages holding dateopt's launcher as a wheel installs it: no pyproject.toml above."""
  package = tmp_path / "site-packages" / "dateopt"
  package.mkdir(parents=True, exist_ok=True)
  (package / "tpu.py").write_text((REPO / "dateopt" / "tpu.py").read_text())
  (package / "__init__.py").write_text(f'__version__ = "{dateopt.__version__}"\n')
  (package / "configs").mkdir(exist_ok=True)
  (package / "configs" / "imagenet_resnet50_legw.py").write_text("")
  return package.parent


def wheel_dry_run(tmp_path, *args):
  """`dateopt-tpu --dry-run ARGS` from that install, in a directory outside any clone."""
  code = "import sys; from dateopt import tpu; sys.exit(tpu.main())"
  return subprocess.run([sys.executable, "-c", code, "--dry-run", *args], capture_output=True,
                        text=True, timeout=60, check=False, cwd=tmp_path,
                        env={**os.environ, "PYTHONPATH": str(wheel_install(tmp_path))})


def test_a_wheel_install_runs_with_no_source_installing_this_version(tmp_path):
  done = wheel_dry_run(tmp_path, "run", *TARGET, *SLICE, *PACKAGED_JOB)
  assert done.returncode == 0, done.stderr
  out = done.stdout.splitlines()
  assert [line.split(" --")[0] for line in out] == [
      "gcloud compute tpus tpu-vm describe my-tpu", "gcloud compute tpus tpu-vm create my-tpu",
      *[SSH.split(" --")[0]] * 3]  # nothing to copy: install, prepare, launch
  pinned = f'"dateopt[train,data,gcp,tpu]=={dateopt.__version__}"'
  assert remote_script(out[2]).endswith(f".venv/bin/python -m pip install -q {pinned}")
  assert remote_script(out[3]) == PREPARE
  assert remote_script(out[4]) == PACKAGED_LAUNCH
  assert "echo $! > ~/dateopt_logs/dateopt-train.pid" in out[4]
  assert not [kill for kill in FOREIGN_KILLS if kill in done.stdout]
  assert f"install dateopt=={dateopt.__version__} from PyPI" in done.stderr


def test_an_install_from_git_sends_the_same_commit_to_the_workers(tmp_path):
  # pip's record of a `pip install "dateopt @ git+..."` (PEP 610), as the launcher finds it.
  site = wheel_install(tmp_path)
  info = site / f"dateopt-{dateopt.__version__}.dist-info"
  info.mkdir()
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dateopt\n"
                                 f"Version: {dateopt.__version__}\n")
  commit = "0f97ea1" + "0" * 33
  (info / "direct_url.json").write_text(json.dumps({
      "url": "https://github.com/dateopt/dateopt",
      "vcs_info": {"vcs": "git", "commit_id": commit, "requested_revision": "main"}}))
  done = wheel_dry_run(tmp_path, "run", *TARGET, *SLICE, *PACKAGED_JOB)
  assert done.returncode == 0, done.stderr
  install = remote_script(done.stdout.splitlines()[2])
  assert install.endswith('.venv/bin/python -m pip install -q "dateopt[train,data,gcp,tpu] @ '
                          f'git+https://github.com/dateopt/dateopt@{commit}"')
  assert f"install git+https://github.com/dateopt/dateopt@{commit}" in done.stderr
  # A record that could break out of the shell's quotes is not used.
  (info / "direct_url.json").write_text(json.dumps({
      "url": 'https://x"; rm -rf ~; "', "vcs_info": {"vcs": "git", "commit_id": commit}}))
  done = wheel_dry_run(tmp_path, "run", *TARGET, *SLICE, *PACKAGED_JOB)
  assert "rm -rf ~" not in done.stdout and f"=={dateopt.__version__}" in done.stdout


def test_a_wheel_install_refuses_what_it_cannot_send(tmp_path):
  done = wheel_dry_run(tmp_path, "run", *TARGET, *SLICE, "--config=configs/mine.py", JOB[1])
  assert done.returncode == 2 and done.stdout == ""
  assert "not a packaged config (imagenet_resnet50_legw)" in done.stderr
  assert "--source" in done.stderr
  done = wheel_dry_run(tmp_path, "copy", *TARGET)
  assert done.returncode == 2 and "nothing to copy" in done.stderr


def test_no_source_tree_in_process_gives_the_same_commands(monkeypatch, capsys):
  monkeypatch.setattr(tpu_vm, "source_tree", lambda: None)
  assert tpu_vm.main(["--dry-run", "run", *TARGET, *SLICE, "--spot", *PACKAGED_JOB,
                      "--watch"]) == 0
  out = capsys.readouterr().out
  assert out.count(f'"dateopt[train,data,gcp,tpu]=={dateopt.__version__}"') == 2  # + relaunch
  assert " scp " not in out and not [kill for kill in FOREIGN_KILLS if kill in out]


def test_wheel_option_copies_and_installs_that_file(tmp_path):
  wheel = tmp_path / "dist" / "dateopt-0.1.0-py3-none-any.whl"
  wheel.parent.mkdir()
  wheel.write_bytes(b"")
  out = lines("run", *TARGET, *SLICE, *PACKAGED_JOB, f"--wheel={wheel}")[2:]
  assert out[0] == (f"gcloud compute tpus tpu-vm scp {wheel} "
                    f"my-tpu:dateopt-0.1.0-py3-none-any.whl {WHERE} --worker=all")
  assert remote_script(out[1]).endswith(
      ".venv/bin/python -m pip uninstall -q -y dateopt 2>/dev/null || true; "
      '.venv/bin/python -m pip install -q "dateopt[train,data,gcp,tpu] @ '
      'file://$HOME/dateopt-0.1.0-py3-none-any.whl"')
  assert out[2:] == [ssh(PREPARE), ssh(PACKAGED_LAUNCH)]
  assert lines("copy", *TARGET, f"--wheel={wheel}") == [out[0]]
  assert lines("install", *TARGET, f"--wheel={wheel}") == [out[1]]


def test_no_dry_run_prints_a_kill_of_processes_it_did_not_start():
  commands = [("start", *TARGET, *JOB), ("stop", *TARGET), ("run", *TARGET, *SLICE, *JOB),
              ("run", *TARGET, *SLICE, "--spot", *JOB, "--watch")]
  for args in commands:
    out = "\n".join(lines(*args))
    assert not [kill for kill in FOREIGN_KILLS if kill in out], args
    # Every signal goes to the pid file's group: TERM, a liveness probe, KILL.
    assert set(re.findall(r"\bkill [^;]*", out)) <= {
        "kill -s TERM -- -$pid", "kill -0 -- -$pid 2>/dev/null || return 0",
        "kill -s KILL -- -$pid 2>/dev/null || true"}, args


# ------------------------------------------------------------------ start and stop, run here


@pytest.fixture
def worker(tmp_path):
  """A worker's home with a fake metadata server and a fake trainer (bash runs the scripts).

  The trainer saves and exits 143 on SIGTERM, as dateopt-train does; `stubborn`
  makes one that ignores it.
  """
  home, bin_dir = tmp_path / "home", tmp_path / "bin"
  trainer = home / "dateopt" / ".venv" / "bin" / "dateopt-train"
  trainer.parent.mkdir(parents=True)
  bin_dir.mkdir()
  # No TPU here, and the real sudo stays out of it: `sudo lsof -t` finds no holder.
  for name, body in {"curl": "echo 0", "sudo": "exit 0"}.items():
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)
  env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
  started = []

  def write_trainer(on_term='exit 143'):
    trainer.write_text(f'#!/bin/sh\ntrap "{on_term}" TERM\nsleep 300 &\nwait\nwait\n')
    trainer.chmod(0o755)

  def run(script):
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60, check=False)

  def other(*argv, leader=False):
    """A process of someone else's, whose pid the test may plant in the pid file."""
    process = subprocess.Popen(argv, process_group=0 if leader else None)
    started.append(process)
    return process

  write_trainer()
  yield types.SimpleNamespace(bin=bin_dir, run=run, other=other, write_trainer=write_trainer,
                              pid_file=home / "dateopt_logs" / "dateopt-train.pid",
                              log=home / "dateopt_logs" / "worker-0.log")
  for process in started:
    process.kill()
    process.wait()


def alive(pid):
  """Running (a zombie has ended: only its exit status waits for its parent)."""
  try:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"


def group_alive(pgid):
  """Whether any process of the group `pgid` runs."""
  return any(_pgid(p) == pgid and alive(int(p.name))
             for p in Path("/proc").iterdir() if p.name.isdigit())


def _pgid(proc):
  try:
    return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
  except (OSError, IndexError):  # it ended meanwhile
    return None


def wait_until(condition, seconds=20):
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if condition():
      return True
    time.sleep(0.1)
  return condition()


def launch(worker):
  """Runs the start's launch script; returns the pid file's pid once the trainer sleeps."""
  done = worker.run(tpu_vm.launch_script(tpu_vm.TrainJob("configs/x.py", "gs://b/r")))
  assert done.returncode == 0, done.stderr
  pid = int(worker.pid_file.read_text())
  assert wait_until(lambda: any(_pgid(p) == pid and b"sleep" in (p / "cmdline").read_bytes()
                                for p in Path("/proc").iterdir() if p.name.isdigit()))
  return pid


def test_stop_ends_the_group_start_began_and_nothing_else(worker):
  bystander = worker.other("sleep", "300")
  # Its command line names dateopt-train too: a pattern match would have killed it.
  namesake = worker.other("bash", "-c", "sleep 300; : dateopt-train")
  pid = launch(worker)
  assert pid not in (bystander.pid, namesake.pid)
  assert os.getpgid(pid) == pid  # setsid: the pid file names a process group leader
  assert worker.run(tpu_vm.run_status_script()).stdout == "running\n"
  done = worker.run(tpu_vm.stop_script(grace_seconds=20))
  assert done.returncode == 0, done.stderr
  assert not group_alive(pid)
  assert worker.log.read_text().splitlines()[-1] == "== dateopt-train exited with status 143"
  assert bystander.poll() is None and namesake.poll() is None
  assert not worker.pid_file.exists()
  assert worker.run(tpu_vm.run_status_script()).stdout == "stopped\n"


def test_stop_kills_the_group_after_the_grace(worker):
  worker.write_trainer(on_term="")  # ignores SIGTERM, and so does its child
  bystander = worker.other("sleep", "300")
  pid = launch(worker)
  done = worker.run(tpu_vm.stop_script(grace_seconds=2))
  assert f"SIGKILL to its process group {pid}" in done.stdout
  assert wait_until(lambda: not group_alive(pid))
  assert bystander.poll() is None


@pytest.mark.parametrize("leader, cmdline", [
    (True, ["sleep", "300"]),  # a group leader, but not the trainer's shell: a reused pid
    (False, ["bash", "-c", "sleep 300; : dateopt-train"]),  # the name, but no group of its own
])
def test_stop_leaves_a_pid_that_is_no_longer_ours_alone(worker, leader, cmdline):
  other = worker.other(*cmdline, leader=leader)
  # Once it runs its own command line (not the test's, from before its exec).
  assert wait_until(lambda: Path(f"/proc/{other.pid}/cmdline").read_bytes().split(b"\0")[:-1]
                    == [part.encode() for part in cmdline])
  worker.pid_file.parent.mkdir(parents=True)
  worker.pid_file.write_text(f"{other.pid}\n")
  done = worker.run(tpu_vm.stop_script(grace_seconds=2))
  assert done.returncode == 0
  assert "no dateopt-train started by dateopt-tpu runs" in done.stdout
  assert other.poll() is None


def test_start_ends_its_earlier_run_then_starts_again(worker):
  first = launch(worker)
  done = worker.run(tpu_vm.prepare_script(grace_seconds=20))
  assert done.returncode == 0, done.stdout + done.stderr
  assert f"(process group {first})" in done.stdout and not group_alive(first)
  assert launch(worker) != first


def test_start_refuses_a_busy_tpu_and_leaves_its_holder_alone(worker):
  holder = worker.other("sleep", "300", leader=True)
  # This machine has no TPU: ls names one, and `sudo lsof -t` answers the holder's pid.
  fakes = {"ls": "echo /dev/accel0", "sudo": f'[ "$1" = lsof ] && echo {holder.pid}',
           "sleep": "true"}  # the wait for a device to be let go, without the wait
  for name, body in fakes.items():
    (worker.bin / name).write_text(f"#!/bin/sh\n{body}\n")
    (worker.bin / name).chmod(0o755)
  done = worker.run(tpu_vm.prepare_script())
  assert done.returncode == 1
  assert "is in use by processes that dateopt-tpu did not start" in done.stdout
  assert re.search(rf"^\s*{holder.pid} .*sleep 300$", done.stdout, re.M), done.stdout
  assert "end those processes yourself" in done.stdout
  assert holder.poll() is None


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
  assert out[5:] == [ssh(PREPARE), ssh(LAUNCH)]


def test_run_watch_dry_run_shows_one_relaunch_with_the_same_workdir():
  out = lines("run", *TARGET, *SLICE, "--queued", "--spot", *JOB, "--watch",
              "--config.batch_size=16384")
  queued = "gcloud compute tpus queued-resources"
  describe = f"{queued} describe my-tpu {WHERE} '--format=value(state.state)'"
  create = (f"{queued} create my-tpu {WHERE} --node-id=my-tpu --accelerator-type=v4-32 "
            "--runtime-version=tpu-ubuntu2204-base --spot")
  launch = [ssh(PREPARE), ssh(LAUNCH)]
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
  starts = [c for c in fake.commands if "setsid nohup" in c]
  assert len(starts) == 1 and not any(" delete " in c for c in fake.commands)


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
  assert sum("setsid nohup" in c for c in fake.commands) == 1
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
    (["install", "my-tpu", "--zone=z", "--wheel=dist/other-1.0-py3-none-any.whl"],
     "not a dateopt wheel or sdist"),
    (["install", "my-tpu", "--zone=z", "--wheel=dist/dateopt-9.9-py3-none-any.whl"],
     "no such file"),
    (["copy", "my-tpu", "--zone=z", "--source=.", "--wheel=dateopt-1.tar.gz"], "not both"),
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


