"""tbdzoo's PyTorch backend against hand-written training loops, on one GPU.

    python3 benchmarks/gpu_handwritten.py --out results.json          # every cell
    python3 benchmarks/gpu_handwritten.py --models transformer --attribute

The hand-written contenders are what a user would write instead:

- ResNet-50: torchvision's ``resnet50``; SGD momentum 0.9, weight decay 1e-4.
- Transformer, ``handwritten``: ``torch.nn.Transformer`` (6+6 layers, d_model 512, 8 heads, FFN
  2048, dropout 0.1, post-norm) with a shared 32k embedding tied to the output projection,
  sinusoidal positions and padding and causal masks.
- Transformer, ``marian``: Hugging Face's ``MarianMTModel`` built from a ``MarianConfig`` with
  tbdzoo's shapes (shared and tied 32k vocabulary, d_model 512, 6+6 layers, 8 heads, FFN 2048,
  ReLU, dropout 0.1 after attention, FFN and embeddings, ReLU dropout 0.1, attention dropout and
  pad id as tbdzoo's config, ``scale_embedding``, SDPA attention). Where it differs from tbdzoo's
  Transformer: a zero ``final_logits_bias`` buffer is added to the logits (one more logits-sized
  add); its sinusoidal table holds the sines in the first half of each vector and the cosines in
  the second instead of interleaving them (a fixed permutation of features, same cost); its
  embedding ignores the pad row (``padding_idx``: no gradient there); LayerNorm epsilon 1e-5
  (tbdzoo 1e-6); post-norm with no final encoder or decoder LayerNorm, as tbdzoo (and unlike
  ``nn.Transformer``, which adds one to each); Q, K and V are three GEMMs where tbdzoo fuses them.

Every Transformer contender gets label-smoothed (0.1) cross-entropy with the pad ignored, written
with ``F.cross_entropy`` as a user writes it. All sides get the same synthetic batch, the same
optimizer (SGD momentum 0.9 / weight decay 1e-4 for ResNet-50, Adam (0.9, 0.98, 1e-9) for the
Transformer; the fused implementation on every side), the same precision (TF32 or bf16 autocast, for the whole step) and memory format
(channels-last for ResNet-50), cuDNN's autotuner on, and ``torch.compile`` on the same function
(forward and loss) when compiled.

Per cell: build all, one step each, then one step each to measure peak memory: the allocator's
high-water mark during the step (``max_memory_allocated`` after a reset) less what the other
contenders hold (their weights, gradients, optimizer state and batch stay allocated meanwhile).
``--attribute`` then replays one more step per contender under the allocator's trace and lists
what is live at its peak, by the line that allocated it. Then warm-up, and ``repeats`` rounds
that time ``steps`` steps of each contender (order rotating), each round ending in a device
synchronisation. Reported: the median step time, throughput, and the tbdzoo/anchor ratios of
throughput and peak memory.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

SHAPES = {"resnet50": {"batch_size": 256},
          "transformer": {"batch_size": 128, "src_len": 128, "tgt_len": 128}}


# -- hand-written contenders ----------------------------------------------------------------
class HandwrittenTransformer(nn.Module):
    """The Transformer base as a PyTorch user writes it with torch.nn.Transformer."""

    def __init__(self, vocab=32000, d=512, heads=8, ffn=2048, layers=6, dropout=0.1, pad=0, max_len=1024):
        super().__init__()
        self.d, self.pad = d, pad
        self.embed = nn.Embedding(vocab, d)
        nn.init.normal_(self.embed.weight, std=d ** -0.5)
        self.core = nn.Transformer(d, heads, layers, layers, ffn, dropout, batch_first=True)
        self.drop = nn.Dropout(dropout)
        position = torch.arange(max_len)[:, None]
        rate = torch.pow(10000.0, -torch.arange(0, d, 2) / d)
        pe = torch.zeros(max_len, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
        self.register_buffer("pe", pe, persistent=False)

    def _embed(self, tokens):
        return self.drop(self.embed(tokens) * math.sqrt(self.d) + self.pe[: tokens.shape[1]])

    def forward(self, src, tgt):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        y = self.core(self._embed(src), self._embed(tgt), tgt_mask=causal, tgt_is_causal=True,
                      src_key_padding_mask=src == self.pad, tgt_key_padding_mask=tgt == self.pad,
                      memory_key_padding_mask=src == self.pad)
        return F.linear(y, self.embed.weight)


def handwritten(model_name, batch, device, channels_last):
    """(module, forward-and-loss function, optimizer, input tensors) as a user writes them."""
    if model_name == "resnet50":
        import torchvision
        net = torchvision.models.resnet50().to(device)
        x = torch.from_numpy(batch["images"]).to(device)
        if channels_last:
            net, x = net.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        y = torch.from_numpy(batch["labels"]).long().to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True)
        return net, (lambda: F.cross_entropy(net(x), y)), opt, [x, y]
    net = HandwrittenTransformer().to(device)
    src, tgt, labels = (torch.from_numpy(batch[k]).long().to(device) for k in ("src", "tgt_in", "labels"))
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def loss():
        logits = net(src, tgt)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=0, label_smoothing=0.1)
    return net, loss, opt, [src, tgt, labels]


def marian(batch, device):
    """(module, forward-and-loss function, optimizer, input tensors): MarianMTModel with tbdzoo's shapes."""
    from transformers import MarianConfig, MarianMTModel
    from tbdzoo.models.transformer import PAPER as hp
    config = MarianConfig(
        vocab_size=hp["vocab"], decoder_vocab_size=hp["vocab"], share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, d_model=hp["d_model"], encoder_layers=hp["encoder_layers"],
        decoder_layers=hp["decoder_layers"], encoder_attention_heads=hp["heads"],
        decoder_attention_heads=hp["heads"], encoder_ffn_dim=hp["ffn"], decoder_ffn_dim=hp["ffn"],
        activation_function="relu", dropout=hp["dropout"], activation_dropout=hp["dropout"],
        attention_dropout=hp["attention_dropout"], scale_embedding=True, pad_token_id=hp["pad_id"],
        bos_token_id=hp["bos_id"], eos_token_id=hp["eos_id"], decoder_start_token_id=hp["bos_id"],
        max_position_embeddings=1024, use_cache=False)
    net = MarianMTModel._from_config(config, attn_implementation="sdpa").to(device)
    assert net.config._attn_implementation == "sdpa", net.config._attn_implementation
    assert net.lm_head.weight is net.model.shared.weight, "output projection not tied"
    src, tgt, labels = (torch.from_numpy(batch[k]).long().to(device) for k in ("src", "tgt_in", "labels"))
    pad = hp["pad_id"]
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def loss():
        logits = net(input_ids=src, attention_mask=src != pad, decoder_input_ids=tgt,
                     decoder_attention_mask=tgt != pad).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=pad, label_smoothing=hp["label_smoothing"])
    return net, loss, opt, [src, tgt, labels]


