"""Seq2Seq and Deep Speech 2: their graphs against counts worked out from the sizes, their
hyperparameter rules, their synthetic batches, the spectrogram front-end, the checks that turn
a bad batch into a clear error, and a short training run of the tiny configs on PyTorch."""
import itertools

import numpy as np
import pytest

import tbdzoo
from tbdzoo.datasets import spectrogram
from tbdzoo.errors import BatchError, HyperparameterError
from tbdzoo.models import deepspeech2, seq2seq
from tbdzoo.spec import Graph, initial_weights, ops


def _graph(name, config="paper", **overrides):
    md = tbdzoo.get_model(name)
    hp = md.hparams(config, **overrides)
    return md, hp, md.build_graph(hp)


# -- graphs ----------------------------------------------------------------------------------
def _lstm_layer(d, h):
    return 4 * h * (d + h) + 4 * h            # four gates, one bias each


def _gru_direction(d, h):
    return 3 * h * (d + h) + 4 * h            # three gates, b_r, b_z, b_in, b_hn


def test_seq2seq_paper_parameters_match_the_closed_form():
    _, _, g = _graph("seq2seq")
    embeddings = 17191 * 512 + 7709 * 512
    lstms = 4 * _lstm_layer(512, 512)          # two encoder and two decoder layers
    attention = 512 * 512 + 512 * 512 + 512     # W_query, W_memory, v
    attention_layer = 512 * (512 + 512)         # over [decoder output; context], no bias
    projection = 512 * 7709                     # no bias
    assert g.trainable_count() == embeddings + lstms + attention + attention_layer + projection
    assert g.trainable_count() == 26141696


def test_seq2seq_wiring_lengths_init_and_loss():
    _, _hp, g = _graph("seq2seq")
    assert g.nodes["encoder.lstm"].inputs == ["encoder.embedding", "src_lengths"]
    assert g.nodes["decoder.lstm"].inputs == ["decoder.embedding", "tgt_lengths"]
    assert g.nodes["attention"].inputs == ["decoder.lstm", "encoder.lstm", "src_lengths"]
    assert g.shape_of("output_projection") == (50, 7709)
    params = g.params()
    assert params["encoder.lstm.l1.fw.u_o"].init == ("uniform", 0.1)
    assert params["decoder.lstm.l0.fw.b_f"].init == ("shifted", 1.0, ("uniform", 0.1))
    assert params["attention.v"].init == ("uniform", 0.1)
    assert params["output_projection.weight"].init == ("uniform", 0.1)
    for table in ("encoder.embedding.weight", "decoder.embedding.weight"):   # as TF NMT's
        assert params[table].init == ("uniform", 0.1)
    loss = g.program.losses["loss"]
    assert loss["kind"] == "softmax_cross_entropy" and loss["attrs"]["ignore_index"] == 0
    group = g.program.groups["all"]
    assert group["clip"] == {"kind": "global_norm", "value": 1.0}
    assert group["optimizer"]["kind"] == "adam" and group["optimizer"]["lr"] == 3e-4


def test_every_initial_value_of_seq2seq_lies_in_tf_nmts_range():
    _md, _hp, g = _graph("seq2seq", "tiny")
    weights = initial_weights(g, seed=3)
    for name, value in weights.items():
        low, high = (0.9, 1.1) if name.endswith(".b_f") else (-0.1, 0.1)   # forget bias + 1
        assert low <= value.min() and value.max() <= high, name
    table = weights["encoder.embedding.weight"]
    assert table.max() > 0.09 and table.min() < -0.09 and abs(table.mean()) < 0.02


def test_an_embedding_without_init_keeps_its_normal_table_and_its_attributes():
    g = Graph("e")
    tokens = g.input("tokens", (4,), dtype="int32")
    g.add("plain", "embedding", tokens, vocab=50, dim=16)
    g.add("uniform", "embedding", tokens, vocab=50, dim=16, init=["uniform", 0.1])
    assert "init" not in g.nodes["plain"].attrs      # the Transformer's specs hash as before
    params = g.params()
    assert params["plain.weight"].init == ("normal", 0.25)
    assert params["uniform.weight"].init == ("uniform", 0.1)
    with pytest.raises(ValueError, match="embedding init must be an initialiser tuple"):
        g.add("bad", "embedding", tokens, vocab=50, dim=16, init=0.1)


