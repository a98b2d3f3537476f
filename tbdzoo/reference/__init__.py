"""The float64 NumPy reference: every spec op, loss and optimizer written from the spec alone,
sharing no code with any backend. ``tbd consistency`` holds every backend to it
(tbdzoo/consistency.py).

  ops.py         each op's forward pass (OPS: op name -> fn(inputs, params, attrs, training,
                 dropout mask))
  losses.py      each loss kind of tbdzoo/spec/losses.py
  graph.py       a whole graph's values, its loss, a training program's objectives
  optimizers.py  SGD, Adam, RMSProp, gradient clipping and the weight hook (docs/optimizers.md)
  model.py       a model run by the reference alone: initial weights, synthetic batches,
                 inference, objectives, the targets step, one optimizer per parameter group

The names below are the ones tests reach for; ``from tbdzoo import reference as ref``.
"""
from .graph import forward, loss, objective
from .losses import (
                     LOSSES,
                     ctc,
                     ctc_example,
                     log_softmax,
                     loss_term,
                     sigmoid_cross_entropy,
                     smooth_l1,
                     softmax_cross_entropy,
)
from .ops import (
                     OPS,
                     additive_attention,
                     avgpool2d,
                     batchnorm,
                     bilinear_taps,
                     channel_layernorm,
                     conv2d,
                     conv2d_input_grad,
                     dropout,
                     frozen_batchnorm,
                     gru_step,
                     layernorm,
                     lengths_after_conv,
                     lstm_step,
                     maxpool2d,
                     multi_head_attention,
                     recurrent,
                     roi_align,
                     sequence_batchnorm,
                     sinusoid,
                     softmax,
                     valid_positions,
)

__all__ = ["forward", "loss", "objective", "LOSSES", "ctc", "ctc_example", "log_softmax",
           "loss_term", "sigmoid_cross_entropy", "smooth_l1", "softmax_cross_entropy", "OPS",
           "additive_attention", "avgpool2d", "batchnorm", "bilinear_taps", "channel_layernorm",
           "conv2d", "conv2d_input_grad", "dropout", "frozen_batchnorm", "gru_step",
           "layernorm", "lengths_after_conv", "lstm_step", "maxpool2d", "multi_head_attention",
           "recurrent", "roi_align", "sequence_batchnorm", "sinusoid", "softmax",
           "valid_positions"]
