"""ResNet-50/ImageNet planned by LEGW from the 1K baseline (docs/papers.md §3).

Baseline: LARS at batch 1024, peak 2^2.5, 0.3125 warmup epochs, 90 epochs.
DATE's LEGW plan at 32K: peak 32, warmup 10 epochs (override batch_size for
the other rows of the table: 4096 -> 11.31 / 1.25, 8192 -> 16 / 2.5, ...).
  dateopt-train --config configs/imagenet_resnet50_legw.py --workdir gs://bucket/legw \
      --config.data_dir=gs://bucket/tensorflow_datasets --config.batch_size=16384
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "imagenet2012"
  config.model = "resnet50"
  config.compute_dtype = "bfloat16"
  config.baseline = dict(
      batch_size=1024, num_epochs=90, optimizer="lars", learning_rate=2 ** 2.5,
      momentum=0.9, weight_decay=1e-4, warmup_epochs=0.3125, decay="polynomial",
      power=2.0, end_value=1e-4)
  config.batch_size = 32768
  config.strategy = "legw"
  config.grad_groups = 0  # plain BN over the batch: no grouped gradients (no noise scale)
  config.checkpoint_every_steps = 200
  return config
