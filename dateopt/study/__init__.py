"""The batch-scaling study: DATE against the static scaling rules, from 1x to 64x.

Every run starts from ONE baseline recipe, tuned once at batch B0 and then
frozen; each cell of the grid (workload x batch B0·k x strategy x seed) only
changes what its strategy changes:

  * "baseline": the recipe as it is, at B0;
  * "adaptive": DATE's dynamic mode (`dateopt.date.adaptive`): the baseline's
    schedule walked at the gain measured from the gradient noise scale; the
    run chooses its own budget (You et al. SC'19; AdaScale, Johnson et al. 2020);
  * "legw", "linear", "sqrt", "none": the static rules at equal epochs (the
    paper's protocol): LEGW (peak x √k, warmup epochs x k), linear scaling with
    Goyal et al.'s warmup (5 of 90 epochs, kept as that share of a shorter
    run), √k without LEGW's warmup, and the batch alone;
  * "legw_date_steps": static LEGW trained for the steps DATE chose at that
    batch (the mean over DATE's seeds), so that "more steps" and "an adaptive
    LR" are told apart.

The package: `cells` (the grid, each cell's config and run), `runner`
(`Study`: results appended to `<outdir>/cells.jsonl` as each run finishes, so
a re-run skips the finished cells), `report` (`summarize`, `markdown_report`,
`write_csv`, the bars), `figures` (the study's PNGs) and `__main__`, the
command: `python -m dateopt.study` (`scripts/scaling_study.py` runs it).

Example:
  >>> from dateopt import configs, study
  >>> workloads = {"lstm": configs.load("study_mnist1d_lstm")}
  >>> runner = study.Study("runs/scaling_study", workloads)
  >>> rows = runner.run(study.grid(["lstm"], multiples=(1, 4), seeds=(0,)))
  >>> print(study.markdown_report(study.summarize(rows)))
"""

from dateopt.study.cells import (
    ADAPTIVE_STRATEGIES,
    BAR_TOLERANCE,
    DEFAULT_STRATEGIES,
    MULTIPLES,
    STATIC_RULES,
    STRATEGIES,
    Cell,
    cell_config,
    effective_noise_scale,
    filled_profile,
    finite_median,
    grid,
    measured_noise_scales,
    run_cell,
)
from dateopt.study.report import (
    bar_check,
    baseline_target,
    dominated,
    growth_report,
    language_model_report,
    law_report,
    markdown_report,
    prediction_report,
    profile_report,
    progress_profile,
    read_as_largest,
    read_run,
    steps_to_target,
    summarize,
    write_csv,
)
from dateopt.study.runner import Study

__all__ = [
    "ADAPTIVE_STRATEGIES", "BAR_TOLERANCE", "DEFAULT_STRATEGIES", "MULTIPLES", "STATIC_RULES",
    "STRATEGIES", "Cell", "Study", "bar_check", "baseline_target", "cell_config", "dominated",
    "effective_noise_scale", "filled_profile", "finite_median", "grid", "growth_report",
    "language_model_report", "law_report", "markdown_report", "measured_noise_scales", "prediction_report",
    "profile_report", "progress_profile", "read_as_largest", "read_run", "run_cell",
    "steps_to_target", "summarize", "write_csv",
]
