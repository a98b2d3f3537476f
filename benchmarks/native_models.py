"""tbdzoo's train step against the framework's own model, one backend per process.

    .venv/bin/python -m benchmarks.native_models --model inception_v3            # all three
    .venv/bin/python -m benchmarks.native_models --model resnet50 --backend torch  # one, here
    .venv/bin/python -m benchmarks.native_models --model deepspeech2 --set max_frames=200
    .venv/bin/python -m benchmarks.native_models --model deepspeech2 --backends mxnet --alone

What users would pick instead, trained the framework's idiomatic way (a PyTorch loop,
``train_on_batch``, a Gluon ``Trainer``), on the same synthetic batch, the loss read back every
step on both sides. The two are interleaved: each repeat times a few steps of every contender in
turn (the order rotating from repeat to repeat), so drifts in the machine's speed hit all alike;
the median repeat is compared. Each backend runs in its own process (TensorFlow and torchvision
cannot share one). Where the architectures differ, tbdzoo's variant matching the framework's
model is timed too (the like-for-like comparison), beside its paper config.

ResNet-50: torchvision ``resnet50`` (v1.5), ``keras.applications.ResNet50`` and Gluon's
``resnet50_v1`` (both v1: the stride on the 1x1 convolution; tbdzoo's ``stride_in_1x1=True``).
v1.5 does about 7% more arithmetic. SGD, momentum 0.9, weight decay 1e-4, lr 0.1.

Inception-v3: torchvision ``inception_v3`` has the auxiliary head, as tbdzoo's paper config
(parameter for parameter); ``keras.applications.InceptionV3`` and Gluon's ``inception_v3`` have
none (tbdzoo's ``aux_head=False``). RMSProp (lr 0.045, decay 0.9, momentum 0.9, eps 1.0, weight
decay 4e-5), global-norm clipping at 2.0 (``clip_grad_norm_``, Keras' ``global_clipnorm``,
``gluon.utils.clip_global_norm``), label smoothing 0.1, the auxiliary loss at weight 0.4.
What still differs: Keras' BatchNorm has no gamma (``scale=False``) and Keras' model no dropout
(tbdzoo's and Gluon's drop 0.5 of a 4 x 2048 matrix: negligible); each framework's RMSProp keeps
its own formula (PyTorch: eps outside the root; Keras: eps inside, lr in the momentum buffer,
decoupled weight decay, tbdzoo's formula on every backend, docs/optimizers.md); Gluon's RMSProp
has no momentum unless centered, so Gluon's update is lighter than tbdzoo's by one buffer per
parameter (the comparison slightly favours Gluon).

Seq2Seq and Deep Speech 2 train on tbdzoo's own synthetic batch (``synthetic_batch`` of the model:
ragged lengths, padding at the end), the same arrays on both sides, at the suite's CPU sizes
(tbdzoo.suite: 16 sentence pairs of up to 50 tokens; Deep Speech 2 padded to 1 s,
``max_frames=100``, here two utterances so that their lengths differ). ``--set KEY=VALUE``
changes a hyperparameter on both sides. The rates count the model's own unit: target tokens,
seconds of audio.

Seq2Seq, paper config (2 x 512 LSTM encoder and decoder, additive attention of 512 without
input feeding, attention layer 512 and projection without bias, Adam 3e-4 with eps 1e-8,
global-norm clipping at 1.0, the loss averaged over target tokens): PyTorch ``nn.Embedding``,
``nn.LSTM`` over packed sequences (``pack_padded_sequence``), the attention as two
``nn.Linear`` and a ``v`` with ``masked_fill``, ``clip_grad_norm_``; Keras ``Embedding(
mask_zero=True)``, ``LSTM``, two ``Dense`` and ``AdditiveAttention`` (its scale is ``v``), the
mask carried through to the loss, ``train_on_batch`` with ``global_clipnorm``; Gluon
``rnn.LSTM`` (fused), the attention masked by ``softmax(length=...)``, the loss weighted by the
labels' mask, ``clip_global_norm`` and a ``Trainer``. What still differs: the Gluon LSTMs run over
the padding (unidirectional, so every output before a sequence's length is exact; the padded
ones are masked later), PyTorch's over each sequence's own length, tbdzoo's MXNet one fused call
the same way; PyTorch's and Gluon's LSTMs carry two biases per gate (tbdzoo and Keras one);
Keras' LSTM on the CPU is a while loop with the mask, as is tbdzoo's TensorFlow LSTM (its input
projection hoisted out of the loop, docs/models.md).

Deep Speech 2, paper config (two convolutions, each ReLU then BatchNorm; 7 x [BatchNorm over
the sequence, bidirectional GRU of 1,760 with the reset after the recurrent matmul, directions
concatenated]; dense 1,760 without bias, BatchNorm, ReLU; dense 29; CTC with blank 0 summed per
utterance and averaged over the batch; SGD 3e-4 with momentum 0.9, element-wise clipping at 100):
PyTorch ``nn.Conv2d``, ``nn.BatchNorm1d`` over (N, D, T), ``nn.GRU(bidirectional=True)`` over
packed sequences, ``nn.CTCLoss`` on ``log_softmax``, ``clip_grad_value_``; Keras ``Conv2D``
(channels last), ``BatchNormalization`` and ``Bidirectional(GRU(reset_after=True))`` given the
mask of valid steps, ``keras.ops.ctc_loss`` in a ``tf.function`` step with ``GradientTape``,
``SGD(clipvalue=100)``; Gluon ``Conv2D``, ``BatchNorm(axis=2)``, ``rnn.GRU(bidirectional=True)``
(fused), ``gluon.loss.CTCLoss``, a ``Trainer`` with ``clip_gradient``. What still differs:
PyTorch's and Gluon's sequence BatchNorms count the padded steps in their statistics (as
deepspeech.pytorch does), tbdzoo's and Keras' only the valid ones; Gluon's GRU runs over the
padding, both directions in one fused call per layer (MXNet 1.9's Gluon GRU cannot take lengths:
``use_sequence_length`` passes them where an LSTM's cell state goes, and the CPU kernel would
not use them), so its backward direction reads each shorter utterance's padding first, where
tbdzoo's MXNet backend reverses every sequence within its length (one fused call per direction
and layer, docs/models.md): the comparison favours Gluon; Gluon's CTC takes the blank last, so
its logits are rotated by one class; ``keras.ops.ctc_loss`` passes dense labels (TensorFlow's CTC
written in TensorFlow ops), tbdzoo's TensorFlow backend sparse ones (the CTCLoss kernel).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

BACKENDS = ("torch", "tensorflow", "mxnet")
UNIT_KEY = "{}_per_s"   # images_per_s, tokens_per_s (target tokens), audio_s_per_s


# -- ResNet-50 as each framework's users write it ----------------------------------------------
def resnet50_torch(batch, _hp=None):
    import torch
    import torchvision
    net = torchvision.models.resnet50()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = torch.from_numpy(batch["images"]), torch.from_numpy(batch["labels"]).long()
    loss_fn = torch.nn.CrossEntropyLoss()
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def resnet50_tensorflow(batch, _hp=None):
    import keras
    net = keras.applications.ResNet50(weights=None, classifier_activation=None)
    net.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, weight_decay=1e-4),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _nhwc(batch["images"]), batch["labels"]
    return lambda: float(net.train_on_batch(x, y))


def resnet50_mxnet(batch, _hp=None):
    mx, autograd, gluon = _mxnet()
    net = gluon.model_zoo.vision.resnet50_v1()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = mx.nd.array(batch["images"]), mx.nd.array(batch["labels"])
    n = len(batch["labels"])

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(n)
        return float(loss.mean().asscalar())
    return step


# -- Inception-v3 as each framework's users write it -------------------------------------------
RMSPROP = {"lr": 0.045, "decay": 0.9, "momentum": 0.9, "eps": 1.0, "weight_decay": 4e-5}
CLIP_NORM, SMOOTHING, AUX_WEIGHT = 2.0, 0.1, 0.4


def inception_v3_torch(batch, _hp=None):
    import torch
    import torchvision
    net = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False)
    opt = torch.optim.RMSprop(net.parameters(), lr=RMSPROP["lr"], alpha=RMSPROP["decay"],
                              eps=RMSPROP["eps"], momentum=RMSPROP["momentum"],
                              weight_decay=RMSPROP["weight_decay"])
    x, y = torch.from_numpy(batch["images"]), torch.from_numpy(batch["labels"]).long()
    ce = torch.nn.functional.cross_entropy
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        logits, aux = net(x)
        loss = ce(logits, y, label_smoothing=SMOOTHING) + \
            AUX_WEIGHT * ce(aux, y, label_smoothing=SMOOTHING)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP_NORM)
        opt.step()
        return loss.item()
    return step


def inception_v3_tensorflow(batch, _hp=None):
    import keras
    import numpy as np
    net = keras.applications.InceptionV3(weights=None, classifier_activation=None)
    net.compile(optimizer=keras.optimizers.RMSprop(
        learning_rate=RMSPROP["lr"], rho=RMSPROP["decay"], momentum=RMSPROP["momentum"],
        epsilon=RMSPROP["eps"], weight_decay=RMSPROP["weight_decay"], global_clipnorm=CLIP_NORM),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=SMOOTHING))
    x = _nhwc(batch["images"])
    y = np.eye(1000, dtype="float32")[batch["labels"]]  # Keras smooths one-hot labels only
    return lambda: float(net.train_on_batch(x, y))


def inception_v3_mxnet(batch, _hp=None):
    import numpy as np
    mx, autograd, gluon = _mxnet()
    net = gluon.model_zoo.vision.inception_v3()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    trainer = gluon.Trainer(params, "rmsprop", {
        "learning_rate": RMSPROP["lr"], "gamma1": RMSPROP["decay"], "epsilon": RMSPROP["eps"],
        "wd": RMSPROP["weight_decay"], "centered": False})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    one_hot = np.eye(1000, dtype="float32")[batch["labels"]]
    x = mx.nd.array(batch["images"])
    y = mx.nd.array(one_hot * (1 - SMOOTHING) + SMOOTHING / 1000)

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y).mean()
        loss.backward()
        gluon.utils.clip_global_norm([p.grad() for p in params], CLIP_NORM)
        trainer.step(1)
        return float(loss.asscalar())
    return step


# -- Seq2Seq as each framework's users write it ------------------------------------------------
# tbdzoo's paper config (tbdzoo/models/seq2seq/): 2 x 512 LSTM encoder and decoder, additive
# attention of 512 over the encoder's outputs (no input feeding), an attention layer of 512 and
# the projection, neither with a bias; Adam 3e-4 (eps 1e-8), global-norm clipping at 1.0.
def seq2seq_torch(batch, hp):
    import torch
    from torch import nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            units, att = hp["units"], hp["attention_units"]
            self.src_embed = nn.Embedding(hp["src_vocab"], hp["embed_dim"])
            self.tgt_embed = nn.Embedding(hp["tgt_vocab"], hp["embed_dim"])
            self.encoder = nn.LSTM(hp["embed_dim"], units, hp["encoder_layers"], batch_first=True)
            self.decoder = nn.LSTM(hp["embed_dim"], units, hp["decoder_layers"], batch_first=True)
            self.query = nn.Linear(units, att, bias=False)
            self.key = nn.Linear(units, att, bias=False)
            self.v = nn.Linear(att, 1, bias=False)
            self.attention_layer = nn.Linear(2 * units, hp["attention_layer"], bias=False)
            self.project = nn.Linear(hp["attention_layer"], hp["tgt_vocab"], bias=False)

        def forward(self, src, src_lengths, tgt, tgt_lengths):
            memory = _packed(self.encoder, self.src_embed(src), src_lengths)
            y = _packed(self.decoder, self.tgt_embed(tgt), tgt_lengths)
            scores = self.v(torch.tanh(self.query(y)[:, :, None] + self.key(memory)[:, None]))
            padded = torch.arange(src.shape[1])[None, None, :] >= src_lengths[:, None, None]
            weights = scores.squeeze(-1).masked_fill(padded, float("-inf")).softmax(-1)
            context = torch.bmm(weights, memory)
            return self.project(self.attention_layer(torch.cat([y, context], -1)))

    net = Seq2Seq()
    for name, param in net.named_parameters():
        if "embed" not in name:
            nn.init.uniform_(param, -hp["init_weight"], hp["init_weight"])
    opt = torch.optim.Adam(net.parameters(), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                           eps=hp["eps"])
    src, tgt = torch.from_numpy(batch["src"]).long(), torch.from_numpy(batch["tgt_in"]).long()
    src_lengths = torch.from_numpy(batch["src_lengths"]).long()
    tgt_lengths = torch.from_numpy(batch["tgt_lengths"]).long()
    labels = torch.from_numpy(batch["labels"]).long()
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        logits = net(src, src_lengths, tgt, tgt_lengths)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                           ignore_index=hp["pad_id"])
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), hp["grad_clip_norm"])
        opt.step()
        return loss.item()
    return step


def _packed(rnn, x, lengths):
    """A PyTorch recurrent layer over each sequence's own length, padded back to x's length."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    out, _ = rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


