"""Token-batch workload: the CPU-light input side of language-model training.

Batches are slices of a pre-tokenised corpus held in memory (no decoding, no augmentation), so the input
pipeline costs almost nothing and throughput should *not* depend on the number of cores: the control case
next to the image pipeline. The compute step (embedding gather, next-token scores) runs single-threaded in
NumPy without BLAS, so extra cores cannot speed it up either.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def run(report: Callable[[int], None], *, batch_size: int = 64, seq_len: int = 256, vocab: int = 32_000,
        dim: int = 64, corpus_tokens: int = 2_000_000, steps: int | None = None, seed: int = 0) -> None:
    """Run until stopped (or for `steps` batches), reporting each batch's sequences."""
    rng = np.random.default_rng(seed)
    corpus = rng.integers(0, vocab, size=corpus_tokens, dtype=np.int32)
    embedding = (rng.standard_normal((vocab, dim)) * 0.02).astype(np.float32)
    offsets = np.arange(seq_len + 1)
    done = 0
    while steps is None or done < steps:
        starts = rng.integers(0, corpus_tokens - seq_len - 1, size=batch_size)
        tokens = corpus[starts[:, None] + offsets]
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        hidden = embedding[inputs]
        scores = np.einsum("bld,bld->bl", hidden, embedding[labels])
        float(-scores.mean())
        report(batch_size)
        done += 1
