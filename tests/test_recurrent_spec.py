"""The recurrent ops and the CTC loss in the spec, and their NumPy reference on hand-worked cases.

The reference (tbdzoo/reference/) is what the PyTorch backend, and through it every
backend, is checked against; these cases pin the reference itself to numbers worked out on
paper: one LSTM and one GRU step, the backward direction within each example's length, CTC of
two frames by enumerating its alignments, and statistics over valid steps only.
"""
import math

import numpy as np
import pytest

from tbdzoo import reference as ref
from tbdzoo.spec import Graph, initial_weights, losses
from tbdzoo.spec.program import Program, ProgramError


def _sequence_graph(t=5, d=3):
    g = Graph("g")
    g.input("x", (t, d))
    g.input("x_lengths", (), "int32")
    return g


# -- spec -----------------------------------------------------------------------------------
def test_lstm_parameters_follow_the_contract_names_shapes_and_order():
    g = _sequence_graph()
    g.add("rnn", "lstm", ["x", "x_lengths"], units=4, num_layers=2, bidirectional=True)
    names = list(g.params())
    assert names[:12] == ["rnn.l0.fw." + s for s in (
        "w_i", "w_f", "w_g", "w_o", "u_i", "u_f", "u_g", "u_o", "b_i", "b_f", "b_g", "b_o")]
    assert names[12].startswith("rnn.l0.bw.") and names[24].startswith("rnn.l1.fw.")
    assert len(names) == 48
    assert g.params()["rnn.l0.fw.w_i"].shape == (4, 3)
    assert g.params()["rnn.l1.bw.w_g"].shape == (4, 8)  # D_1 = H * dirs
    assert g.params()["rnn.l1.bw.u_o"].shape == (4, 4)
    assert g.shape_of("rnn") == (5, 8)
    assert g.params()["rnn.l0.fw.w_i"].init == ("uniform", 0.5)  # PyTorch's 1/sqrt(H)


def test_gru_parameters_and_merge_sum_shape():
    g = _sequence_graph()
    g.add("rnn", "gru", ["x", "x_lengths"], units=2, bidirectional=True, merge="sum")
    assert [n.split(".", 3)[3] for n in g.params()][:10] == [
        "w_r", "w_z", "w_n", "u_r", "u_z", "u_n", "b_r", "b_z", "b_in", "b_hn"]
    assert g.shape_of("rnn") == (5, 2)


def test_forget_bias_shifts_only_the_forget_bias_initial_value():
    g = _sequence_graph()
    g.add("plain", "lstm", ["x", "x_lengths"], units=3, init=("uniform", 0.1))
    g.add("nmt", "lstm", ["x", "x_lengths"], units=3, init=("uniform", 0.1), forget_bias=1.0)
    w = initial_weights(g, seed=4)
    b_f = w["nmt.l0.fw.b_f"]
    assert np.all((b_f > 0.9) & (b_f < 1.1))
    for name in ("b_i", "w_f", "u_f"):
        assert np.all(np.abs(w["nmt.l0.fw." + name]) <= 0.1)
    # the same random draw as without the shift: only the constant differs
    plain_named = initial_weights(_renamed(g, "nmt"), seed=4)["nmt.l0.fw.b_f"]
    np.testing.assert_allclose(b_f, plain_named + 1.0, rtol=1e-6)


def _renamed(g, name):
    h = _sequence_graph()
    h.add(name, "lstm", ["x", "x_lengths"], units=3, init=("uniform", 0.1))
    return h


def test_recurrent_flops_count_every_layer_and_direction():
    g = _sequence_graph(t=5, d=3)
    g.add("rnn", "gru", ["x", "x_lengths"], units=2, num_layers=2, bidirectional=True)
    layer0 = 2 * 5 * (2 * 3 * 2 * (3 + 2) + 12 * 2)
    layer1 = 2 * 5 * (2 * 3 * 2 * (4 + 2) + 12 * 2)
    assert g.flops()["rnn"] == layer0 + layer1


