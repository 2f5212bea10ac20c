"""Offline stand-ins for the Hub downloads of Hugging Face example scripts.

Each function replaces one download on a line marked ``# zoo:``: the GLUE MRPC dataset (sentence
pairs with a label), the ``bert-base-cased`` tokenizer (a WordPiece tokenizer whose vocabulary is
counted from the corpus here, with BERT's special tokens and pair template), the pretrained BERT
classifier (a 2-layer BERT of width 32 from a config: random weights, seeded by the script's own
``set_seed``), and the ``evaluate`` GLUE metric (accuracy and F1 computed here).
Sizes: ``ZOO_DATASET_SIZE`` training pairs (default 64), ``ZOO_TEST_SIZE`` validation pairs
(default 32).
"""

from __future__ import annotations

import os
import random
from typing import Any

from .corpus import sentences, vocabulary


def glue_mrpc() -> Any:
    from datasets import Dataset, DatasetDict

    def split(count: int, seed: int) -> Any:
        rng = random.Random(seed)
        first = sentences(count, seed=seed, low=5, high=18)
        second = sentences(count, seed=seed + 7, low=5, high=18)
        labels = []
        for i in range(count):
            if rng.random() < 0.5:  # a paraphrase: the same words, shuffled
                words = first[i].rstrip(".").lower().split()
                rng.shuffle(words)
                second[i] = " ".join(words).capitalize() + "."
                labels.append(1)
            else:
                labels.append(0)
        return Dataset.from_dict({"sentence1": first, "sentence2": second, "label": labels,
                                  "idx": list(range(count))})

    return DatasetDict({
        "train": split(int(os.environ.get("ZOO_DATASET_SIZE", 64)), 11),
        "validation": split(int(os.environ.get("ZOO_TEST_SIZE", 32)), 23),
    })


def bert_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    # The vocabulary is counted, not trained: every word of the corpus in both cases, punctuation,
    # and single characters (plain and "##" continuations) so any other word still splits.
    words = vocabulary()
    letters = sorted({c for word in words for c in word})
    pieces = sorted(set(words) | {w.capitalize() for w in words} | {".", ",", "!", "?"}
                    | set(letters) | {c.upper() for c in letters} | {"##" + c for c in letters})
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: i for i, token in enumerate(special + pieces)}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                   model_max_length=128)


def bert_classifier() -> Any:
    from transformers import AutoModelForSequenceClassification, BertConfig

    config = BertConfig(vocab_size=len(bert_tokenizer()), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    return AutoModelForSequenceClassification.from_config(config)


class GlueMetric:
    """``evaluate.load("glue", "mrpc")``'s interface: ``add_batch`` then ``compute``."""

    def __init__(self) -> None:
        self.predictions: list[int] = []
        self.references: list[int] = []

    def add_batch(self, *, predictions: Any, references: Any) -> None:
        self.predictions += [int(p) for p in predictions]
        self.references += [int(r) for r in references]

    def compute(self) -> dict[str, float]:
        pairs = list(zip(self.predictions, self.references))
        self.predictions, self.references = [], []
        correct = sum(p == r for p, r in pairs)
        tp = sum(p == r == 1 for p, r in pairs)
        fp = sum(p == 1 and r == 0 for p, r in pairs)
        fn = sum(p == 0 and r == 1 for p, r in pairs)
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        return {"accuracy": correct / len(pairs) if pairs else 0.0, "f1": f1}


def glue_metric() -> GlueMetric:
    return GlueMetric()
