"""Synthetic batches in the canonical layouts, seeded and framework-neutral (NumPy out).

They follow the statistics that matter for speed and numerics (unit-variance images, valid
label ranges, realistic padding in token batches), not any real data set.
"""
import numpy as np


def image_classification(batch_size, channels, size, num_classes, seed=0):
    rng = np.random.RandomState(seed)
    return {
        "images": rng.standard_normal((batch_size, channels, size, size)).astype(np.float32),
        "labels": rng.randint(0, num_classes, size=(batch_size,)).astype(np.int32),
    }


def translation(batch_size, src_len, tgt_len, vocab, pad_id=0, bos_id=1, eos_id=2,
                first_token=3, min_fraction=0.5, seed=0):
    """Token batches padded at the end; every sentence keeps at least ``min_fraction`` of the
    length, so padding masks are exercised but no row is empty.

    ``tgt_in`` is the decoder input (BOS + target), ``labels`` the target shifted by one with
    EOS, both padded with ``pad_id``.
    """
    rng = np.random.RandomState(seed)

    def lengths(limit):
        low = max(1, int(np.ceil(limit * min_fraction)))
        return rng.randint(low, limit + 1, size=batch_size)

    src = np.full((batch_size, src_len), pad_id, np.int32)
    for i, n in enumerate(lengths(src_len)):
        src[i, :n] = rng.randint(first_token, vocab, size=n)
    tgt_in = np.full((batch_size, tgt_len), pad_id, np.int32)
    labels = np.full((batch_size, tgt_len), pad_id, np.int32)
    for i, n in enumerate(lengths(tgt_len)):
        words = rng.randint(first_token, vocab, size=n - 1) if n > 1 else np.zeros(0, np.int32)
        tgt_in[i, 0] = bos_id
        tgt_in[i, 1:n] = words
        labels[i, :n - 1] = words
        labels[i, n - 1] = eos_id
    return {"src": src, "tgt_in": tgt_in, "labels": labels}
