"""The Final Polishing study with a larger train/eval gap: noise as strong as the signal.

configs/polish_mnist1d_resnet.py with the training signals shifted by up to 6
steps, scaled by U(0.6, 1.4) and given Gaussian noise of std 1.0 (the clean
signals have std ~1), so the BN statistics of augmented and clean data differ
more.

  python scripts/polish_study.py --config configs/polish_mnist1d_resnet_strong.py \
      --outdir runs/polish_study_strong
"""

import importlib.util
import os


def get_config():
  path = os.path.join(os.path.dirname(__file__), "polish_mnist1d_resnet.py")
  spec = importlib.util.spec_from_file_location("polish_mnist1d_resnet", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.dataset_kwargs.update(augment_shift=6, augment_scale=0.4, augment_noise=1.0)
  return config
