"""Word-level language-model data over PTB-format text files (Zaremba et al. 2014).

Reads train/valid/test text files (Mikolov's preprocessed Penn Treebank:
`ptb.train.txt` or `train.txt`, ...), marks line ends with "<eos>", builds the
vocabulary from the training file (most frequent first, ties by word, as the
TensorFlow PTB tutorial's reader), and cuts each token stream into
non-overlapping windows of `seq_len` tokens; the labels of a window are the
same tokens shifted by one.

Windows are independent examples (the model starts each batch from a zero
state), so they are shuffled and fetched by random access like any other
dataset. This differs from the paper's sequential truncated BPTT, which
carries the LSTM state across batches: expect somewhat higher perplexity.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import numpy as np

from dateopt.data.base import Dataset
from dateopt.validation import check_choice, check_range, check_type

END_OF_SENTENCE = "<eos>"
UNKNOWN_WORD = "<unk>"
PTB_SPLITS = ("train", "valid", "test")


def find_split_file(data_dir: str | os.PathLike, split: str) -> Path:
  """The file of `split` in `data_dir`: ptb.{split}.txt, else {split}.txt.

  Raises:
    FileNotFoundError: naming the dataset and every path tried.
  """
  candidates = [Path(data_dir) / f"ptb.{split}.txt", Path(data_dir) / f"{split}.txt"]
  for candidate in candidates:
    if candidate.is_file():
      return candidate
  raise FileNotFoundError(f"ptb: no {split} file in {data_dir}; looked for "
                          f"{', '.join(str(c) for c in candidates)}.")


def read_words(path: str | os.PathLike) -> list[str]:
  """The whitespace-separated words of a file, with "<eos>" at every line end.

  Example:
    >>> read_words("ptb.valid.txt")[:3]  # doctest: +SKIP
  """
  with open(path, encoding="utf-8") as f:
    return f.read().replace("\n", f" {END_OF_SENTENCE} ").split()


def build_vocabulary(words: list[str]) -> tuple[str, ...]:
  """Distinct words, most frequent first, ties broken alphabetically (id = position).

  Example:
    >>> build_vocabulary(["b", "a", "b"])
    ('b', 'a')
  """
  counts = collections.Counter(words)
  return tuple(sorted(counts, key=lambda word: (-counts[word], word)))


def words_to_ids(words: list[str], vocabulary: tuple[str, ...], path: Path) -> np.ndarray:
  """Token ids of `words`; out-of-vocabulary words become "<unk>" when the vocabulary has it.

  Raises:
    ValueError: on out-of-vocabulary words and no "<unk>" in the vocabulary.
  """
  word_to_id = {word: index for index, word in enumerate(vocabulary)}
  unknown_id = word_to_id.get(UNKNOWN_WORD)
  missing = sorted({word for word in words if word not in word_to_id})
  if missing and unknown_id is None:
    raise ValueError(f"ptb: {path} has {len(missing)} words missing from the training "
                     f"vocabulary (e.g. {missing[:5]}) and the vocabulary has no {UNKNOWN_WORD!r}.")
  return np.array([word_to_id.get(word, unknown_id) for word in words], np.int32)


class TokenWindowSource:
  """Example i: inputs tokens[i*T:(i+1)*T], labels tokens[i*T+1:(i+1)*T+1] (T = seq_len)."""

  def __init__(self, tokens: np.ndarray, seq_len: int):
    self._tokens = tokens
    self._seq_len = seq_len
    if len(self) < 1:
      raise ValueError(f"ptb: {len(tokens)} tokens are too few for one window of seq_len="
                       f"{seq_len} plus its next-token label.")

  def __len__(self) -> int:
    return (len(self._tokens) - 1) // self._seq_len

  def gather(self, indices: np.ndarray, augment_key) -> dict[str, np.ndarray]:
    del augment_key
    positions = np.asarray(indices)[:, None] * self._seq_len + np.arange(self._seq_len)
    return {"inputs": self._tokens[positions], "labels": self._tokens[positions + 1]}


def build_ptb(*, data_dir: str | None = None, seq_len: int = 35,
              eval_split: str = "valid") -> Dataset:
  """Penn Treebank (or any PTB-format corpus) as windows of `seq_len` tokens.

  Args:
    data_dir: directory with ptb.train.txt / ptb.valid.txt / ptb.test.txt
      (or train.txt / valid.txt / test.txt).
    seq_len: tokens per window, the unrolled length: 20 for Zaremba's small
      model, 35 for medium and large (`dateopt.models.PTB_PRESETS`).
    eval_split: "valid" or "test".

  Returns:
    A language-model `Dataset`: inputs and labels (seq_len,) int32,
    num_classes = vocabulary size, metadata["vocabulary"] = the words by id.

  Example:
    >>> ds = build_ptb(data_dir="/data/ptb", seq_len=20)  # doctest: +SKIP
  """
  if data_dir is None:
    raise FileNotFoundError("ptb needs data_dir: a directory with ptb.train.txt, "
                            "ptb.valid.txt and ptb.test.txt (or train.txt, ...).")
  check_type("seq_len", seq_len, int, what="a positive int")
  check_range("seq_len", seq_len, low=1)
  check_choice("eval_split", eval_split, PTB_SPLITS[1:])
  train_path = find_split_file(data_dir, "train")
  eval_path = find_split_file(data_dir, eval_split)
  train_words = read_words(train_path)
  vocabulary = build_vocabulary(train_words)
  train_tokens = words_to_ids(train_words, vocabulary, train_path)
  eval_tokens = words_to_ids(read_words(eval_path), vocabulary, eval_path)
  return Dataset(
      name="ptb", task="language_model", num_classes=len(vocabulary), input_shape=(seq_len,),
      input_dtype=np.dtype(np.int32), train_source=TokenWindowSource(train_tokens, seq_len),
      eval_source=TokenWindowSource(eval_tokens, seq_len),
      metadata={"vocabulary": vocabulary, "seq_len": seq_len, "train_file": str(train_path),
                "eval_file": str(eval_path), "num_train_tokens": len(train_tokens),
                "num_eval_tokens": len(eval_tokens)})
