"""The same LARS/LAMB updates on 1 device, jit over a Mesh, shard_map and pmap."""

import os
import subprocess
import sys

import numpy as np
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import conftest
import dateopt

N_DEVICES = 8


def _tree(seed):
  # Every leading dimension divides 8, so every leaf can be sharded on it.
  rng = np.random.default_rng(seed)
  shapes = {"conv": {"kernel": (8, 3, 3, 4)}, "dense": {"kernel": (16, 5), "bias": (8,)},
            "bn": {"scale": (16,), "bias": (16,)}}
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s).astype(np.float32)), shapes,
                      is_leaf=lambda x: isinstance(x, tuple))


OPTIMIZERS = {
    "lars_paper": lambda axis: dateopt.lars(optax.linear_schedule(0.1, 1.0, 5), weight_decay=1e-3,
                                            nesterov=True, axis_name=axis),
    "lars_optax": lambda axis: dateopt.lars(0.5, weight_decay=1e-3, mode="optax", mask=None,
                                            trust_clip=True, axis_name=axis),
    "lamb": lambda axis: dateopt.lamb(1e-2, weight_decay=1e-2, max_grad_norm=1.0,
                                      axis_name=axis),
}
STEPS = 4


def _single_device(tx, params, grads_seq):
  state = tx.init(params)
  for grads in grads_seq:
    updates, state = jax.jit(tx.update)(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


def _grads_seq():
  return [_tree(100 + t) for t in range(STEPS)]


def _close(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-5), a, b)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_jit_over_mesh_matches_single_device(name, mesh8):
  params, grads_seq = _tree(0), _grads_seq()
  expected = _single_device(OPTIMIZERS[name](None), params, grads_seq)
  mesh = mesh8
  sharded = NamedSharding(mesh, P("data"))
  shard = lambda t: jax.tree.map(lambda x: jax.device_put(x, sharded), t)
  tx = OPTIMIZERS[name](None)  # jit partitions the norms itself: no axis_name.
  params_s = shard(params)
  state = tx.init(params_s)
  step = jax.jit(lambda g, s, p: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p)))
  for grads in grads_seq:
    params_s, state = step(shard(grads), state, params_s)
  assert params_s["conv"]["kernel"].sharding.spec == P("data")
  _close(params_s, expected)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_shard_map_with_axis_name_matches_single_device(name, mesh8):
  params, grads_seq = _tree(0), _grads_seq()
  expected = _single_device(OPTIMIZERS[name](None), params, grads_seq)
  mesh = mesh8
  tx = OPTIMIZERS[name]("data")  # each device holds 1/8 of every leaf.
  state_spec = jax.tree.map(lambda x: P("data") if x.ndim else P(),
                            jax.eval_shape(tx.init, params))

  def local_step(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P("data"), state_spec, P("data")),
                               out_specs=(P("data"), state_spec)))
  init = jax.jit(jax.shard_map(tx.init, mesh=mesh, in_specs=P("data"), out_specs=state_spec))
  state = init(params)
  for grads in grads_seq:
    params, state = step(grads, state, params)
  _close(params, expected)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_pmap_with_pmean_gradients_matches_single_device(name):
  params, per_device = _tree(0), [[_tree(1000 * t + d) for d in range(N_DEVICES)]
                                   for t in range(STEPS)]
  mean_seq = [jax.tree.map(lambda *xs: sum(xs) / N_DEVICES, *g) for g in per_device]
  expected = _single_device(OPTIMIZERS[name](None), params, mean_seq)
  tx = OPTIMIZERS[name](None)  # replicated params: norms are already global.
  replicate = lambda t: jax.tree.map(lambda x: jnp.stack([x] * N_DEVICES), t)
  stack = lambda trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees)

  def local_step(grads, state, params):
    grads = jax.lax.pmean(grads, "batch")
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.pmap(local_step, axis_name="batch")
  params_r = replicate(params)
  state = jax.pmap(tx.init)(params_r)
  for grads in per_device:
    params_r, state = step(stack(grads), state, params_r)
  _close(jax.tree.map(lambda x: x[0], params_r), expected)


_THREADS_AFTER_AN_ALL_REDUCE = """
import os, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("d",))
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))
float(total(jax.device_put(jnp.ones(64), NamedSharding(mesh, P("d")))))
print(len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_pjrt_nproc_sizes_the_cpu_thread_pools_the_suite_relies_on():
  """conftest.py sets PJRT_NPROC so that 8 simulated devices cannot fill XLA:CPU's pool
  (notes/reliability.md); this checks that XLA still reads it."""
  def threads(nproc: str) -> int:
    env = dict(os.environ, PJRT_NPROC=nproc, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={N_DEVICES}")
    out = subprocess.run([sys.executable, "-c", _THREADS_AFTER_AN_ALL_REDUCE], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return int(out.split()[-1])

  assert os.environ["PJRT_NPROC"] == str(conftest.MIN_CPU_THREADS)
  small, large = threads("1"), threads(str(conftest.MIN_CPU_THREADS))
  # Two pools (the client's and the intra-op one) sized by it; a thread of one may not have
  # started yet on a loaded machine, so one pool's growth is what the check asks.
  assert large - small >= conftest.MIN_CPU_THREADS - N_DEVICES
