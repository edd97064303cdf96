"""DATE static planning: `plan` a large-batch recipe from a tuned one, `explain` it."""

from __future__ import annotations

import math
import numbers
import statistics
import warnings
from typing import Any, Mapping, Sequence

from dateopt import schedules
from dateopt.date import _adam_scaling as adam_rules
from dateopt.date import _batch_schedules as batch_schedules
from dateopt.date._builder import batch_schedule_of
from dateopt.date._engine_config import EngineConfig, engine_config
from dateopt.date._noise import expected_efficiency
from dateopt.date._progress import batch_credit, batch_ladder, predicted_budget
from dateopt.date._recipe import GAIN_RULES, MOMENTUM_OPTIMIZERS, Recipe
from dateopt.validation import check_choice, check_range, check_type

#: The strategies `plan` knows (see its docstring): DATE's, the static rules, and the
#: field's batch schedules (`dateopt.date._batch_schedules`).
STRATEGIES = ("adaptive", "legw", "linear", "sqrt", "none") + batch_schedules.BATCH_SCHEDULES

# The LR rule each strategy applies to the peak (and the whole LR curve).
_LR_RULES = {"legw": "sqrt", "linear": "linear", "sqrt": "sqrt", "none": "none"}

# Families promoted to a layer-wise adaptive one above the promotion threshold.
_PROMOTIONS = {"momentum": "lars", "nesterov": "lars", "adam": "lamb", "adamw": "lamb"}

#: A promoted recipe's peak LR comes from a published recipe of the new family, (batch size,
#: peak LR) by family, scaled to the target batch by the strategy's rule: a trust ratio
#: changes what the LR means (a relative per-layer step).
DEFAULT_PROMOTION_ANCHORS = {
    # LEGW ResNet-50/ImageNet with LARS (docs/papers.md §3): 2^2.5 at batch 1K.
    "lars": (1024, 2 ** 2.5),
    # NVIDIA's BERT pre-training with LAMB (DeepLearningExamples, phase 1).
    "lamb": (65536, 6e-3),
}

#: The batch size above which `plan` promotes momentum-SGD to LARS and Adam(W) to LAMB (by
#: default for the "legw" strategy only).
DEFAULT_PROMOTE_ABOVE = 8192


class PlanningError(ValueError):
  """The rule's recipe at this batch is not a valid `Recipe`: the rule has no recipe there.

  For example LEGW's warmup of k·w0 epochs is longer than a run of E epochs once
  k·w0 ≥ E (You et al., SC'19, §3). A ValueError, as every bad input to `plan` is;
  its own class so that a sweep can keep such a cell as a result of the rule.
  """


def _no_recipe(error: ValueError, batch_size: int, strategy: str,
               base_batch_size: int) -> PlanningError:
  return PlanningError(f"{error} (planning batch_size={batch_size} with strategy "
                       f"{strategy!r} from batch {base_batch_size})")


class LargeBatchWarning(UserWarning):
  """The planned batch is far beyond the measured critical batch size."""


