"""tbdzoo's ResNet-50 and Transformer on the PyTorch backend against PyTorch baselines, on one GPU.

    python3 -m benchmarks.gpu_handwritten --profile --out benchmarks/results/h200_handwritten.json
    python3 -m benchmarks.gpu_handwritten --models transformer --executions eager --attribute
    python3 -m benchmarks.gpu_handwritten --device cpu --tiny --models resnet50 --executions eager \\
        --precisions tf32 --steps 1 --rounds 2 --processes 1 --warmup 1 --out /tmp/check.json

Run from the repository root. The baselines are what a PyTorch user who wants speed writes:

- **ResNet-50**: torchvision's ``ResNet`` with ``Bottleneck`` blocks (``resnet50`` is
  ``ResNet(Bottleneck, [3, 4, 6, 3])``: v1.5, in-place ReLUs) holding tbdzoo's initial weights
  (the parameter names are torchvision's; BatchNorm's gamma and beta are its weight and bias),
  ``F.cross_entropy``, SGD momentum 0.9, weight decay 1e-4 (fused on a GPU, foreach elsewhere).
  Built twice, plain NCHW (``baseline_nchw``) and channels-last (``baseline_channels_last``):
  both are timed and the faster is THE baseline of the cell. From the same weights, on the same
  batch, the first loss is tbdzoo's (``checks.first_loss_rel_diff``). Batch 256.
- **Transformer base** (``marian``): Hugging Face's ``MarianMTModel`` (transformers must be
  installed) built from a ``MarianConfig`` with tbdzoo's shapes: shared and tied vocabulary,
  d_model, layers, heads and FFN of the config, ReLU, dropout after attention, FFN, embeddings
  and ReLU, attention dropout and pad id as tbdzoo's config, ``scale_embedding``, SDPA
  attention, no KV cache; label-smoothed ``F.cross_entropy`` on its logits with the pad
  ignored, the masks made from the token ids inside the (compiled) function; Adam (0.9, 0.98,
  1e-9; fused on a GPU). It holds tbdzoo's initial weights, LayerNorm epsilon and interleaved
  sinusoid table (``marian_from_tbdzoo``), so with dropout off its first loss is tbdzoo's; it
  keeps three Q, K, V GEMMs where tbdzoo fuses them and adds its zero ``final_logits_bias``.
  With dropout (the paper's 0.1) the two draw different masks, so the first losses differ a
  little (recorded). Batch 128 x 128 tokens.
  ``torch.nn.Transformer`` is no baseline here: it adds a final LayerNorm to each stack and
  merges the padding and causal masks in every layer, work tbdzoo's Transformer does not do.

Every side reads the same synthetic batch under the same precision (TF32, or bf16 autocast for
the whole step) with cuDNN's autotuner on; compiled, ``torch.compile`` takes the baseline's
forward pass and loss.

The repeat protocol is benchmarks/harness.py's: ``--processes`` fresh processes per execution
mode, each building every contender, one step each (first losses), one for peak memory,
``--warmup`` steps, then ``--rounds`` interleaved rounds of ``--steps`` steps; ``--profile`` adds a
torch.profiler summary per contender in the last process; ``--attribute`` adds, per contender,
what is live at its peak memory by allocation site. On a CPU (``--device cpu --tiny``, a check
that the script runs) tf32 means fp32, ResNet-50's tiny config keeps torchvision's stem width 64
(torchvision's ResNet has no width option) and no memory is measured.
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks import harness
from benchmarks.gpu_programs import LAYOUTS, fast_optimizer

MODELS = ("resnet50", "transformer")
SHAPES = {"resnet50": {"batch_size": 256},
          "transformer": {"batch_size": 128, "src_len": 128, "tgt_len": 128}}
TINY_SHAPES = {"resnet50": {"width": 64}, "transformer": {}}   # torchvision's stem is 64 wide


# -- ResNet-50 --------------------------------------------------------------------------------
def resnet_state(weights):
    """tbdzoo's weights as torchvision ResNet's state dict (the names are torchvision's)."""
    state = {}
    for name, value in weights.items():
        key = name.replace(".gamma", ".weight").replace(".beta", ".bias")
        state[key] = torch.as_tensor(value)
    return state


class OneLossBaseline:
    """A baseline's step: its ``loss()`` under its autocast, backward, its optimizer's update;
    a subclass sets ``net``, ``opt``, ``autocast`` and ``loss``."""

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        with self.autocast:
            loss = self.loss()
        loss.backward()
        self.opt.step()
        return loss.detach()

    def held(self):
        return harness.held_bytes([self.net], [self.opt])


class ResNetBaseline(OneLossBaseline):
    def __init__(self, hp, weights, batch, device, precision, compiled, channels_last):
        from torchvision.models.resnet import Bottleneck, ResNet
        if hp["width"] != 64 or hp["stride_in_1x1"]:
            raise ValueError("torchvision's ResNet is v1.5 with a 64-wide stem: width=64 and "
                             "stride_in_1x1=False, not {} and {}".format(hp["width"], hp["stride_in_1x1"]))
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        net = ResNet(Bottleneck, list(hp["blocks"]), num_classes=hp["num_classes"])
        state = resnet_state(weights)
        if tuple(state["fc.weight"].shape) != tuple(net.fc.weight.shape):
            state["fc.weight"] = state["fc.weight"].t()
        missing = net.load_state_dict(state, strict=False).missing_keys
        if any(not k.endswith("num_batches_tracked") for k in missing):
            raise ValueError("tbdzoo's ResNet weights lack {}".format(missing))
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eps, m.momentum = hp["bn_eps"], hp["bn_momentum"]
        self.net = net.to(device, memory_format=fmt).train()
        self.x = torch.from_numpy(batch["images"]).to(device).contiguous(memory_format=fmt)
        self.y = torch.from_numpy(batch["labels"]).long().to(device)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=hp["lr"], momentum=hp["momentum"],
                                   weight_decay=hp["weight_decay"], nesterov=hp["nesterov"],
                                   **fast_optimizer(device))
        self.smoothing = hp["label_smoothing"]
        self.autocast = torch.autocast(str(device).split(":")[0], dtype=torch.bfloat16,
                                       enabled=precision == "bf16")
        self.loss = torch.compile(self._loss) if compiled else self._loss

    def _loss(self):
        return F.cross_entropy(self.net(self.x), self.y, label_smoothing=self.smoothing)


