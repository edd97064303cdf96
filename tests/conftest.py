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

# The runs that tests start in other processes (the CLI, scripts, notebook kernels) compile
# with LLVM's optimizations off (`--xla_backend_optimization_level=0`), which cuts their
# compile time, most of their run: `make test` took 982 s before and 806 s after on 2 cores
# (b6796b7, a clean clone). This process and its pytest workers keep XLA's
# defaults, as a user's run has them: at another optimization level the last bit of a float
# can change, and the tests that compare two programs bit for bit (tests/test_guard.py) or
# replay a run recorded at the defaults (tests/test_engine_replay.py) rightly fail, and so
# do the subprocess runs at 1,000x the LR of tests/test_divergence.py, whose own flags keep
# the defaults (at O0 the watch gives that run up as not learning, not as diverged). The flag
# is taken off before this process's backend starts, and put back for its children after.
CHILD_FLAG = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].replace(CHILD_FLAG, "").strip()

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_enable_x64", False)
jax.devices()  # this process's backend starts with the flags above
os.environ["XLA_FLAGS"] += " " + CHILD_FLAG


import pytest  # noqa: E402

import tiny_config  # noqa: E402  (tests/tiny_config.py)
from dateopt.train import parallel  # noqa: E402


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
LONGEST_FILES = ("test_faults.py", "test_lm_training.py", "test_train.py", "test_batch_growth.py",
                 "test_notebooks.py", "test_study.py", "test_divergence.py", "test_docs.py",
                 "test_schedule_comparison.py", "test_engine_replay.py", "test_polish.py",
                 "test_transformer.py", "test_grad_accum.py", "test_main_job.py")


def _file_rank(item) -> int:
  name = item.path.name
  return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(items):
  items.sort(key=_file_rank)  # stable: each file's own order is kept
