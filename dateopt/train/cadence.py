"""When the train loop logs, evaluates and saves: one small object asked at every step.

Each happens every `n` steps and at the run's last step. A period of 0 means
"only at the last step"; a negative checkpoint period means no checkpoints.
The evaluation period's default (`config.eval_every_steps=-1`) is one epoch.

Example:
  >>> cadence = Cadence(last=100, log_every=10, eval_every=50, save_every=-1)
  >>> cadence.logs(20), cadence.evaluates(20), cadence.saves(100)
  (True, False, False)
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Cadence:
  """Which of logging, evaluation and checkpointing fall on a step."""

  last: int
  log_every: int
  eval_every: int
  save_every: int  # < 0: no checkpoints

  @property
  def checkpoints(self) -> bool:
    return self.save_every >= 0

  def logs(self, step: int) -> bool:
    return _every(step, self.log_every, self.last)

  def evaluates(self, step: int) -> bool:
    return _every(step, self.eval_every, self.last)

  def saves(self, step: int) -> bool:
    return self.checkpoints and _every(step, self.save_every, self.last)


def _every(step: int, period: int, last: int) -> bool:
  return step == last or (period > 0 and step % period == 0)