def seq2seq_tensorflow(batch, hp):
    import keras
    layers = keras.layers
    init = keras.initializers.RandomUniform(-hp["init_weight"], hp["init_weight"])

    def lstm_stack(x, count):
        for _ in range(count):
            x = layers.LSTM(hp["units"], return_sequences=True, kernel_initializer=init,
                            recurrent_initializer=init, unit_forget_bias=True)(x)
        return x

    src = keras.Input((batch["src"].shape[1],), dtype="int32")
    tgt = keras.Input((batch["tgt_in"].shape[1],), dtype="int32")
    # mask_zero: padding (id 0) is masked through the LSTMs, the attention and the loss
    memory = lstm_stack(layers.Embedding(hp["src_vocab"], hp["embed_dim"], mask_zero=True)(src),
                        hp["encoder_layers"])
    y = lstm_stack(layers.Embedding(hp["tgt_vocab"], hp["embed_dim"], mask_zero=True)(tgt),
                   hp["decoder_layers"])
    query = layers.Dense(hp["attention_units"], use_bias=False, kernel_initializer=init)(y)
    key = layers.Dense(hp["attention_units"], use_bias=False, kernel_initializer=init)(memory)
    context = layers.AdditiveAttention()([query, memory, key])  # v . tanh(q + k), v its scale
    mixed = layers.Dense(hp["attention_layer"], use_bias=False, kernel_initializer=init)(
        layers.Concatenate()([y, context]))
    logits = layers.Dense(hp["tgt_vocab"], use_bias=False, kernel_initializer=init)(mixed)
    net = keras.Model([src, tgt], logits)
    net.compile(optimizer=keras.optimizers.Adam(hp["lr"], beta_1=hp["beta1"], beta_2=hp["beta2"],
                                                epsilon=hp["eps"],
                                                global_clipnorm=hp["grad_clip_norm"]),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                ignore_class=hp["pad_id"]))
    x, y_true = [batch["src"], batch["tgt_in"]], batch["labels"]
    return lambda: float(net.train_on_batch(x, y_true))


