"""Runs a command on a machine made busy on purpose: the test suite's check for a loaded CI host.

On a 2-core machine at load average ~13, `make test` died with `Fatal Python error:
Aborted`. The cause (notes/reliability.md, from gdb stacks of a run hung under this
script): XLA:CPU's client thread pool has max(cores, devices) = 8 threads for 8
simulated devices, and a busy machine let all 8 block at once (7 device parts waiting in an
all-reduce for the 8th, whose launch waited for its device's previous program). XLA then
aborts when the rendezvous limit runs out ("Termination timeout ... Expected 8 threads to
join the rendezvous, but only 7 of them arrived on time"; `--abort-demo` shows that message
with the limit at 1 s). `tests/conftest.py` sets PJRT_NPROC=64, which sizes the pool. The
check:

  python research/under_load.py --busy 12 -- .venv/bin/python -m pytest -q tests/test_polish.py

It starts `--busy` processes that spin, runs the command, stops them, and prints the
load average seen and the command's exit status (which it exits with).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading

# 8 simulated devices all-reduce 400 times: the case that aborts when one thread is late.
_ALL_REDUCE = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("d",))
body = lambda v: jax.lax.psum(jnp.sin(v) @ jnp.cos(v).T, "d")
step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P()))
x = jax.device_put(jnp.ones((8 * 256, 256)), NamedSharding(mesh, P("d")))
for _ in range(400):
  y = step(x)
y.block_until_ready()
print("400 all-reduces done")
"""
_ONE_SECOND = ("--xla_force_host_platform_device_count=8 "
               "--xla_cpu_collective_timeout_seconds=1 "
               "--xla_cpu_collective_call_terminate_timeout_seconds=1")


def _spin() -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _watch_load(stop: threading.Event, peak: list[float]) -> None:
  while not stop.wait(2.0):
    peak[0] = max(peak[0], os.getloadavg()[0])


def run_under_load(command: list[str], busy: int, env: dict[str, str] | None = None) -> int:
  """`command`'s exit status, run while `busy` spinning processes load the machine."""
  spinners = [_spin() for _ in range(busy)]
  stop, peak = threading.Event(), [os.getloadavg()[0]]
  watcher = threading.Thread(target=_watch_load, args=(stop, peak), daemon=True)
  watcher.start()
  try:
    status = subprocess.call(command, env=env)
  finally:
    stop.set()
    for spinner in spinners:
      spinner.kill()
      spinner.wait()
  print(f"under_load: {busy} busy processes on {os.cpu_count()} cores, peak 1-minute load "
        f"average {peak[0]:.1f}; the command exited {status}.", flush=True)
  return status


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--busy", type=int, default=12, help="spinning processes (default 12)")
  parser.add_argument("--abort-demo", action="store_true",
                      help="run 8-device all-reduces with XLA's rendezvous limit at 1 s")
  parser.add_argument("command", nargs="*", help="the command (after --)")
  args = parser.parse_args()
  if args.busy < 0:
    parser.error(f"--busy must be >= 0; got {args.busy}")
  if args.abort_demo == bool(args.command):
    parser.error("give a command after --, or --abort-demo (not both)")
  if args.abort_demo:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=_ONE_SECOND)
    return run_under_load([sys.executable, "-c", _ALL_REDUCE], args.busy, env)
  return run_under_load(args.command, args.busy)


if __name__ == "__main__":
  sys.exit(main())
