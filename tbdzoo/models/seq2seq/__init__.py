"""Seq2Seq: an LSTM encoder-decoder with additive (Bahdanau) attention, TBD's machine
translation model as it trained TensorFlow NMT on IWSLT'15 English-Vietnamese.

The encoder reads the (reversed) source; the decoder reads the target shifted right; each
decoder output attends over the encoder's outputs (masked by the source length); the attention
layer mixes the decoder output with its context, and a projection gives the target
vocabulary's logits. Sequences are padded batches with per-example lengths.

Two deliberate changes from TF NMT, so that the decoder is one fused recurrent node on every
framework (docs/models/seq2seq.md says what each costs):
  - no input feeding: TF NMT's AttentionWrapper feeds the previous step's attention vector into
    the next decoder step, which makes the decoder a cell loop; here attention is computed from
    each decoder output after the whole decoder has run;
  - the decoder starts from a zero state, not the encoder's final state (the recurrent node
    has no initial-state input).

Values carry their source: [T] TBD's hparams file for this run
(``nmt_tf_1.2-iwslt15_en_vi-full_training.json`` in tbd-suite), [N] TF NMT's code
(``nmt/model.py``, ``attention_model.py``, ``model_helper.py``) and TF 1.x's
``tf.contrib.seq2seq`` it calls, [V] the sizes of TF NMT's IWSLT'15 vocabulary files
(``vocab.en``, ``vocab.vi``, whose first lines are ``<unk>``, ``<s>``, ``</s>``), as TF NMT's
tutorial gives them (recalled, not re-counted here: the files are not in this repository).
"""
import numpy as np

from ...datasets import synthetic
from ...errors import BatchError
from ...spec import Graph
from ...spec.program import clip_of, single_objective
from .. import metrics
from ..card import Benchmark, Consistency, Measured, Training
from ..constraints import boolean, integer, number
from ..registry import register_model

PAPER = {
    "src_vocab": 17191,         # [V] vocab.en: 17,191 lines
    "tgt_vocab": 7709,          # [V] vocab.vi: 7,709 lines
    "embed_dim": 512,           # [N] embeddings are num_units wide
    "units": 512,               # [T] num_units
    "encoder_layers": 2,        # [T] num_layers, encoder_type "uni"
    "decoder_layers": 2,        # [T] num_layers
    "attention_units": 512,     # [T] attention "bahdanau" of num_units [N] (normalize=False)
    "attention_layer": 512,     # [N] attention_layer_size = num_units: Dense over [output; context]
    "forget_bias": 1.0,         # [T]
    "init_weight": 0.1,         # [T] every parameter U(-0.1, 0.1) (the scope's initializer [N])
    "pad_id": 0, "bos_id": 1, "eos_id": 2,   # [V] <s> 1, </s> 2; 0 pads (docs/models/seq2seq.md)
    # Padded lengths of a synthetic batch. [T] filters training pairs at 100 tokens but
    # buckets them (num_buckets 10), so a batch pads to its own longest sentence, not to 100;
    # 50 is TF NMT's own cap for this data set (standard_hparams/iwslt15.json src_max_len and
    # tgt_max_len), a padded length a bucket of IWSLT's sentences can plausibly have.
    "src_len": 50, "tgt_len": 50,
    "reverse_source": True,     # [T] source_reverse (the data side: batches are reversed)
    "batch_size": 128,          # [T]
    # [T] adam at 3e-4; [N] TF1's AdamOptimizer defaults beta1 0.9, beta2 0.999, epsilon 1e-8
    "optimizer": "adam", "lr": 3e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
    "weight_decay": 0.0,
    # [T] decay_factor 1.0 from step 17,000: the rate never changes.
    "lr_schedule": "constant",
    "grad_clip_norm": 1.0,      # [T] max_gradient_norm (clip_by_global_norm [N])
}

# Vocabularies of ~20, units of 8, one or two layers, ragged lengths (4 to 7 source tokens, 3 to
# 6 target tokens).
TINY = dict(PAPER, src_vocab=19, tgt_vocab=17, embed_dim=6, units=8, encoder_layers=2,
            decoder_layers=1, attention_units=5, attention_layer=7, src_len=7, tgt_len=6,
            batch_size=3)

# Synthetic sentences draw words from ids 3 and up, so each vocabulary holds at least 4 ids.
RULES = {
    "src_vocab": integer(4), "tgt_vocab": integer(4), "embed_dim": integer(1),
    "units": integer(1), "encoder_layers": integer(1), "decoder_layers": integer(1),
    "attention_units": integer(1), "attention_layer": integer(1), "forget_bias": number(),
    "init_weight": number(0.0, open_low=True), "pad_id": integer(0), "bos_id": integer(0),
    "eos_id": integer(0), "src_len": integer(1), "tgt_len": integer(1),
    "reverse_source": boolean(),
}


def _special_ids_fit(hp):
    ids = [hp["pad_id"], hp["bos_id"], hp["eos_id"]]
    if len(set(ids)) < 3 or max(ids) >= min(hp["src_vocab"], hp["tgt_vocab"]):
        return ("pad_id, bos_id and eos_id ({}) must be three different ids below both "
                "vocabularies ({} and {})".format(", ".join(str(i) for i in ids),
                                                 hp["src_vocab"], hp["tgt_vocab"]))


