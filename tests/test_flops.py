"""Analytic FLOPs against counts worked out by hand for small graphs.

Convention (tbdzoo/spec/ops.py, docs/profiling.md): per example, forward, a multiply-add is 2
FLOPs; bias additions are not counted; element-wise ops count their listed operations per output
element. Each expected number below is written out as arithmetic, from the layer's shapes, not
from ops.py's formulas.
"""
import pytest

from tbdzoo.profiling import flops
from tbdzoo.spec import Graph


def image_graph():
    g = Graph("hand/image")
    x = g.input("x", (3, 8, 8))
    x = g.add("conv", "conv2d", x, filters=4, kernel=3, padding=1, use_bias=True)     # (4, 8, 8)
    x = g.add("bn", "batchnorm", x)
    x = g.add("relu", "relu", x)
    x = g.add("pool", "maxpool2d", x, kernel=2)                                        # (4, 4, 4)
    x = g.add("grouped", "conv2d", x, filters=6, kernel=3, stride=2, groups=2,
              padding=((1, 0), (1, 0)))                                                # (6, 2, 2)
    x = g.add("dilated", "conv2d", x, filters=2, kernel=2, dilation=(1, 2),
              padding=((0, 1), (1, 1)))                                                # (2, 2, 2)
    x = g.add("avg", "avgpool2d", x, kernel=2, stride=1, padding=((0, 1), (0, 0)))     # (2, 2, 1)
    x = g.add("flat", "flatten", x)                                                    # (4,)
    x = g.add("fc", "dense", x, units=5)
    g.input("labels", (), dtype="int32", role="target")
    g.set_output(x)
    g.set_loss("softmax_cross_entropy", logits=x, labels="labels")
    return g


IMAGE_BY_HAND = {
    # 8x8 outputs of 4 filters, each a 3x3x3 window of multiply-adds
    "conv": 2 * (4 * 8 * 8) * (3 * 3 * 3),            # 13,824
    "bn": 4 * (4 * 8 * 8),                             # subtract, divide, scale, shift: 1,024
    "relu": 4 * 8 * 8,                                 # 256
    "pool": (4 * 4 * 4) * (2 * 2),                     # 4 cells read per output: 256
    # (4 + 1 - 3) // 2 + 1 = 2 rows and columns; each filter sees 4 / 2 = 2 channels
    "grouped": 2 * (6 * 2 * 2) * (2 * 3 * 3),          # 864
    # rows (2 + 1 - 2) + 1 = 2, columns 2 + 2 - (2 * (2 - 1) + 1) + 1 = 2; dilation adds no taps
    "dilated": 2 * (2 * 2 * 2) * (6 * 2 * 2),          # 384
    "avg": (2 * 2 * 1) * (2 * 2),                      # 16
    "flat": 0,
    "fc": 2 * 5 * 4,                                   # 40
}


def sequence_graph():
    g = Graph("hand/sequence")
    tokens = g.input("tokens", (6,), dtype="int32")
    memory = g.input("memory", (5,), dtype="int32")
    x = g.add("embed", "embedding", tokens, vocab=11, dim=8, scale=2.0)               # (6, 8)
    m = g.add("mem_embed", "embedding", memory, vocab=11, dim=8)                       # (5, 8)
    x = g.add("pos", "positional_encoding", x)
    a = g.add("self", "multi_head_attention", [x, x, tokens], num_heads=2, causal=True)
    x = g.add("res", "add", [x, a])
    x = g.add("norm", "layernorm", x)
    c = g.add("cross", "multi_head_attention", [x, m, memory], num_heads=2)
    x = g.add("drop", "dropout", c, rate=0.1)
    x = g.add("proj", "dense", x, units=3)                                             # (6, 3)
    g.input("labels", (6,), dtype="int32", role="target")
    g.set_output(x)
    g.set_loss("softmax_cross_entropy", logits=x, labels="labels")
    return g


SEQUENCE_BY_HAND = {
    "embed": 6 * 8,                                    # one scaling multiply per element
    "mem_embed": 5 * 8,
    "pos": 6 * 8,                                      # one add per element
    # T = S = 6, D = 8, 2 heads of 4:
    #   Q, K, V, O projections: 4 matrices x 6 rows x 8 x 8 multiply-adds = 1,536 -> 3,072
    #   scores Q K^T: 2 heads x 6 x 6 x 4 = 288 multiply-adds -> 576; weights x V the same: 576
    #   5 operations per score (scale, mask, exp, sum, divide): 5 x 2 x 6 x 6 = 360
    "self": 2 * 4 * 6 * 8 * 8 + 2 * (2 * 2 * 6 * 6 * 4) + 5 * 2 * 6 * 6,              # 4,584
    "res": 6 * 8,
    "norm": 8 * 6 * 8,                                 # mean, variance, normalise, scale, shift
    # T = 6 queries, S = 5 keys: Q and O over 6 rows, K and V over 5
    "cross": 2 * (2 * 6 + 2 * 5) * 8 * 8 + 2 * (2 * 2 * 6 * 5 * 4) + 5 * 2 * 6 * 5,  # 4,076
    "drop": 2 * 6 * 8,                                 # mask and scale
    "proj": 2 * 6 * 3 * 8,                             # 288
}