def plan(
    baseline: Recipe,
    batch_size: int,
    strategy: str = "legw",
    *,
    promote: bool | None = None,
    promote_above: int = DEFAULT_PROMOTE_ABOVE,
    batch_norm: bool = True,
    promotion_anchors: Mapping[str, tuple[int, float]] | None = None,
    momentum_scaling: bool = False,
    noise_scale: float | Sequence[float] | None = None,
    critical_batch_factor: float = 4.0,
    gain_rule: str = "linear",
    linear_warmup_epochs: float = schedules.GOYAL_WARMUP_EPOCHS,
    grow_batch: bool = False,
    engine: EngineConfig | Mapping[str, Any] | None = None,
    noise_of: str | None = None,
    budget: float = 1.0,
    schedule_options: Mapping[str, object] | None = None,
    adam_scaling: Sequence[str] = (),
) -> Recipe:
  """Plans a recipe for `batch_size` from a tuned `baseline`, without re-tuning.

  With k = batch_size / baseline.batch_size, the strategies are:
    * "adaptive": DATE's dynamic mode (`dateopt.date.adaptive`). The recipe
      keeps the baseline's schedule, counted in baseline steps, and records
      B0 in `base_batch_size`; while training, each step advances that
      schedule by the gain r_t measured from the gradient noise scale and
      scales its LR by r_t (`gain_rule="linear"`) or √r_t ("sqrt"). The
      warmup is LEGW's (the baseline's warmup steps, a ramp from 0), and the
      run stops when it has covered the baseline's steps, so it chooses its
      own budget. With `grow_batch=True`, `batch_size` is the largest batch
      (the hardware's limit): the run starts at the baseline's and doubles
      its batch as the measured noise scale grows (`date.batch_ladder`,
      `dateopt.date._progress.wants_next_rung`). With `noise_scale`, the rationale predicts
      the steps, the examples and the largest batch reached.
    * "legw" (default): peak LR × √k and warmup × k epochs, the same decay over
      the same epochs (You et al., "Large-Batch Training for LSTM and Beyond",
      SC'19). The warmup lasts as many steps as the baseline's.
    * "linear": peak LR × k, a 5-epoch warmup starting from the baseline LR
      (Goyal et al. 2017); `linear_warmup_epochs` sets another length (a
      shorter run keeping Goyal's 5-of-90-epoch proportion, say).
    * "sqrt": peak LR × √k, warmup epochs unchanged.
    * "none": only the batch size changes.
  The whole LR curve keeps its shape: `end_value` and `init_value` scale
  with the peak.

  The field's batch schedules, with nothing measured (`batch_size` is the
  largest batch; `dateopt.date._batch_schedules` has each rule and its paper):
  "linear_ramp" (Megatron-LM, MaxText), "doubling" (OLMo-core's √ LR rule),
  "seesaw" (Meterez et al. 2025) and "batch_for_decay" (Smith et al. 2018).
  Their LR schedule is the baseline's counted in examples (its warmup in
  examples, its decay over the budget), times the rule's factor of the
  step's batch; `schedule_options` sets the rule's free parameters.

  Optimizer promotion (on by default for "legw"): above `promote_above`,
  momentum-SGD with batch norm becomes LARS and Adam(W) becomes LAMB, the
  layer-wise adaptive optimizers built for large batches (You et al. 2017,
  2019). The promoted peak LR is re-based on `promotion_anchors[family]`
  (a tuned (batch, LR) of that family) and scaled by the strategy's rule.

  Momentum scaling (off by default; Smith et al. 2017, "Don't decay the
  learning rate, increase the batch size"): keeping the SGD noise scale with
  B ∝ 1/(1 − m) gives 1 − m' = (1 − m)/k. This raises the effective LR
  lr/(1 − m) by k on top of the strategy's LR rule.

  With a measured `noise_scale` (B_noise, McCandlish et al. 2018; from
  `track_statistics` at the baseline), the expected efficiency
  gain(k)/k of the target batch (AdaScale, Johnson et al. 2020) is recorded in
  the rationale, and a `LargeBatchWarning` is issued when batch_size exceeds
  `critical_batch_factor` × B_noise.

  Args:
    baseline: the tuned small-batch recipe.
    batch_size: the target global batch size.
    strategy: "legw", "linear", "sqrt" or "none".
    promote: promote the optimizer family (None: only for "legw").
    promote_above: promote only when batch_size is above this.
    batch_norm: the model uses batch norm (momentum-SGD → LARS needs it).
    promotion_anchors: {family: (batch_size, peak_lr)}; defaults to
      `DEFAULT_PROMOTION_ANCHORS`.
    momentum_scaling: apply Smith et al.'s momentum rule.
    noise_scale: a measured gradient noise scale B_noise, in examples; for
      "adaptive", also a profile: B_noise at equally spaced points of the
      baseline's run (what the baseline logged), for the budget prediction.
    critical_batch_factor: warn above this multiple of B_noise.
    gain_rule: "adaptive" only: "linear" or "sqrt" (see above).
    linear_warmup_epochs: "linear" only: the warmup's epochs (Goyal's 5).
    grow_batch: "adaptive" only: grow the batch up to `batch_size`.
    engine: "adaptive" only: the engine's knobs, an `EngineConfig` or a mapping of
      some of its fields (None: the defaults), e.g. {"step_price": 2.0}: with
      `grow_batch`, a step's price in examples of the largest batch, in the rule
      "from rung B to B' once B · B' ≤ step_price · B_max · B_noise".
    noise_of: "adaptive" only: "gradient", "lars_step" for a LARS baseline
      (the noise scale of the step LARS takes, each leaf's gradient times its
      trust ratio: `dateopt.date._builder.noise_leaf_scales`), "adam_step" for an
      adam/adamw baseline (the gradient in Adam's metric, opt-in), or "auto"
      (lars_step where it applies: `Recipe.measured_noise_of`). None: the
      baseline's (by default "auto").
    budget: the static strategies and the batch schedules: the examples to
      train on, × the baseline's (its epochs × budget; the decay spans them).
      "adaptive" chooses its own.
    schedule_options: a batch schedule's options (`batch_schedules.resolve_options`):
      "start_batch", "ramp_share" or "ramp_examples", "increment", "alpha".
    adam_scaling: the Adam family's rules beyond the LR (`dateopt.date._adam_scaling`:
      "b2", "eps", "weight_decay"): a static plan writes the scaled values; DATE and
      the batch schedules apply them at every step. Off by default.

  Returns:
    The planned `Recipe`; its `rationale` says which rule set each field.

  Raises:
    ValueError: naming the field, for a bad argument or an impossible plan
      (e.g. a warmup scaled past the end of training).

  Example:
    >>> base = Recipe(batch_size=1024, num_examples=1_281_167, num_epochs=90,
    ...               learning_rate=2**2.5, optimizer="lars", warmup_epochs=0.3125,
    ...               decay="polynomial", end_value=1e-4)
    >>> big = plan(base, 32768)
    >>> round(big.learning_rate, 3), big.warmup_epochs
    (32.0, 10.0)
  """
  batch_size = _check_plan_args(baseline, batch_size, strategy, gain_rule=gain_rule,
                                promote_above=promote_above, grow_batch=grow_batch,
                                critical_batch_factor=critical_batch_factor,
                                linear_warmup_epochs=linear_warmup_epochs)
  anchors = dict(DEFAULT_PROMOTION_ANCHORS, **(promotion_anchors or {}))
  rules = _check_budget_and_options(strategy, budget, schedule_options, adam_scaling)
  if promote is None:
    promote = strategy == "legw"
  if strategy in batch_schedules.BATCH_SCHEDULES:
    if (promote or momentum_scaling or grow_batch or noise_of is not None
        or noise_scale is not None):
      raise ValueError(f"strategy={strategy!r} is a fixed batch schedule: promote, "
                       f"momentum_scaling, grow_batch, noise_of and noise_scale do not apply.")
    return _with_rung_rules(
        _scheduled_plan(baseline, batch_size, strategy, budget, schedule_options), rules)
  if strategy == "adaptive":
    if promote or momentum_scaling:
      raise ValueError("promote and momentum_scaling are rules of the static strategies; the "
                       "'adaptive' strategy keeps the baseline's optimizer and hyper-parameters.")
    return _with_rung_rules(_adaptive_plan(
        baseline, batch_size, gain_rule, noise_scale, critical_batch_factor, grow_batch,
        engine_config(engine), noise_of=noise_of), rules)
  if noise_of is not None:
    raise ValueError(f"noise_of={noise_of!r} is a rule of the 'adaptive' strategy (what its "
                     f"noise scale is measured on); got strategy={strategy!r}.")
  if grow_batch:
    raise ValueError(f"grow_batch=True is a rule of the 'adaptive' strategy (the measured noise "
                     f"scale chooses the batch); got strategy={strategy!r}.")
  if noise_scale is not None and not isinstance(noise_scale, numbers.Real):
    raise TypeError(f"noise_scale must be a number (B_noise in examples) for strategy "
                    f"{strategy!r}; a profile is for 'adaptive'. Got {noise_scale!r}.")
  family = _promoted_family(baseline, batch_size, promote, promote_above, batch_norm)
  return _static_plan(baseline, batch_size, strategy, family, anchors=anchors,
                      promote_above=promote_above, momentum_scaling=momentum_scaling,
                      noise_scale=noise_scale, critical_batch_factor=critical_batch_factor,
                      linear_warmup_epochs=linear_warmup_epochs, budget=budget, rules=rules)


