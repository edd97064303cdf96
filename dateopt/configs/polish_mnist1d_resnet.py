"""The Final Polishing study: a batch-norm ResNet trained on augmented MNIST-1D at 32x batch.

`resnet_tiny` (1-D convolutions, plain batch norm over the whole batch) learns
from MNIST-1D signals that are shifted by up to 4 steps, scaled by U(0.75, 1.25)
and given Gaussian noise of std 0.3 (the clean signals have std ~1): the
statistics its BN layers learn on those no longer fit the clean evaluation
signals. The LARS baseline at batch 32 is planned by DATE (LEGW) for batch
1,024. `scripts/polish_study.py` trains it with and without the paper's final
epochs (`polish.epochs` None: 5/90 of the run on evaluation-style data) and
re-estimates the BN statistics on clean and on weakly augmented batches.

  dateopt-train --config configs/polish_mnist1d_resnet.py --workdir runs/polish_b1024
  python scripts/polish_study.py
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "mnist1d"
  config.dataset_kwargs = dict(num_samples=10_000, augment_shift=4, augment_scale=0.25,
                               augment_noise=0.3)
  config.model = "resnet_tiny"
  config.baseline = dict(
      batch_size=32, num_epochs=32, optimizer="lars", learning_rate=2.0, momentum=0.9,
      weight_decay=1e-4, warmup_epochs=0.1, decay="polynomial", power=2.0,
      end_value=1e-4, label_smoothing=0.1)
  config.batch_size = 1024
  config.strategy = "legw"
  config.statistics, config.grad_groups = False, 0  # plain BN over the batch: no gradient groups
  config.eval_batch_size = 1000
  config.log_every_steps = 10
  config.checkpoint_every_steps = -1
  config.progress_bar = False
  config.polish.batches = 8  # 8 x 1,024: about the 8,000 training signals once
  return config