@pytest.mark.parametrize("op, attrs, inputs, message", [
    ("lstm", {"units": 0}, ["x", "x_lengths"], "node 'node' (lstm): lstm units must be an integer >= 1, not 0"),
    ("lstm", {"units": 2, "merge": "mean"}, ["x", "x_lengths"], "merge must be 'concat' or 'sum'"),
    ("gru", {"units": 2, "forget_bias": 1.0}, ["x", "x_lengths"], "no attribute(s) forget_bias"),
    ("lstm", {"units": 2}, ["x", "x"], "lengths must be one int32 per example"),
    ("lstm", {"units": 2}, ["x", "f"], "lengths must be int32, got float32"),
    ("transpose", {"perm": (0, 0)}, ["x"], "not a permutation"),
    ("clipped_relu", {"ceiling": 0}, ["x"], "ceiling must be a number > 0"),
    ("lengths_after_conv", {"kernel": 3, "padding": (1, 2, 3)}, ["x_lengths"],
     "padding must be (before, after)"),
    ("additive_attention", {"units": 3}, ["x", "x", "f"], "memory_lengths must be int32"),
    ("sequence_batchnorm", {}, ["x"], "takes inputs [x, lengths]"),
])
def test_bad_attributes_and_inputs_fail_with_the_reason(op, attrs, inputs, message):
    g = _sequence_graph()
    g.input("f", ())
    with pytest.raises(ValueError) as e:
        g.add("node", op, inputs, **attrs)
    assert message in str(e.value)


def test_shapes_dtypes_and_json_round_trip():
    g = _sequence_graph(t=7, d=4)
    g.add("att", "additive_attention", ["x", "x", "x_lengths"], units=5)
    g.add("bn", "sequence_batchnorm", ["att", "x_lengths"])
    g.add("clip", "clipped_relu", "bn", ceiling=20)
    g.add("tr", "transpose", "clip", perm=(1, 0))
    g.add("len", "lengths_after_conv", "x_lengths", kernel=11, stride=2, padding=5)
    assert g.shape_of("att") == (7, 4) and g.shape_of("tr") == (4, 7)
    assert g.shape_of("len") == () and g.dtype_of("len") == "int32"
    assert g.nodes["len"].attrs["padding"] == (5, 5)
    assert list(g.params()) == ["att.w_query", "att.w_memory", "att.v", "bn.gamma", "bn.beta",
                                "bn.running_mean", "bn.running_var"]
    assert g.flops()["len"] == 0 and g.flops()["tr"] == 0
    assert Graph.from_json(g.dumps()).hash() == g.hash()


def _ctc_graph():
    g = _sequence_graph(t=6, d=3)
    g.add("logits", "dense", "x", units=4)
    g.input("labels", (3,), "int32", "target")
    g.input("label_lengths", (), "int32", "target")
    return g


def _ctc_program(**overrides):
    roles = dict(logits="logits", labels="labels", input_lengths="x_lengths",
                 label_lengths="label_lengths")
    roles.update(overrides)
    p = Program()
    p.loss("ctc", "ctc", **roles)
    p.objective("loss", {"ctc": 1.0})
    p.group("all", "*", {"kind": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False,
                         "weight_decay": 0.0})
    p.phase("train", "loss", "all")
    return p


def test_ctc_loss_roles_are_checked_against_the_graph():
    g = _ctc_graph()
    g.set_program(_ctc_program())
    with pytest.raises(ValueError, match="label_lengths must be one int32 per example"):
        _ctc_graph().set_program(_ctc_program(label_lengths="x"))
    with pytest.raises(ValueError, match="labels must be .L,. int32"):
        _ctc_graph().set_program(_ctc_program(labels="x_lengths"))
    with pytest.raises(ValueError, match="only blank=0"):
        _ctc_graph().set_program(_ctc_program(blank=3))
    with pytest.raises(ProgramError, match="needs input.s. label_lengths"):
        Program().loss("ctc", "ctc", logits="logits", labels="labels", input_lengths="x_lengths")


