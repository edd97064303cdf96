#!/usr/bin/env bash
# Runs a dateopt config on every worker of a Cloud TPU VM pod slice.
#
#   scripts/launch_tpu_vm.sh TPU_NAME ZONE configs/imagenet_resnet50_legw.py gs://bucket/run \
#       --config.data_dir=gs://bucket/tensorflow_datasets --config.batch_size=16384
#
# Every worker installs dateopt and runs the same command; jax.distributed
# detects the slice's processes by itself, the mesh spans all their devices.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 TPU_NAME ZONE CONFIG WORKDIR [--config.field=value ...]" >&2
  exit 2
fi
TPU_NAME=$1 ZONE=$2 CONFIG=$3 WORKDIR=$4
shift 4
REPO_URL=${DATEOPT_REPO_URL:-"$(git config --get remote.origin.url)"}
EXTRA_ARGS=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command "
  set -e
  [ -d dateopt ] || git clone '$REPO_URL' dateopt
  cd dateopt && git pull --ff-only
  python3 -m venv .venv && .venv/bin/pip install -q -U pip
  .venv/bin/pip install -q -e '.[data]' 'jax[tpu]'
  .venv/bin/dateopt-train --config '$CONFIG' --workdir '$WORKDIR' $EXTRA_ARGS
"
