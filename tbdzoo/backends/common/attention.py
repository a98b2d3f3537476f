"""Attention masking as the spec defines it (tbdzoo/spec/ops.py, multi_head_attention)."""
import numpy as np

# What a masked attention logit becomes before the softmax.
MASKED_LOGIT = -1e9


def causal_table(queries, keys, dtype=np.float32):
    """(queries, keys) table, 1 (True) where key s lies after query t: the causal mask."""
    return np.triu(np.ones((queries, keys), dtype=dtype), 1)
