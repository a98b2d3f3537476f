"""tbdzoo's ResNet-50 and Transformer on the JAX backend against hand-written Flax NNX models.

    python -m benchmarks.flax_handwritten --out benchmarks/results/cpu_flax_handwritten.json
    python3 -m benchmarks.flax_handwritten --device cuda:0 --precisions tf32,bf16 \\
        --out benchmarks/results/h100_flax_handwritten.json
    python -m benchmarks.flax_handwritten --tiny --rounds 1 --processes 1 --steps 1 --out /tmp/x.json

Run from the repository root with the JAX environment's interpreter (``.venv-jax/bin/python``;
on a GPU machine, the python3 that has jax with CUDA). The baselines are what a Flax user writes
after Flax's own examples, with tbdzoo's architecture and hyperparameters exactly:

- **ResNet-50** (after the ImageNet example's ``ResNet``): NHWC images, ``nnx.Conv`` without
  bias, ``nnx.BatchNorm`` (momentum 0.9 in Flax's convention: tbdzoo's 0.1; epsilon 1e-5),
  bottleneck blocks with the stride on the 3x3 convolution (v1.5) and a projection shortcut
  where the shape changes, explicit (1, 1) padding of the strided 3x3 convolutions and of the
  max pool (PyTorch's windows, which tbdzoo's ResNet has; Flax's 'SAME' pads (0, 1)), mean
  pooling, ``nnx.Linear``; integer-label cross entropy; ``optax.add_decayed_weights(1e-4)``
  then ``optax.sgd(0.1, momentum=0.9)`` (tbdzoo's coupled weight decay on every parameter).
- **Transformer base** (after the WMT example's ``Transformer``): one ``nnx.Embed`` shared by
  the source, the target and the output projection (``attend``), embeddings scaled by
  sqrt(d_model), a sinusoid table added (tbdzoo's interleaved sin/cos), ``nnx.MultiHeadAttention``
  with the example's padding masks (``make_attention_mask`` of the non-pad tokens, combined with
  ``make_causal_mask`` in the decoder), an MLP block (Dense, ReLU, dropout, Dense) and
  ``nnx.LayerNorm`` (epsilon 1e-6) and ``nnx.Dropout`` as tbdzoo's Transformer has them:
  post-norm, LayerNorm(x + Dropout(sublayer(x))), no final norm (the example is pre-norm with
  one). The loss is the example's weighted cross entropy over non-pad tokens with tbdzoo's label
  smoothing (``optax.smooth_labels``: (1 - 0.1) one-hot + 0.1 / vocab); ``optax.adam`` (0.9,
  0.98, 1e-9) on the inverse-square-root schedule of tbdzoo's card.

Both hold tbdzoo's initial weights (copied from the JAX backend's model in the same process), read
the same synthetic batch (``synthetic_batch(seed=0)``; images transposed once to NHWC for the
hand-written ResNet) and train with one ``jax.jit`` program per step whose model and optimizer
state is donated (``nnx.split`` once, ``nnx.merge`` inside the jitted function: Flax's functional
API, the fastest way to call an NNX model). The first losses agree up to float32 rounding (the
Transformer's up to dropout's masks, which the two draw differently; ``--no-dropout`` sets the
rate to 0 for a check). tbdzoo's side is ``build_native(name, "jax", ...)``'s ``train_step``.

Precisions: ``fp32`` (full float32 products, tbdzoo's default; the CPU's default here), ``tf32``
(``jax.default_matmul_precision("tensorfloat32")`` around both sides' steps, as the backend sets
it), ``bf16`` (Flax's usual mixed precision on the hand-written side: every layer's ``dtype``
bfloat16, ``param_dtype`` float32, the loss in float32; tbdzoo's backend runs its convolutions and
dense layers in bfloat16 and the rest in float32, under the tf32 context).

Sizes: on a CPU the models' CPU benchmark batches (the cards' ``cpu_batch_size``: ResNet-50 8
images of 224 pixels; Transformer 16 sentences of 32 + 32 tokens), on a GPU the paper batches
(32 images; 64 sentences); ``--batch-size`` sets both.

The repeat protocol is benchmarks/harness.py's: ``--processes`` fresh processes of this script,
each building both contenders of every cell, one step each (first losses, and the compile),
``--warmup`` steps each, then ``--rounds`` interleaved rounds (the order rotating) of ``--steps``
steps each, the clock stopped after ``jax.block_until_ready`` of the last step's outputs; both
sides read their loss back to the host every step (tbdzoo's ``train_step`` returns it as a
float). The summary: median step time, the spread over rounds and processes, the throughput
ratio (handwritten step time / tbdzoo step time) paired round by round and its verdict.
Peak memory, on a GPU only: each contender of each cell alone in one more fresh process
(``--memory-processes``, default 1), its device's ``memory_stats()['peak_bytes_in_use']`` after
``--warmup`` + 1 steps (JAX cannot reset the peak, and the two in one process would mask each
other). A CPU run records no memory.
"""
import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import harness
from tbdzoo.spec.tables import sinusoid_table