@pytest.mark.parametrize("build,by_hand,total", [
    (image_graph, IMAGE_BY_HAND, 13824 + 1024 + 256 + 256 + 864 + 384 + 16 + 0 + 40),
    (sequence_graph, SEQUENCE_BY_HAND, 48 + 40 + 48 + 4584 + 48 + 384 + 4076 + 96 + 288),
])
def test_forward_flops_match_the_hand_count(build, by_hand, total):
    g = build()
    assert dict(g.flops()) == by_hand
    assert flops.forward_per_example(g) == total


def test_dropout_without_a_rate_costs_nothing():
    g = Graph("hand/identity")
    g.add("drop", "dropout", g.input("x", (4, 6)), rate=0.0)
    assert dict(g.flops()) == {"drop": 0}


def test_a_training_step_of_matrix_layers_is_three_products_per_layer():
    """For a layer y = x W (batch B, n inputs, m outputs) one training step multiplies three
    matrices of the same size: forward x W, weight gradient x^T dy, input gradient dy W^T,
    2 B n m FLOPs each. A 1x1 convolution is that product per pixel. Batch 2:
      conv 1x1, 3 -> 4 channels over 5x5 pixels:  B n m = 2 x 25 x 3 x 4 = 600 per product
      dense 100 -> 7:                              B n m = 2 x 100 x 7  = 1,400 per product
    three products of 2 FLOPs per multiply-add: 3 x 2 x (600 + 1,400) = 12,000."""
    g = Graph("hand/train")
    x = g.add("conv", "conv2d", g.input("x", (3, 5, 5)), filters=4, kernel=1)
    x = g.add("fc", "dense", g.add("flat", "flatten", x), units=7)
    g.input("labels", (), dtype="int32", role="target")
    g.set_output(x)
    g.set_loss("softmax_cross_entropy", logits=x, labels="labels")
    assert flops.training_step(g, 2) == 12000


def test_recurrent_and_additive_attention_flops_match_the_hand_count():
    """Per step and direction a gated layer multiplies its input (D) and state (H) into every
    gate: 2 x gates x H x (D + H); then its element-wise work per unit (LSTM 13: four bias
    adds, four activations, c' = f c + i g as three, tanh(c'), h' = o tanh(c'); GRU 12: four
    bias adds, three activations, r (U_n h + b_hn), h' = (1 - z) n + z h as three, one add)."""
    g = Graph("hand/recurrent")
    lengths = g.input("x_lengths", (), dtype="int32")
    x = g.input("x", (5, 3))
    # layer 0 reads D = 3; layer 1 the two directions of layer 0, D = 8; H = 4
    g.add("lstm", "lstm", [x, lengths], units=4, num_layers=2, bidirectional=True)
    g.add("gru", "gru", [x, lengths], units=4, bidirectional=True, merge="sum")
    q, m = g.input("q", (4, 3)), g.input("m", (5, 2))
    g.add("attn", "additive_attention", [q, m, g.input("m_lengths", (), dtype="int32")], units=6)
    assert dict(g.flops()) == {
        "lstm": 5 * 2 * (2 * 4 * 4 * (3 + 4) + 13 * 4) + 5 * 2 * (2 * 4 * 4 * (8 + 4) + 13 * 4),
        # the two directions' outputs summed: one add per step and unit
        "gru": 5 * 2 * (2 * 3 * 4 * (3 + 4) + 12 * 4) + 5 * 4,
        # W_q over 4 queries of 3, W_m over 5 memories of 2, into 6 units: 2 x 6 x (12 + 10);
        # per (t, s) pair: the add, tanh and the dot with v (2 per unit): 4 x 6 = 24 per pair;
        # mask, exp, sum, divide and max per pair (5); context: 4 x 5 weights x 2 features x 2
        "attn": 2 * 6 * (4 * 3 + 5 * 2) + 4 * 5 * 24 + 5 * 4 * 5 + 2 * 4 * 5 * 2,
    }


def test_a_ctc_loss_adds_no_model_flops():
    """Losses are not nodes: the FLOPs count the network, as for cross-entropy. CTC's
    recursion is (2L + 1) states per frame, some thousands of FLOPs per frame at Deep Speech 2's
    sizes against 0.72 GFLOPs per frame in its GRUs (docs/profiling.md)."""
    from tbdzoo.spec.program import single_objective
    g = Graph("hand/ctc")
    lengths = g.input("x_lengths", (), dtype="int32")
    rnn = g.add("gru", "gru", [g.input("x", (6, 3)), lengths], units=4, bidirectional=True)
    logits = g.add("fc", "dense", rnn, units=5)                         # (6, 5) from (6, 8)
    g.input("labels", (3,), dtype="int32", role="target")
    g.input("label_lengths", (), dtype="int32", role="target")
    g.set_output(logits)
    hp = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False,
          "weight_decay": 0.0, "lr_schedule": "constant"}
    g.set_program(single_objective(g, hp, "ctc", logits=logits, labels="labels",
                                   input_lengths=lengths, label_lengths="label_lengths"))
    gru = 6 * 2 * (2 * 3 * 4 * (3 + 4) + 12 * 4)                      # 2,592
    assert flops.forward_per_example(g) == gru + 2 * 6 * 5 * 8         # + 480
    assert flops.training_step(g, 2) == 3 * 2 * (gru + 480)