def _check_plan_args(baseline: Recipe, batch_size: int, strategy: str, *, gain_rule: str,
                     promote_above: int, grow_batch: bool, critical_batch_factor: float,
                     linear_warmup_epochs: float) -> int:
  """`plan`'s arguments checked (an error names the field); the batch size as an int."""
  check_type("baseline", baseline, Recipe, what="a dateopt.date.Recipe")
  check_type("batch_size", batch_size, numbers.Integral, what="an int")
  check_range("batch_size", batch_size, low=0, low_inclusive=False)
  check_choice("strategy", strategy, STRATEGIES)
  check_choice("gain_rule", gain_rule, GAIN_RULES)  # for every strategy: a typo must not pass
  check_range("promote_above", promote_above, low=0)
  check_range("critical_batch_factor", critical_batch_factor, low=0.0,
              low_inclusive=False)
  check_type("linear_warmup_epochs", linear_warmup_epochs, numbers.Real, what="a number >= 0")
  check_range("linear_warmup_epochs", linear_warmup_epochs, low=0.0)
  check_type("grow_batch", grow_batch, bool, what="a bool")
  return int(batch_size)


def _static_plan(baseline: Recipe, batch_size: int, strategy: str, family: str, *,
                 anchors: Mapping[str, tuple[int, float]], promote_above: int,
                 momentum_scaling: bool, noise_scale: float | None,
                 critical_batch_factor: float, linear_warmup_epochs: float, budget: float,
                 rules: tuple[str, ...]) -> Recipe:
  """The static strategies: the LR scaled by `strategy`'s rule (re-based on `family`'s anchor
  where the optimizer was promoted), the warmup, momentum, budget and Adam rules."""
  k = batch_size / baseline.batch_size
  rule = _LR_RULES[strategy]
  changes = {"batch_size": batch_size}
  why = {"batch_size": f"target batch: k = {k:g} × baseline"}
  if family != baseline.optimizer:
    anchor_batch, anchor_lr = anchors[family]
    peak = schedules.scale_learning_rate(anchor_lr, anchor_batch, batch_size, rule=rule)
    changes.update(optimizer=family, eps=None, optimizer_options={})
    why["optimizer"] = (f"promoted above batch {promote_above}: "
                        f"{baseline.optimizer} → {family} (You et al. 2017/2019)")
    why["learning_rate"] = (f"re-based on the {family} anchor {anchor_lr:g} at batch "
                            f"{anchor_batch}, then {_RULE_TEXT[rule](anchor_batch, batch_size)}")
    why["eps"] = f"{family}'s default"
    why["optimizer_options"] = f"dropped: options of {baseline.optimizer}"
  else:
    peak = schedules.scale_learning_rate(baseline.learning_rate, baseline.batch_size,
                                         batch_size, rule=rule)
    why["learning_rate"] = _RULE_TEXT[rule](baseline.batch_size, batch_size)
  changes["learning_rate"] = peak
  curve = peak / baseline.learning_rate  # the rest of the LR curve keeps its shape
  changes["end_value"] = baseline.end_value * curve
  changes["init_value"] = baseline.init_value * curve
  why["end_value"] = why["init_value"] = f"scaled with the peak (× {curve:.4g})"

  changes.update(_planned_warmup(baseline, batch_size, strategy, why, linear_warmup_epochs))
  if momentum_scaling and family in MOMENTUM_OPTIMIZERS:
    changes["momentum"] = max(0.0, 1.0 - (1.0 - baseline.momentum) / k)
    why["momentum"] = f"Smith et al. 2017: B ∝ 1/(1 − m), so 1 − m ÷ {k:g}"
  if noise_scale is not None:
    why["expected efficiency"] = _efficiency_note(
        noise_scale, baseline.batch_size, batch_size, critical_batch_factor)
  changes.update(_budget_and_adam_rules(baseline, family, k, curve, budget, rules, why))

  try:
    return baseline.replace(**changes, rationale=why)
  except ValueError as e:
    raise _no_recipe(e, batch_size, strategy, baseline.batch_size) from e


