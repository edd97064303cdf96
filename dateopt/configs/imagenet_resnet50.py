"""ResNet-50 on ImageNet with LARS at batch 32K, MLPerf-style (docs/papers.md §4).

The tuned 32,768 recipe is trained as it is (no planning): peak LR 29, 18
warmup epochs, momentum 0.929, weight decay 1e-4, polynomial power 2 to 1e-4,
label smoothing 0.1, 60 epochs, BN and biases excluded from LARS, ghost BN
over 64 images, bf16 compute.
  dateopt-train --config configs/imagenet_resnet50.py --workdir gs://bucket/run \
      --config.data_dir=gs://bucket/tensorflow_datasets
"""

from dateopt.train import default_config


def get_config():
  config = default_config()
  config.dataset = "imagenet2012"
  config.model = "resnet50"
  config.model_kwargs = dict(bn_group_size=64)
  config.compute_dtype = "bfloat16"
  config.baseline = dict(
      batch_size=32768, num_epochs=60, optimizer="lars", learning_rate=29.0,
      momentum=0.929, weight_decay=1e-4, warmup_epochs=18, decay="polynomial",
      power=2.0, end_value=1e-4, label_smoothing=0.1, mask="exclude_bias_and_norm")
  config.batch_size = None
  config.log_every_steps = 20
  config.checkpoint_every_steps = 200
  config.eval_every_steps = 4 * 39  # about every 4 epochs at 32K
  # Final Polishing (Kasagi et al. 2020): the last 5 of 90 epochs on eval-style images,
  # then precise BN over 20 clean batches.
  config.polish.mode = "both"
  config.polish.epochs = 5.0
  config.polish.batches = 20
  return config
