"""Greedy decoding of the translation models through ``model.predict`` alone, so it runs the
same on every backend: the decoder reads its own previous words instead of the reference's.

Both translation models are causal in the target (an LSTM decoder; the Transformer's masked
self-attention), so the output at position t reads only ``tgt_in[:, :t + 1]``: one predict
over the whole padded target per position, with the words chosen so far written in, gives
the next word. That costs ``tgt_len`` forward passes a batch, each over the full length, which
is what a backend-neutral loop can do without a per-framework incremental decoder; the
held-out split of a proxy is small enough for it (docs/training.md)."""
import numpy as np

__all__ = ["greedy_decode"]


def greedy_decode(model, batch, hp):
    """The decoded target ids of each row of ``batch`` (a list of lists, without the end mark):
    the argmax word at each position, fed back, until every row has written ``eos_id`` or the
    config's ``tgt_len`` is used up."""
    pad, bos, eos = hp["pad_id"], hp["bos_id"], hp["eos_id"]
    rows, length = batch["tgt_in"].shape
    tgt_in = np.full((rows, length), pad, np.int32)
    tgt_in[:, 0] = bos
    feed = dict(batch, tgt_in=tgt_in)
    if "tgt_lengths" in feed:           # every position is read; causality hides the rest
        feed["tgt_lengths"] = np.full(rows, length, np.int32)
    words = np.full((rows, length), pad, np.int32)
    finished = np.zeros(rows, bool)
    for t in range(length):
        logits = np.asarray(model.predict(dict(feed, tgt_in=tgt_in.copy())))
        chosen = np.where(finished, pad, np.argmax(logits[:, t], axis=-1)).astype(np.int32)
        words[:, t] = chosen
        finished |= chosen == eos
        if finished.all() or t + 1 == length:
            break
        tgt_in[:, t + 1] = np.where(finished, pad, chosen)
    out = []
    for row in words:
        ids = list(row)
        out.append(ids[:ids.index(eos)] if eos in ids else ids)
    return out