def anchor_step(anchor, model_name, batch, device, precision, compiled, channels_last):
    """(step, resident): one training step of a hand-written contender, and the tensors it
    holds between steps."""
    build = marian if anchor == "marian" else (
        lambda b, d: handwritten(model_name, b, d, channels_last))
    net, loss_fn, opt, inputs = build(batch, device)
    if compiled:
        loss_fn = torch.compile(loss_fn)
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn()
        loss.backward()
        opt.step()

    def resident():
        return list(net.parameters()) + list(net.buffers()) + _grads_and_state(net.parameters(), opt) + inputs
    return step, resident


def _grads_and_state(params, optimizer):
    grads = [p.grad for p in params if p.grad is not None]
    return grads + [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


def tbdzoo_step(model_name, device, precision, compiled):
    from tbdzoo.backends.registry import build_native
    model = build_native(model_name, "torch", device=device, precision=precision,
                         execution="compiled" if compiled else "eager", **SHAPES[model_name])
    prepared = model.prepare_batch(model.synthetic_batch(seed=0))

    def resident():
        native = model.native
        return (list(native.parameters()) + list(native.buffers())
                + _grads_and_state(native.parameters(), model.optimizer) + list(prepared.native.values()))
    return model, (lambda: model.train_step(prepared, sync=False)), resident


# -- measuring -------------------------------------------------------------------------------
def _storage_bytes(tensors):
    storages = {}
    for t in tensors:
        if t is not None and t.is_cuda:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def peak_bytes(step, resident, device):
    """The step's high-water mark less what everything but this contender holds meanwhile."""
    torch.cuda.synchronize(device)
    others = torch.cuda.memory_allocated(device) - _storage_bytes(resident())
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - others


def _site(frames):
    """Where a block was allocated: the innermost line of tbdzoo, transformers or this script,
    and the PyTorch function it called."""
    if not frames:
        return "(no Python frame: autograd engine thread)"
    own = ("tbdzoo" + os.sep, "transformers" + os.sep, "benchmarks" + os.sep)
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
    at_peak, peak_event, seen = dict(live), None, 0
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
        seen = n
    if at_peak is None:
        at_peak = dict(live)
    groups = {}
    for size, site in at_peak.values():
        g = groups.setdefault(site, {"site": site, "bytes": 0, "blocks": 0, "sizes": {}})
        g["bytes"] += size
        g["blocks"] += 1
        g["sizes"][str(size)] = g["sizes"].get(str(size), 0) + 1
    ranked = sorted(groups.values(), key=lambda g: -g["bytes"])
    for g in ranked:  # the five most frequent block sizes suffice to recognise a tensor
        g["sizes"] = dict(sorted(g["sizes"].items(), key=lambda kv: -int(kv[0]) * kv[1])[:5])
    return {"replayed_peak": peak, "events": seen + 1,
            "peak_at_event": peak_event[0] if peak_event else None,
            "peak_set_by": {"site": peak_event[1], "bytes": peak_event[2]} if peak_event else None,
            "sites": ranked[:top], "other_sites_bytes": sum(g["bytes"] for g in ranked[top:])}


def run_cell(model_name, precision, compiled, device, warmup, steps, repeats, anchors, attribute):
    tf32 = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True  # as PyTorch's ImageNet example does; tbdzoo does too
    start = time.perf_counter()
    model, ours, our_resident = tbdzoo_step(model_name, device, precision, compiled)
    batch = model.synthetic_batch(seed=0)
    contenders = {"tbdzoo": (ours, our_resident)}
    for anchor in anchors:
        contenders[anchor] = anchor_step(anchor, model_name, batch, device, precision, compiled,
                                         channels_last=model.channels_last)
    for step, _ in contenders.values():  # first step compiles; then the memory step
        step()
    peaks = {name: peak_bytes(step, resident, device) for name, (step, resident) in contenders.items()}
    sites = {name: peak_sites(step, device) for name, (step, _) in contenders.items()} if attribute else None
    for step, _ in contenders.values():
        for _ in range(warmup):
            step()
    torch.cuda.synchronize(device)
    times = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(repeats):
        for name in order[r % len(order):] + order[:r % len(order)]:
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                contenders[name][0]()
            torch.cuda.synchronize(device)
            times[name].append((time.perf_counter() - t0) / steps)
    items = model.model_def.items(model.hparams, batch)
    padded_tokens = int(batch["labels"].size) if model_name == "transformer" else None
    result = {"model": model_name, "precision": precision,
              "execution": "compiled" if compiled else "eager",
              "batch": SHAPES[model_name], "unit": model.model_def.unit, "items_per_step": items,
              "padded_tokens_per_step": padded_tokens, "cell_seconds": time.perf_counter() - start}
    for name in contenders:
        median = statistics.median(times[name])
        result[name] = {"step_s": times[name], "step_s_median": median,
                        "throughput": items / median, "peak_bytes": peaks[name]}
        if sites:
            result[name]["at_peak"] = sites[name]
    result["ratios"] = {anchor: {"throughput": result["tbdzoo"]["throughput"] / result[anchor]["throughput"],
                                 "memory": peaks["tbdzoo"] / peaks[anchor]} for anchor in anchors}
    del model, ours, contenders
    torch.cuda.empty_cache()
    return result


def environment():
    props = torch.cuda.get_device_properties(0)
    from tbdzoo.profiling.gpu import device_info, framework_device_uuid, nvml_index
    info = device_info(nvml_index(0, framework_device_uuid("torch", 0))) or {}
    return {"gpu": props.name, "driver": info.get("driver"), "cuda_driver": info.get("cuda_driver"),
            "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "host_cpus": os.cpu_count()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,transformer")
    p.add_argument("--precisions", default="tf32,bf16")
    p.add_argument("--executions", default="eager,compiled")
    p.add_argument("--anchors", default="handwritten,marian",
                   help="Transformer contenders besides tbdzoo (ResNet-50 has only 'handwritten')")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--attribute", action="store_true",
                   help="also list what is live at each contender's peak, by allocation site")
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu_handwritten.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs a GPU", file=sys.stderr)
        return 2
    device = "cuda:0"
    results = {"command": " ".join(["benchmarks/gpu_handwritten.py"] + sys.argv[1:]),
               "environment": environment(), "cells": []}
    print("{:<12} {:<5} {:<9} {:<12} {:>14} {:>14} {:>8} {:>8} {:>16}".format(
        "model", "prec", "exec", "anchor", "tbdzoo", "anchor", "speed", "memory", "peak GiB"), flush=True)
    for model_name in args.models.split(","):
        anchors = args.anchors.split(",") if model_name == "transformer" else ["handwritten"]
        for execution in args.executions.split(","):
            for precision in args.precisions.split(","):
                cell = run_cell(model_name, precision, execution == "compiled", device,
                                args.warmup, args.steps, args.repeats, anchors, args.attribute)
                results["cells"].append(cell)
                for anchor in anchors:
                    print(("{:<12} {:<5} {:<9} {:<12} {:>14,.0f} {:>14,.0f} {:>7.3f}x {:>7.3f}x "
                           "{:>7.2f}/{:<7.2f} ({} {:.0f}s)").format(
                        model_name, precision, execution, anchor, cell["tbdzoo"]["throughput"],
                        cell[anchor]["throughput"], cell["ratios"][anchor]["throughput"],
                        cell["ratios"][anchor]["memory"], cell["tbdzoo"]["peak_bytes"] / 2 ** 30,
                        cell[anchor]["peak_bytes"] / 2 ** 30, cell["unit"], cell["cell_seconds"]), flush=True)
                os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                with open(args.out, "w") as f:  # rewritten after every cell: a cut run keeps its cells
                    json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