def test_deepspeech2_paper_parameters_match_the_closed_form():
    _, _, g = _graph("deepspeech2")
    # 161 bins -> (161 - 41) / 2 + 1 = 61 -> (61 - 21) / 2 + 1 = 21 frequencies, 32 channels
    convs = 32 * 1 * 11 * 41 + 32 * 32 * 11 * 21 + 2 * (2 * 32)   # kernels, no bias; BN gamma, beta
    first = 2 * _gru_direction(32 * 21, 1760) + 2 * 672           # BN over the GRU's 672 inputs
    others = 6 * (2 * _gru_direction(3520, 1760) + 2 * 3520)
    fc = 3520 * 1760 + 2 * 1760                                   # no bias; BN after it
    output = 1760 * 29 + 29
    assert g.trainable_count() == convs + first + others + fc + output
    assert g.trainable_count() == 366865757
    assert g.shape_of("flatten") == (785, 672)   # (1600 - 11) // 2 + 1 = 795, - 10 = 785 steps


def test_deepspeech2_without_the_rear_layer_feeds_the_gru_outputs_to_the_classifier():
    _, _, g = _graph("deepspeech2", fc_units=0, rnn_layers=1)
    assert "fc" not in g.nodes and g.nodes["output"].inputs == ["rnn.0"]
    assert g.params()["output.weight"].shape == (29, 3520)


def test_deepspeech2_wiring_lengths_and_ctc():
    _md, hp, g = _graph("deepspeech2")
    assert [g.nodes[n].op for n in ("conv1", "conv1.act", "conv1.bn")] == ["conv2d", "relu", "batchnorm"]
    assert g.nodes["rnn.0.bn"].op == "sequence_batchnorm"
    assert g.nodes["rnn.0.bn"].inputs == ["flatten", "conv2.lengths"]
    assert g.nodes["rnn.6"].attrs["bidirectional"] and g.nodes["rnn.6"].attrs["merge"] == "concat"
    loss = g.program.losses["ctc"]
    assert loss["kind"] == "ctc" and loss["inputs"]["input_lengths"] == "conv2.lengths"
    assert g.program.groups["all"]["clip"] == {"kind": "value", "value": 100.0}
    # the model's own step count is the chain of lengths_after_conv nodes
    frames = np.array([31, 32, 100, 1599, 1600])
    steps = frames
    for node in ("conv1.lengths", "conv2.lengths"):
        steps = ops.length_after_conv(steps, g.nodes[node].attrs)
    np.testing.assert_array_equal(deepspeech2.output_steps(hp, frames), steps)
    assert list(steps) == [1, 1, 35, 785, 785]   # 100: (100 - 11) // 2 + 1 = 45, - 10
    _, _, clipped = _graph("deepspeech2", relu_ceiling=20.0)
    assert clipped.nodes["conv1.act"].op == "clipped_relu"
    assert clipped.nodes["conv1.act"].attrs["ceiling"] == 20.0


def test_tiny_configs_stay_tiny():
    for name in ("seq2seq", "deepspeech2"):
        _, hp, g = _graph(name, "tiny")
        assert g.trainable_count() < 5000 and hp["batch_size"] == 3


# -- hyperparameters -------------------------------------------------------------------------
@pytest.mark.parametrize("name,overrides,message", [
    ("seq2seq", {"bos_id": 0}, "three different ids"),
    ("seq2seq", {"tgt_vocab": 3}, "tgt_vocab"),
    ("seq2seq", {"encoder_layers": 0}, "encoder_layers"),
    ("deepspeech2", {"conv1_kernel": (11,)}, "two integers"),
    ("deepspeech2", {"sample_rate": 1600}, "frequency bins"),
    ("deepspeech2", {"max_frames": 30}, "receptive field"),
    ("deepspeech2", {"relu_ceiling": -1.0}, "relu_ceiling"),
])
def test_bad_hyperparameters_are_refused_by_name(name, overrides, message):
    with pytest.raises(HyperparameterError, match=message):
        tbdzoo.get_model(name).hparams("paper", **overrides)


