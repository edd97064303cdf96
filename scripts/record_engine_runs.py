"""Records the engine runs that `tests/test_engine_replay.py` replays: real trainer runs,
each showing one of DATE's phases at work, kept as their `recipe.json` and a gzipped
`engine.jsonl` under tests/data/engine_runs/<name>/.

- plateau: the study LSTM grown to 64x (seed 0), on the chance plateau for its first steps,
  its loss rising for a while later (a hold);
- lm_climb: the study's Transformer LM grown to 64x (seed 0), its batch climbing from 4 to 128
  (`dateopt/configs/study_lm_shakespeare.py`);
- resnet_climb: the study ResNet (LARS, `dateopt/configs/study_mnist1d_resnet.py`) grown to
  64x (seed 0);
- spike: the main job's LSTM with its gradient multiplied by 1,000 at step 50, a jump the
  engine skips (`scripts/divergence_evidence.py`'s `main_job_explode_at_50`);
- divergence: the main job's LSTM at 1,000x its LR, whose gradients explode: the engine skips
  them, and gives up once they have used its patience (`main_job_lr_x1000`).

The test replays each with `dateopt.train.replay_run` and asks for every decision bit for bit:
a change to the engine that changes what it decides on any of them shows up there. After
such a change on purpose, record them again (about 20 minutes on 2 cores):

  python scripts/record_engine_runs.py [--only NAME] [--workdir runs/engine_runs]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import shutil
import sys

from absl import logging

sys.path.insert(0, os.path.dirname(__file__))
import divergence_evidence as evidence  # noqa: E402  (a sibling script: its runs and faults)

from dateopt.train import engine_log  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "engine_runs"


def recorded_runs() -> list[evidence.Run]:
  diverged = {spec.name: spec for spec in evidence.diverged_runs()}
  lm = evidence._adaptive("dateopt/configs/study_lm_shakespeare.py", 64)  # pylint: disable=protected-access
  lstm = evidence._adaptive(evidence.STUDY["lstm"], 64)  # pylint: disable=protected-access
  resnet = evidence._adaptive(evidence.STUDY["resnet"], 64)  # pylint: disable=protected-access
  for config in (lm, lstm, resnet):
    config.plan = dict(config.plan.to_dict(), grow_batch=True)
  return [evidence.Run("plateau", lstm), evidence.Run("lm_climb", lm),
          evidence.Run("resnet_climb", resnet),
          diverged["main_job_explode_at_50"]._replace(name="spike"),
          diverged["main_job_lr_x1000"]._replace(name="divergence")]


def keep(workdir: str, name: str) -> dict:
  """The run's recipe.json and gzipped engine.jsonl into OUT/name; what its phases were."""
  target = OUT / name
  shutil.rmtree(target, ignore_errors=True)
  target.mkdir(parents=True)
  shutil.copy(os.path.join(workdir, "recipe.json"), target / "recipe.json")
  source = pathlib.Path(workdir) / engine_log.ENGINE_FILE
  with gzip.open(target / (engine_log.ENGINE_FILE + ".gz"), "wt", encoding="utf-8") as out:
    out.write(source.read_text())
  rows = [json.loads(line) for line in source.read_text().splitlines()]
  return {"steps": len(rows), "phases": sorted({row["phase"] for row in rows})}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/engine_runs")
  parser.add_argument("--only", default=None)
  args = parser.parse_args()
  logging.set_verbosity(logging.ERROR)
  for spec in recorded_runs():
    if args.only in (None, spec.name):
      workdir = os.path.join(args.workdir, spec.name)
      row = evidence.run(spec, workdir)
      print(json.dumps(dict(row, **keep(workdir, spec.name))), flush=True)


if __name__ == "__main__":
  main()
