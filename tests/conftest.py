"""Test configuration: 8 simulated CPU devices, set before jax is imported."""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
# XLA:CPU aborts the process ("Fatal Python error: Aborted") when a device thread has not
# joined a collective within 40 s. Eight simulated devices on 2 busy cores can take that
# long, so the suite gives them 10 minutes (the flags exist in jaxlib 0.10; unknown flags abort).
SLOW_COLLECTIVES = ("--xla_cpu_collective_timeout_seconds=600 "
                    "--xla_cpu_collective_call_terminate_timeout_seconds=600")
# XLA:CPU runs each device's part of a program as a task on a client thread pool of
# max(cores, devices) threads, and a part waiting in a collective holds its thread. With 8
# simulated devices on 2 cores that pool is exactly 8 threads: 7 parts of one step waiting
# in an all-reduce for the 8th, and the next step's launch on the 8th device waiting for
# that device's previous program, filled it, and nothing could run (issue 22, item 9: gdb
# stacks in notes/reliability.md). The rendezvous timeout then aborted the process. XLA
# sizes the pool from PJRT_NPROC: 64 threads leave room for every part and launch of
# several programs at once.
MIN_CPU_THREADS = 64
if int(os.environ.get("PJRT_NPROC") or 0) < MIN_CPU_THREADS:
  os.environ["PJRT_NPROC"] = str(MIN_CPU_THREADS)
for flag in (_FLAG, SLOW_COLLECTIVES):
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_enable_x64", False)