def _check_budget_and_options(strategy: str, budget: float,
                              schedule_options: Mapping[str, object] | None,
                              adam_scaling: Sequence[str]) -> tuple[str, ...]:
  """`plan`'s budget, schedule options and Adam rules, checked; the rules as a tuple."""
  check_type("budget", budget, numbers.Real, what="a number > 0")
  check_range("budget", budget, low=0.0, low_inclusive=False)
  if schedule_options is not None and strategy not in batch_schedules.BATCH_SCHEDULES:
    raise ValueError(f"schedule_options are a batch schedule's (one of "
                     f"{', '.join(batch_schedules.BATCH_SCHEDULES)}); got strategy={strategy!r}.")
  if strategy == "adaptive" and budget != 1.0:
    raise ValueError(f"budget={budget:g}: the 'adaptive' strategy chooses its own budget "
                     f"(it stops when its progress covers the baseline's steps).")
  check_type("adam_scaling", adam_scaling, (list, tuple), what="a list of rule names")
  return tuple(adam_scaling)


def _budgeted_epochs(baseline: Recipe, budget: float) -> dict:
  """The epochs of a run `budget` × as long, the decay's milestones and period with it (the
  warmup keeps its examples)."""
  changes = {"num_epochs": baseline.num_epochs * budget}
  if baseline.decay == "multistep":
    changes["decay_epochs"] = tuple(e * budget for e in baseline.decay_epochs)
  if baseline.decay == "exponential":
    changes["decay_every_epochs"] = baseline.decay_every_epochs * budget
  return changes


def _budget_and_adam_rules(baseline: Recipe, family: str, k: float, curve: float,
                           budget: float, rules: tuple[str, ...], why: dict) -> dict:
  """A static plan's budget in epochs and its scaled β₂, ε and weight decay, with their
  reasons added to `why`."""
  changes = {}
  if budget != 1.0:
    changes.update(_budgeted_epochs(baseline, budget))
    why["num_epochs"] = f"budget: {budget:g} × the baseline's examples"
  if rules:
    if family != baseline.optimizer:
      raise ValueError(f"adam_scaling={rules} scales the baseline's {baseline.optimizer!r}; this "
                       f"plan promotes it to {family!r}: pass promote=False.")
    adam_rules.check_rules(rules, family)
    eps = baseline.eps if baseline.eps is not None and family == baseline.optimizer else (
        adam_rules.DEFAULT_EPS[family])
    scaled = adam_rules.planned_values(rules, k=k, lr_factor=curve, b1=baseline.b1,
                                       b2=baseline.b2, eps=eps,
                                       weight_decay=baseline.weight_decay)
    changes.update(scaled)
    why.update({name: _ADAM_RULE_TEXT[name](k, curve) for name in scaled})
  return changes


