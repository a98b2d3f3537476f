"""Synthetic batches in the canonical layouts, seeded and framework-neutral (NumPy out).

They follow the statistics that matter for speed and numerics (unit-variance images, valid
label ranges, realistic padding in token batches), not any real data set.
"""
import numpy as np

from ..spec.losses import ctc_required_frames
from . import spectrogram as front


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


def ragged_lengths(rng, batch_size, limit, min_fraction=0.5, low=1):
    """Per-example lengths in [max(low, ceil(limit * min_fraction)), limit]: the first example
    at full length (the batch pads to it, as a bucketed batch pads to its longest), the last
    at the shortest (when there are two or more), the rest uniform in between."""
    shortest = min(limit, max(low, int(np.ceil(limit * min_fraction))))
    lengths = rng.randint(shortest, limit + 1, size=batch_size)
    lengths[0] = limit
    if batch_size > 1:
        lengths[-1] = shortest
    return lengths.astype(np.int32)


def parallel_sentences(batch_size, src_len, tgt_len, src_vocab, tgt_vocab, pad_id=0, bos_id=1,
                       eos_id=2, first_token=3, min_fraction=0.5, reverse_source=False, seed=0):
    """Sentence pairs over two vocabularies, padded at the end, with their lengths.

    ``src`` holds the source words (reversed within each sentence's length when
    ``reverse_source``, as TF NMT's ``source_reverse`` does), ``tgt_in`` the decoder input
    (BOS + words), ``labels`` the decoder target (words + EOS); ``src_lengths`` and
    ``tgt_lengths`` count the tokens of each (tgt_in and labels have the same length). Padding
    is ``pad_id``; words are drawn from ids ``first_token`` and up.
    """
    rng = np.random.RandomState(seed)
    src = np.full((batch_size, src_len), pad_id, np.int32)
    src_lengths = ragged_lengths(rng, batch_size, src_len, min_fraction)
    for i, n in enumerate(src_lengths):
        words = rng.randint(first_token, src_vocab, size=n)
        src[i, :n] = words[::-1] if reverse_source else words
    tgt_in = np.full((batch_size, tgt_len), pad_id, np.int32)
    labels = np.full((batch_size, tgt_len), pad_id, np.int32)
    tgt_lengths = ragged_lengths(rng, batch_size, tgt_len, min_fraction)
    for i, n in enumerate(tgt_lengths):
        words = rng.randint(first_token, tgt_vocab, size=n - 1)
        tgt_in[i, 0] = bos_id
        tgt_in[i, 1:n] = words
        labels[i, :n - 1] = words
        labels[i, n - 1] = eos_id
    return {"src": src, "src_lengths": src_lengths, "tgt_in": tgt_in,
            "tgt_lengths": tgt_lengths, "labels": labels}


def utterances(batch_size, max_frames, num_classes, steps_of, max_label_length,
               chars_per_second=15.0, min_fraction=0.5, min_frames=1, sample_rate=16000,
               window_ms=20.0, hop_ms=10.0, seed=0):
    """Spectrograms of synthetic audio with transcripts, padded at the end, with lengths.

    Each utterance is tones in noise, put through the Deep Speech 2 front-end
    (tbdzoo/datasets/spectrogram.py), so the input has the statistics the network sees (a
    normalised log spectrogram); frames past an utterance's length are 0. Its transcript holds
    about ``chars_per_second`` characters per second of audio, ids in [1, num_classes) (0 is
    CTC's blank), padded with 0 to ``max_label_length``, and never more than CTC allows after
    the network's subsampling: ``steps_of(frames)`` gives the output steps of ``frames`` input
    frames. Returns ``spectrogram`` (N, T, bins), ``spectrogram_lengths``, ``labels`` (N, L)
    and ``label_lengths``.
    """
    rng = np.random.RandomState(seed)
    hop = front.hop_samples(sample_rate, hop_ms)
    bins = front.num_bins(sample_rate, window_ms)
    lengths = ragged_lengths(rng, batch_size, max_frames, min_fraction, low=min_frames)
    spect = np.zeros((batch_size, max_frames, bins), np.float32)
    labels = np.zeros((batch_size, max_label_length), np.int32)
    label_lengths = np.zeros(batch_size, np.int32)
    t = np.arange((max_frames - 1) * hop) / float(sample_rate)
    for i, frames in enumerate(lengths):
        n = (frames - 1) * hop        # a centred STFT of n samples has exactly `frames` frames
        audio = 0.1 * rng.standard_normal(n)
        for freq in rng.uniform(50.0, sample_rate / 2.0, size=3):
            audio += rng.uniform(0.1, 1.0) * np.sin(2 * np.pi * freq * t[:n] + rng.uniform(0, 6.3))
        spect[i, :frames] = front.spectrogram(audio, sample_rate, window_ms, hop_ms)
        count = int(round(frames * hop_ms / 1000.0 * chars_per_second))
        text = rng.randint(1, num_classes, size=max(1, min(count, max_label_length)))
        while len(text) > 1 and ctc_required_frames(text) > steps_of(frames):
            text = text[:-1]
        labels[i, :len(text)] = text
        label_lengths[i] = len(text)
    return {"spectrogram": spect, "spectrogram_lengths": lengths, "labels": labels,
            "label_lengths": label_lengths}
