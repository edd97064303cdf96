"""Parameter masks: which leaves get the trust ratio and the weight decay.

Every large-batch ResNet recipe (tensorflow/tpu, MLPerf, NVIDIA) leaves batch-norm
scale/bias and every bias out of the LARS trust ratio and the weight decay; they
get plain momentum. `optax.lars` does not do this by default. The masks here do.
Transformer recipes (nanoGPT, BERT with LAMB) leave norms and biases out too. The
default mask also leaves out learned position-embedding tables
(`POSITION_TABLE_NAMES`); token embeddings and kernels keep their decay.

A mask is a static, hashable object, deliberately NOT callable: optax's
`inject_hyperparams` treats every callable argument as a schedule (and calls it
with the step count), so callable masks get silently mangled there. Masks built
here survive `inject_hyperparams`, `optax.masked`, `MultiSteps` and configs.

Masks select by the '/'-joined parameter path (`"Dense_0/kernel"`,
`"layer1/bn/scale"`), as big_vision does, and work on Flax Linen trees (nested
dicts) and Flax NNX states (whose `Variable` leaves add a trailing `value`
component, which is ignored).

Example:
  >>> import dateopt, jax.numpy as jnp
  >>> params = {"conv": {"kernel": jnp.ones((3, 3, 1, 8))}, "bn": {"scale": jnp.ones(8)}}
  >>> dateopt.masks.resolve(dateopt.masks.exclude_bias_and_norm, params)
  {'bn': {'scale': False}, 'conv': {'kernel': True}}
  >>> dateopt.masks.resolve("conv/.*", params)
  {'bn': {'scale': False}, 'conv': {'kernel': True}}
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import re
from typing import Any, Callable, Union

import jax
import numpy as np

#: Leaf names that normalisation layers and biases use across Flax, Haiku and Keras-style
#: trees; `ExcludeBiasAndNorm` leaves them out (and every leaf with ndim <= 1, which catches
#: the rest).
BIAS_AND_NORM_NAMES = frozenset({"bias", "scale", "beta", "gamma", "offset"})

#: Module names of learned position-embedding tables (dateopt's, timm's, Hugging Face's,
#: GPT-2's "wpe"). Such a table is added to every input at its position, a bias indexed by
#: position, so `ExcludeBiasAndNorm` treats it as one.
POSITION_TABLE_NAMES = frozenset({"position_embed", "pos_embed", "position_embedding", "wpe"})

# NNX `Variable`s flatten to a leaf under one of these attribute names.
_VARIABLE_VALUE_KEYS = frozenset({"value", "raw_value"})


def path_to_str(path: tuple[Any, ...]) -> str:
  """Joins a `jax.tree_util` key path into 'a/b/c', dropping NNX's trailing `value`.

  Example:
    >>> path_to_str((jax.tree_util.DictKey("Dense_0"), jax.tree_util.DictKey("kernel")))
    'Dense_0/kernel'
  """
  names = [_key_name(k) for k in path]
  while names and names[-1] in _VARIABLE_VALUE_KEYS and len(names) > 1:
    names.pop()
  return "/".join(names)


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


class Mask(abc.ABC):
  """A static selector of parameter leaves: True = apply the masked transform.

  Subclasses implement `select(path: str, leaf) -> bool`. Masks compose with
  `&`, `|` and `~`, compare by value and hash, so they can sit in configs and in
  `optax.inject_hyperparams` arguments.
  """

  @abc.abstractmethod
  def select(self, path: str, leaf: Any) -> bool:
    """True when the leaf at `path` is selected."""

  def tree(self, params: Any) -> Any:
    """Returns a pytree of Python bools with the structure of `params`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: bool(self.select(path_to_str(path), leaf)), params)

  def __and__(self, other: "Mask") -> "Mask":
    return AllOf((self, _as_mask(other)))

  def __or__(self, other: "Mask") -> "Mask":
    return AnyOf((self, _as_mask(other)))

  def __invert__(self) -> "Mask":
    return Not(self)


@dataclasses.dataclass(frozen=True)
class ExcludeBiasAndNorm(Mask):
  """False for biases, normalisation parameters and position tables; True otherwise.

  The MLPerf / tensorflow-tpu ResNet LARS rule: batch-norm scale and bias and every
  bias get no trust ratio and no weight decay. A leaf is left out when its name is
  in `BIAS_AND_NORM_NAMES`, when it has ndim <= 1, or when any '/'-separated
  component of its path is in `POSITION_TABLE_NAMES` (a Transformer's
  `position_embed/embedding`). Token embeddings and kernels are selected.
  """

  def select(self, path: str, leaf: Any) -> bool:
    components = path.split("/")
    return (getattr(leaf, "ndim", 0) > 1 and components[-1] not in BIAS_AND_NORM_NAMES
            and POSITION_TABLE_NAMES.isdisjoint(components))


@dataclasses.dataclass(frozen=True)
class Regex(Mask):
  """True where `re.search(pattern, path)` matches the '/'-joined parameter path."""

  pattern: str

  def __post_init__(self):
    try:
      re.compile(self.pattern)
    except re.error as e:
      raise ValueError(f"mask regex {self.pattern!r} does not compile: {e}.") from e

  def select(self, path: str, leaf: Any) -> bool:
    return re.search(self.pattern, path) is not None


@dataclasses.dataclass(frozen=True)
class MinNdim(Mask):
  """True for leaves with at least `ndim` dimensions (2 keeps kernels, drops vectors)."""

  ndim: int = 2

  def select(self, path: str, leaf: Any) -> bool:
    return getattr(leaf, "ndim", 0) >= self.ndim


