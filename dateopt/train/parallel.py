"""Data-parallel layout: one `data` mesh axis over every device of every process.

The train step is a plain `jax.jit` over a `Mesh`: the batch is sharded on the
`data` axis, parameters and optimizer state are replicated, and XLA inserts the
gradient all-reduce. Each process feeds only its own slice of the global batch
(`jax.make_array_from_process_local_data`).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None) -> None:
  """`jax.distributed.initialize` for multi-host runs; a no-op for one process.

  On Cloud TPU VMs and SLURM every argument is detected by JAX itself (call with
  none); elsewhere pass all three. CPU processes talk through gloo.
  """
  explicit = coordinator_address is not None
  on_tpu_pod = bool(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(","))
  if not explicit and not on_tpu_pod and "SLURM_JOB_ID" not in os.environ:
    return
  if jax.distributed.is_initialized():
    return
  # Only the CPU client reads this; asking for the backend here would start it too early.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named `data` over `devices` (default: all devices of all processes).

  Built with `Mesh` directly: its axes are Auto, while `jax.make_mesh` now
  defaults to Explicit axes, which changes how jit propagates shardings.
  """
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles each process's slice into one global array sharded on `data`."""
  sharding = batch_sharded(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


def to_host(tree: Any) -> Any:
  """Fully-replicated arrays to NumPy on every process."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array)
                      else x, tree)