# -- synthetic batches -----------------------------------------------------------------------
def test_seq2seq_batches_are_ragged_valid_and_reversed():
    md = tbdzoo.get_model("seq2seq")
    hp = md.hparams("tiny")
    b = md.synthetic_batch(hp, 5, seed=2)
    for tokens, lengths in (("src", "src_lengths"), ("tgt_in", "tgt_lengths")):
        n, width = b[lengths], b[tokens].shape[1]
        assert b[lengths].dtype == np.int32 and n[0] == width and n[-1] < width
        assert np.all((n >= 1) & (n <= width))
        pad = np.arange(width)[None, :] >= n[:, None]
        assert np.all(b[tokens][pad] == 0) and np.all(b[tokens][~pad] > 0)
    rows = np.arange(5)
    assert np.all(b["tgt_in"][:, 0] == hp["bos_id"])
    assert np.all(b["labels"][rows, b["tgt_lengths"] - 1] == hp["eos_id"])
    np.testing.assert_array_equal(b["labels"][:, :-1][b["tgt_in"][:, 1:] > 0],
                                  b["tgt_in"][:, 1:][b["tgt_in"][:, 1:] > 0])
    forward = md.synthetic_batch(md.hparams("tiny", reverse_source=False), 5, seed=2)
    for i, n in enumerate(b["src_lengths"]):
        np.testing.assert_array_equal(b["src"][i, :n], forward["src"][i, :n][::-1])
    seq2seq.check_batch(hp, b)
    assert md.items(hp, b) == int(b["tgt_lengths"].sum())


def test_deepspeech2_batches_are_ragged_normalised_and_alignable():
    md = tbdzoo.get_model("deepspeech2")
    hp = md.hparams("tiny")
    b = md.synthetic_batch(hp, 4, seed=1)
    frames, n = b["spectrogram"], b["spectrogram_lengths"]
    assert frames.shape == (4, 30, 17) and n[0] == 30 and n[-1] == 15
    for i in range(4):
        valid = frames[i, :n[i]]
        assert abs(valid.mean()) < 1e-5 and abs(valid.std(ddof=1) - 1) < 1e-4
        assert not frames[i, n[i]:].any()
    steps = deepspeech2.output_steps(hp, n)
    from tbdzoo.spec.losses import ctc_required_frames
    for i in range(4):
        text = b["labels"][i, :b["label_lengths"][i]]
        assert len(text) >= 1 and np.all((text >= 1) & (text < 29))
        assert ctc_required_frames(text) <= steps[i] and not b["labels"][i, len(text):].any()
    deepspeech2.check_batch(hp, b)
    assert md.items(hp, b) == pytest.approx(n.sum() * 0.01)


def test_deepspeech2_paper_batch_shapes():
    md = tbdzoo.get_model("deepspeech2")
    hp = md.hparams("paper")
    b = md.synthetic_batch(hp, 2, seed=0)
    assert b["spectrogram"].shape == (2, 1600, 161) and b["labels"].shape == (2, 240)
    assert list(b["label_lengths"]) == [240, 120]   # 15 characters a second of 16 s and 8 s


# -- the spectrogram front-end ---------------------------------------------------------------
def test_front_end_sizes_follow_the_window_and_hop():
    assert spectrogram.window_samples() == 320 and spectrogram.hop_samples() == 160
    assert spectrogram.num_bins() == 161
    one_second = np.zeros(16000)
    one_second[::7] = 1.0
    assert spectrogram.spectrogram(one_second).shape == (101, 161)   # 1 + 16000 // 160
    assert spectrogram.spectrogram(one_second[:16159]).shape == (101, 161)
    assert spectrogram.spectrogram(one_second[:15999]).shape == (100, 161)


def test_a_pure_tone_lands_in_its_bin():
    # bins are 16000 / 320 = 50 Hz apart: 1 kHz is bin 20, 2.5 kHz bin 50
    t = np.arange(16000) / 16000.0
    for hz, bin_ in ((1000.0, 20), (2500.0, 50)):
        mag = spectrogram.magnitude(np.sin(2 * np.pi * hz * t))
        # every frame but the two whose window reaches into the reflected padding
        assert np.all(mag[1:-1].argmax(axis=1) == bin_)
        # a windowed sine of amplitude 1 peaks at sum(window) / 2 in its bin, and the window's
        # cosines sum to 1 over k = 0..319 (less the negative frequency's leakage, 1e-6 here)
        assert mag[50, bin_] == pytest.approx((0.54 * 320 - 0.46 * 1) / 2, rel=1e-5)