# -- Transformer: MarianMTModel -----------------------------------------------------------------
def marian_config(hp):
    from transformers import MarianConfig
    return MarianConfig(
        vocab_size=hp["vocab"], decoder_vocab_size=hp["vocab"], share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, d_model=hp["d_model"], encoder_layers=hp["encoder_layers"],
        decoder_layers=hp["decoder_layers"], encoder_attention_heads=hp["heads"],
        decoder_attention_heads=hp["heads"], encoder_ffn_dim=hp["ffn"], decoder_ffn_dim=hp["ffn"],
        activation_function="relu", dropout=hp["dropout"], activation_dropout=hp["dropout"],
        attention_dropout=hp["attention_dropout"], scale_embedding=True, pad_token_id=hp["pad_id"],
        bos_token_id=hp["bos_id"], eos_token_id=hp["eos_id"], decoder_start_token_id=hp["bos_id"],
        max_position_embeddings=max(1024, hp["src_len"], hp["tgt_len"]), use_cache=False)


def marian_state(hp, weights):
    """tbdzoo's Transformer weights as MarianMTModel's state dict (the shared embedding, its
    ties included; per layer Q, K, V and output projections, LayerNorms and FFN)."""
    w = {k: torch.as_tensor(v) for k, v in weights.items()}
    state = {"model.shared.weight": w["embed.weight"]}
    parts = {"self_attn": "self_attn", "encoder_attn": "cross_attn"}
    for side, layers in (("encoder", hp["encoder_layers"]), ("decoder", hp["decoder_layers"])):
        for i in range(layers):
            ours, theirs = "{}.{}.".format(side, i), "model.{}.layers.{}.".format(side, i)
            for attn in (("self_attn",) if side == "encoder" else ("self_attn", "encoder_attn")):
                a = ours + parts[attn] + "."
                for proj, name in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
                    state[theirs + attn + "." + proj + ".weight"] = w[a + "W_" + name]
                    state[theirs + attn + "." + proj + ".bias"] = w[a + "b_" + name]
                state[theirs + attn + "_layer_norm.weight"] = w[a + "norm.gamma"]
                state[theirs + attn + "_layer_norm.bias"] = w[a + "norm.beta"]
            for fc, linear in (("fc1", "linear1"), ("fc2", "linear2")):
                state[theirs + fc + ".weight"] = w[ours + "ffn." + linear + ".weight"]
                state[theirs + fc + ".bias"] = w[ours + "ffn." + linear + ".bias"]
            state[theirs + "final_layer_norm.weight"] = w[ours + "ffn.norm.gamma"]
            state[theirs + "final_layer_norm.bias"] = w[ours + "ffn.norm.beta"]
    return state