def seq2seq_mxnet(batch, hp):
    mx, autograd, gluon = _mxnet()
    nn, rnn = gluon.nn, gluon.rnn
    init = mx.init.Uniform(hp["init_weight"])

    class Seq2Seq(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            units, att = hp["units"], hp["attention_units"]
            with self.name_scope():
                self.src_embed = nn.Embedding(hp["src_vocab"], hp["embed_dim"])
                self.tgt_embed = nn.Embedding(hp["tgt_vocab"], hp["embed_dim"])
                self.encoder = rnn.LSTM(units, hp["encoder_layers"], layout="NTC",
                                        input_size=hp["embed_dim"], i2h_weight_initializer=init,
                                        h2h_weight_initializer=init)
                self.decoder = rnn.LSTM(units, hp["decoder_layers"], layout="NTC",
                                        input_size=hp["embed_dim"], i2h_weight_initializer=init,
                                        h2h_weight_initializer=init)
                dense = dict(use_bias=False, flatten=False, weight_initializer=init)
                self.query = nn.Dense(att, in_units=units, **dense)
                self.key = nn.Dense(att, in_units=units, **dense)
                self.v = nn.Dense(1, in_units=att, **dense)
                self.attention_layer = nn.Dense(hp["attention_layer"], in_units=2 * units, **dense)
                self.project = nn.Dense(hp["tgt_vocab"], in_units=hp["attention_layer"], **dense)

        def hybrid_forward(self, F, src, src_lengths, tgt):
            # unidirectional: the outputs before each length never see the padding after it
            memory = self.encoder(self.src_embed(src))
            y = self.decoder(self.tgt_embed(tgt))
            hidden = F.tanh(F.broadcast_add(F.expand_dims(self.query(y), axis=2),
                                            F.expand_dims(self.key(memory), axis=1)))
            scores = F.reshape(self.v(hidden), shape=(0, 0, 0))
            lengths = F.broadcast_like(F.expand_dims(src_lengths, axis=1), scores,
                                       lhs_axes=(1,), rhs_axes=(1,))   # (N, T)
            weights = F.softmax(scores, length=lengths, use_length=True, axis=-1)
            context = F.batch_dot(weights, memory)
            return self.project(self.attention_layer(F.concat(y, context, dim=2)))

    net = Seq2Seq()
    net.initialize(init)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "adam", {
        "learning_rate": hp["lr"], "beta1": hp["beta1"], "beta2": hp["beta2"],
        "epsilon": hp["eps"]})
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    src, tgt = mx.nd.array(batch["src"]), mx.nd.array(batch["tgt_in"])
    src_lengths = mx.nd.array(batch["src_lengths"], dtype="int32")
    labels = mx.nd.array(batch["labels"])
    weights = mx.nd.array(batch["labels"] != hp["pad_id"]).expand_dims(axis=2)
    tokens = float(weights.sum().asscalar())

    def step():
        with autograd.record():
            loss = loss_fn(net(src, src_lengths, tgt), labels, weights).sum() * \
                (batch["labels"].shape[1] / tokens)   # the mean over target tokens
        loss.backward()
        gluon.utils.clip_global_norm([p.grad() for p in params], hp["grad_clip_norm"])
        trainer.step(1)
        return float(loss.asscalar())
    return step


