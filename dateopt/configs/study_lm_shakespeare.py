"""The study's language model: a 2-block byte-level Transformer on Shakespeare's plays.

`lm_shakespeare` made cheaper for grids of many runs (`python -m dateopt.study --workload lm`,
and `--compare`): the same corpus, windows, split and AdamW recipe, with 2 of char_small's 4
blocks (462,336 parameters) and half its tokens: 0.2 epochs at batch 4 windows of 128 bytes,
1,809 steps, 0.93M tokens, about a minute on 2 CPU cores.

Its LR was tuned once at batch 4 by the sweep below (seed 0, every other field as here, the
cosine's floor a tenth of each peak; final validation loss on the 512 held-out windows, and bits
per byte against the training bytes' unigram entropy of 4.81):

  peak LR       1e-3    2e-3    4e-3    8e-3    1.6e-2
  loss, nats    2.1384  1.9362  1.8689  2.5691  2.6615
  bits / byte   3.085   2.793   2.696   3.706   3.840

4e-3 is kept and frozen for every batch and strategy. Its validation loss sits near 2.55 nats
for its first 600 steps, then falls at every evaluation to the
end (2.23, 2.01, 1.92, 1.87 at steps 900 to 1,800); at 8e-3 and above the run never leaves
that plateau.

  dateopt-train --config study_lm_shakespeare --workdir runs/study_lm_sweep/lr4e-3 \
      --config.baseline.learning_rate=4e-3 --config.baseline.end_value=4e-4
  python -m dateopt.study --workload lm
  python -m dateopt.study --compare --workload lm --outdir runs/schedule_study
"""

from dateopt.configs import lm_shakespeare


def get_config():
  config = lm_shakespeare.get_config()
  config.model_kwargs = dict(preset="char_small", num_layers=2)
  config.baseline = dict(config.baseline.to_dict(), num_epochs=0.2, warmup_epochs=0.004,
                         learning_rate=4e-3, end_value=4e-4)
  config.eval_every_steps = 300
  return config
