"""The batch layout: how one global batch splits over processes, devices, micro-batches,
gradient groups and ghost batch-norm groups, checked in one place.

Every batch the trainer runs (the recipe's, or each rung of a growing batch's
ladder) must split evenly: over the devices and the processes; into
`grad_accum_steps` micro-batches, each again over the devices; into
`grad_groups` equal gradient groups of which every micro-batch holds an equal
part (the noise scale's groups); and, for a model with batch norm measured
over groups, into whole ghost batch-norm groups of `bn_group_size`. `quantum`
is the smallest step all of that allows; `check` raises one message per rule
a batch breaks, naming the config field the batch came from.

Example:
  >>> layout = BatchLayout(num_devices=8, grad_accum_steps=2, grad_groups=4)
  >>> layout.quantum
  16
  >>> layout.sizes(64)
  {'per_device': 8, 'per_microbatch': 32, 'per_group': 16, 'seen_by_batch_norm': 8}
  >>> layout.check("config.batch_size", 72)
  Traceback (most recent call last):
  ValueError: config.grad_accum_steps=2: config.batch_size=72 must be divisible by ...
"""

from __future__ import annotations

import dataclasses
import math
import jax
import ml_collections

from dateopt.train import config as config_lib


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """The divisors a global batch must respect (see the module docstring)."""

  num_devices: int
  num_processes: int = 1
  grad_accum_steps: int = 1
  grad_groups: int = 0  # 0 or 1: one gradient, no groups
  bn_group_size: int | None = None  # the model's ghost batch-norm size, if any
  has_batch_norm: bool = False  # whether grouped gradients split batch norm

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, num_devices: int,
                  grad_groups: int) -> "BatchLayout":
    """The layout of `config` on `num_devices` (every process's), with `grad_groups`
    the gradient groups the run measures over (0 when it measures none).

    Raises:
      ValueError: `config.grad_accum_steps` is not an int >= 1.
    """
    accum = config.grad_accum_steps
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
      raise ValueError(f"config.grad_accum_steps must be an int >= 1 (micro-batches per "
                       f"optimizer step); got {accum!r}.")
    return cls(num_devices=num_devices, num_processes=jax.process_count(),
               grad_accum_steps=accum, grad_groups=grad_groups,
               bn_group_size=config_lib.to_dict(config.model_kwargs).get("bn_group_size"),
               has_batch_norm=config.model.startswith("resnet"))

  @property
  def groups(self) -> int:
    """Gradient groups, at least 1."""
    return max(self.grad_groups, 1)

  @property
  def quantum(self) -> int:
    """The smallest batch step that every rule allows: each batch is a multiple of it."""
    accum = self.grad_accum_steps
    quantum = math.lcm(self.num_devices, self.num_processes, accum * self.num_devices,
                       accum * self.groups)
    if self.bn_group_size and self.has_batch_norm:
      quantum = math.lcm(quantum, accum * self.groups * int(self.bn_group_size))
    return quantum

  def quantum_reason(self) -> str:
    """What `quantum` is made of, in words: "8 devices x 8 accumulation steps"."""
    accum = self.grad_accum_steps
    steps = f" x {_count(accum, 'accumulation step')}" if accum > 1 else ""
    terms = [(accum * self.num_devices, f"{_count(self.num_devices, 'device')}{steps}"),
             (self.num_processes, _count(self.num_processes, "process", "processes")),
             (accum * self.groups, f"{_count(self.groups, 'gradient group')}{steps}")]
    if self.bn_group_size and self.has_batch_norm:
      terms.append((accum * self.groups * int(self.bn_group_size),
                    f"{_count(self.groups, 'gradient group')}{steps} x ghost batch-norm "
                    f"groups of {self.bn_group_size}"))
    exact = [what for value, what in terms if value == self.quantum]
    if exact:
      return exact[0]
    parts = [what for value, what in terms if value > 1]
    return f"the least common multiple of {', '.join(parts[:-1])} and {parts[-1]}"

  def sizes(self, batch_size: int) -> dict[str, int]:
    """The examples each piece of `batch_size` holds (for a batch that passes `check`)."""
    microbatch = batch_size // self.grad_accum_steps
    return {"per_device": batch_size // self.num_devices, "per_microbatch": microbatch,
            "per_group": batch_size // self.groups,
            "seen_by_batch_norm": microbatch // self.groups}

  def check(self, field: str, batch_size: int) -> None:
    """Raises ValueError naming `field` for the first rule `batch_size` breaks."""
    for rule in (self._devices, self._microbatches, self._groups, self._batch_norm):
      message = rule(field, batch_size)
      if message:
        raise ValueError(message)

  def _devices(self, field: str, batch_size: int) -> str | None:
    for divisor, what in ((self.num_devices, "the device count"),
                          (self.num_processes, "the process count")):
      if batch_size % divisor:
        return f"{field}={batch_size} must be divisible by {what} ({divisor})."
    return None

  def _microbatches(self, field: str, batch_size: int) -> str | None:
    k = self.grad_accum_steps
    if k > 1 and batch_size % (k * self.num_devices):
      return (f"config.grad_accum_steps={k}: {field}={batch_size} must be divisible by "
              f"grad_accum_steps x the device count ({k} x {self.num_devices} = "
              f"{k * self.num_devices}), so that every micro-batch is split evenly over the "
              f"devices.")
    if k > 1 and self.grad_groups > 1 and batch_size % (k * self.grad_groups):
      return (f"config.grad_accum_steps={k}: {field}={batch_size} must be divisible by "
              f"grad_accum_steps x config.grad_groups ({k} x {self.grad_groups} = "
              f"{k * self.grad_groups}), so that every micro-batch holds an equal part of "
              f"every gradient group.")
    seen = batch_size // (k * self.groups)
    if k > 1 and self.bn_group_size and seen % self.bn_group_size:
      return (f"config.grad_accum_steps={k}: batch norm sees {seen} examples at a time "
              f"(the batch / grad_accum_steps{' / grad_groups' if self.grad_groups > 1 else ''}"
              f"), not a multiple of config.model_kwargs.bn_group_size={self.bn_group_size}.")
    return None

  def _groups(self, field: str, batch_size: int) -> str | None:
    if self.grad_groups > 1 and batch_size % self.grad_groups:
      return (f"{field}={batch_size} must be divisible by config.grad_groups "
              f"({self.grad_groups}).")
    return None

  def _batch_norm(self, field: str, batch_size: int) -> str | None:
    """Grouped gradients normalise each group alone: only ghost BN keeps its meaning."""
    if self.grad_groups < 2 or not self.has_batch_norm:
      return None
    seen = batch_size // self.grad_accum_steps // self.grad_groups
    if self.bn_group_size is None or seen % self.bn_group_size:
      return (f"config.grad_groups={self.grad_groups} would compute batch norm over groups of "
              f"{seen} examples instead of the batch: set config.grad_groups=0 (no noise "
              f"scale), or config.model_kwargs.bn_group_size to a divisor of {seen}.")
    return None


def _count(n: int, noun: str, plural: str | None = None) -> str:
  """'1 device', '8 devices'."""
  return f"{n} {noun if n == 1 else plural or noun + 's'}"
