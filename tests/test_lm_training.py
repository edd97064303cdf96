"""The byte-level Transformer LM through the trainer: its metrics, the growing batch, resume.

Every run is the tiny preset with one decoder block (each block adds to every compile; the
model's own tests cover its depth) on a small corpus of plain-text files written here
(`text_files`), on the 8 simulated devices.
"""

import csv
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import conftest  # tests/conftest.py: the XLA flags of the suite's child processes
from dateopt import train
from dateopt.train import engine_log
from dateopt.data import get_dataset

pytestmark = pytest.mark.slow  # training runs

SEQ_LEN = 32
WORDS = ("the king queen lord lady sword crown night day love death fool speak hear "
         "good ill sweet bitter heaven earth fire water blood gold").split()


def write_corpus(directory, num_documents: int = 6, words_per_document: int = 1500):
  """Deterministic documents of seeded word sequences, one file each."""
  rng = np.random.default_rng(0)
  directory.mkdir(parents=True, exist_ok=True)
  for d in range(num_documents):
    words = rng.choice(WORDS, size=words_per_document)
    lines = [" ".join(words[i:i + 12]) + "." for i in range(0, len(words), 12)]
    (directory / f"act{d}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  return directory


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return str(write_corpus(tmp_path_factory.mktemp("corpus")))


def lm_config(corpus_dir, **fields):
  config = train.default_config()
  config.dataset = "text_files"
  config.data_dir = corpus_dir
  config.dataset_kwargs = dict(seq_len=SEQ_LEN, eval_share=0.2, eval_windows=64)
  config.model = "transformer_lm"
  config.model_kwargs = dict(preset="tiny", num_layers=1)
  config.baseline = dict(batch_size=16, num_epochs=1, optimizer="adamw", learning_rate=3e-3,
                         b2=0.99, weight_decay=0.1, warmup_epochs=0.1, decay="cosine",
                         grad_clip_norm=1.0)
  config.grad_groups = 4
  config.eval_batch_size = 64
  config.log_every_steps = 5
  config.eval_every_steps = 0
  config.checkpoint_every_steps = -1
  config.progress_bar = False
  config.divergence_watch = False
  for key, value in fields.items():
    setattr(config, key, value)
  return config


def rows_of(workdir):
  return [json.loads(line) for line in open(f"{workdir}/metrics.jsonl", encoding="utf-8")]


def test_a_language_model_run_logs_tokens_bits_per_byte_and_perplexity(corpus, tmp_path):
  config = lm_config(corpus, num_train_steps=20)
  result = train.train_and_evaluate(config, str(tmp_path))
  rows = rows_of(tmp_path)
  logged = [r for r in rows if "train/loss" in r]
  for row in logged:
    assert row["train/tokens_seen"] == row["train/examples_seen"] * SEQ_LEN == row["step"] * 16 * SEQ_LEN
    if "train/examples_per_second" in row:
      assert row["train/tokens_per_second"] == pytest.approx(
          row["train/examples_per_second"] * SEQ_LEN)
  assert any("train/tokens_per_second" in r for r in logged)
  final = [r for r in rows if "eval/loss" in r][-1]
  assert final["eval/bits_per_byte"] == pytest.approx(final["eval/loss"] / math.log(2))
  assert final["eval/perplexity"] == pytest.approx(math.exp(final["eval/loss"]))
  assert final["eval/tokens_seen"] == 20 * 16 * SEQ_LEN
  assert result.tokens == result.examples * SEQ_LEN == 20 * 16 * SEQ_LEN
  summary = next(r for r in rows if "run/tokens" in r)
  assert summary["run/tokens"] == result.tokens
  # The eval loss, by a second path: the model applied window by window to the eval split.
  exp = train.build_experiment(config)
  dataset = exp.dataset
  batch = dataset.eval_source.gather(np.arange(dataset.num_eval_examples), None)
  logits = exp.model.apply({"params": result.state.params}, jnp.asarray(batch["inputs"]),
                           train=False)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
  assert result.eval_metrics["loss"] == pytest.approx(float(loss), rel=1e-5)
  assert result.eval_metrics["bits_per_byte"] == pytest.approx(float(loss) / math.log(2),
                                                               rel=1e-5)


def _growing(corpus, **fields):
  """DATE adaptive from B0 = 16 up to 32 (each rung is a compile); a step priced at 1000
  largest batches, so the climb is due as soon as the growth rule looks (20 steps after
  the warmup)."""
  return lm_config(corpus, strategy="adaptive", batch_size=32,
                   plan=dict(grow_batch=True, engine={"step_price": 1000.0}), **fields)


def test_a_growing_language_model_run_killed_at_a_grown_rung_resumes_bit_exact(corpus, tmp_path):
  config = _growing(corpus, checkpoint_every_steps=25, keep_checkpoints=20)
  whole = train.train_and_evaluate(config, str(tmp_path / "whole"))
  rows = rows_of(tmp_path / "whole")
  changes = [(r["step"], r["train/batch_size"]) for r in rows
             if "train/batch_size" in r and "train/loss" not in r]
  assert [batch for _, batch in changes] == [16, 32]  # it did climb
  resume_at = 25  # the first checkpoint: after the climb, the tokens and the feed at rung 32
  assert changes[-1][0] < resume_at
  shutil.copytree(tmp_path / "whole" / "checkpoints" / str(resume_at),
                  tmp_path / "resumed" / "checkpoints" / str(resume_at))
  resumed = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert (resumed.steps, resumed.examples, resumed.tokens) == (whole.steps, whole.examples,
                                                               whole.tokens)
  assert resumed.largest_batch_size == whole.largest_batch_size
  for a, b in zip(jax.tree.leaves(whole.state.params), jax.tree.leaves(resumed.state.params)):
    np.testing.assert_array_equal(a, b)
  assert resumed.eval_metrics == whole.eval_metrics
  # The engine's record of every step: the same after the resume, and its code re-run on
  # those readings decides every step as the run did.
  engine_rows = lambda run: [row for row in (tmp_path / run / engine_log.ENGINE_FILE)
                             .read_text().splitlines() if json.loads(row)["step"] > resume_at]
  assert engine_rows("resumed") == engine_rows("whole")  # the rows after the checkpoint
  report = engine_log.replay_run(tmp_path / "whole")
  assert report.exact and report.steps == whole.steps, report.first_mismatch


def test_gradient_accumulation_takes_the_same_language_model_steps(corpus, tmp_path):
  plain = train.train_and_evaluate(lm_config(corpus, num_train_steps=6, batch_size=64),
                                   str(tmp_path / "plain"))
  accumulated = train.train_and_evaluate(
      lm_config(corpus, num_train_steps=6, batch_size=64, grad_accum_steps=2),
      str(tmp_path / "accumulated"))
  for a, b in zip(jax.tree.leaves(plain.state.params),
                  jax.tree.leaves(accumulated.state.params)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_the_divergence_guard_watches_a_language_model(corpus, tmp_path):
  # A peak LR 10^4 times the tuned one: the loss blows up and the guard skips steps and
  # cuts the LR, as on the other workloads.
  config = lm_config(corpus, num_train_steps=40)
  config.baseline = dict(config.baseline.to_dict(), learning_rate=30.0)
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result.train_metrics["guard/num_skipped"] > 0
  assert result.train_metrics["guard/lr_multiplier"] < 1.0


def test_eval_windows_are_spread_over_the_validation_stream(corpus):
  whole = get_dataset("text_files", data_dir=corpus, seq_len=SEQ_LEN, eval_share=0.2)
  spread = get_dataset("text_files", data_dir=corpus, seq_len=SEQ_LEN, eval_share=0.2,
                       eval_windows=10)
  n = whole.num_eval_examples
  assert spread.num_eval_examples == 10
  expected = [round(j * (n - 1) / 9) for j in range(10)]
  np.testing.assert_array_equal(spread.eval_source.gather(np.arange(10), None)["inputs"],
                                whole.eval_source.gather(np.array(expected), None)["inputs"])
  assert get_dataset("text_files", data_dir=corpus, seq_len=SEQ_LEN, eval_share=0.2,
                     eval_windows=10 * n).num_eval_examples == n
  with pytest.raises(ValueError, match="eval_windows"):
    get_dataset("text_files", data_dir=corpus, seq_len=SEQ_LEN, eval_windows=0)


def test_a_study_cell_of_a_language_model_reports_its_loss_and_tokens(corpus, tmp_path):
  from dateopt import study  # pylint: disable=import-outside-toplevel
  base = lm_config(corpus, num_train_steps=20, eval_every_steps=10)
  cell = study.Cell("lm", "baseline", 1, 0)
  examples = train.build_experiment(base).dataset.num_train_examples
  row = study.run_cell(cell, study.cell_config(base, cell, num_train_examples=examples),
                       str(tmp_path))
  rows = rows_of(tmp_path)
  final = [r for r in rows if "eval/loss" in r][-1]
  assert row["final_loss"] == pytest.approx(final["eval/loss"])
  assert row["final_bits_per_byte"] == pytest.approx(final["eval/loss"] / math.log(2))
  assert row["tokens"] == row["examples"] * SEQ_LEN == 20 * 16 * SEQ_LEN
  assert row["eval_loss"] == [r["eval/loss"] for r in rows if "eval/loss" in r]
  assert row["eval_tokens"] == [r["eval/tokens_seen"] for r in rows if "eval/loss" in r]
  assert row["eval_tokens"][-1] == row["tokens"]
  summary = study.summarize([row])
  assert "| baseline (B0) | 16 (1x) | 1 |" in study.language_model_report(summary)
  # A text workload's figures are of its loss, against batch, steps and tokens; its CSV row
  # has the loss, bits per byte and tokens.
  from dateopt.study import figures  # pylint: disable=import-outside-toplevel
  assert os.path.getsize(figures.plot_loss_vs_batch(summary, str(tmp_path / "loss.png"))) > 0
  grown = dict(row, key="lm/adaptive_grow/4x/seed0", strategy="adaptive_grow", multiple=4,
               eval_tokens=[])  # a grown row without its tokens: on the steps panel only
  assert figures._tokens_at_evals(grown) is None  # pylint: disable=protected-access
  assert figures._tokens_at_evals(dict(row, eval_tokens=[])) == pytest.approx(  # pylint: disable=protected-access
      row["eval_tokens"])  # a fixed batch: steps × its tokens a step
  assert os.path.getsize(figures.plot_loss_curves([row, grown], str(tmp_path / "c.png"))) > 0
  study.write_csv([row], str(tmp_path / "results.csv"))
  written = next(csv.DictReader(open(tmp_path / "results.csv", encoding="utf-8")))
  assert float(written["final_loss"]) == pytest.approx(row["final_loss"])
  assert int(written["tokens"]) == row["tokens"]


def test_the_packaged_lm_config_runs_from_the_command_line(corpus, tmp_path):
  """`dateopt-train --config lm_shakespeare`, its corpus and model shrunk by overrides: the
  final line has the validation loss, bits per byte, tokens and tokens per second."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "dateopt.cli", "--config", "lm_shakespeare",
         "--workdir", str(workdir), "--config.dataset=text_files", f"--config.data_dir={corpus}",
         f"--config.dataset_kwargs.seq_len={SEQ_LEN}", "--config.dataset_kwargs.eval_windows=16",
         "--config.model_kwargs.preset=tiny", "--config.num_train_steps=6",
         "--config.eval_every_steps=0", "--config.eval_batch_size=16",
         "--config.log_every_steps=2",
         "--config.checkpoint_every_steps=-1", "--config.progress_bar=False"]
  # One device, as a laptop has (the suite's 8 simulated ones do not divide batch 4).
  env = dict(os.environ, XLA_FLAGS=conftest.CHILD_FLAG)
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-2000:]
  final = json.loads(next(line for line in out.stdout.splitlines()
                          if line.startswith("final:"))[len("final:"):])
  assert final["steps"] == 6 and final["tokens"] == 6 * 4 * SEQ_LEN  # batch 4 windows
  assert final["eval"]["bits_per_byte"] == pytest.approx(final["eval"]["loss"] / math.log(2))
  assert final["tokens_per_second"] == pytest.approx(
      final["tokens"] * final["steps_per_second"] / final["steps"])
  assert json.loads((workdir / "final_metrics.json").read_text()) == final
