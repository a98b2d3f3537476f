"""Transformer base (Vaswani et al. 2017): post-norm encoder-decoder with a shared vocabulary.

One embedding matrix serves the source embedding, the target embedding and the pre-softmax
projection, as in the paper. Batches are padded to fixed lengths; padding and causal masks are
explicit attention inputs, so every backend sees the same static shapes.
"""
from ...datasets import synthetic
from ...spec import Graph
from .. import metrics
from ..card import Benchmark, Consistency, Measured, Training
from ..constraints import integer, number
from ..registry import register_model

PAPER = {
    "vocab": 32000, "d_model": 512, "heads": 8, "ffn": 2048, "encoder_layers": 6,
    "decoder_layers": 6, "dropout": 0.1, "attention_dropout": 0.0, "ln_eps": 1e-6,
    "pad_id": 0, "bos_id": 1, "eos_id": 2,
    "batch_size": 64, "src_len": 32, "tgt_len": 32,        # 2,048 target tokens per batch
    "optimizer": "adam", "lr": 1.0, "beta1": 0.9, "beta2": 0.98, "eps": 1e-9, "weight_decay": 0.0,
    "lr_schedule": "inverse_sqrt", "warmup_steps": 4000,
    "label_smoothing": 0.1,
}

TINY = dict(PAPER, vocab=50, d_model=16, heads=2, ffn=32, encoder_layers=2, decoder_layers=2,
            batch_size=4, src_len=7, tgt_len=6, warmup_steps=10)

# The rules of the Transformer's own hyperparameters; the shared ones are in constraints.COMMON.
# Synthetic sentences draw words from ids 3 and up, so the vocabulary holds at least 4 ids.
RULES = {
    "vocab": integer(4), "d_model": integer(1), "heads": integer(1), "ffn": integer(1),
    "encoder_layers": integer(0), "decoder_layers": integer(0), "ln_eps": number(0.0, open_low=True),
    "pad_id": integer(0), "bos_id": integer(0), "eos_id": integer(0),
    "src_len": integer(1), "tgt_len": integer(1),
}


def _heads_divide_d_model(hp):
    if hp["d_model"] % hp["heads"]:
        return "d_model {} is not divisible by heads {}; pick heads that divide it".format(
            hp["d_model"], hp["heads"])


def _special_ids_fit(hp):
    ids = [hp["pad_id"], hp["bos_id"], hp["eos_id"]]
    if len(set(ids)) < 3 or max(ids) >= hp["vocab"]:
        return ("pad_id, bos_id and eos_id ({}) must be three different ids below vocab {}"
                .format(", ".join(str(i) for i in ids), hp["vocab"]))


def _batch(hp, batch_size, seed):
    return synthetic.translation(batch_size, hp["src_len"], hp["tgt_len"], hp["vocab"],
                                 hp["pad_id"], hp["bos_id"], hp["eos_id"], seed=seed)


def _target_tokens(hp, batch):
    """Target tokens that are not padding: the tokens the loss counts (it ignores ``pad_id``)."""
    return int((batch["labels"] != hp["pad_id"]).sum())


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# The proxy: numbers-en-vi in one shared vocabulary (4 special ids, then the English and the
# Vietnamese words); 2 + 2 layers of d_model 64, 4 heads; the paper's inverse-square-root
# schedule (lr 1.0 x d_model^-0.5) with 100 warm-up steps instead of 4,000.
TRAINING = Training(metrics=(metrics.TOKENS, metrics.SENTENCES, metrics.EXACT, metrics.BLEU),
                    target="token_accuracy=0.5", eval_every=25,
                    task="tbdzoo.training.translation_task:TranslationTask", data_parallel="batch slices",
                    proxy={"vocab": 128, "d_model": 64, "heads": 4, "ffn": 128,
                           "encoder_layers": 2, "decoder_layers": 2, "src_len": 12,
                           "tgt_len": 14, "batch_size": 32, "warmup_steps": 100})
# A batch that keeps a full-size training step to seconds on a small CPU.
BENCHMARK = Benchmark(cpu_batch_size=16)
# Without dropout, whose masks no two frameworks draw alike.
CONSISTENCY = Consistency(overrides={"dropout": 0.0})
MEASURED = Measured(parameters=60522496, flops_per_example=3913531392)


@register_model("transformer", domain="machine translation", configs={"paper": PAPER, "tiny": TINY},
                unit="tokens/s", items=_target_tokens, synthetic_batch=_batch, rules=RULES,
                checks=(_heads_divide_d_model, _special_ids_fit),
                training=TRAINING, benchmark=BENCHMARK, consistency=CONSISTENCY, measured=MEASURED)
def build(hp):
    g = Graph("transformer")
    g.block("", "Transformer")
    d, pad = hp["d_model"], hp["pad_id"]
    src = g.input("src", (hp["src_len"],), dtype="int32")
    tgt = g.input("tgt_in", (hp["tgt_len"],), dtype="int32")
    g.input("labels", (hp["tgt_len"],), dtype="int32", role="target")

    def embed(name, tokens, shared):
        kw = {"shared": {"weight": "embed.weight"}} if shared else {}
        x = g.add(name, "embedding", tokens, vocab=hp["vocab"], dim=d, scale=d ** 0.5, **kw)
        x = g.add(name + ".pos", "positional_encoding", x)
        return g.add(name + ".dropout", "dropout", x, rate=hp["dropout"])

    def sublayer(name, x, y):
        """Post-norm residual: LayerNorm(x + Dropout(y))."""
        y = g.add(name + ".dropout", "dropout", y, rate=hp["dropout"])
        y = g.add(name + ".add", "add", [x, y])
        return g.add(name + ".norm", "layernorm", y, eps=hp["ln_eps"])

    def attention(name, q, kv, keys, causal):
        return g.add(name, "multi_head_attention", [q, kv, keys], num_heads=hp["heads"],
                     causal=causal, pad_id=pad, dropout=hp["attention_dropout"])

    def feed_forward(name, x):
        g.block(name, "FeedForward")
        h = g.add(name + ".linear1", "dense", x, units=hp["ffn"], init="xavier_uniform")
        h = g.add(name + ".relu", "relu", h)
        h = g.add(name + ".inner_dropout", "dropout", h, rate=hp["dropout"])
        return g.add(name + ".linear2", "dense", h, units=d, init="xavier_uniform")

    x = embed("embed", src, shared=False)
    for i in range(hp["encoder_layers"]):
        p = g.block("encoder.{}".format(i), "EncoderLayer") + "."
        x = sublayer(p + "self_attn", x, attention(p + "self_attn", x, x, src, causal=False))
        x = sublayer(p + "ffn", x, feed_forward(p + "ffn", x))
    memory = x

    y = embed("tgt_embed", tgt, shared=True)
    for i in range(hp["decoder_layers"]):
        p = g.block("decoder.{}".format(i), "DecoderLayer") + "."
        y = sublayer(p + "self_attn", y, attention(p + "self_attn", y, y, tgt, causal=True))
        y = sublayer(p + "cross_attn", y, attention(p + "cross_attn", y, memory, src, causal=False))
        y = sublayer(p + "ffn", y, feed_forward(p + "ffn", y))

    logits = g.add("generator", "dense", y, units=hp["vocab"], use_bias=False,
                   shared={"weight": "embed.weight"})
    g.set_output(logits)
    g.set_loss("softmax_cross_entropy", logits=logits, labels="labels",
               label_smoothing=hp["label_smoothing"], ignore_index=pad)
    return g
