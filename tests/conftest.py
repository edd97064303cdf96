"""Test configuration: 8 simulated CPU devices, set before jax is imported."""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
# XLA:CPU aborts the process ("Fatal Python error: Aborted") when a device thread has not
# joined a collective within 40 s. Eight simulated devices on 2 busy cores can take that
# long, so the suite gives them 10 minutes (the flags exist in jaxlib 0.10; unknown flags abort).
SLOW_COLLECTIVES = ("--xla_cpu_collective_timeout_seconds=600 "
                    "--xla_cpu_collective_call_terminate_timeout_seconds=600")
for flag in (_FLAG, SLOW_COLLECTIVES):
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)

jax.config.update("jax_enable_x64", False)