@dataclasses.dataclass(frozen=True)
class Everything(Mask):
  """True for every leaf (equivalent to passing `mask=None`)."""

  def select(self, path: str, leaf: Any) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class AllOf(Mask):
  masks: tuple[Mask, ...]

  def select(self, path: str, leaf: Any) -> bool:
    return all(m.select(path, leaf) for m in self.masks)


@dataclasses.dataclass(frozen=True)
class AnyOf(Mask):
  masks: tuple[Mask, ...]

  def select(self, path: str, leaf: Any) -> bool:
    return any(m.select(path, leaf) for m in self.masks)


@dataclasses.dataclass(frozen=True)
class Not(Mask):
  mask: Mask

  def select(self, path: str, leaf: Any) -> bool:
    return not self.mask.select(path, leaf)


#: The default mask, which selects every leaf but biases, normalisation parameters and
#: position tables (`ExcludeBiasAndNorm`).
exclude_bias_and_norm = ExcludeBiasAndNorm()
#: The mask that selects every leaf (the same as `mask=None`).
everything = Everything()


def regex(pattern: str) -> Mask:
  """A mask that is True where `pattern` matches the parameter path (`re.search`).

  Example:
    >>> m = regex(r"(^|/)kernel$")   # only kernels get the trust ratio
  """
  return Regex(pattern)


def min_ndim(ndim: int = 2) -> Mask:
  """A mask that is True for leaves with `ndim` or more dimensions."""
  if not isinstance(ndim, int) or ndim < 0:
    raise ValueError(f"ndim must be a non-negative int, got {ndim!r}.")
  return MinNdim(ndim)


#: The masks a config may name as its `mask` field, by name (see `from_name`).
NAMED_MASKS = {
    "exclude_bias_and_norm": exclude_bias_and_norm,
    "all": everything,
    "kernels": min_ndim(2),
}

#: What a `mask=` argument accepts (see `resolve`). None or True selects every leaf, False
#: none; otherwise a `Mask`, a string (a name in `NAMED_MASKS` or a regex on the parameter
#: path), a callable `params -> bool tree`, or a bool tree shaped like the parameters.
MaskLike = Union[None, bool, str, Mask, Callable[[Any], Any], Any]


def from_name(name: str) -> Mask:
  """Maps a config string to a Mask: a name in NAMED_MASKS, else a regex.

  A bare word close to a name (a misspelling such as "exclude_bias_and_nrom")
  is refused rather than read as a regex that would match no parameter.

  Raises:
    ValueError: `name` is a near-miss of a name in NAMED_MASKS; the message
      lists the names.

  Example:
    >>> from_name("exclude_bias_and_norm") is exclude_bias_and_norm
    True
  """
  if name in NAMED_MASKS:
    return NAMED_MASKS[name]
  # Only a bare word can be a misspelt name; a string with regex syntax is a regex.
  close = (difflib.get_close_matches(name, NAMED_MASKS, n=1, cutoff=0.8)
           if re.fullmatch(r"\w+", name) else [])
  if close:
    raise ValueError(f"unknown mask name {name!r} (did you mean {close[0]!r}?); named masks: "
                     f"{', '.join(sorted(NAMED_MASKS))}. For a regex on parameter paths, "
                     f"pass dateopt.masks.regex({name!r}).")
  return regex(name)


def _as_mask(mask: Any) -> Mask:
  if isinstance(mask, Mask):
    return mask
  if isinstance(mask, str):
    return from_name(mask)
  raise ValueError(f"mask must be a dateopt.masks.Mask or a string, got {mask!r}.")


def resolve(mask: MaskLike, params: Any, *, name: str = "mask") -> Any:
  """Turns any accepted mask form into a bool pytree matching `params`.

  Accepted: None or True (every leaf), False (no leaf), a `Mask`, a string (a name
  from `NAMED_MASKS` or a regex on the parameter path), a callable
  `params -> bool tree`, or a bool pytree with the structure of `params`.

  Raises:
    ValueError: naming `name`, when the mask's tree does not match `params`.
    TypeError: naming `name` and the parameter path, when a leaf of the
      mask's tree is not a bool (a float 1.0 or 0.0 would be read as True or
      False without a word).
  """
  if mask is None or mask is True or mask is False:
    return jax.tree.map(lambda _: bool(mask is not False), params)
  if isinstance(mask, (Mask, str)):
    return _as_mask(mask).tree(params)
  tree = mask(params) if callable(mask) else mask
  _check_same_structure(name, tree, params)
  _check_bool_leaves(name, mask, tree)
  return tree


def _is_static_bool(leaf: Any) -> bool:
  """A Python/NumPy bool, or a concrete 0-d bool array: what `if flag` can read under jit."""
  if isinstance(leaf, (bool, np.bool_)):
    return True
  return (getattr(leaf, "dtype", None) == np.bool_ and np.ndim(leaf) == 0
          and not isinstance(leaf, jax.core.Tracer))


def _check_bool_leaves(name: str, mask: Any, tree: Any) -> None:
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    if not _is_static_bool(leaf):
      given = (f"{name} {getattr(mask, '__qualname__', type(mask).__name__)} returned"
               if callable(mask) else f"the {name} pytree holds")
      raise TypeError(
          f"{given} {leaf!r} of type {type(leaf).__name__} for the parameter "
          f"{path_to_str(path)!r}; a mask must give a Python bool for every parameter "
          f"(True: apply the transform).")


def _check_same_structure(name: str, tree: Any, params: Any) -> None:
  expected = jax.tree.structure(params)
  got = jax.tree.structure(tree)
  if got != expected:
    raise ValueError(
        f"{name} does not match the parameter tree: expected a bool pytree shaped "
        f"like the params {expected}, got {got}.")