def test_ctc_batch_check_names_the_example_and_the_fix():
    losses.check_ctc_batch([[1, 1, 2], [3, 0, 0]], [4, 1], [3, 1], 6, 4)
    cases = [
        (([[1, 1, 2]], [3], [3], 6, 4), "3 labels need 4 frames"),
        (([[1, 4, 2]], [5], [3], 6, 4), "label id 4 is outside [1, 4)"),
        (([[1, 0, 2]], [5], [3], 6, 4), "label id 0 is outside"),
        (([[1, 2, 2]], [7], [3], 6, 4), "input_length 7 is outside [1, 6]"),
        (([[1, 2, 2]], [0], [3], 6, 4), "input_length 0 is outside"),
        (([[1, 2, 2]], [6], [4], 6, 4), "label_length 4 is outside [0, 3]"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError) as e:
            losses.check_ctc_batch(*args)
        assert message in str(e.value) and "example 0" in str(e.value)


# -- NumPy reference by hand ----------------------------------------------------------------
def _scalar_params(prefix, **values):
    return {prefix + k: np.array(v, np.float64).reshape((1, 1) if k[0] in "wu" else (1,))
            for k, v in values.items()}


def test_reference_lstm_two_steps_by_hand():
    """H = D = 1, no weights on x or h: i = o = sigma(0) = 1/2, g = tanh(ln(3)/2) = 1/2,
    f = sigma(ln 3) = 3/4. Step 1: c = 1/4, h = tanh(1/4)/2. Step 2: c = 3/16 + 1/4 = 7/16."""
    zero = dict(w_i=0, w_f=0, w_g=0, w_o=0, u_i=0, u_f=0, u_g=0, u_o=0)
    p = _scalar_params("l0.fw.", b_i=0, b_f=math.log(3), b_g=math.log(3) / 2, b_o=0, **zero)
    x = np.zeros((1, 3, 1))
    out = ref.recurrent([x, np.array([2])], p, {"num_layers": 1, "bidirectional": False,
                                                 "merge": "concat"}, ref.lstm_step)
    np.testing.assert_allclose(out[0, :, 0], [math.tanh(0.25) / 2, math.tanh(7 / 16.0) / 2, 0.0],
                               rtol=1e-12)


def test_reference_gru_resets_after_the_recurrent_matmul():
    """One step from h = 0 with r = z = 1/2 and b_hn = 2: n = tanh(0 + r (0 + 2)) = tanh(1),
    h = (1 - z) n = tanh(1)/2. Resetting before the matmul would give tanh(2)/2."""
    p = _scalar_params("l0.fw.", w_r=0, w_z=0, w_n=0, u_r=0, u_z=0, u_n=0, b_r=0, b_z=0, b_in=0,
                       b_hn=2)
    h, _ = ref.gru_step(np.ones(1), np.zeros(1), None, p, "l0.fw.")
    assert h[0] == pytest.approx(math.tanh(1.0) / 2, rel=1e-12)


def test_reference_backward_direction_reverses_within_each_length():
    """[a, b, pad] read backward is [b, a]: the backward output at t = 0 is the forward
    output after [b, a], at t = 1 the one after [b]; the padded step stays 0 however large."""
    rng = np.random.RandomState(0)
    weights = {}
    for d in ("fw", "bw"):
        for k in ("w_i", "w_f", "w_g", "w_o"):
            weights["l0.{}.{}".format(d, k)] = rng.standard_normal((2, 3))
        for k in ("u_i", "u_f", "u_g", "u_o"):
            weights["l0.{}.{}".format(d, k)] = rng.standard_normal((2, 2))
        for k in ("b_i", "b_f", "b_g", "b_o"):
            weights["l0.{}.{}".format(d, k)] = rng.standard_normal(2)
    x = rng.standard_normal((1, 3, 3))
    x[0, 2] = 1e3
    attrs = {"num_layers": 1, "bidirectional": True, "merge": "concat"}
    out = ref.recurrent([x, np.array([2])], weights, attrs, ref.lstm_step)
    as_forward = {k.replace("bw", "fw"): v for k, v in weights.items() if ".bw." in k}
    reversed_x = x[:, [1, 0, 2]]
    fw = ref.recurrent([reversed_x, np.array([2])], as_forward,
                       dict(attrs, bidirectional=False), ref.lstm_step)
    np.testing.assert_allclose(out[0, 0, 2:], fw[0, 1], rtol=1e-12)
    np.testing.assert_allclose(out[0, 1, 2:], fw[0, 0], rtol=1e-12)
    assert np.all(out[0, 2] == 0)
    summed = ref.recurrent([x, np.array([2])], weights, dict(attrs, merge="sum"), ref.lstm_step)
    np.testing.assert_allclose(summed, out[..., :2] + out[..., 2:], rtol=1e-12)


def test_reference_ctc_two_frames_by_enumerating_alignments():
    """Classes (blank, 1, 2), two frames. Label (1): alignments 11, 01, 10.
    Label (1, 2): only 12. Label (1, 1) needs three frames. Empty label: 00."""
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    logits = np.log(p) + 7.0  # log-softmax removes the shift
    one = p[0, 1] * p[1, 1] + p[0, 0] * p[1, 1] + p[0, 1] * p[1, 0]
    assert ref.ctc_example(logits, [1]) == pytest.approx(-math.log(one), rel=1e-12)
    assert ref.ctc_example(logits, [1, 2]) == pytest.approx(-math.log(p[0, 1] * p[1, 2]), rel=1e-12)
    assert ref.ctc_example(logits, [1, 1]) == math.inf
    assert ref.ctc_example(logits, []) == pytest.approx(-math.log(p[0, 0] * p[1, 0]), rel=1e-12)
    # three frames, label (1, 1): only 1 0 1
    q = np.array([[0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [0.3, 0.4, 0.3]])
    assert ref.ctc_example(np.log(q), [1, 1]) == pytest.approx(
        -math.log(q[0, 1] * q[1, 0] * q[2, 1]), rel=1e-12)
    # the batch: only each example's own frames and labels count, summed per example, averaged
    batch_logits = np.stack([np.vstack([logits, [[50.0, -50.0, 0.0]]])] * 2)
    got = ref.ctc(batch_logits, np.array([[1, 0], [1, 2]]), [2, 2], [1, 2])
    assert got == pytest.approx((-math.log(one) - math.log(p[0, 1] * p[1, 2])) / 2, rel=1e-12)


def test_reference_sequence_batchnorm_ignores_padding():
    """x = [1, 3, pad 100] in one example of length 2: mean 2, variance 1; padding gives 0."""
    x = np.array([[[1.0], [3.0], [100.0]]])
    p = {"gamma": np.array([2.0]), "beta": np.array([0.5]), "running_mean": np.array([0.0]),
         "running_var": np.array([1.0])}
    a = {"eps": 0.0, "track_running_stats": True}
    out = ref.sequence_batchnorm(x, np.array([2]), p, a, training=True)
    np.testing.assert_allclose(out[0, :, 0], [-1.5, 2.5, 0.0])
    out = ref.sequence_batchnorm(x, np.array([2]), p, a, training=False)
    np.testing.assert_allclose(out[0, :, 0], [2.5, 6.5, 0.0])


def test_reference_attention_masks_memory_past_its_length():
    """v = 0 makes every score 0: the context is the plain mean of the valid memory rows."""
    memory = np.array([[[1.0, 2.0], [3.0, 6.0], [1e3, 1e3]]])
    query = np.ones((1, 2, 4))
    p = {"w_query": np.ones((3, 4)), "w_memory": np.ones((3, 2)), "v": np.zeros(3)}
    out = ref.additive_attention(query, memory, np.array([2]), p)
    np.testing.assert_allclose(out, [[[2.0, 4.0], [2.0, 4.0]]])


def test_reference_small_ops_by_hand():
    a = {"kernel": 11, "stride": 2, "padding": (5, 5), "dilation": 1}
    assert ref.lengths_after_conv(np.array([1, 2, 20, 21]), a).tolist() == [1, 1, 10, 11]
    assert ref.lengths_after_conv(np.array([1]), dict(a, padding=(0, 0))).tolist() == [1]
    x = np.array([[-1.0, 0.0, 5.0, 25.0]])
    assert ref.OPS["clipped_relu"]([x], {}, {"ceiling": 20.0}, False, None).tolist() == \
        [[0.0, 0.0, 5.0, 20.0]]
    y = np.arange(24).reshape(1, 2, 3, 4)
    assert ref.OPS["transpose"]([y], {}, {"perm": (1, 0, 2)}, False, None).shape == (1, 3, 2, 4)


def test_an_empty_ctc_label_passes_the_batch_check_and_a_long_one_does_not():
    """``labels_lengths`` follows the <x>_lengths naming, but a CTC label may be empty:
    its lengths are checked against [0, L] by the CTC check, not against [1, L]."""
    from tbdzoo.backends.common.sequences import check_batch
    from tbdzoo.models.probes import get_probe
    md = get_probe("ctc")
    hp = md.hparams("tiny")
    graph = md.build_graph(hp)
    batch = md.synthetic_batch(hp, 3, 0)
    batch["labels"][-1] = 0
    batch["labels_lengths"][-1] = 0
    check_batch(graph, batch)
    batch["labels_lengths"][-1] = batch["labels"].shape[1] + 1
    with pytest.raises(ValueError) as e:
        check_batch(graph, batch)
    assert "label_length" in str(e.value) and "example 2" in str(e.value)