def _adaptive_plan(baseline: Recipe, batch_size: int, gain_rule: str,
                   noise_scale: float | Sequence[float] | None, critical_batch_factor: float,
                   grow_batch: bool, engine: EngineConfig, *, noise_of: str | None) -> Recipe:
  """The "adaptive" strategy: the baseline's schedule, walked by measured progress."""
  check_range("batch_size", batch_size, low=baseline.batch_size)
  k = batch_size / baseline.batch_size
  rule = "r_t" if gain_rule == "linear" else "√r_t"
  base_steps, warmup = baseline.total_steps, baseline.warmup_steps
  why = {
      "batch_size": f"target batch: k = {k:g} × baseline",
      "base_batch_size": "the baseline's: the schedule counts baseline steps",
      "learning_rate": (f"the baseline's peak × {rule}, the gain measured each step "
                        f"(AdaScale, Johnson et al. 2020), 1 ≤ r_t ≤ {k:g}"),
      "gain_rule": f"lr × {rule}",
      "warmup_epochs": (f"LEGW: the baseline's {warmup} steps, now at batch {batch_size}, "
                        f"a ramp from 0"),
      "num_epochs": (f"budget: stop when the progress Σ r_t reaches the baseline's "
                     f"{base_steps} steps (at most {base_steps} steps, "
                     f"at least {-(-base_steps // int(k))})"),
  }
  why["engine"] = _engine_text(engine, grow_batch)
  if grow_batch:
    ladder = batch_ladder(baseline.batch_size, batch_size)
    why["batch_size"] = f"the largest batch: k = {k:g} × baseline"
    why["warmup_epochs"] = (f"LEGW: the baseline's {warmup} steps, at the first rung, "
                            f"a ramp from 0")
    price, alpha = engine.step_price, engine.noise_batch_exponent
    why["grow_batch"] = (f"start at {ladder[0]}, one rung up every {engine.growth_interval} "
                         f"steps after the warmup, once the loss has fallen to "
                         f"{engine.learnt:g} × its start, while B·B_next ≤ {price:g}·"
                         f"{batch_size:,}·B_noise (a step priced at {price:g} × {batch_size:,} "
                         f"examples: the rung with the cheapest progress, (B + price)/r(B), "
                         f"McCandlish et al. 2018's B* = √(price·B_noise)), rung B reading "
                         f"B_noise × ({batch_size:,}/B)^{alpha:g}, never down "
                         f"(Smith et al. 2018)")
    why["batch ladder"] = ", ".join(f"{b:,}" for b in ladder)
  try:
    planned = baseline.replace(
        batch_size=batch_size, base_batch_size=baseline.batch_size, gain_rule=gain_rule,
        grow_batch=grow_batch, engine=engine,
        noise_of=baseline.noise_of if noise_of is None else noise_of)
  except ValueError as e:
    raise _no_recipe(e, batch_size, "adaptive", baseline.batch_size) from e
  if noise_scale is not None:
    why.update(_budget_notes(noise_scale, planned, critical_batch_factor))
  if planned.measured_noise_of == "lars_step":
    why["noise_of"] = (("auto: " if planned.noise_of == "auto" else "")
                       + "the step LARS takes: each leaf's gradient × its trust ratio, the gain "
                       "and the growth read its noise (Johnson et al. 2020: the gain of the "
                       "optimizer's own step); a noise_scale given predicts as it is")
  return planned.replace(rationale=why)


_ADAM_RULE_TEXT = {  # (k, the LR's factor) -> why the field has its value
    "b2": lambda k, f: (f"β₂^k, k = {k:g}: its half-life in examples (Marek et al. 2025), "
                        f"no lower than β₁"),
    "eps": lambda k, f: f"ε/√k, k = {k:g} (Malladi et al. 2022)",
    "weight_decay": lambda k, f: (f"λ·k/(η'/η) = λ·{k:g}/{f:.4g}: the AdamW timescale "
                                  f"B/(η·λ·D) held (Bergsma et al. 2025)"),
}


_ADAM_STEP_TEXT = {
    "b2": "β₂^k, no lower than β₁ (Marek et al. 2025)",
    "eps": "ε/√k (Malladi et al. 2022)",
    "weight_decay": "λ·k/(η'/η), the AdamW timescale held (Bergsma et al. 2025)",
}


def _with_rung_rules(planned: Recipe, rules: tuple[str, ...]) -> Recipe:
  """A dynamic plan with the Adam family's rules applied at every step."""
  if not rules:
    return planned
  try:
    with_rules = planned.replace(adam_scaling=rules)
  except ValueError as e:
    raise ValueError(f"{e} (planning with adam_scaling={rules})") from e
  why = dict(planned.rationale)
  why["adam_scaling"] = ("at every step, from its batch k·B0 and the LR factor η'/η it "
                         "applied: " + "; ".join(_ADAM_STEP_TEXT[r] for r in rules))
  return with_rules.replace(rationale=why)


