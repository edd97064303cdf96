"""The batch-scaling study's workload (b): a batch-norm ResNet with LARS on MNIST-1D.

`resnet_tiny` (3 stages of 1 basic block, 16-32-64 filters) runs 1-D
convolutions over the 40-step signals; ghost batch norm over groups of 16
keeps the BN statistics the same at every batch (Hoffer et al. 2017) and lets
the noise scale's 2 gradient groups keep whole BN groups. The LARS baseline was
tuned once at batch 32 and is frozen; the data are workload (a)'s (60,000
training examples).

  dateopt-train --config configs/study_mnist1d_resnet.py --workdir runs/study_resnet_b32
  python scripts/scaling_study.py --workload resnet

Every run measures the noise scale of the step LARS takes (`Recipe.noise_of`'s default,
"auto"). `study_mnist1d_resnet.py:<noise_of>` sets DATE's runs' `plan.noise_of`:
`:gradient` gives the gradient's, as the study's cells before 2026-11-28 measured it:

  python scripts/scaling_study.py --workload resnet --config resnet=study_mnist1d_resnet:gradient
"""

from dateopt.train import default_config


def get_config(noise_of: str = ""):
  config = default_config()
  config.dataset = "mnist1d"
  config.dataset_kwargs = dict(num_samples=75_000)
  config.model = "resnet_tiny"
  config.model_kwargs = dict(bn_group_size=16)
  config.baseline = dict(
      batch_size=32, num_epochs=4, optimizer="lars", learning_rate=4.0, momentum=0.9,
      weight_decay=1e-4, warmup_epochs=0.04, decay="polynomial", power=2.0,
      end_value=1e-4, label_smoothing=0.1)
  config.grad_groups = 2
  config.eval_batch_size = 1000
  config.log_every_steps = 20
  config.checkpoint_every_steps = 500
  if noise_of:  # DATE's runs only: the baseline's recipe takes no plan
    config.plan = dict(noise_of=noise_of)
  return config
