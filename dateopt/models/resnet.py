"""ResNet v1.5 family in Flax Linen, with zero-init residual BN and ghost batch norm.

ResNet (He et al. 2016, "Deep Residual Learning for Image Recognition") in the
"v1.5" form used by MLPerf and torchvision: in a bottleneck block the stride
sits in the 3x3 convolution, not in the first 1x1. Large-batch details from
Goyal et al. 2017 ("Accurate, Large Minibatch SGD"): the last batch-norm scale
of every residual branch starts at zero, so each fresh block is the identity
plus its shortcut, and the classifier starts from N(0, 0.01). Ghost batch norm
(Hoffer et al. 2017, "Train longer, generalize better") normalises groups of
`bn_group_size` examples separately.

Parameter names follow Flax conventions ("kernel"/"bias" for convolutions and
dense layers, "scale"/"bias" for batch norm): optimizer masks select on them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from dateopt.validation import check_choice, check_range, check_type

# He et al. 2015 init for convolutions (fan_out, as torchvision and MLPerf).
_CONV_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
# Goyal et al. 2017, Sec. 5.1: the fc layer starts from a Gaussian with std 0.01.
_HEAD_INIT = nn.initializers.normal(stddev=0.01)

#: The batch-norm statistics' momentum of the reference ResNets.
BN_MOMENTUM = 0.9
#: The batch-norm epsilon of the reference ResNets.
BN_EPSILON = 1e-5


class GhostBatchNorm(nn.Module):
  """Batch norm whose statistics come from groups of `group_size` examples.

  The batch (axis 0) is reshaped from (B, ...) to (B // g, g, ...), every group
  is normalised with its own mean and variance (Hoffer et al. 2017, "Train
  longer, generalize better: closing the generalization gap in large batch
  training of neural networks"), and the running statistics follow
  `flax.linen.BatchNorm`'s convention with the group statistics averaged:
  `ra = momentum * ra + (1 - momentum) * mean_over_groups(stat)`, the variance
  biased, as Keras' `virtual_batch_size` does. With `group_size` None or equal
  to the batch this is exactly `nn.BatchNorm` (same variables, same numbers).

  Groups are contiguous rows: when a batch is sharded over devices along axis 0
  and the per-device batch is a multiple of `group_size`, every group lives on
  one device and needs no communication.

  Attributes:
    use_running_average: if True, normalise with the running statistics.
    group_size: examples per group; None means the whole batch.
    momentum: decay of the running statistics.
    epsilon: added to the variance.
    dtype: dtype of the output (statistics are always float32).
    param_dtype: dtype of "scale" and "bias".
    scale_init: initialiser of "scale".
    bias_init: initialiser of "bias".

  Example:
    >>> import jax, jax.numpy as jnp
    >>> norm = GhostBatchNorm(use_running_average=False, group_size=4)
    >>> x = jnp.ones((8, 5, 5, 3))
    >>> variables = norm.init(jax.random.key(0), x)
    >>> y, updates = norm.apply(variables, x, mutable=["batch_stats"])
  """

  use_running_average: bool | None = None
  group_size: int | None = None
  momentum: float = 0.99
  epsilon: float = 1e-5
  dtype: Any = None
  param_dtype: Any = jnp.float32
  scale_init: Callable[..., jax.Array] = nn.initializers.ones
  bias_init: Callable[..., jax.Array] = nn.initializers.zeros

  @nn.compact
  def __call__(self, x: jax.Array, use_running_average: bool | None = None) -> jax.Array:
    use_running_average = nn.merge_param(
        "use_running_average", self.use_running_average, use_running_average)
    num_features = x.shape[-1]
    ra_mean = self.variable("batch_stats", "mean", jnp.zeros, (num_features,), jnp.float32)
    ra_var = self.variable("batch_stats", "var", jnp.ones, (num_features,), jnp.float32)
    scale = self.param("scale", self.scale_init, (num_features,), self.param_dtype)
    bias = self.param("bias", self.bias_init, (num_features,), self.param_dtype)

    if use_running_average:
      mean, var = ra_mean.value, ra_var.value
      return self._normalize(x, mean, var, scale, bias)

    # `init` may be called with any dummy batch: use plain batch statistics then
    # (the running statistics are not updated during init anyway).
    group_size = x.shape[0] if self.is_initializing() else self._checked_group_size(x.shape[0])
    groups = x.reshape((x.shape[0] // group_size, group_size) + x.shape[1:])
    group_mean, group_var = _group_moments(groups)
    if not self.is_initializing():
      ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * group_mean.mean(0)
      ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * group_var.mean(0)
    # Broadcast (num_groups, C) against (num_groups, g, ..., C).
    stat_shape = (groups.shape[0],) + (1,) * (groups.ndim - 2) + (num_features,)
    y = self._normalize(groups, group_mean.reshape(stat_shape), group_var.reshape(stat_shape),
                        scale, bias)
    return y.reshape(x.shape)

  def _checked_group_size(self, batch_size: int) -> int:
    if self.group_size is None:
      return batch_size
    if batch_size % self.group_size:
      raise ValueError(
          f"bn_group_size={self.group_size} must divide the batch size seen by batch norm; "
          f"got a batch of {batch_size}.")
    return self.group_size

  def _normalize(self, x, mean, var, scale, bias):
    # Same arithmetic and order as flax.linen.BatchNorm, so the two agree bit for bit
    # up to reduction order.
    y = x - mean
    y = y * (jax.lax.rsqrt(var + self.epsilon) * scale)
    y = y + bias
    return jnp.asarray(y, self.dtype if self.dtype is not None else x.dtype)


def _group_moments(groups: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-group mean and biased variance over all axes but the group and channel axes.

  Computed in float32 as E[x^2] - E[x]^2 clipped at 0, like flax's BatchNorm.
  """
  groups = groups.astype(jnp.promote_types(groups.dtype, jnp.float32))
  axes = tuple(range(1, groups.ndim - 1))
  mean = groups.mean(axes)
  mean_of_squares = jnp.square(groups).mean(axes)
  return mean, jnp.maximum(0.0, mean_of_squares - jnp.square(mean))


def _make_norm(train: bool, group_size: int | None, dtype: Any,
               momentum: float = BN_MOMENTUM) -> Callable[..., nn.Module]:
  """Batch-norm constructor: nn.BatchNorm, or GhostBatchNorm when groups are asked for."""
  if group_size is None:
    return functools.partial(nn.BatchNorm, use_running_average=not train, momentum=momentum,
                             epsilon=BN_EPSILON, dtype=dtype)
  return functools.partial(GhostBatchNorm, use_running_average=not train, group_size=group_size,
                           momentum=momentum, epsilon=BN_EPSILON, dtype=dtype)


def _conv(features: int, kernel: int, strides: int, dtype: Any, name: str,
          spatial_dims: int = 2) -> nn.Conv:
  # Symmetric padding k // 2, as torchvision: a stride-2 3x3 conv sees the same pixels.
  pad = kernel // 2
  return nn.Conv(features, (kernel,) * spatial_dims, strides=(strides,) * spatial_dims,
                 padding=((pad, pad),) * spatial_dims, use_bias=False, kernel_init=_CONV_INIT,
                 dtype=dtype, name=name)


class BasicBlock(nn.Module):
  """Two 3x3 convolutions (ResNet-18/34); the second BN scale starts at zero.

  Example:
    >>> block = BasicBlock(filters=16, strides=1, norm=_make_norm(False, None, jnp.float32))
  """

  filters: int
  strides: int
  norm: Callable[..., nn.Module]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    dims = x.ndim - 2
    residual = _conv(self.filters, 3, self.strides, self.dtype, "conv1", dims)(x)
    residual = nn.relu(self.norm(name="bn1")(residual))
    residual = _conv(self.filters, 3, 1, self.dtype, "conv2", dims)(residual)
    # Goyal et al. 2017: zero gamma, so the fresh block is its shortcut.
    residual = self.norm(name="bn2", scale_init=nn.initializers.zeros)(residual)
    return nn.relu(_shortcut(x, self.filters, self.strides, self.norm, self.dtype) + residual)


class BottleneckBlock(nn.Module):
  """1x1 -> 3x3 (strided: v1.5) -> 1x1 x4 (ResNet-50/101/152); the last BN scale starts at zero.

  Example:
    >>> block = BottleneckBlock(filters=64, strides=2, norm=_make_norm(False, None, jnp.float32))
  """

  filters: int
  strides: int
  norm: Callable[..., nn.Module]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    dims = x.ndim - 2
    residual = _conv(self.filters, 1, 1, self.dtype, "conv1", dims)(x)
    residual = nn.relu(self.norm(name="bn1")(residual))
    residual = _conv(self.filters, 3, self.strides, self.dtype, "conv2", dims)(residual)
    residual = nn.relu(self.norm(name="bn2")(residual))
    residual = _conv(4 * self.filters, 1, 1, self.dtype, "conv3", dims)(residual)
    residual = self.norm(name="bn3", scale_init=nn.initializers.zeros)(residual)
    return nn.relu(_shortcut(x, 4 * self.filters, self.strides, self.norm, self.dtype) + residual)


def _shortcut(x, features, strides, norm, dtype):
  """Identity, or a strided 1x1 projection + BN when the shape changes."""
  if x.shape[-1] == features and strides == 1:
    return x
  x = _conv(features, 1, strides, dtype, "proj_conv", x.ndim - 2)(x)
  return norm(name="proj_bn")(x)


_BLOCKS = {"basic": BasicBlock, "bottleneck": BottleneckBlock}


class ResNet(nn.Module):
  """ResNet v1.5 (He et al. 2016) for NHWC images or NLC sequences; returns float32 logits.

  The convolutions are 2-D on (B, H, W, C) inputs and 1-D on (B, L, C) inputs
  (MNIST-1D), with the same kernel sizes and strides along each axis.

  Attributes:
    stage_sizes: residual blocks per stage, e.g. (3, 4, 6, 3) for ResNet-50.
    block: "basic" (two 3x3) or "bottleneck" (1x1-3x3-1x1, x4 expansion).
    num_classes: size of the classifier output.
    num_filters: filters of the first stage; doubled at each later stage.
    stem: "imagenet" (7x7/2 conv + 3x3/2 max-pool) or "small" (3x3/1 conv, no
      pool: for 8x8 to 32x32 images).
    bn_group_size: ghost batch norm group size (Hoffer et al. 2017); None is
      plain batch norm over the whole batch.
    bn_momentum: decay of the batch-norm running statistics (flax's
      convention: `ra = m * ra + (1 - m) * batch_stat`).
    dtype: compute dtype (e.g. jnp.bfloat16); parameters and batch-norm
      statistics stay float32 and the logits are returned as float32.
    input_normalization: (mean, std) per channel: the inputs (uint8 pixels,
      say) become (x - mean) / std in float32 before the cast to `dtype`, on
      the accelerator, inside the jitted step (a dataset's
      `input_normalization`). None: the inputs are used as they come.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> model = ResNet(stage_sizes=(1, 1, 1), block="basic", num_classes=10,
    ...                num_filters=16, stem="small")
    >>> x = jnp.zeros((2, 8, 8, 1))
    >>> variables = model.init(jax.random.key(0), x, train=False)
    >>> logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"])
  """

  stage_sizes: Sequence[int]
  block: str = "bottleneck"
  num_classes: int = 1000
  num_filters: int = 64
  stem: str = "imagenet"
  bn_group_size: int | None = None
  bn_momentum: float = BN_MOMENTUM
  dtype: Any = jnp.float32
  input_normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    norm = _make_norm(train, self.bn_group_size, self.dtype, self.bn_momentum)
    if self.input_normalization is not None:
      mean, std = (jnp.asarray(values, jnp.float32) for values in self.input_normalization)
      x = (jnp.asarray(x, jnp.float32) - mean) / std
    x = jnp.asarray(x, self.dtype)
    dims = x.ndim - 2  # 2: NHWC images; 1: NLC sequences (1-D convolutions)
    if self.stem == "imagenet":
      x = _conv(self.num_filters, 7, 2, self.dtype, "stem_conv", dims)(x)
      x = nn.relu(norm(name="stem_bn")(x))
      x = nn.max_pool(x, (3,) * dims, strides=(2,) * dims, padding=((1, 1),) * dims)
    else:
      x = _conv(self.num_filters, 3, 1, self.dtype, "stem_conv", dims)(x)
      x = nn.relu(norm(name="stem_bn")(x))
    block_cls = _BLOCKS[self.block]
    for stage, num_blocks in enumerate(self.stage_sizes):
      for index in range(num_blocks):
        strides = 2 if stage > 0 and index == 0 else 1
        x = block_cls(filters=self.num_filters * 2**stage, strides=strides, norm=norm,
                      dtype=self.dtype, name=f"stage{stage + 1}_block{index + 1}")(x)
    x = jnp.mean(x, axis=tuple(range(1, 1 + dims)))
    x = nn.Dense(self.num_classes, kernel_init=_HEAD_INIT, dtype=self.dtype, name="head")(x)
    # Softmax and loss run in float32 even under bf16 compute.
    return jnp.asarray(x, jnp.float32)


#: The architecture of each named ResNet; `make_resnet` fills in the remaining fields.
RESNET_CONFIGS: dict[str, dict[str, Any]] = {
    "resnet18": dict(stage_sizes=(2, 2, 2, 2), block="basic"),
    "resnet34": dict(stage_sizes=(3, 4, 6, 3), block="basic"),
    "resnet50": dict(stage_sizes=(3, 4, 6, 3), block="bottleneck"),
    "resnet101": dict(stage_sizes=(3, 4, 23, 3), block="bottleneck"),
    "resnet152": dict(stage_sizes=(3, 8, 36, 3), block="bottleneck"),
    "resnet_tiny": dict(stage_sizes=(1, 1, 1), block="basic", num_filters=16, stem="small",
                        num_classes=10),
}


def make_resnet(name: str, *, num_classes: int | None = None, dtype: Any = jnp.float32,
                bn_group_size: int | None = None, num_filters: int | None = None,
                stage_sizes: Sequence[int] | None = None, stem: str | None = None,
                bn_momentum: float = BN_MOMENTUM,
                input_normalization: tuple[Sequence[float], Sequence[float]] | None = None
                ) -> ResNet:
  """Builds a ResNet from `RESNET_CONFIGS[name]`, overriding the given fields.

  Example:
    >>> model = make_resnet("resnet50", num_classes=1000, bn_group_size=32)
  """
  fields = dict(num_classes=1000, num_filters=64, stem="imagenet")
  fields.update(RESNET_CONFIGS[name])
  overrides = dict(num_classes=num_classes, num_filters=num_filters, stage_sizes=stage_sizes,
                   stem=stem)
  fields.update({k: v for k, v in overrides.items() if v is not None})
  check_type("num_classes", fields["num_classes"], int, what="a positive int")
  check_range("num_classes", fields["num_classes"], low=1)
  check_type("num_filters", fields["num_filters"], int, what="a positive int")
  check_range("num_filters", fields["num_filters"], low=1)
  check_choice("stem", fields["stem"], ("imagenet", "small"))
  fields["stage_sizes"] = tuple(fields["stage_sizes"])
  if not fields["stage_sizes"] or any(
      not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in fields["stage_sizes"]):
    raise ValueError(f"stage_sizes must be a non-empty sequence of positive ints; "
                     f"got {stage_sizes!r}.")
  if bn_group_size is not None:
    check_type("bn_group_size", bn_group_size, int, what="a positive int or None")
    check_range("bn_group_size", bn_group_size, low=1)
  check_range("bn_momentum", bn_momentum, low=0.0, high=1.0, high_inclusive=False)
  return ResNet(bn_group_size=bn_group_size, bn_momentum=bn_momentum, dtype=dtype,
                input_normalization=_checked_normalization(input_normalization), **fields)


def _checked_normalization(normalization) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
  """(mean, std) as tuples of floats (hashable module fields), std > 0; or None."""
  if normalization is None:
    return None
  try:
    mean, std = (tuple(float(v) for v in values) for values in normalization)
  except (TypeError, ValueError) as error:
    raise ValueError(f"input_normalization must be (mean, std), two sequences of numbers; "
                     f"got {normalization!r}.") from error
  if len(mean) != len(std) or not all(v > 0 for v in std):
    raise ValueError(f"input_normalization: mean and std must have one value per channel and "
                     f"std > 0; got {normalization!r}.")
  return mean, std