# What each batch schedule's LR factor m(B) is, for the rationale.
_SCHEDULE_LR_TEXT = {
    "linear_ramp": "the LR planned for the largest batch, lr0 · √(B_max/B0) (LEGW), at every "
                   "batch: Megatron-LM does not change the LR at a step-up",
    "doubling": "lr0 · √(B/B0): × √2 at each doubling (OLMo-core's rule for Adam)",
    "seesaw": "lr0 · √(B/B0) over the schedule: at each fall of the schedule by α, the batch "
              "× 1/α and the LR falls by √α only (Meterez et al. 2025)",
    "batch_for_decay": "lr0 · √(B_s/B0) · B/B_s over the schedule: at each fall by α, the "
                       "batch × 1/α and the LR kept (Smith et al., ICLR 2018)",
}
_SCHEDULE_CITATION = {
    "linear_ramp": "Megatron-LM --rampup-batch-size START INCREMENT SAMPLES; MaxText",
    "doubling": "Megatron-LM --step-batch-size-schedule; OLMo-core BatchSizeSchedulerCallback",
    "seesaw": "Meterez et al. 2025, arXiv 2510.14717",
    "batch_for_decay": "Smith, Kindermans, Ying & Le, ICLR 2018",
}


def _scheduled_plan(baseline: Recipe, batch_size: int, strategy: str, budget: float,
                    options: Mapping[str, object] | None) -> Recipe:
  """A field batch schedule: the baseline's LR curve in examples, the batch on a schedule."""
  check_range("batch_size", batch_size, low=baseline.batch_size)
  b0 = baseline.batch_size
  options = dict(options or {})
  if strategy in ("seesaw", "batch_for_decay") and baseline.decay == "multistep":
    options.setdefault("alpha", baseline.decay_rate)  # the schedule's own cut (Smith et al.)
  try:
    budgeted = baseline.replace(**_budgeted_epochs(baseline, budget))
    resolved = batch_schedules.resolve_options(
        strategy, options, base_batch_size=b0, max_batch_size=batch_size,
        budget_examples=budgeted.total_steps * b0)
    planned = budgeted.replace(batch_size=batch_size, base_batch_size=b0,
                               batch_schedule=strategy, batch_schedule_options=resolved)
    schedule = batch_schedule_of(planned)
  except ValueError as e:
    raise _no_recipe(e, batch_size, strategy, b0) from e
  steps, examples = schedule.steps_for(planned.total_steps * b0)
  why = {
      "batch_size": f"the largest batch: k = {batch_size / b0:g} × baseline",
      "base_batch_size": "the baseline's: the LR schedule counts examples (baseline steps)",
      "learning_rate": _SCHEDULE_LR_TEXT[strategy],
      "warmup_epochs": "the baseline's, counted in examples",
      "num_epochs": (f"budget: {budget:g} × the baseline's examples, the decay over all of "
                     f"them"),
      "batch_schedule": _SCHEDULE_CITATION[strategy],
      "batch_schedule_options": "defaults filled in (batch_schedules.resolve_options)"
                                if not options else "as given, defaults filled in",
      "batch schedule": schedule.describe(),
      "predicted steps": f"{steps:,} steps, {examples:,} examples (the schedule fixes both)",
  }
  return planned.replace(rationale=why)


def _budget_notes(noise_scale, planned: Recipe, critical_batch_factor: float) -> dict[str, str]:
  """The rationale's prediction rows for a measured noise scale (a number or a profile)."""
  profile = _noise_profile(noise_scale)
  budget = plan_predicted_budget(planned, profile)
  grow_batch = planned.grow_batch
  what = (f"B_noise = {profile[0]:,.0f}" if len(profile) == 1
          else f"a {len(profile)}-point B_noise profile, median {statistics.median(profile):,.0f}")
  notes = {}
  alpha = planned.engine_config.noise_batch_exponent
  read = batch_credit(planned.base_batch_size, planned.batch_size, alpha)
  if len(profile) == 1 and not grow_batch:  # the efficiency of the noise the run will read
    notes["expected efficiency"] = _efficiency_note(
        profile[0] * read, planned.base_batch_size, planned.batch_size, critical_batch_factor)
  notes["predicted steps"] = (f"{budget['steps']:,} for {what} at the baseline's batch, read "
                              f"× {read:.3g} at {planned.batch_size:,} (the batch trend, "
                              f"× (B/B0)^{alpha:g}), played out by the "
                              f"engine's own steps (McCandlish et al. 2018: steps ∝ 1 + "
                              f"B_noise/B)")
  notes["predicted examples"] = (f"{budget['examples']:,} = "
                                 f"{budget['examples_vs_baseline']:.2f} × the baseline's")
  if grow_batch:
    notes["predicted largest batch"] = f"{budget['largest_batch_size']:,}"
  return notes


def _batches_of(base_batch_size: int, batch_size: int, grow_batch: bool) -> tuple[int, ...]:
  """The batches an adaptive run trains at: the ladder up to `batch_size`, or that batch alone."""
  return batch_ladder(base_batch_size, batch_size) if grow_batch else (batch_size,)