def marian_from_tbdzoo(hp, weights):
    """MarianMTModel with tbdzoo's shapes holding tbdzoo's weights, LayerNorm epsilon and
    interleaved sinusoid table: the same function as tbdzoo's Transformer (Q, K and V stay
    three GEMMs; the zero final_logits_bias stays)."""
    from transformers import MarianMTModel

    from tbdzoo.spec.tables import sinusoid_table
    net = MarianMTModel._from_config(marian_config(hp), attn_implementation="sdpa")
    state = marian_state(hp, weights)
    unexpected = net.load_state_dict(state, strict=False).unexpected_keys
    if unexpected:
        raise ValueError("MarianMTModel has no {}".format(unexpected))
    with torch.no_grad():
        for side in (net.model.encoder, net.model.decoder):
            table = side.embed_positions.weight
            table.copy_(torch.from_numpy(sinusoid_table(table.shape[0], table.shape[1])))
    for m in net.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = hp["ln_eps"]
    return net


class MarianBaseline(OneLossBaseline):
    def __init__(self, hp, weights, batch, device, precision, compiled, channels_last=False):
        try:
            import transformers  # noqa: F401  (a clear error now, not deep inside the baseline)
        except ImportError:
            raise RuntimeError("the Transformer's baseline is Hugging Face's MarianMTModel: "
                               "install transformers (pip install transformers) or run --models resnet50") from None
        net = marian_from_tbdzoo(hp, weights).to(device)
        if net.config._attn_implementation != "sdpa":
            raise RuntimeError("MarianMTModel runs {} attention, not sdpa".format(net.config._attn_implementation))
        if net.lm_head.weight is not net.model.shared.weight:
            raise RuntimeError("MarianMTModel's output projection is not tied to its embedding")
        self.net = net.train()
        self.src, self.tgt, self.labels = (torch.from_numpy(batch[k]).long().to(device)
                                           for k in ("src", "tgt_in", "labels"))
        self.pad, self.smoothing = hp["pad_id"], hp["label_smoothing"]
        self.opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(hp["beta1"], hp["beta2"]),
                                    eps=hp["eps"], **fast_optimizer(device))
        self.autocast = torch.autocast(str(device).split(":")[0], dtype=torch.bfloat16,
                                       enabled=precision == "bf16")
        self.loss = torch.compile(self._loss) if compiled else self._loss

    def _loss(self):
        logits = self.net(input_ids=self.src, attention_mask=self.src != self.pad,
                          decoder_input_ids=self.tgt, decoder_attention_mask=self.tgt != self.pad).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.labels.reshape(-1),
                               ignore_index=self.pad, label_smoothing=self.smoothing)


def baselines_of(model_name):
    """name -> (class, channels_last) of each baseline of the model."""
    if model_name == "resnet50":
        return {name: (ResNetBaseline, cl) for name, cl in LAYOUTS.items()}
    return {"marian": (MarianBaseline, False)}


# -- memory at the peak, by allocation site ------------------------------------------------------
def _site(frames):
    """Where a block was allocated: the innermost line of tbdzoo, transformers, torchvision or
    this script, and the PyTorch function it called."""
    if not frames:
        return "(no Python frame: autograd engine thread)"
    own = ("tbdzoo" + os.sep, "transformers" + os.sep, "torchvision" + os.sep, "benchmarks" + os.sep)
    user = next((f for f in frames if any(k in f["filename"] for k in own)), None)
    inner = frames[0]
    label = "{}:{} {}".format(os.path.basename(user["filename"]), user["line"], user["name"]) if user else ""
    if inner is not user:
        label += " <- {}:{} {}".format(os.path.basename(inner["filename"]), inner["line"], inner["name"])
    return label.strip()


