"""Offline data for the zoo's scripts, written into a run's data folder before the script starts.

Every function here takes the folder and the run's step count and writes exactly what the
script would otherwise download, sized so that the script takes that many optimizer steps.
Everything is generated from fixed seeds: two calls write the same bytes.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

from zoo_support.corpus import sentences

ZOO = Path(__file__).resolve().parent


def text_lines(count: int, seed: int = 0) -> list[str]:
    return sentences(count, seed=seed)


def hf_clm(data: Path, steps: int) -> None:
    """A text file for run_clm.py's ``--train_file`` and a byte-level BPE tokenizer trained on it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lines = text_lines(400 + 40 * steps, seed=3)
    (data / "train.txt").write_text("\n".join(lines) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<|endoftext|>", model_max_length=64).save_pretrained(str(data / "tokenizer"))


def lightning_lm(data: Path, steps: int) -> None:
    """``data/wikitext-2.txt``: present, so the Lightning demo's WikiText2 does not download it.

    The script splits its samples (35 tokens each) into n-4000 / 2000 / 2000 and trains with a
    batch of 20; the file holds enough for ``steps`` batches and a few more.
    """
    folder = data / "data"
    folder.mkdir(parents=True, exist_ok=True)
    needed_tokens = (4000 + 20 * (steps + 2)) * 35
    lines, tokens, seed = [], 0, 0
    while tokens < needed_tokens:
        for line in text_lines(500, seed=seed):
            lines.append(" " + line + " ")
            tokens += len(line.split()) + 1  # the demo adds <eos> at each line end
        seed += 1
    (folder / "wikitext-2.txt").write_text("\n".join(lines) + "\n")


def nanogpt(data: Path, steps: int) -> None:
    """A character-level dataset in nanoGPT's format (``train.bin``, ``val.bin``, ``meta.pkl``)."""
    text = "\n".join(text_lines(3000, seed=4))
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    split = int(len(ids) * 0.9)
    folder = data / "chars"
    folder.mkdir(parents=True, exist_ok=True)
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def llmc(data: Path, steps: int) -> None:
    """A token shard in llm.c's format: a 256-int32 header (magic 20240520, version 1, count)."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 50257, size=32768, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))
    with open(data / "train.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def word_lm(data: Path, steps: int) -> None:
    """wikitext-2's three files, sized so that training takes ``steps`` batches (batch 20, bptt 35).

    The last batch is half as long as the others: word_language_model feeds a shorter
    sequence at the end of each epoch, as it does on the real corpus.
    """
    folder = data / "wikitext-2"
    folder.mkdir(parents=True, exist_ok=True)
    batch, bptt = 20, 35
    rows = (steps - 1) * bptt + 1 + bptt // 2
    _write_tokens(folder / "train.txt", rows * batch, seed=6)
    _write_tokens(folder / "valid.txt", 10 * (bptt + 1), seed=7)
    _write_tokens(folder / "test.txt", 10 * (bptt + 1), seed=8)


def _write_tokens(path: Path, tokens: int, seed: int) -> None:
    """Lines whose words plus one ``<eos>`` per line add up to exactly ``tokens``."""
    out, total = [], 0
    for line in text_lines(tokens, seed=seed):
        words = line.split()
        room = tokens - total - 1
        if room <= 0:
            break
        words = words[:room]
        out.append(" " + " ".join(words) + " ")
        total += len(words) + 1
    assert total == tokens, (total, tokens)
    path.write_text("\n".join(out) + "\n")


def lbfgs_sine(data: Path, steps: int) -> None:
    """``traindata.pt``, written by the example's own generate_sine_wave.py."""
    subprocess.run([sys.executable, str(ZOO / "lbfgs_sine" / "generate_sine_wave.py")], cwd=data, check=True)


def maml(data: Path, steps: int, task_num: int = 2, test_classes: int = 10) -> None:
    """``omniglot-data/omniglot.npy`` as the example's loader caches Omniglot: [classes, 20, 1, 28, 28]
    float64 in [0, 1], each class a fixed random stroke pattern and its 20 drawings that pattern with
    noise; ``task_num`` training classes per step (the loader's split, ``ZOO_TRAIN_CLASSES``) and
    ``test_classes`` more for its test pass."""
    rng = np.random.default_rng(0)
    classes = task_num * steps + test_classes
    prototypes = (rng.random((classes, 1, 1, 28, 28)) < 0.15).astype(np.float64)
    noise = rng.normal(0.0, 0.2, size=(classes, 20, 1, 28, 28))
    (data / "omniglot-data").mkdir(parents=True, exist_ok=True)
    np.save(data / "omniglot-data" / "omniglot.npy", np.clip(prototypes + noise, 0.0, 1.0))


PREPARE = {
    "hf_clm": hf_clm,
    "lightning_lm": lightning_lm,
    "nanogpt": nanogpt,
    "llmc": llmc,
    "word_lm": word_lm,
    "lbfgs_sine": lbfgs_sine,
    "maml": maml,
}