def _noise_profile(noise_scale) -> list[float]:
  """`noise_scale` (a number or a sequence of numbers > 0) as a list of floats."""
  values = [noise_scale] if isinstance(noise_scale, numbers.Real) else noise_scale
  check_type("noise_scale", values, (list, tuple), what="a number or a sequence of numbers")
  if not values:
    raise ValueError("noise_scale: a profile needs at least one value.")
  for value in values:
    check_type("noise_scale", value, numbers.Real, what="a number or a sequence of numbers")
    check_range("noise_scale", value, low=0.0, low_inclusive=False, finite=False)
  return [float(v) for v in values]


def plan_predicted_steps(recipe: Recipe, noise_scale: float | Sequence[float] | None
                         ) -> int | None:
  """The steps `recipe` will take: its own for a static recipe, its schedule's for a
  field batch schedule, the law's when adaptive.

  None for an adaptive recipe without a `noise_scale` to predict from.

  Example:
    >>> base = Recipe(batch_size=32, num_examples=8000, num_epochs=30,
    ...               learning_rate=2e-3, optimizer="adam", warmup_epochs=0.25)
    >>> plan_predicted_steps(plan(base, 512, "adaptive"), noise_scale=500.0)
    750
  """
  if not recipe.adaptive:
    return recipe.total_steps
  if recipe.scheduled:  # unrounded: the devices' rounding can only save a few steps
    return batch_schedule_of(recipe).steps_for(recipe.total_steps * recipe.base_batch_size)[0]
  if noise_scale is None:
    return None
  return plan_predicted_budget(recipe, noise_scale)["steps"]


def plan_predicted_budget(recipe: Recipe, noise_scale: float | Sequence[float], *,
                          read_at_batch_size: int | None = None) -> dict[str, Any]:
  """`predicted_budget` for an adaptive `recipe`: steps, examples and the largest batch, the
  engine's steps played out on `noise_scale` (a number or a profile over the baseline's progress,
  as a run at the baseline's batch reads it, or at `read_at_batch_size`; read × (B/B0)^α at
  batch B, α the recipe's `engine["noise_batch_exponent"]`, for a fixed batch too).

  Example:
    >>> base = Recipe(batch_size=32, num_examples=8000, num_epochs=30,
    ...               learning_rate=2e-3, optimizer="adam", warmup_epochs=0.25)
    >>> budget = plan_predicted_budget(plan(base, 512, "adaptive", grow_batch=True), 500.0)
    >>> budget["steps"], budget["largest_batch_size"], round(budget["examples_vs_baseline"], 2)
    (835, 512, 1.53)
  """
  if not recipe.adaptive or recipe.scheduled:
    raise ValueError("plan_predicted_budget: the recipe must be DATE's adaptive one "
                     "(plan(..., \"adaptive\")); a static or batch-schedule recipe fixes its "
                     "own steps: plan_predicted_steps.")
  ladder = _batches_of(recipe.base_batch_size, recipe.batch_size, recipe.grow_batch)
  return predicted_budget(_noise_profile(noise_scale), base_batch_size=recipe.base_batch_size,
                          batch_sizes=ladder, base_steps=recipe.total_steps,
                          warmup_steps=recipe.warmup_steps, config=recipe.engine_config,
                          read_at_batch_size=read_at_batch_size)


def _engine_text(engine: EngineConfig, grow_batch: bool) -> str:
  """Why the engine has its knobs: the defaults, or which fields the plan was given."""
  defaults = EngineConfig().to_dict()
  changed = {f: v for f, v in engine.to_dict().items() if v != defaults[f]}
  if not grow_batch:  # a fixed batch neither climbs nor credits
    changed = {f: v for f, v in changed.items()
               if f not in ("early_rungs", "step_price", "noise_batch_exponent")}
  given = (", ".join(f"{f} {v:g}" for f, v in changed.items()) + " as given, the rest at "
           "their defaults" if changed else "every knob at its default")
  return (f"{given} (`EngineConfig`): a {engine.horizon}-step horizon "
          f"(noise EMAs {engine.noise_decay:g}/{engine.signal_decay:g}), a "
          f"{engine.warm_in}-step warm-in, the loss held at {engine.hold_share:g} of its gains")


_RULE_TEXT = {  # (from batch, to batch) -> how the LR rule scaled the peak
    "sqrt": lambda b0, b: (f"sqrt scaling × √{b / b0:g} = × {math.sqrt(b / b0):.4g} "
                           f"(You et al. SC'19)"),
    "linear": lambda b0, b: f"linear scaling × {b / b0:g} (Goyal et al. 2017)",
    "none": lambda b0, b: "unchanged (strategy 'none')",
}


def _promoted_family(baseline, batch_size, promote, promote_above, batch_norm) -> str:
  """The optimizer family of the plan: the baseline's, or its promotion."""
  family = _PROMOTIONS.get(baseline.optimizer)
  if not promote or batch_size <= promote_above or family is None:
    return baseline.optimizer
  if family == "lars" and not batch_norm:
    return baseline.optimizer
  return family