def _batch(hp, batch_size, seed):
    return synthetic.parallel_sentences(
        batch_size, hp["src_len"], hp["tgt_len"], hp["src_vocab"], hp["tgt_vocab"],
        hp["pad_id"], hp["bos_id"], hp["eos_id"], reverse_source=hp["reverse_source"], seed=seed)


def check_batch(hp, batch):
    """Raise BatchError when a label past its target's length is not ``pad_id`` (the loss
    would count it). The rest of a batch (token ids inside their vocabularies, lengths inside
    [1, padded length]) is the shared check's (common/batches.py), from the graph."""
    if "labels" not in batch or "tgt_lengths" not in batch:
        return
    labels, n = np.asarray(batch["labels"]), np.asarray(batch["tgt_lengths"])
    valid = (n >= 1) & (n <= labels.shape[1])  # a length outside is the shared check's
    beyond = (np.arange(labels.shape[1])[None, :] >= n[:, None]) & (labels != hp["pad_id"]) \
        & valid[:, None]
    if beyond.any():
        row, col = (int(v) for v in np.argwhere(beyond)[0])
        raise BatchError("batch['labels'][{}, {}] = {} lies past tgt_lengths[{}] = {}; labels "
                         "there must be pad_id {} (the loss would count them)".format(
                             row, col, labels[row, col], row, n[row], hp["pad_id"]),
                         input="labels", position=(row, col), value=int(labels[row, col]),
                         allowed=hp["pad_id"])


def _target_tokens(hp, batch):
    """Target tokens the loss counts (labels that are not padding): the throughput unit."""
    return int((np.asarray(batch["labels"]) != hp["pad_id"]).sum())


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# The proxy: numbers-en-vi's word vocabularies (107 English and 20 Vietnamese lines, plus the
# special ids), sentences of up to 10 + 11 words, layers 2 + 2 as in the paper but 64 units
# wide; Adam at 3e-3 instead of 3e-4, so the proxy learns in a few hundred steps.
TRAINING = Training(metrics=(metrics.TOKENS, metrics.SENTENCES, metrics.EXACT, metrics.BLEU),
                    target="token_accuracy=0.5", eval_every=25,
                    task="tbdzoo.training.translation_task:TranslationTask", data_parallel="batch slices",
                    proxy={"src_vocab": 110, "tgt_vocab": 24, "embed_dim": 32, "units": 64,
                           "attention_units": 32, "attention_layer": 64, "src_len": 12,
                           "tgt_len": 14, "batch_size": 32, "lr": 3e-3})
# A batch that keeps a full-size training step to seconds on a small CPU.
BENCHMARK = Benchmark(cpu_batch_size=16)
# Ragged sentences: padding, masks and lengths.
CONSISTENCY = Consistency()
MEASURED = Measured(parameters=26141696, flops_per_example=1347494100)


@register_model("seq2seq", domain="machine translation", configs={"paper": PAPER, "tiny": TINY},
                unit="target tokens/s", items=_target_tokens, synthetic_batch=_batch, rules=RULES,
                checks=(_special_ids_fit,), check_batch=check_batch,
                training=TRAINING, benchmark=BENCHMARK, consistency=CONSISTENCY, measured=MEASURED)
def build(hp):
    g = Graph("seq2seq")
    g.block("", "Seq2Seq")
    init = ("uniform", hp["init_weight"])
    src = g.input("src", (hp["src_len"],), dtype="int32")
    src_lengths = g.input("src_lengths", (), dtype="int32")
    tgt = g.input("tgt_in", (hp["tgt_len"],), dtype="int32")
    tgt_lengths = g.input("tgt_lengths", (), dtype="int32")
    g.input("labels", (hp["tgt_len"],), dtype="int32", role="target")

    def lstm(name, x, lengths, layers):
        return g.add(name, "lstm", [x, lengths], units=hp["units"], num_layers=layers,
                     init=init, forget_bias=hp["forget_bias"])

    # [N] the embeddings too are drawn by the scope's initializer, U(-0.1, 0.1)
    x = g.add("encoder.embedding", "embedding", src, vocab=hp["src_vocab"], dim=hp["embed_dim"],
              init=init)
    memory = lstm("encoder.lstm", x, src_lengths, hp["encoder_layers"])
    y = g.add("decoder.embedding", "embedding", tgt, vocab=hp["tgt_vocab"], dim=hp["embed_dim"],
              init=init)
    y = lstm("decoder.lstm", y, tgt_lengths, hp["decoder_layers"])
    context = g.add("attention", "additive_attention", [y, memory, src_lengths],
                    units=hp["attention_units"], init=init)
    mixed = g.add("attention.concat", "concat", [y, context], axis=1)
    # [N] AttentionWrapper's attention_layer: Dense(attention_layer_size, use_bias=False), no
    # activation.
    mixed = g.add("attention_layer", "dense", mixed, units=hp["attention_layer"], use_bias=False,
                  init=init)
    logits = g.add("output_projection", "dense", mixed, units=hp["tgt_vocab"], use_bias=False,
                   init=init)   # [N] output_layer: Dense(tgt_vocab_size, use_bias=False)
    g.set_output(logits)

    g.set_program(single_objective(g, hp, "softmax_cross_entropy", clip=clip_of(hp),
                                   logits=logits, labels="labels", label_smoothing=0.0,
                                   ignore_index=hp["pad_id"]))
    return g
