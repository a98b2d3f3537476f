"""tbdzoo's PyTorch backend against hand-written training loops, on one GPU.

    python3 benchmarks/gpu_handwritten.py --out results.json          # every cell
    python3 benchmarks/gpu_handwritten.py --models resnet50 --executions eager

The hand-written contenders are what a user would write instead: torchvision's ``resnet50``
and a Transformer built from ``torch.nn.Transformer`` (6+6 layers, d_model 512, 8 heads, FFN
2048, dropout 0.1, post-norm) with a shared 32k embedding tied to the output projection,
sinusoidal positions and padding and causal masks. Both sides get the same synthetic batch, the
same optimizer (SGD momentum 0.9 / weight decay 1e-4 for ResNet-50, Adam (0.9, 0.98) for the
Transformer, PyTorch's default implementation for the hand-written side), the same precision
(TF32 or bf16 autocast, for the whole step) and memory format (channels-last for ResNet-50),
cuDNN's autotuner on for both, and ``torch.compile`` on the same function (forward and loss)
when compiled.

Per cell: build both, one step each to measure peak memory (``max_memory_allocated`` after a
reset), warm-up, then ``repeats`` rounds that time ``steps`` steps of one contender and then of
the other (order alternating), each round ending in a device synchronisation. Reported: the
median step time, throughput, and the tbdzoo/hand-written ratios of throughput and peak memory.
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
    """(forward-and-loss function, optimizer, params) as a user writes them."""
    if model_name == "resnet50":
        import torchvision
        net = torchvision.models.resnet50().to(device)
        x = torch.from_numpy(batch["images"]).to(device)
        if channels_last:
            net, x = net.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        y = torch.from_numpy(batch["labels"]).long().to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        return net, (lambda: F.cross_entropy(net(x), y)), opt
    net = HandwrittenTransformer().to(device)
    src, tgt, labels = (torch.from_numpy(batch[k]).long().to(device) for k in ("src", "tgt_in", "labels"))
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def loss():
        logits = net(src, tgt)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=0, label_smoothing=0.1)
    return net, loss, opt


def handwritten_step(model_name, batch, device, precision, compiled, channels_last):
    net, loss_fn, opt = handwritten(model_name, batch, device, channels_last)
    if compiled:
        loss_fn = torch.compile(loss_fn)
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn()
        loss.backward()
        opt.step()
    return step


def tbdzoo_step(model_name, device, precision, compiled):
    from tbdzoo.backends.registry import build_native
    model = build_native(model_name, "torch", device=device, precision=precision,
                         execution="compiled" if compiled else "eager", **SHAPES[model_name])
    prepared = model.prepare_batch(model.synthetic_batch(seed=0))
    return model, (lambda: model.train_step(prepared, sync=False))


# -- measuring -------------------------------------------------------------------------------
def peak_bytes(step, device):
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def run_cell(model_name, precision, compiled, device, warmup, steps, repeats):
    tf32 = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True  # as PyTorch's ImageNet example does; tbdzoo does too
    start = time.perf_counter()
    model, ours = tbdzoo_step(model_name, device, precision, compiled)
    batch = model.synthetic_batch(seed=0)
    theirs = handwritten_step(model_name, batch, device, precision, compiled,
                              channels_last=model.channels_last)
    contenders = {"tbdzoo": ours, "handwritten": theirs}
    for step in contenders.values():  # first step compiles; then the memory step
        step()
    peaks = {name: peak_bytes(step, device) for name, step in contenders.items()}
    for step in contenders.values():
        for _ in range(warmup):
            step()
    torch.cuda.synchronize(device)
    times = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(repeats):
        for name in (order if r % 2 == 0 else order[::-1]):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                contenders[name]()
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
    result["throughput_ratio"] = result["tbdzoo"]["throughput"] / result["handwritten"]["throughput"]
    result["memory_ratio"] = peaks["tbdzoo"] / peaks["handwritten"]
    del model, ours, theirs, contenders
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
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu_handwritten.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs a GPU", file=sys.stderr)
        return 2
    device = "cuda:0"
    results = {"command": " ".join(["benchmarks/gpu_handwritten.py"] + sys.argv[1:]),
               "environment": environment(), "cells": []}
    print("{:<12} {:<5} {:<9} {:>14} {:>14} {:>8} {:>8}".format(
        "model", "prec", "exec", "tbdzoo", "handwritten", "speed", "memory"), flush=True)
    for model_name in args.models.split(","):
        for execution in args.executions.split(","):
            for precision in args.precisions.split(","):
                cell = run_cell(model_name, precision, execution == "compiled", device,
                                args.warmup, args.steps, args.repeats)
                results["cells"].append(cell)
                print("{:<12} {:<5} {:<9} {:>14,.0f} {:>14,.0f} {:>7.3f}x {:>7.3f}x  ({} {:.0f}s)".format(
                    model_name, precision, execution, cell["tbdzoo"]["throughput"],
                    cell["handwritten"]["throughput"], cell["throughput_ratio"], cell["memory_ratio"],
                    cell["unit"], cell["cell_seconds"]), flush=True)
                os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                with open(args.out, "w") as f:  # rewritten after every cell: a cut run keeps its cells
                    json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