# -- Deep Speech 2 as each framework's users write it ------------------------------------------
# tbdzoo's paper config (tbdzoo/models/deepspeech2/): two convolutions (ReLU, then BatchNorm),
# 7 x [BatchNorm over the sequence, bidirectional GRU of 1,760 (directions concatenated)], a
# dense layer of 1,760 without bias, BatchNorm, ReLU, the output layer of 29, CTC with blank 0
# summed per utterance and averaged over the batch; SGD 3e-4 with momentum 0.9, element-wise
# clipping at 100. Every contender reads each utterance's length after the convolutions.
def ds2_output_lengths(hp, lengths):
    from tbdzoo.models.deepspeech2 import output_steps
    return output_steps(hp, lengths).astype("int32")


def _ds2_conv_width(hp):
    from tbdzoo.datasets import spectrogram
    width = spectrogram.num_bins(hp["sample_rate"], hp["window_ms"])
    for conv in ("conv1", "conv2"):
        width = (width - hp[conv + "_kernel"][1]) // hp[conv + "_stride"][1] + 1
    return width


def deepspeech2_torch(batch, hp):
    import torch
    from torch import nn
    bn = dict(eps=hp["bn_eps"], momentum=hp["bn_momentum"])
    channels, units = hp["channels"], hp["rnn_units"]

    class DeepSpeech2(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(
                nn.Conv2d(1, channels, hp["conv1_kernel"], hp["conv1_stride"]), nn.ReLU(),
                nn.BatchNorm2d(channels, **bn),
                nn.Conv2d(channels, channels, hp["conv2_kernel"], hp["conv2_stride"]), nn.ReLU(),
                nn.BatchNorm2d(channels, **bn))
            sizes = [channels * _ds2_conv_width(hp)] + [2 * units] * (hp["rnn_layers"] - 1)
            self.norms = nn.ModuleList(nn.BatchNorm1d(d, **bn) for d in sizes)
            self.grus = nn.ModuleList(nn.GRU(d, units, bidirectional=True, batch_first=True)
                                      for d in sizes)
            self.fc = nn.Linear(2 * units, hp["fc_units"], bias=False)
            self.fc_norm = nn.BatchNorm1d(hp["fc_units"], **bn)
            self.output = nn.Linear(hp["fc_units"], hp["num_classes"])

        def forward(self, x, lengths):
            x = self.conv(x[:, None])                      # (N, C, T', F')
            x = x.permute(0, 2, 1, 3).flatten(2)           # (N, T', C F')
            for norm, gru in zip(self.norms, self.grus):
                x = _packed(gru, norm(x.transpose(1, 2)).transpose(1, 2), lengths)
            x = torch.relu(self.fc_norm(self.fc(x).transpose(1, 2)).transpose(1, 2))
            return self.output(x)

    net = DeepSpeech2()
    opt = torch.optim.SGD(net.parameters(), lr=hp["lr"], momentum=hp["momentum"])
    ctc = nn.CTCLoss(blank=0, reduction="sum")
    x = torch.from_numpy(batch["spectrogram"])
    lengths = torch.from_numpy(ds2_output_lengths(hp, batch["spectrogram_lengths"])).long()
    labels = torch.from_numpy(batch["labels"]).long()
    label_lengths = torch.from_numpy(batch["label_lengths"]).long()
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        log_probs = net(x, lengths).log_softmax(-1).transpose(0, 1)   # (T', N, classes)
        loss = ctc(log_probs, labels, lengths, label_lengths) / len(labels)
        loss.backward()
        nn.utils.clip_grad_value_(net.parameters(), hp["grad_clip_value"])
        opt.step()
        return loss.item()
    return step


def deepspeech2_tensorflow(batch, hp):
    import keras
    import tensorflow as tf
    layers = keras.layers
    bn = dict(epsilon=hp["bn_eps"], momentum=1.0 - hp["bn_momentum"])
    channels, units = hp["channels"], hp["rnn_units"]

    class DeepSpeech2(keras.Model):
        def __init__(self):
            super().__init__()
            self.convs = [layers.Conv2D(channels, hp[c + "_kernel"], hp[c + "_stride"],
                                        activation="relu") for c in ("conv1", "conv2")]
            self.conv_norms = [layers.BatchNormalization(**bn) for _ in self.convs]
            self.norms = [layers.BatchNormalization(**bn) for _ in range(hp["rnn_layers"])]
            self.grus = [layers.Bidirectional(layers.GRU(units, return_sequences=True,
                                                         reset_after=True))
                         for _ in range(hp["rnn_layers"])]
            self.fc = layers.Dense(hp["fc_units"], use_bias=False)
            self.fc_norm = layers.BatchNormalization(**bn)
            self.output_layer = layers.Dense(hp["num_classes"])

        def call(self, x, mask, training=False):
            x = x[..., None]                                  # (N, T, F, 1): channels last
            for conv, norm in zip(self.convs, self.conv_norms):
                x = norm(conv(x), training=training)
            x = keras.ops.reshape(x, (-1, x.shape[1], x.shape[2] * x.shape[3]))
            for norm, gru in zip(self.norms, self.grus):     # statistics over the valid steps
                x = gru(norm(x, training=training, mask=mask), mask=mask, training=training)
            x = keras.ops.relu(self.fc_norm(self.fc(x), training=training, mask=mask))
            return self.output_layer(x)

    net = DeepSpeech2()
    opt = keras.optimizers.SGD(hp["lr"], momentum=hp["momentum"], clipvalue=hp["grad_clip_value"])
    x = tf.constant(batch["spectrogram"])
    lengths = ds2_output_lengths(hp, batch["spectrogram_lengths"])
    steps = int(max(ds2_output_lengths(hp, [batch["spectrogram"].shape[1]])))
    mask = tf.sequence_mask(lengths, steps)
    lengths, labels = tf.constant(lengths), tf.constant(batch["labels"])
    label_lengths = tf.constant(batch["label_lengths"])

    @tf.function
    def train(x, mask, lengths, labels, label_lengths):
        with tf.GradientTape() as tape:
            logits = net(x, mask, training=True)
            loss = tf.reduce_mean(keras.ops.ctc_loss(labels, logits, label_lengths, lengths,
                                                     mask_index=0))
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))
        return loss
    return lambda: float(train(x, mask, lengths, labels, label_lengths))


