"""The batch layout: one place computes every split of a batch and names each broken rule."""

import doctest

import pytest

from dateopt.train import layout as layout_lib
from dateopt.train.layout import BatchLayout


def test_quantum_is_the_lcm_of_every_split_by_hand():
  assert BatchLayout(num_devices=8).quantum == 8
  assert BatchLayout(num_devices=8, grad_accum_steps=4).quantum == 32           # 4 x 8
  assert BatchLayout(num_devices=8, grad_accum_steps=3, grad_groups=4).quantum == 24  # 3x8, 3x4
  assert BatchLayout(num_devices=2, grad_groups=8, bn_group_size=4,
                     has_batch_norm=True).quantum == 32                        # 8 groups x 4
  # Ghost BN only matters for a model with batch norm.
  assert BatchLayout(num_devices=2, grad_groups=8, bn_group_size=4).quantum == 8


def test_every_size_is_computed_once():
  layout = BatchLayout(num_devices=8, grad_accum_steps=2, grad_groups=4)
  assert layout.sizes(256) == {"per_device": 32, "per_microbatch": 128, "per_group": 64,
                               "seen_by_batch_norm": 32}
  for batch in range(layout.quantum, 20 * layout.quantum, layout.quantum):
    layout.check("config.batch_size", batch)  # every multiple of the quantum passes


@pytest.mark.parametrize("layout, batch, message", [
    (BatchLayout(num_devices=8), 60,
     r"config.batch_size=60 must be divisible by the device count \(8\)\."),
    (BatchLayout(num_devices=8, num_processes=16), 8,
     r"config.batch_size=8 must be divisible by the process count \(16\)\."),
    (BatchLayout(num_devices=8, grad_accum_steps=4), 48,
     r"config.grad_accum_steps=4: config.batch_size=48 must be divisible by grad_accum_steps "
     r"x the device count \(4 x 8 = 32\)"),
    (BatchLayout(num_devices=2, grad_accum_steps=2, grad_groups=3), 8,
     r"grad_accum_steps x config.grad_groups \(2 x 3 = 6\)"),
    (BatchLayout(num_devices=2, grad_accum_steps=2, bn_group_size=3), 8,
     r"batch norm sees 4 examples at a time .*bn_group_size=3"),
    (BatchLayout(num_devices=2, grad_groups=3), 8,
     r"config.batch_size=8 must be divisible by config.grad_groups \(3\)\."),
    (BatchLayout(num_devices=2, grad_groups=4, has_batch_norm=True), 16,
     r"config.grad_groups=4 would compute batch norm over groups of 4 examples"),
])
def test_each_broken_rule_has_its_message(layout, batch, message):
  with pytest.raises(ValueError, match=message):
    layout.check("config.batch_size", batch)


def test_docstring_examples():
  result = doctest.testmod(layout_lib, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0