def test_the_window_is_the_symmetric_hamming_window():
    w = spectrogram.hamming(320)
    assert w[0] == pytest.approx(0.08) and w[-1] == pytest.approx(0.08)
    np.testing.assert_allclose(w, w[::-1])
    k = np.arange(320)
    np.testing.assert_allclose(w, 0.54 - 0.46 * np.cos(2 * np.pi * k / 319))


def test_the_spectrogram_is_log1p_of_the_magnitude_normalised_per_utterance():
    rng = np.random.RandomState(0)
    audio = rng.standard_normal(4000)
    raw = spectrogram.spectrogram(audio, normalize=False)
    np.testing.assert_allclose(raw, np.log1p(spectrogram.magnitude(audio)), rtol=1e-6)
    out = spectrogram.spectrogram(audio)
    np.testing.assert_allclose(out, (raw - raw.mean()) / raw.std(ddof=1), rtol=1e-4, atol=1e-5)


def test_the_front_end_refuses_what_it_cannot_transform():
    with pytest.raises(ValueError, match="1-D"):
        spectrogram.spectrogram(np.zeros((2, 400)))
    with pytest.raises(ValueError, match="too short"):
        spectrogram.spectrogram(np.zeros(100))


# -- bad batches -----------------------------------------------------------------------------
def _check(name, hp, batch):
    """The one batch check (common/batches.py) of model ``name``, no framework needed."""
    from tbdzoo.backends.common import batches
    md = tbdzoo.get_model(name)
    graph = md.build_graph(hp)
    batches.check(graph, batches.Facts(graph), batch, list(graph.inputs), None, md.check_batch,
                  hp)


def _seq2seq_batch():
    md = tbdzoo.get_model("seq2seq")
    hp = md.hparams("tiny")
    return hp, md.synthetic_batch(hp, 3, seed=0)


def _ds2_batch():
    md = tbdzoo.get_model("deepspeech2")
    hp = md.hparams("tiny")
    return hp, md.synthetic_batch(hp, 3, seed=0)


def test_seq2seq_refuses_lengths_past_the_padding():
    hp, b = _seq2seq_batch()
    b["src_lengths"][1] = 8
    with pytest.raises(BatchError, match=r"batch\['src_lengths'\]\[1\] = 8 is outside \[1, 7\]"):
        _check("seq2seq", hp, b)
    hp, b = _seq2seq_batch()
    b["tgt_lengths"][2] = 0
    with pytest.raises(BatchError, match=r"tgt_lengths.*= 0 is outside \[1, 6\]"):
        _check("seq2seq", hp, b)


def test_seq2seq_refuses_a_token_outside_the_vocabulary():
    hp, b = _seq2seq_batch()
    b["src"][0, 2] = 19
    with pytest.raises(BatchError, match=r"batch\['src'\]\[0, 2\] = 19 is outside \[0, 19\): "
                                         r"the vocabulary of 19 ids"):
        _check("seq2seq", hp, b)
    hp, b = _seq2seq_batch()
    b["labels"][1, 0] = -1
    with pytest.raises(BatchError, match=r"labels'\]\[1, 0\] = -1 is outside \[0, 17\): class "
                                         r"ids of 17 classes"):
        _check("seq2seq", hp, b)


def test_seq2seq_refuses_labels_past_the_target_length():
    hp, b = _seq2seq_batch()
    n = b["tgt_lengths"][2]
    b["labels"][2, n] = 5
    with pytest.raises(BatchError, match="past tgt_lengths"):
        seq2seq.check_batch(hp, b)


def test_deepspeech2_refuses_lengths_past_the_padding_or_below_the_receptive_field():
    hp, b = _ds2_batch()
    b["spectrogram_lengths"][0] = 31
    with pytest.raises(ValueError, match=r"spectrogram_lengths'\]\[0\] = 31 is outside \[7, 30\]"):
        deepspeech2.check_batch(hp, b)
    b["spectrogram_lengths"][0] = 6
    with pytest.raises(ValueError, match="receptive|frames the convolutions read"):
        deepspeech2.check_batch(hp, b)