def deepspeech2_mxnet(batch, hp):
    mx, autograd, gluon = _mxnet()
    nn, rnn = gluon.nn, gluon.rnn
    bn = dict(epsilon=hp["bn_eps"], momentum=1.0 - hp["bn_momentum"])
    channels, units = hp["channels"], hp["rnn_units"]

    class DeepSpeech2(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.conv = nn.HybridSequential()
                for c, cin in (("conv1", 1), ("conv2", channels)):
                    self.conv.add(nn.Conv2D(channels, hp[c + "_kernel"], hp[c + "_stride"],
                                            activation="relu", in_channels=cin),
                                  nn.BatchNorm(in_channels=channels, **bn))
                sizes = [channels * _ds2_conv_width(hp)] + [2 * units] * (hp["rnn_layers"] - 1)
                self.norms = nn.HybridSequential()
                self.grus = nn.HybridSequential()
                for d in sizes:
                    self.norms.add(nn.BatchNorm(axis=2, in_channels=d, **bn))
                    # over the padding: MXNet 1.9's GRU cannot take lengths (docstring)
                    self.grus.add(rnn.GRU(units, bidirectional=True, input_size=d))
                self.fc = nn.Dense(hp["fc_units"], use_bias=False, flatten=False,
                                   in_units=2 * units)
                self.fc_norm = nn.BatchNorm(axis=2, in_channels=hp["fc_units"], **bn)
                self.output = nn.Dense(hp["num_classes"], flatten=False, in_units=hp["fc_units"])

        def hybrid_forward(self, F, x):
            x = self.conv(F.expand_dims(x, axis=1))                  # (N, C, T', F')
            x = F.reshape(F.transpose(x, axes=(2, 0, 1, 3)), shape=(0, 0, -1))   # (T', N, C F')
            for i in range(len(self.grus)):
                x = self.norms[i](F.swapaxes(x, 0, 1))
                x = self.grus[i](F.swapaxes(x, 0, 1))
            x = F.relu(self.fc_norm(self.fc(F.swapaxes(x, 0, 1))))
            return self.output(x)                                     # (N, T', classes)

    net = DeepSpeech2()
    net.initialize(mx.init.Xavier(magnitude=2.0, factor_type="in"))
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {
        "learning_rate": hp["lr"], "momentum": hp["momentum"],
        "clip_gradient": hp["grad_clip_value"]})
    ctc = gluon.loss.CTCLoss(layout="NTC", label_layout="NT")   # the blank is the last class
    x = mx.nd.array(batch["spectrogram"])
    lengths = mx.nd.array(ds2_output_lengths(hp, batch["spectrogram_lengths"]))
    # characters 1..28 become 0..27, so that the blank (0 in tbdzoo) is Gluon's last class
    labels = mx.nd.array(batch["labels"] - 1)
    label_lengths = mx.nd.array(batch["label_lengths"])
    n = len(batch["labels"])

    def step():
        with autograd.record():
            logits = net(x)
            # each class moves one down: tbdzoo's blank 0 becomes Gluon's last
            logits = mx.nd.concat(logits[:, :, 1:], logits[:, :, :1], dim=2)
            loss = ctc(logits, labels, lengths, label_lengths)
        loss.backward()
        trainer.step(n)
        return float(loss.mean().asscalar())
    return step