def _planned_warmup(baseline: Recipe, batch_size: int, strategy: str,
                    why: dict, linear_warmup_epochs: float) -> dict:
  """The warmup fields of the plan, with their reasons added to `why`."""
  if strategy == "legw":
    epochs = schedules.legw_warmup_epochs(baseline.warmup_epochs,
                                          baseline.batch_size, batch_size)
    why["warmup_epochs"] = (f"LEGW: × k = × {batch_size / baseline.batch_size:g} "
                            f"epochs (same steps as the baseline)")
    if baseline.warmup_epochs == 0 and batch_size > baseline.batch_size:
      why["warmup_epochs"] += "; the baseline has no warmup to scale"
      warnings.warn("LEGW scales the baseline's warmup, and it has none: the "
                    "planned recipe has no warmup either. Give the baseline one "
                    "(or use strategy='linear').", UserWarning, stacklevel=3)
    return {"warmup_epochs": epochs}
  if strategy == "linear":
    why["warmup_epochs"] = f"Goyal et al. 2017: {linear_warmup_epochs:g}-epoch gradual warmup"
    why["init_value"] = "Goyal et al. 2017: warmup starts at the baseline LR"
    return {"warmup_epochs": float(linear_warmup_epochs),
            "init_value": baseline.learning_rate}
  return {}


def _efficiency_note(noise_scale, base_batch_size, batch_size, factor) -> str:
  """The efficiency row of the rationale; warns far beyond the critical batch."""
  check_range("noise_scale", noise_scale, low=0.0, low_inclusive=False)
  noise_scale = float(noise_scale)
  efficiency = expected_efficiency(noise_scale, base_batch_size, batch_size)
  if batch_size > factor * noise_scale:
    warnings.warn(
        f"batch_size={batch_size} is {batch_size / noise_scale:.1f}× the measured "
        f"critical batch B_noise≈{noise_scale:.0f}: each step is worth only "
        f"{efficiency:.2f} of the k-fold speed-up (McCandlish et al. 2018).",
        LargeBatchWarning, stacklevel=3)
  return (f"{efficiency:.3f} = gain(k)/k for B_noise = {noise_scale:,.0f} "
          f"(McCandlish et al. 2018; AdaScale gain, Johnson et al. 2020)")


# --------------------------------------------------------------------------
# explain
# --------------------------------------------------------------------------

_DERIVED_ROWS = ("steps_per_epoch", "warmup_steps", "total_steps")


def explain(baseline: Recipe, planned: Recipe) -> str:
  """A readable table, one row per hyper-parameter: baseline, planned, and why.

  Rows cover the fields either recipe's optimizer family and decay read, the
  derived step counts, and any extra note of the plan (such as the expected
  efficiency). The rule comes from `planned.rationale`; a field without one is
  "unchanged" or "set by hand".

  Example:
    >>> base = Recipe(batch_size=1024, num_examples=1_281_167, num_epochs=90,
    ...               learning_rate=2**2.5, optimizer="lars", warmup_epochs=0.3125)
    >>> print(explain(base, plan(base, 4096)))   # doctest: +ELLIPSIS
    hyper-parameter ...
    batch_size         1024 ...
  """
  check_type("baseline", baseline, Recipe, what="a dateopt.date.Recipe")
  check_type("planned", planned, Recipe, what="a dateopt.date.Recipe")
  used = set(baseline.used_fields()) | set(planned.used_fields())
  names = [n for n in planned.to_dict() if n in used]
  rows = [("hyper-parameter", "baseline", "planned", "rule")]
  for name in names + list(_DERIVED_ROWS):
    before, after = getattr(baseline, name), getattr(planned, name)
    if name in planned.rationale:
      rule = planned.rationale[name]
    elif name in _DERIVED_ROWS:
      rule = "derived (epochs → steps)"
    else:
      rule = "unchanged" if before == after else "set by hand"
    rows.append((name, _show(before), _show(after), rule))
  fields = planned.to_dict()
  for note, text in planned.rationale.items():
    if note not in fields:  # notes about the plan itself, not about a field
      rows.append((note, "", "", text))
  widths = [max(len(r[i]) for r in rows) for i in range(3)]
  return "\n".join(
      "  ".join(cell.ljust(w) for cell, w in zip(r[:3], widths)) + "  " + r[3]
      for r in rows)


def _show(value) -> str:
  """A short, readable rendering of a field value."""
  if value is None:
    return "None"
  if isinstance(value, float):
    return f"{value:.6g}"
  if isinstance(value, tuple):
    return ",".join(_show(v) for v in value) or "()"
  if isinstance(value, Mapping):
    return ",".join(f"{k}={_show(v)}" for k, v in value.items()) or "{}"
  return str(value)
