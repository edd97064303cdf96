"""Test configuration: 8 simulated CPU devices, set before jax is imported."""

import importlib.metadata
import os

_FLAG = "--xla_force_host_platform_device_count=8"


def _jaxlib_at_least(major: int, minor: int) -> bool:
  """Whether the installed jaxlib is `major.minor` or newer (read before jax is imported)."""
  release = importlib.metadata.version("jaxlib").split(".")[:2]
  return tuple(int(part) for part in release) >= (major, minor)


# XLA:CPU aborts the process ("Fatal Python error: Aborted") when a device thread has not
# joined a collective within 40 s. Eight simulated devices on 2 busy cores can take that
# long, so the suite gives them 10 minutes. The flags exist in jaxlib 0.10, not in 0.8 (the
# oldest allowed, `make test-oldest`), and an unknown flag aborts the process: older ones
# keep XLA's default.
SLOW_COLLECTIVES = ("--xla_cpu_collective_timeout_seconds=600 "
                    "--xla_cpu_collective_call_terminate_timeout_seconds=600"
                    if _jaxlib_at_least(0, 10) else "")
# XLA:CPU runs each device's part of a program as a task on a client thread pool of
# max(cores, devices) threads, and a part waiting in a collective holds its thread. With 8
# simulated devices on 2 cores that pool is exactly 8 threads: 7 parts of one step waiting
# in an all-reduce for the 8th, and the next step's launch on the 8th device waiting for
# that device's previous program, filled it, and nothing could run (gdb stacks in
# notes/reliability.md, "The cause, from the stacks of a hung run"). The rendezvous timeout
# then aborted the process. XLA sizes the pool from PJRT_NPROC: 64 threads leave room for
# every part and launch of several programs at once.
MIN_CPU_THREADS = 64
if int(os.environ.get("PJRT_NPROC") or 0) < MIN_CPU_THREADS:
  os.environ["PJRT_NPROC"] = str(MIN_CPU_THREADS)
for flag in (_FLAG, SLOW_COLLECTIVES):
  if flag and flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the test run, inherited by the subprocess runs: the
# suite compiles the same tiny programs in many tests and processes (test_batch_growth.py:
# 95 s -> 68 s on 2 cores). A cached executable is the same binary, so bit-exact comparisons
# hold. The directory is new each run and removed at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile
  _CACHE = tempfile.mkdtemp(prefix="dateopt-tests-jax-cache-")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE,
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.2",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")

# Every run of the suite compiles with LLVM's optimizations off
# (`--xla_backend_optimization_level=0`): this process, its pytest workers and the runs they
# start in other processes (the CLI, scripts, notebook kernels). Compiling is most of a tiny
# run: `make test` took 982 s with none of them at O0 and 806 s with the child processes at
# O0 (b6796b7, 2 cores of an Intel Xeon); with the workers at O0 too, 1,062 s -> 850 s (2
# cores of an AMD EPYC, before and after 0604157). A test that compares with XLA's default
# code generation (a run recorded at the defaults, two programs bit for bit: at another
# optimization level the last bit of a float can change), or whose time is running rather
# than compiling, is marked `xla_defaults` and runs in a child pytest at the defaults
# (`pytest_pyfunc_call` below); that child keeps the defaults for its own process only.
CHILD_FLAG = "--xla_backend_optimization_level=0"
AT_XLA_DEFAULTS = "DATEOPT_TESTS_AT_XLA_DEFAULTS"
os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].replace(CHILD_FLAG, "").strip()
if not os.environ.get(AT_XLA_DEFAULTS):
  os.environ["XLA_FLAGS"] += " " + CHILD_FLAG

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_enable_x64", False)
jax.devices()  # this process's backend starts with the flags above
if CHILD_FLAG not in os.environ["XLA_FLAGS"]:  # a child at the defaults: its own children at O0
  os.environ["XLA_FLAGS"] += " " + CHILD_FLAG


import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

import tiny_config  # noqa: E402  (tests/tiny_config.py)
from dateopt.train import parallel  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
  """A test marked `xla_defaults` runs at XLA's default optimization level (see `CHILD_FLAG`):
  the first such test of a file runs all of the file's in one child pytest, and each takes
  its outcome from the child's report (a failure quotes it)."""
  if pyfuncitem.get_closest_marker("xla_defaults") is None or os.environ.get(AT_XLA_DEFAULTS):
    return None
  outcomes = _AT_DEFAULTS.get(pyfuncitem.path)
  if outcomes is None:
    outcomes = _AT_DEFAULTS[pyfuncitem.path] = _run_at_xla_defaults(
        [item for item in pyfuncitem.session.items if item.path == pyfuncitem.path
         and item.get_closest_marker("xla_defaults") is not None], pyfuncitem.config)
  outcome, text = outcomes.get(pyfuncitem.name, ("failure", "the child pytest did not run it"))
  if outcome == "skipped":
    pytest.skip(text)
  if outcome != "passed":
    pytest.fail(f"at XLA's defaults, in a child pytest:\n{text}", pytrace=False)
  return True


_AT_DEFAULTS: dict = {}  # a test file -> {test name: (outcome, what the child said)}


def _run_at_xla_defaults(items, config) -> dict:
  """Runs `items` (of one file) in one child pytest at XLA's defaults: {test name:
  ("passed" | "failure" | "error" | "skipped", the child's report)}."""
  import tempfile
  import xml.etree.ElementTree as ElementTree
  env = dict(os.environ, **{AT_XLA_DEFAULTS: "1"})
  env["XLA_FLAGS"] = env["XLA_FLAGS"].replace(CHILD_FLAG, "").strip()
  with tempfile.TemporaryDirectory() as folder:
    report = os.path.join(folder, "report.xml")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", f"--junitxml={report}",
                           *[item.nodeid for item in items]],
                          cwd=str(config.rootpath), env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    if not os.path.exists(report):
      return {item.name: ("error", done.stdout[-6000:] + done.stderr[-2000:]) for item in items}
    cases = list(ElementTree.parse(report).getroot().iter("testcase"))
  outcomes = {}
  for case in cases:
    said = [(child.tag, (child.text or child.get("message", ""))[-6000:]) for child in case
            if child.tag in ("failure", "error", "skipped")]
    outcomes[case.get("name")] = said[0] if said else ("passed", "")
  return outcomes


@pytest.fixture
def tiny():
  """The tiny MNIST-1D LSTM config with fields set: `tiny(strategy="adaptive")`."""
  return tiny_config.with_fields


@pytest.fixture(scope="session")
def mesh8():
  """The 8 simulated devices on one `data` axis, as the trainer builds its mesh."""
  mesh = parallel.make_mesh()
  assert mesh.size == 8, "tests/conftest.py sets 8 simulated devices"
  return mesh


# The test files that take longest (seconds of work on 2 cores, `pytest --durations=0`),
# longest first. `make test` hands files to its two workers in collection order
# (--no-loadscope-reorder): starting these first keeps one worker from running a long file
# alone at the end. A stale list only costs time.
LONGEST_FILES = ("test_faults.py", "test_batch_growth.py", "test_train.py", "test_lm_training.py",
                 "test_notebooks.py", "test_divergence.py", "test_study.py", "test_docs.py",
                 "test_engine_replay.py", "test_transformer.py", "test_schedule_comparison.py",
                 "test_grad_accum.py", "test_polish.py", "test_main_job.py", "test_guard.py")


def _file_rank(item) -> int:
  name = item.path.name
  return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(items):
  items.sort(key=_file_rank)  # stable: each file's own order is kept