def _nhwc(images):
    import numpy as np
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1))  # Keras wants NHWC


def _mxnet():
    import numpy
    if not hasattr(numpy, "bool"):  # MXNet 1.9 still reads numpy.bool
        numpy.bool = bool
    import mxnet as mx
    from mxnet import autograd, gluon
    return mx, autograd, gluon


# -- what is compared --------------------------------------------------------------------------
# Per model: the batch, each backend's native (name, variant, step builder), and tbdzoo's
# variants as hyperparameter overrides; the first variant is the paper config.
MODELS = {
    "resnet50": {
        "batch_size": 16, "image_size": 224,
        "native": {"torch": ("torchvision.models.resnet50", "v1.5", resnet50_torch),
                   "tensorflow": ("keras.applications.ResNet50", "v1", resnet50_tensorflow),
                   "mxnet": ("gluon.model_zoo.vision.resnet50_v1", "v1", resnet50_mxnet)},
        "tbdzoo": {"v1.5": {}, "v1": {"stride_in_1x1": True}},
    },
    "inception_v3": {
        "batch_size": 4, "image_size": 299,  # its card's benchmark.cpu_batch_size
        "native": {"torch": ("torchvision.models.inception_v3", "aux", inception_v3_torch),
                   "tensorflow": ("keras.applications.InceptionV3", "no aux", inception_v3_tensorflow),
                   "mxnet": ("gluon.model_zoo.vision.inception_v3", "no aux", inception_v3_mxnet)},
        "tbdzoo": {"aux": {}, "no aux": {"aux_head": False}},
    },
    "seq2seq": {
        "batch_size": 16, "unit": "tokens",  # its card's benchmark.cpu_batch_size
        "native": {"torch": ("torch.nn.LSTM", "paper", seq2seq_torch),
                   "tensorflow": ("keras.layers.LSTM", "paper", seq2seq_tensorflow),
                   "mxnet": ("gluon.rnn.LSTM", "paper", seq2seq_mxnet)},
        "tbdzoo": {"paper": {}},
    },
    "deepspeech2": {
        # tbdzoo.suite: one utterance on a CPU; two, so that their lengths differ
        "batch_size": 2, "overrides": {"max_frames": 100}, "unit": "audio_s",
        "native": {"torch": ("torch.nn.GRU", "paper", deepspeech2_torch),
                   "tensorflow": ("keras.layers.GRU", "paper", deepspeech2_tensorflow),
                   "mxnet": ("gluon.rnn.GRU", "paper", deepspeech2_mxnet)},
        "tbdzoo": {"paper": {}},
    },
}


