"""An adaptive run that diverged: no checkpoint while it is, and a stop with status 1 if it stays.

DATE's engine judges every step (`dateopt.date._divergence`): while it calls
the run diverged it holds the progress and cuts the LR, and after
the engine's horizon of stalled steps in all (`date.EngineConfig`) it gives up. The trainer
then saves nothing more (the newest checkpoint is the last healthy state) and
stops with `DivergedError`, which `dateopt-train` prints as one line and
status 1. A run is never reported finished while its engine has given up.

Example:
  >>> health = EngineHealth.read(state.opt_state)   # at a log, eval or save step
  >>> health.raise_if_gave_up(learning_rate_of(metrics), ckpt.directory, ckpt.latest_step())
  >>> if saves and not health.diverged: ckpt.save(step, state)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import optax

from dateopt import date
from dateopt.train import parallel


class DivergedError(Exception):
  """The adaptive run diverged and did not recover; its newest checkpoint predates it."""

  exit_code = 1


@dataclasses.dataclass(frozen=True)
class EngineHealth:
  """What the adaptive engine's divergence watch says after a step (host numbers)."""

  diverged: bool
  gave_up: bool
  diverged_at: int  # the engine step the divergence began at (0-based)
  diverged_steps: int  # in all
  stalled_steps: int  # of those, the ones whose loss was not falling: the patience counts them
  gradient_jumps: int  # steps skipped for an exploding gradient: counted by the patience too
  loss: float  # the watch's smoothed loss
  first_loss: float
  best_loss: float
  gain: float
  lr_scale: float
  losses_seen: int = 0  # the losses the watch has read: the run's steps, resumes included
  config: date.EngineConfig = dataclasses.field(default_factory=date.EngineConfig)  # its bands

  @classmethod
  def read(cls, opt_state: Any, config: date.EngineConfig | None = None
           ) -> "EngineHealth | None":
    """The health of the `date.adaptive` engine in `opt_state` (run with `config`, None: the
    defaults); None without one."""
    engine = optax.tree.get(opt_state, date.AdaptiveState.__name__)
    if engine is None:
      return None
    w, gain = parallel.to_host((engine.watch, engine.gain))
    return cls(bool(w.diverged_steps > 0), bool(w.gave_up), int(w.diverged_at),
               int(w.diverged_total), int(w.stalled_total), int(w.gradient_jumps), float(w.ema),
               float(min(w.first, w.initial)), float(w.best), float(gain), float(w.lr_scale),
               int(w.count), config or date.EngineConfig())

  @property
  def never_learnt(self) -> bool:
    """Diverged by the no-learning rule: the loss never fell below `stall_drop` of its start,
    and never blew up. Shuffled labels or a long plateau, not a too-high LR."""
    return (self.diverged_at >= 0 and self.best_loss > self.config.stall_drop * self.first_loss
            and self.loss < self.config.blow_up * self.first_loss)

  def last_healthy(self, saved_steps) -> int | None:
    """The newest of `saved_steps` taken before the divergence began (None: none was).

    A checkpoint saved after the divergence began but before the watch called it
    (its smoothed loss lags) holds a diverging state, healthy as it looked then.
    """
    before = [s for s in saved_steps if self.diverged_at < 0 or s <= self.diverged_at]
    return max(before, default=None)

  def raise_if_gave_up(self, learning_rate: float | None, checkpoint_dir: str | None,
                       last_checkpoint: int | None, *, at_end: bool = False) -> None:
    """Raises `DivergedError` naming the step, the loss, the gain and the LR if the engine
    gave up, or (`at_end`: the run reached its last step) is still diverged."""
    if not (self.gave_up or (at_end and self.diverged)):
      return
    lr = "" if learning_rate is None else f", LR {learning_rate:.3g}"
    if last_checkpoint is not None:
      kept = f"The last healthy checkpoint, step {last_checkpoint}, is kept in {checkpoint_dir}."
    else:
      kept = "No checkpoint was saved before it."
    losses = (f"smoothed loss {self.loss:.4g}, against {self.first_loss:.4g} at the start and "
              f"{self.best_loss:.4g} at its best; gain {self.gain:.3g}{lr}")
    jumps = ""
    if self.gradient_jumps:
      steps = "step" if self.gradient_jumps == 1 else "steps"
      jumps = f"skipped {self.gradient_jumps} {steps} whose gradient exploded or was not finite"
    if self.never_learnt:
      raise DivergedError(self._never_learnt_message(kept))
    if self.diverged_at >= 0:
      what = (f"diverged at step {self.diverged_at + 1} ({losses}) and stayed diverged for "
              f"{self.diverged_steps} steps in all, {self.stalled_steps} of them without its "
              f"loss falling, with the LR cut to {self.lr_scale:.3g}x"
              + (f", and {jumps}" if jumps else ""))
    else:
      what = f"{jumps} ({losses})"
    raise DivergedError(
        f"stopped: the adaptive run {what}. {kept} Lower the baseline's learning "
        f"rate, or clip the gradient norm (grad_clip_norm), and start a new --workdir.")


  def _never_learnt_message(self, kept: str) -> str:
    share = round(100 * (1 - self.config.stall_drop))
    return (f"stopped: the adaptive run has not learnt: in {self.losses_seen} steps its smoothed "
            f"loss never fell {share}% below its start ({self.first_loss:.4g} at the start, "
            f"{self.best_loss:.4g} at its best, {self.loss:.4g} now). {kept} A loss that does "
            f"not move points at the data (labels that do not match the inputs, a wrong or "
            f"shuffled split) or a plateau longer than a quarter of the baseline's steps, not "
            f"at the LR. Check the data; for a known long plateau, "
            f"--config.divergence_watch=False lets the run go on unwatched.")


def learning_rate_of(metrics: Mapping[str, Any]) -> float | None:
  """The LR the step applied, from its metrics (None if the optimizer has none)."""
  value = metrics.get("learning_rate")
  return None if value is None else float(parallel.to_host(value))