def test_deepspeech2_refuses_transcripts_ctc_cannot_align():
    hp, b = _ds2_batch()
    short = 2
    steps = int(deepspeech2.output_steps(hp, b["spectrogram_lengths"][short]))
    b["labels"][short] = 0
    b["labels"][short, :steps] = 1          # all repeats: needs 2 * steps - 1 steps
    b["label_lengths"][short] = steps
    with pytest.raises(BatchError, match="{} labels need {} frames".format(steps, 2 * steps - 1)):
        _check("deepspeech2", hp, b)


def test_deepspeech2_refuses_label_ids_and_label_lengths_out_of_range():
    hp, b = _ds2_batch()
    b["labels"][0, 0] = 29
    with pytest.raises(BatchError, match=r"label id 29 is outside \[1, 29\) .*labels'\]\[0, 0\]"):
        _check("deepspeech2", hp, b)
    hp, b = _ds2_batch()
    b["label_lengths"][1] = 6
    with pytest.raises(BatchError, match=r"label_length 6 is outside \[0, 5\].*label_lengths'\]\[1\]"):
        _check("deepspeech2", hp, b)


# -- training on PyTorch ---------------------------------------------------------------------
@pytest.mark.parametrize("name,classes", [("seq2seq", 17), ("deepspeech2", 29)])
def test_a_tiny_training_step_on_torch(tmp_path, name, classes):
    import torch
    m = tbdzoo.build(name, backend="torch", config="tiny", seed=0)
    assert isinstance(m.native, torch.nn.Module)
    batch = m.synthetic_batch(seed=0)
    loss = m.train_step(batch)
    assert np.isfinite(loss) and loss > 0
    out = m.predict(batch)
    assert out.shape == (3,) + m.spec.shape_of(m.spec.output) and out.shape[-1] == classes
    m.save_weights(tmp_path / "w.npz")
    other = tbdzoo.build(name, backend="torch", config="tiny", seed=5)
    assert not np.allclose(other.predict(batch), out)
    other.load_weights(tmp_path / "w.npz")
    np.testing.assert_allclose(other.predict(batch), out, rtol=1e-5, atol=1e-5)


# Seq2Seq's Adam at 3e-4 with clipping moves the tiny model's loss by 1e-3 in 20 steps; at 1e-2
# it learns the batch visibly. Deep Speech 2 learns at its paper rate.
@pytest.mark.parametrize("name,overrides,drop", [
    ("seq2seq", {"lr": 1e-2}, 0.2), ("deepspeech2", {}, 0.08)])
def test_the_loss_goes_down_over_twenty_steps_on_a_fixed_batch(name, overrides, drop):
    m = tbdzoo.build(name, backend="torch", config="tiny", seed=0, **overrides)
    losses = m.train_steps(m.synthetic_batch(seed=0), 20)
    assert np.all(np.isfinite(losses))
    assert losses[-1] < (1 - drop) * losses[0]
    assert sum(b < a for a, b in itertools.pairwise(losses)) >= 17


def test_a_torch_model_refuses_bad_batches_before_its_step():
    m = tbdzoo.build("seq2seq", backend="torch", config="tiny", seed=0)
    batch = m.synthetic_batch(seed=0)
    assert m.prepare_batch(batch).items == int(batch["tgt_lengths"].sum())
    batch["tgt_in"][1, 1] = 40
    with pytest.raises(BatchError, match=r"batch\['tgt_in'\]\[1, 1\] = 40 is outside \[0, 17\)"):
        m.train_step(batch)
    batch = m.synthetic_batch(seed=0)
    batch["src_lengths"][0] = 9
    with pytest.raises(ValueError, match="src_lengths"):
        m.train_step(batch)
    m = tbdzoo.build("deepspeech2", backend="torch", config="tiny", seed=0)
    batch = m.synthetic_batch(seed=0)
    batch["labels"][2] = 0
    batch["labels"][2, :5] = [1, 1, 1, 1, 1]     # the 15-frame utterance gives 5 steps
    batch["label_lengths"][2] = 5
    with pytest.raises(BatchError, match="5 labels need 9 frames"):
        m.train_step(batch)