def tbdzoo_step(model_name, backend, batch_size, overrides, batch):
    from tbdzoo.backends.registry import build_native
    model = build_native(model_name, backend, batch_size=batch_size, **overrides)
    prepared = model.prepare_batch(batch)
    return lambda: model.train_step(prepared)


def synthetic(model_name, batch_size, overrides):
    """(the batch both sides train on, the paper hyperparameters with ``overrides``): images for
    the vision models, tbdzoo's own synthetic batch (ragged lengths) for the others."""
    from tbdzoo.datasets import synthetic as data
    from tbdzoo.models import get_model
    spec = MODELS[model_name]
    model_def = get_model(model_name)
    hp = model_def.hparams("paper", batch_size=batch_size, **overrides)
    if "image_size" in spec:
        return data.image_classification(batch_size, 3, spec["image_size"], 1000, seed=0), hp
    return model_def.synthetic_batch(hp, batch_size, 0), hp


def timed(step, steps, wait=None):
    """Seconds per step; ``wait`` (if given) waits for work the steps left queued, so that it
    is charged to them and not to the contender timed next."""
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if wait is not None:
        wait()
    return (time.perf_counter() - start) / steps


def _engine_wait(backend):
    """MXNet's engine runs an update after the step that queued it has returned (a Gluon
    step reads its loss before ``trainer.step``'s updates have run): wait for all of it."""
    if backend != "mxnet":
        return None
    mx = _mxnet()[0]
    return mx.nd.waitall


def contender_variants(model_name, backend):
    """name -> variant of every contender, in timing order: the native model, tbdzoo's
    like-for-like variant, then the paper config where that differs."""
    spec = MODELS[model_name]
    native_variant = spec["native"][backend][1]
    paper = next(iter(spec["tbdzoo"]))
    out = {"native": native_variant}
    for variant in dict.fromkeys([native_variant, paper]):
        out["tbdzoo " + variant] = variant
    return out


def contenders(model_name, backend, batch_size, overrides, only=None):
    """name -> (variant, step) for the contenders (those named in ``only``, if given), and the
    items (images, tokens, audio seconds) a step trains on."""
    spec = MODELS[model_name]
    overrides = dict(spec.get("overrides", {}), **overrides)
    batch, hp = synthetic(model_name, batch_size, overrides)
    out = {}
    for name, variant in contender_variants(model_name, backend).items():
        if only is not None and name not in only:
            continue
        if name == "native":
            step = spec["native"][backend][2](batch, hp)
        else:
            step = tbdzoo_step(model_name, backend, batch_size,
                               dict(overrides, **spec["tbdzoo"][variant]), batch)
        out[name] = (variant, step)
    return out, _items(model_name, hp, batch)


def _items(model_name, hp, batch):
    from tbdzoo.models import get_model
    if "image_size" in MODELS[model_name]:
        return len(batch["labels"])
    return get_model(model_name).items(hp, batch)


def run_backend(model_name, backend, batch_size, warmup, steps, repeats, overrides=None,
                only=None):
    """Interleaved timings in this process: name -> seconds a step of each repeat, and the
    items a step trains on."""
    steppers, items = contenders(model_name, backend, batch_size, overrides or {}, only)
    names = list(steppers)
    for name in names:
        for _ in range(warmup):
            steppers[name][1]()
    times, wait = {name: [] for name in names}, _engine_wait(backend)
    if wait is not None:
        wait()
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(steppers[name][1], steps, wait))
        print("{} repeat {}: {}".format(backend, r + 1, ", ".join(
            "{} {:.2f} s".format(n, t[-1]) for n, t in times.items())), file=sys.stderr, flush=True)
    return times, items


def run_alone(model_name, backend, batch_size, warmup, steps, repeats, knobs):
    """Each contender in a process of its own, one process a repeat, the order rotating: for
    models too large for two to share this host's memory. Each process builds, warms up and
    times one repeat, so the build and the warm-up are paid again every repeat (untimed)."""
    names = list(contender_variants(model_name, backend))
    times, items = {name: [] for name in names}, None
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.native_models", "--backend", backend, "--only",
                 name] + _with(knobs, "--repeats", "1"), stdout=subprocess.PIPE,
                text=True, cwd=os.path.dirname(HERE))
            if proc.returncode != 0:
                raise RuntimeError("{} {} failed in repeat {} (its error is above)".format(
                    backend, name, r + 1))
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            times[name] += result["times"][name]
            items = result["items"]
        print("{} repeat {} (a process each): {}".format(backend, r + 1, ", ".join(
            "{} {:.2f} s".format(n, t[-1]) for n, t in times.items())), file=sys.stderr, flush=True)
    return times, items