MODELS = ("resnet50", "transformer")
PRECISIONS = ("fp32", "tf32", "bf16")
SUBJECT, BASELINE = "tbdzoo", "flax"


# -- ResNet-50, after Flax's ImageNet example ---------------------------------------------------
class Bottleneck(nnx.Module):
    """1x1 -> 3x3 (stride) -> 1x1 x4 convolutions, BatchNorm after each, ReLU but after the
    last; a projection shortcut where the stride or the width changes."""

    def __init__(self, in_features, width, stride, *, bn_momentum, bn_eps, dtype, rngs):
        conv = lambda i, o, k, s=1, p=0: nnx.Conv(  # noqa: E731
            i, o, (k, k), strides=(s, s), padding=((p, p), (p, p)), use_bias=False,
            dtype=dtype, rngs=rngs)
        norm = lambda f: nnx.BatchNorm(f, momentum=1.0 - bn_momentum, epsilon=bn_eps,  # noqa: E731
                                       dtype=dtype, rngs=rngs)
        self.conv1, self.bn1 = conv(in_features, width, 1), norm(width)
        self.conv2, self.bn2 = conv(width, width, 3, stride, 1), norm(width)
        self.conv3, self.bn3 = conv(width, 4 * width, 1), norm(4 * width)
        if stride != 1 or in_features != 4 * width:
            self.conv_proj, self.norm_proj = conv(in_features, 4 * width, 1, stride), norm(4 * width)
        else:
            self.conv_proj = self.norm_proj = None

    def __call__(self, x):
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = nnx.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        residual = x if self.conv_proj is None else self.norm_proj(self.conv_proj(x))
        return nnx.relu(y + residual)