def peak_sites(step, device, top=30):
    """One step under the allocator's trace, replayed to its peak: the blocks live then, grouped
    by allocation site (blocks live before the step are 'resident before the step')."""
    index = torch.device(device).index or 0
    torch.cuda.synchronize(device)
    before = {b["address"]: (b["size"], "(resident before the step)")
              for seg in torch.cuda.memory._snapshot()["segments"] if seg["device"] == index
              for b in seg["blocks"] if b["state"] == "active_allocated"}
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=2000000)
    try:
        step()
        torch.cuda.synchronize(device)
        events = torch.cuda.memory._snapshot()["device_traces"][index]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    live = dict(before)
    total = peak = sum(size for size, _ in live.values())
    at_peak, peak_event = dict(live), None
    for n, event in enumerate(events):
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = (size, _site(event.get("frames")))
            total += size
            if total > peak:
                peak, at_peak, peak_event = total, None, (n, live[addr][1], size)
        elif action == "free_requested" and addr in live:
            if at_peak is None:
                at_peak = dict(live)
            total -= live.pop(addr)[0]
    if at_peak is None:
        at_peak = dict(live)
    groups = {}
    for size, site in at_peak.values():
        g = groups.setdefault(site, {"site": site, "bytes": 0, "blocks": 0})
        g["bytes"] += size
        g["blocks"] += 1
    ranked = sorted(groups.values(), key=lambda g: -g["bytes"])
    return {"replayed_peak": peak, "events": len(events),
            "peak_set_by": {"site": peak_event[1], "bytes": peak_event[2]} if peak_event else None,
            "sites": ranked[:top], "other_sites_bytes": sum(g["bytes"] for g in ranked[top:])}


# -- one process's cell ---------------------------------------------------------------------------
def run_cell(model_name, precision, compiled, device, args):
    from tbdzoo.backends.registry import build_native
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    if compiled:
        torch._dynamo.reset()
    start = time.perf_counter()
    sizes = dict(TINY_SHAPES[model_name] if args.tiny else SHAPES[model_name])
    if args.batch_size:
        sizes["batch_size"] = args.batch_size
    ours_precision = precision if cuda or precision != "tf32" else "fp32"
    model = build_native(model_name, "torch", config="tiny" if args.tiny else "paper", device=device,
                         precision=ours_precision, execution="compiled" if compiled else "eager", **sizes)
    batch = model.synthetic_batch(seed=0)
    prepared = model.prepare_batch(batch)
    weights = model.get_weights()
    baselines = {name: cls(model.hparams, weights, batch, device, precision, compiled, cl)
                 for name, (cls, cl) in baselines_of(model_name).items()}
    contenders = {"tbdzoo": lambda: model.train_step(prepared, sync=False)}
    contenders.update({name: b.step for name, b in baselines.items()})
    held = {"tbdzoo": lambda: harness.held_bytes([model.native], model.torch_optimizers)}
    held.update({name: b.held for name, b in baselines.items()})
    first = {name: float(model.train_step(prepared) if name == "tbdzoo" else step())
             for name, step in contenders.items()}
    # the same weights and batch: the same first loss (the Transformer's up to dropout's masks)
    checks = {"first_loss_rel_diff": {name: abs(first["tbdzoo"] - first[name]) / max(abs(first[name]), 1e-12)
                                      for name in baselines}}
    peaks = harness.peak_memory(contenders, held, device)
    details = {}
    if args.attribute and cuda:
        details["at_peak"] = {name: peak_sites(step, device) for name, step in contenders.items()}
    times = harness.warm_and_time(contenders, device, args.warmup, args.steps, args.rounds)
    if model_name == "transformer":
        details["padded_tokens_per_step"] = int(batch["labels"].size)
    cell = harness.cell_record(args, device, contenders, start, model, batch, model_name, precision,
                               "compiled" if compiled else "eager", times, peaks, first, checks,
                               details=details)
    return cell


def worker(args, device):
    if not device.startswith("cuda"):
        torch.set_num_threads(1)  # a check, not a measurement
    return harness.run_cells(args, device, run_cell, describe=harness.first_losses)


def arguments(argv=None):
    p = harness.comparison_parser(__doc__, "gpu_handwritten.json", warmup=5, models=MODELS)
    p.add_argument("--attribute", action="store_true",
                   help="what is live at each contender's peak memory, by allocation site (GPU)")
    harness.add_process_options(p, "gpu_handwritten.json")
    args = p.parse_args(argv)
    harness.check_choices(p, args, models=MODELS)
    return p, args


def main(argv=None):
    return harness.main("benchmarks.gpu_handwritten", arguments, worker, argv)


if __name__ == "__main__":
    sys.exit(main())