def _with(knobs, flag, value):
    """``knobs`` with ``flag``'s value replaced."""
    out = list(knobs)
    out[out.index(flag) + 1] = value
    return out


def rows_of(model_name, backend, batch_size, times, items):
    """One row per contender: its median step, its rate, and its ratio to the native model's."""
    variants = contender_variants(model_name, backend)
    native = statistics.median(times["native"])
    rows = []
    for name in times:
        median = statistics.median(times[name])
        rows.append({"backend": backend,
                     "model": MODELS[model_name]["native"][backend][0] if name == "native" else name,
                     "variant": variants[name], "batch_size": batch_size,
                     "step_s_median": median, "step_s": times[name],
                     UNIT_KEY.format(MODELS[model_name].get("unit", "images")): items / median,
                     "ratio_to_native": native / median,
                     # the same repeat's native time over this one's, then the median: a drift
                     # that lasts a repeat cancels
                     "ratio_to_native_paired": statistics.median(
                         a / b for a, b in zip(times["native"], times[name]))})
    return rows


def _override(text):
    """KEY=VALUE, the value read as JSON where it parses (numbers, lists), else as a string."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("{!r} is not KEY=VALUE, e.g. max_frames=200".format(text))
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def main(argv=None, default_model=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default=default_model,
                   required=default_model is None)
    p.add_argument("--backend", choices=BACKENDS, help="run one backend in this process")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated backends to run, each in its own process (default: %(default)s)")
    p.add_argument("--batch-size", type=int, help="default: the model's (see MODELS)")
    p.add_argument("--set", type=_override, action="append", default=[], metavar="KEY=VALUE",
                   help="a hyperparameter of both sides, over the model's CPU overrides "
                        "(MODELS), e.g. max_frames=200")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="default: benchmarks/results/native_<model>.json")
    p.add_argument("--alone", action="store_true",
                   help="each contender in a process of its own, one a repeat (for models too "
                        "large for two to share the host's memory, e.g. Deep Speech 2 on MXNet)")
    p.add_argument("--only", help=argparse.SUPPRESS)   # a --alone child: time this contender
    args = p.parse_args(argv)
    batch_size = args.batch_size or MODELS[args.model]["batch_size"]
    overrides = dict(args.set)
    out = args.out or os.path.join(HERE, "results", "native_{}.json".format(args.model))
    knobs = ["--model", args.model, "--batch-size", str(batch_size), "--warmup", str(args.warmup),
             "--steps", str(args.steps), "--repeats", str(args.repeats)]
    for key, value in sorted(overrides.items()):
        knobs += ["--set", "{}={}".format(key, json.dumps(value))]
    if args.backend and args.only:
        times, items = run_backend(args.model, args.backend, batch_size, args.warmup,
                                   args.steps, args.repeats, overrides, only=[args.only])
        print(json.dumps({"times": times, "items": items}))
        return 0
    if args.backend:
        if args.alone:
            times, items = run_alone(args.model, args.backend, batch_size, args.warmup,
                                     args.steps, args.repeats, knobs)
        else:
            times, items = run_backend(args.model, args.backend, batch_size, args.warmup,
                                       args.steps, args.repeats, overrides)
        print(json.dumps(rows_of(args.model, args.backend, batch_size, times, items)))
        return 0
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        p.error("unknown backend {}; choose from {}".format(unknown[0], ", ".join(BACKENDS)))
    if backends != list(BACKENDS):
        knobs += ["--backends", ",".join(backends)]
    if args.alone:
        knobs += ["--alone"]
    rows, load_before = [], os.getloadavg()
    for backend in backends:
        print("timing {} ...".format(backend), file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.native_models", "--backend",
                               backend] + knobs, stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(HERE))
        if proc.returncode != 0:
            print("{} failed (its error is above)".format(backend), file=sys.stderr)
            continue
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
        _write(out, knobs, load_before, rows)  # after each backend: a long run keeps what it has
    rate = UNIT_KEY.format(MODELS[args.model].get("unit", "images"))
    print("{:<11} {:<38} {:>8} {:>14} {:>9} {:>8}".format("backend", "model", "variant",
                                                           rate, "vs native", "paired"))
    for r in rows:
        print("{:<11} {:<38} {:>8} {:>14.2f} {:>8.3f}x {:>7.3f}x".format(
            r["backend"], r["model"], r["variant"], r[rate], r["ratio_to_native"],
            r["ratio_to_native_paired"]))
    print("written to", os.path.relpath(out))
    return 0


def _write(out, knobs, load_before, rows):
    """The rows so far, the command that gives them and the load average (1, 5, 15 min) when
    the run began and now."""
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"command": " ".join(["-m benchmarks.native_models"] + knobs),
                   "cpus": os.cpu_count(), "load_average": [load_before, os.getloadavg()],
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
