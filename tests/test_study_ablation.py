"""What each engine rule buys (dateopt.study.ablation): the grid, the cells' configs, the table."""

import doctest

import pytest

from dateopt import configs
from dateopt.date._progress import ENGINE_RULES
from dateopt.study import Cell, ablation, cell_config, cells, compare


@pytest.mark.parametrize("module", [ablation, cells])
def test_docstring_examples(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0


def test_the_grid_runs_every_rule_off_on_date_fixed_and_grown_after_every_rule_on():
  grid = ablation.ablation_grid(["lstm"], seeds=(0, 1, 2))
  # A fixed batch runs neither of the two rules only a ladder has.
  assert len(grid) == 3 + 2 * 3 * (1 + len(ENGINE_RULES)) - 3 * len(ablation.LADDER_RULES)
  assert "lstm/adaptive/64x/off:early_climb/seed0" not in [c.key for c in grid]
  keys = [c.key for c in grid]
  assert keys[3:9] == [f"lstm/{m}/64x/seed{s}" for m in ("adaptive", "adaptive_grow")
                       for s in range(3)]  # the comparison's own DATE cells: shared
  assert "lstm/adaptive_grow/64x/off:rising_hold/seed2" in keys
  with pytest.raises(ValueError, match="rules: unknown.*warmup"):
    ablation.ablation_grid(["lstm"], rules=("warmup",))


def test_the_grid_can_run_the_grown_cells_alone():
  keys = [c.key for c in ablation.ablation_grid(
      ["lm"], rules=("early_climb", "signal_horizon"), seeds=(0,), methods=("adaptive_grow",))]
  assert keys == ["lm/baseline/1x/seed0", "lm/adaptive_grow/64x/seed0",
                  "lm/adaptive_grow/64x/off:early_climb/seed0",
                  "lm/adaptive_grow/64x/off:signal_horizon/seed0"]
  for wrong in (("legw",), ()):
    with pytest.raises(ValueError, match="methods: .*allowed: .*adaptive, adaptive_grow"):
      ablation.ablation_grid(["lm"], rules=("early_climb",), methods=wrong)


def test_an_ablation_cell_switches_its_rules_off_and_only_date_takes_one():
  base = configs.load("study_mnist1d_lstm")
  cell = Cell("lstm", "adaptive_grow", 64, 1, "off:early_climb+rising_hold")
  config = cell_config(base, cell, num_train_examples=60_000)
  assert config.engine_rules_off == "early_climb,rising_hold" and config.plan.grow_batch
  on = cell_config(base, Cell("lstm", "adaptive", 64, 1), num_train_examples=60_000)
  assert on.engine_rules_off == ""
  with pytest.raises(ValueError, match="takes no setting"):
    cell_config(base, Cell("lstm", "legw", 64, 0, "off:early_climb"), num_train_examples=60_000)
  with pytest.raises(ValueError, match="off:<rule>"):
    cell_config(base, Cell("lstm", "adaptive", 64, 0, "start16x"), num_train_examples=60_000)


def _row(strategy, seed, steps, examples, accuracy, setting="", divergences=0, multiple=64):
  cell = Cell("lstm", strategy, 1 if strategy == "baseline" else multiple, seed, setting)
  return {"key": cell.key, "workload": "lstm", "strategy": strategy, "multiple": cell.multiple,
          "seed": seed, "setting": setting, "budget": 1.0, "steps": steps,
          "examples": examples, "final_accuracy": accuracy, "divergences": divergences}


ROWS = [_row("baseline", s, 7500, 240_000, 0.99) for s in (0, 1)] + [
    _row("adaptive_grow", 0, 500, 1_000_000, 0.985),
    _row("adaptive_grow", 1, 700, 1_200_000, 0.987),
    _row("adaptive_grow", 0, 900, 1_300_000, 0.983, "off:early_climb"),
    _row("adaptive_grow", 1, 1100, 1_900_000, 0.975, "off:early_climb", divergences=2),
]


def test_the_table_reads_each_rule_off_against_every_rule_on_by_hand():
  entries = ablation.summarize_ablation(ROWS)
  assert [(e["method"], e["rule"]) for e in entries] == [("adaptive_grow", ""),
                                                        ("adaptive_grow", "early_climb")]
  off = entries[1]
  assert off["steps"] == 1000 and off["steps_vs_all_on"] == pytest.approx(1000 / 600)
  assert off["examples_vs_all_on"] == pytest.approx(1_600_000 / 1_100_000)
  # The bar: the baselines' 99% less 1 point; 97.5% misses it; one run was called diverged.
  assert (off["at_bar"], off["diverged"]) == (1, 1)
  text = ablation.ablation_report(entries)
  assert "| (every rule on) | 2 | 600 | 1.00 | 1.00 | 98.60 | 2/2 | 0/2 |" in text
  assert "| early_climb | 2 | 1,000 | 1.67 | 1.45 | 97.90 | 1/2 | 1/2 |" in text


def test_the_comparison_leaves_an_ablations_runs_out():
  entries = compare.summarize_comparison(ROWS)
  grown = next(e for e in entries if e["method"] == "adaptive_grow")
  assert grown["runs"] == 2 and grown["steps"] == 600
  # A Seesaw run that dominates only the ablation's grown runs (fewer steps and examples than
  # 900 at 1.3M) is not reseeded; one that dominates a comparison's grown run is.
  seesaw = lambda setting, steps, examples: dict(
      _row("seesaw", 0, steps, examples, 0.99), setting=setting, key=f"seesaw/{setting}")
  rows = ROWS + [seesaw("start1x", 950, 2_000_000), seesaw("start4x", 800, 1_250_000),
                 seesaw("start16x", 480, 900_000)]
  reseeded = {(c.setting, c.seed) for c in compare.reseeded(rows)}
  assert ("start4x", 1) not in reseeded  # dominates only lstm/adaptive_grow/64x/off:...
  assert {("start16x", 1), ("start16x", 2)} <= reseeded