class ResNet(nnx.Module):
    """The 7x7 stem, a 3x3 max pool, four stages of bottleneck blocks, mean pooling, a dense
    classifier; NHWC throughout."""

    def __init__(self, hp, dtype, rngs):
        width, bn = hp["width"], {"bn_momentum": hp["bn_momentum"], "bn_eps": hp["bn_eps"]}
        self.conv_init = nnx.Conv(3, width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)),
                                  use_bias=False, dtype=dtype, rngs=rngs)
        self.bn_init = nnx.BatchNorm(width, momentum=1.0 - hp["bn_momentum"], epsilon=hp["bn_eps"],
                                     dtype=dtype, rngs=rngs)
        stages, features = [], width
        for i, count in enumerate(hp["blocks"]):
            blocks = []
            for j in range(count):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(Bottleneck(features, width * 2 ** i, stride, dtype=dtype, rngs=rngs, **bn))
                features = 4 * width * 2 ** i
            stages.append(nnx.List(blocks))
        self.stages = nnx.List(stages)
        self.head = nnx.Linear(features, hp["num_classes"], dtype=dtype, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn_init(self.conv_init(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return self.head(x.mean(axis=(1, 2)))


def resnet_loss(model, batch):
    logits = model(batch["images"]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()


def resnet_weights(model, weights):
    """tbdzoo's canonical weights (PyTorch's layouts and names) into the Flax ResNet."""
    def conv_bn(conv, bn, prefix, conv_name, bn_name):
        conv.kernel.set_value(weights[prefix + conv_name + ".weight"].transpose(2, 3, 1, 0))
        for ours, theirs in (("scale", "gamma"), ("bias", "beta"), ("mean", "running_mean"),
                             ("var", "running_var")):
            getattr(bn, ours).set_value(weights[prefix + bn_name + "." + theirs])
    conv_bn(model.conv_init, model.bn_init, "", "conv1", "bn1")
    for i, stage in enumerate(model.stages):
        for j, block in enumerate(stage):
            p = "layer{}.{}.".format(i + 1, j)
            for k in (1, 2, 3):
                conv_bn(getattr(block, "conv{}".format(k)), getattr(block, "bn{}".format(k)), p,
                        "conv{}".format(k), "bn{}".format(k))
            if block.conv_proj is not None:
                conv_bn(block.conv_proj, block.norm_proj, p, "downsample.0", "downsample.1")
    model.head.kernel.set_value(weights["fc.weight"].T)
    model.head.bias.set_value(weights["fc.bias"])


def resnet_parts(hp, batch, dtype):
    model = ResNet(hp, dtype, nnx.Rngs(0))
    tx = optax.chain(optax.add_decayed_weights(hp["weight_decay"]),
                     optax.sgd(hp["lr"], momentum=hp["momentum"], nesterov=hp["nesterov"]))
    feed = {"images": np.ascontiguousarray(batch["images"].transpose(0, 2, 3, 1)),
            "labels": batch["labels"].astype(np.int32)}
    return model, tx, resnet_loss, resnet_weights, feed


# -- Transformer base, after Flax's WMT example -------------------------------------------------
class MlpBlock(nnx.Module):
    def __init__(self, hp, dtype, rngs):
        self.linear1 = nnx.Linear(hp["d_model"], hp["ffn"], dtype=dtype, rngs=rngs)
        self.linear2 = nnx.Linear(hp["ffn"], hp["d_model"], dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(hp["dropout"], rngs=rngs)

    def __call__(self, x):
        return self.linear2(self.dropout(nnx.relu(self.linear1(x))))


def _attention(hp, dtype, rngs):
    return nnx.MultiHeadAttention(hp["heads"], hp["d_model"], dropout_rate=hp["attention_dropout"],
                                  broadcast_dropout=False, decode=False, dtype=dtype, rngs=rngs)


class EncoderLayer(nnx.Module):
    def __init__(self, hp, dtype, rngs):
        norm = lambda: nnx.LayerNorm(hp["d_model"], epsilon=hp["ln_eps"], dtype=dtype, rngs=rngs)  # noqa: E731
        self.self_attn, self.ln_attn = _attention(hp, dtype, rngs), norm()
        self.mlp, self.ln_mlp = MlpBlock(hp, dtype, rngs), norm()
        self.dropout = nnx.Dropout(hp["dropout"], rngs=rngs)

    def __call__(self, x, mask):
        x = self.ln_attn(x + self.dropout(self.self_attn(x, mask=mask)))
        return self.ln_mlp(x + self.dropout(self.mlp(x)))


class DecoderLayer(nnx.Module):
    def __init__(self, hp, dtype, rngs):
        norm = lambda: nnx.LayerNorm(hp["d_model"], epsilon=hp["ln_eps"], dtype=dtype, rngs=rngs)  # noqa: E731
        self.self_attn, self.ln_self = _attention(hp, dtype, rngs), norm()
        self.cross_attn, self.ln_cross = _attention(hp, dtype, rngs), norm()
        self.mlp, self.ln_mlp = MlpBlock(hp, dtype, rngs), norm()
        self.dropout = nnx.Dropout(hp["dropout"], rngs=rngs)

    def __call__(self, y, memory, self_mask, cross_mask):
        y = self.ln_self(y + self.dropout(self.self_attn(y, mask=self_mask)))
        y = self.ln_cross(y + self.dropout(self.cross_attn(y, memory, memory, mask=cross_mask)))
        return self.ln_mlp(y + self.dropout(self.mlp(y)))


class Transformer(nnx.Module):
    """Encoder-decoder with one shared embedding table (inputs and output projection)."""

    def __init__(self, hp, dtype, rngs):
        self.pad_id, self.scale = hp["pad_id"], float(hp["d_model"] ** 0.5)
        self.embed = nnx.Embed(hp["vocab"], hp["d_model"], dtype=dtype, rngs=rngs)
        self.encoder = nnx.List([EncoderLayer(hp, dtype, rngs) for _ in range(hp["encoder_layers"])])
        self.decoder = nnx.List([DecoderLayer(hp, dtype, rngs) for _ in range(hp["decoder_layers"])])
        self.dropout = nnx.Dropout(hp["dropout"], rngs=rngs)

    def embed_tokens(self, tokens):
        x = self.embed(tokens) * self.scale
        x = x + jnp.asarray(sinusoid_table(tokens.shape[1], x.shape[-1]), x.dtype)
        return self.dropout(x)

    def __call__(self, src, tgt):
        keep_src, keep_tgt = src != self.pad_id, tgt != self.pad_id
        x = self.embed_tokens(src)
        src_mask = nnx.make_attention_mask(keep_src, keep_src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        y = self.embed_tokens(tgt)
        self_mask = nnx.combine_masks(nnx.make_attention_mask(keep_tgt, keep_tgt),
                                      nnx.make_causal_mask(tgt))
        cross_mask = nnx.make_attention_mask(keep_tgt, keep_src)
        for layer in self.decoder:
            y = layer(y, x, self_mask, cross_mask)
        return self.embed.attend(y)


def transformer_loss_of(hp):
    def loss(model, batch):
        logits = model(batch["src"], batch["tgt_in"]).astype(jnp.float32)
        labels = batch["labels"]
        targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), hp["label_smoothing"])
        weights = (labels != hp["pad_id"]).astype(jnp.float32)
        return (optax.softmax_cross_entropy(logits, targets) * weights).sum() / weights.sum()
    return loss


def transformer_weights(model, weights):
    """tbdzoo's canonical weights ((out, in) dense matrices, the heads splitting features in
    order) into the Flax Transformer (attention kernels (in, heads, head dim), out kernel
    (heads, head dim, out))."""
    model.embed.embedding.set_value(weights["embed.weight"])

    def attention(mha, p):
        for name in ("query", "key", "value", "out"):
            layer, k = getattr(mha, name), name[0]
            layer.kernel.set_value(weights[p + ".W_" + k].T.reshape(layer.kernel.get_value().shape))
            layer.bias.set_value(weights[p + ".b_" + k].reshape(layer.bias.get_value().shape))

    def norm(ln, p):
        ln.scale.set_value(weights[p + ".gamma"])
        ln.bias.set_value(weights[p + ".beta"])

    def mlp(block, p):
        for name in ("linear1", "linear2"):
            getattr(block, name).kernel.set_value(weights["{}.{}.weight".format(p, name)].T)
            getattr(block, name).bias.set_value(weights["{}.{}.bias".format(p, name)])

    for i, layer in enumerate(model.encoder):
        p = "encoder.{}.".format(i)
        attention(layer.self_attn, p + "self_attn")
        norm(layer.ln_attn, p + "self_attn.norm")
        mlp(layer.mlp, p + "ffn")
        norm(layer.ln_mlp, p + "ffn.norm")
    for i, layer in enumerate(model.decoder):
        p = "decoder.{}.".format(i)
        attention(layer.self_attn, p + "self_attn")
        norm(layer.ln_self, p + "self_attn.norm")
        attention(layer.cross_attn, p + "cross_attn")
        norm(layer.ln_cross, p + "cross_attn.norm")
        mlp(layer.mlp, p + "ffn")
        norm(layer.ln_mlp, p + "ffn.norm")


def inverse_sqrt(hp):
    """tbdzoo's schedule: lr d_model^-0.5 min(n^-0.5, n warmup^-1.5), n = step + 1."""
    def schedule(count):
        n = count.astype(jnp.float32) + 1.0
        return hp["lr"] * hp["d_model"] ** -0.5 * jnp.minimum(n ** -0.5, n * hp["warmup_steps"] ** -1.5)
    return schedule


def transformer_parts(hp, batch, dtype):
    model = Transformer(hp, dtype, nnx.Rngs(0, dropout=1))
    if hp["lr_schedule"] != "inverse_sqrt" or hp["weight_decay"]:
        raise ValueError("the hand-written Transformer has the card's Adam on the inverse-sqrt "
                         "schedule without weight decay; keep those hyperparameters")
    tx = optax.adam(inverse_sqrt(hp), b1=hp["beta1"], b2=hp["beta2"], eps=hp["eps"])
    feed = {k: batch[k].astype(np.int32) for k in ("src", "tgt_in", "labels")}
    return model, tx, transformer_loss_of(hp), transformer_weights, feed


PARTS = {"resnet50": resnet_parts, "transformer": transformer_parts}


# -- the hand-written training step -------------------------------------------------------------
def matmul_precision(precision):
    """The matrix-product precision both sides' steps run under (tbdzoo's backend's choice)."""
    return jax.default_matmul_precision("highest" if precision == "fp32" else "tensorfloat32")


class FlaxStep:
    """The model and its Optax optimizer split once into a graph definition and a state; one
    jitted step merges them, takes the loss's gradient, updates, and returns the loss and the new
    state (the old one donated)."""

    def __init__(self, model_name, hp, weights, batch, device, precision):
        dtype = jnp.bfloat16 if precision == "bf16" else None
        model, tx, loss_fn, load, feed = PARTS[model_name](hp, batch, dtype)
        load(model, {k: np.asarray(v, np.float32) for k, v in weights.items()})
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        graphdef, state = nnx.split((model, optimizer))
        self.state = jax.device_put(state, device)
        self.batch = jax.device_put(feed, device)
        self.precision = precision

        def train_step(state, batch):
            model, optimizer = nnx.merge(graphdef, state)
            loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
            optimizer.update(model, grads)
            return loss, nnx.state((model, optimizer))

        self._step = jax.jit(train_step, donate_argnums=0)

    def step(self):
        with matmul_precision(self.precision):
            loss, self.state = self._step(self.state, self.batch)
        return float(loss)

    def block(self):
        jax.block_until_ready(self.state)


# -- one process's cells ------------------------------------------------------------------------
def jax_device(device):
    if device == "cpu":
        return jax.devices("cpu")[0]
    return jax.devices("gpu")[int(device.split(":")[1]) if ":" in device else 0]


def sizes_of(model_name, args, cuda):
    from tbdzoo.models import get_model
    sizes = {}
    if args.batch_size:
        sizes["batch_size"] = args.batch_size
    elif not cuda and not args.tiny:
        sizes["batch_size"] = get_model(model_name).benchmark.cpu_batch_size
    if args.no_dropout and model_name == "transformer":
        sizes["dropout"] = 0.0
    return sizes


def build_contenders(model_name, precision, device, args, which=(SUBJECT, BASELINE)):
    """{name: (step, block)} of the contenders ``which``, the tbdzoo model and its batch."""
    from tbdzoo.backends.registry import build_native
    cuda = device.startswith("cuda")
    sizes = sizes_of(model_name, args, cuda)
    config = "tiny" if args.tiny else "paper"
    ours = SUBJECT in which
    # the baseline alone (a memory process) takes tbdzoo's weights from a CPU copy
    model = build_native(model_name, "jax", config=config, device=device if ours else "cpu",
                         precision=precision if ours else "fp32", **sizes)
    batch = model.synthetic_batch(seed=0)
    contenders = {}
    if ours:
        prepared = model.prepare_batch(batch)
        contenders[SUBJECT] = (lambda: model.train_step(prepared), model.synchronize)
    if BASELINE in which:
        flax_side = FlaxStep(model_name, model.hparams, model.get_weights(), batch,
                             jax_device(device), precision)
        contenders[BASELINE] = (flax_side.step, flax_side.block)
    return contenders, model, batch


def run_cell(model_name, precision, device, args):
    start = time.perf_counter()
    contenders, model, batch = build_contenders(model_name, precision, device, args)
    first = {name: float(step()) for name, (step, _) in contenders.items()}   # compiles too
    checks = {"first_loss_rel_diff": {BASELINE: abs(first[SUBJECT] - first[BASELINE]) /
                                      max(abs(first[BASELINE]), 1e-12)}}
    for step, _ in contenders.values():
        for _ in range(args.warmup):
            step()
    load_before = os.getloadavg()
    # the clock stops once the last step's outputs are ready
    times = harness.interleaved_rounds({name: step for name, (step, _) in contenders.items()},
                                       device, args.steps, args.rounds,
                                       wait=lambda name: contenders[name][1]())
    last = {name: float(step()) for name, (step, _) in contenders.items()}
    hp = model.hparams
    details = {"last_loss": last, "load_average_before": list(load_before),
               "load_average_after": list(os.getloadavg()), "dropout": hp.get("dropout")}
    if model_name == "transformer":
        details["padded_tokens_per_step"] = int(batch["labels"].size)
    return {"model": model_name, "precision": precision, "execution": "jit",
            "config": "tiny" if args.tiny else "paper", "batch_size": hp["batch_size"],
            "unit": model.model_def.unit, "items_per_step": model.model_def.items(hp, batch),
            "warmup": args.warmup, "steps": args.steps, "times": times,
            "peak_bytes": {name: None for name in contenders}, "first_loss": first,
            "checks": checks, "details": details, "cell_seconds": time.perf_counter() - start}


def run_memory(model_name, precision, device, args):
    """One contender alone (``--memory-of``): the device's peak bytes after a first step and
    ``--warmup`` more."""
    contenders, _, _ = build_contenders(model_name, precision, device, args, which=(args.memory_of,))
    step, block = contenders[args.memory_of]
    for _ in range(1 + args.warmup):
        step()
    block()
    stats = jax_device(device).memory_stats() or {}
    return {"model": model_name, "precision": precision, "execution": "jit",
            "contender": args.memory_of, "peak_bytes": stats.get("peak_bytes_in_use")}


def environment(device):
    import flax
    env = {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
           "python": platform.python_version(), "host_cpus": os.cpu_count(),
           "host_machine": platform.machine(), "device": device,
           "jax_device": str(jax_device(device).device_kind), "load_average": list(os.getloadavg())}
    try:
        import jaxlib
        env["jaxlib"] = jaxlib.__version__
    except ImportError:
        pass
    return env


def worker(args, device):
    measure = run_memory if args.memory_of else run_cell

    def report(cell):
        if "times" in cell:
            med = {k: 1e3 * statistics.median(v) for k, v in cell["times"].items()}
            print("  {} {}: ".format(cell["model"], cell["precision"]) + "  ".join(
                "{} {:.2f} ms".format(k, v) for k, v in med.items()) + harness.first_losses(cell) +
                " ({:.0f}s)".format(cell["cell_seconds"]), flush=True)
        else:
            print("  {} {} {} peak {} bytes".format(cell["model"], cell["precision"],
                                                   cell["contender"], cell["peak_bytes"]), flush=True)

    cells = [({"model": m, "precision": p, "execution": "jit"},
              lambda m=m, p=p: measure(m, p, device, args))
             for m in args.models.split(",") for p in args.precisions.split(",")]
    return harness.record_cells(args, environment(device), cells, report)


# -- the repeat protocol ------------------------------------------------------------------------
def add_memory(result, memory_records):
    """The memory processes' peaks into the aggregate: each contender's peak (the median over
    memory processes) and tbdzoo's peak over the baseline's."""
    peaks = {}
    for record in memory_records:
        for cell in record["cells"]:
            if cell.get("peak_bytes") is not None:
                peaks.setdefault((cell["model"], cell["precision"]), {}).setdefault(
                    cell["contender"], []).append(cell["peak_bytes"])
    for entry in result["cells"]:
        got = peaks.get((entry["model"], entry["precision"]))
        if not got or "contenders" not in entry:
            continue
        for name, values in got.items():
            entry["contenders"][name]["peak_bytes"] = statistics.median(values)
            entry["contenders"][name]["peak_bytes_processes"] = values
        if SUBJECT in got and BASELINE in got:
            ratio = statistics.median(got[SUBJECT]) / statistics.median(got[BASELINE])
            entry["ratios"][BASELINE].update({"memory": ratio, "memory_processes": [
                s / b for s, b in zip(got[SUBJECT], got[BASELINE])]})
            entry["memory"] = ratio
    return result


def main(argv=None):
    _p, args = arguments(argv)
    device = "cuda:0" if args.device == "cuda" else args.device
    if args.process_out:
        return worker(args, device)
    argv = list(sys.argv[1:] if argv is None else argv)
    module = "benchmarks.flax_handwritten"
    command = harness.command_of(module, argv, args.out)
    memory_processes = args.memory_processes if device.startswith("cuda") else 0
    protocol = {"processes": args.processes, "rounds_per_process": args.rounds,
                "steps_per_round": args.steps, "warmup_steps": args.warmup,
                "loss_read_back": "every step, on both sides",
                "speed_ratio": "flax step time / tbdzoo step time (above 1: tbdzoo faster)",
                "memory": ("each contender alone in {} fresh process(es) per cell: "
                           "memory_stats()['peak_bytes_in_use'] after {} steps".format(
                               memory_processes, 1 + args.warmup)
                           if memory_processes else "not measured (a CPU run)"),
                "memory_ratio": "tbdzoo peak / flax peak",
                "verdict": "ahead or behind only when every round's and every process's ratio "
                           "is on one side of 1.0"}
    work = args.work_dir or tempfile.mkdtemp(prefix="tbdzoo-flax-")
    records, memory_records = [], []

    def save():
        result = harness.aggregate(records, command, protocol)
        return harness.write_result(args.out, add_memory(result, memory_records))

    for i in range(args.processes):
        records += harness.run_processes(module, argv, 1, os.path.join(work, "time-{}".format(i)))
        save()
    for i in range(memory_processes):
        for name in (SUBJECT, BASELINE):
            memory_records += harness.run_processes(
                module, argv + ["--memory-of", name], 1, os.path.join(work, "memory-{}-{}".format(name, i)))
            save()
    result = save()
    for cell in result["cells"]:
        if "contenders" not in cell:
            print(cell["model"], cell["precision"], "FAILED", cell.get("error"))
        else:
            print(harness.format_row((cell["model"], cell["precision"]), cell))
    return 0


def arguments(argv=None):
    p = harness.comparison_parser(
        __doc__, "cpu_flax_handwritten.json", warmup=None, models=MODELS,
        overrides={"--precisions": {"default": "fp32", "help": "of fp32, tf32, bf16"},
                   "--executions": None, "--profile": None,
                   "--warmup": {"default": None, "help": "untimed steps of each contender after "
                                "its first (default: 1 on a CPU, 10 on a GPU)"},
                   "--steps": {"default": None, "help": "steps per timed round (default: 2 on a "
                               "CPU, 20 on a GPU)"},
                   "--device": {"default": "cpu", "help": "cpu, cuda or cuda:N"},
                   "--tiny": {"help": "tiny configs (a check that it runs)"}})
    p.add_argument("--no-dropout", action="store_true",
                   help="the Transformer without dropout, so both sides' first losses agree")
    p.add_argument("--memory-processes", type=int, default=1,
                   help="on a GPU, fresh processes per contender and cell measuring its peak memory")
    p.add_argument("--memory-of", choices=(SUBJECT, BASELINE), help=argparse.SUPPRESS)
    harness.add_process_options(p, "cpu_flax_handwritten.json")
    args = p.parse_args(argv)
    harness.check_choices(p, args, models=MODELS, precisions=PRECISIONS)
    cpu = args.device == "cpu"
    args.warmup = (1 if cpu else 10) if args.warmup is None else args.warmup
    args.steps = (2 if cpu else 20) if args.steps is None else args.steps
    if args.memory_processes < 0:
        p.error("--memory-processes {}: must be at least 0".format(args.memory_processes))
    return p, args


if __name__ == "__main__":
    sys.exit(main())
