"""tbdzoo's training programs on the PyTorch backend against hand-written loops, on one GPU.

    python3 benchmarks/gpu_programs.py --out results.json
    python3 benchmarks/gpu_programs.py --models wgan --executions eager

The hand-written contenders are what a PyTorch user writes instead:

- **Inception-v3**: torchvision's ``inception_v3`` with its auxiliary head, the loss
  ``CE(main) + 0.4 CE(aux)`` with label smoothing 0.1, ``torch.optim.RMSprop`` (lr 0.045, alpha
  0.9, eps 1.0, momentum 0.9, weight decay 4e-5) after ``clip_grad_norm_(2.0)``. PyTorch's RMSprop
  puts epsilon and the learning rate outside where tbdzoo's formula has them (docs/optimizers.md):
  the same work per step, different numbers.
- **WGAN-GP**: ``gan_64x64``'s residual generator and critic as ``nn.Module``s, one generator
  update then five critic updates, the penalty by ``torch.autograd.grad(create_graph=True)``,
  Adam (1e-4, betas 0 and 0.9) for each network, generated images detached in the critic's
  updates. Compiled, everything but the penalty goes through ``torch.compile``: its double
  backward cannot (aot_autograd refuses it), so users leave it eager. tbdzoo writes the
  penalty's input gradient as nodes (docs/programs.md) instead, and compiles all of it.

Both sides get the same synthetic batches, the same precision (TF32 or bf16 autocast for the
whole step), channels-last memory, cuDNN's autotuner, and ``torch.compile`` of their step's
forward-and-loss functions when compiled. Per cell: build both, one step each, peak memory of one
step (``max_memory_allocated`` after a reset, less what the other contender holds), warm-up, then
``repeats`` rounds of ``steps`` steps of each in alternating order, each round synchronised.
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from gpu_handwritten import environment, peak_sites  # noqa: E402

SHAPES = {"inception_v3": {"batch_size": 32}, "wgan": {"batch_size": 64}}


# -- hand-written WGAN-GP (gan_64x64's GoodGenerator and GoodDiscriminator) ------------------
class UpBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.shortcut = nn.Conv2d(cin, cout, 1)
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, padding=1)

    def forward(self, x):
        up = F.interpolate(x, scale_factor=2, mode="nearest")
        y = F.interpolate(F.relu(self.bn1(x)), scale_factor=2, mode="nearest")
        y = self.conv2(F.relu(self.bn2(self.conv1(y))))
        return self.shortcut(up) + y


class DownBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.shortcut = nn.Conv2d(cin, cout, 1)
        self.ln1, self.conv1 = ChannelLayerNorm(cin), nn.Conv2d(cin, cin, 3, padding=1, bias=False)
        self.ln2, self.conv2 = ChannelLayerNorm(cin), nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        y = self.conv2(F.relu(self.ln2(self.conv1(F.relu(self.ln1(x))))))
        return self.shortcut(F.avg_pool2d(x, 2)) + F.avg_pool2d(y, 2)


class ChannelLayerNorm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gamma, self.beta = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x):
        y = F.layer_norm(x, x.shape[1:], eps=1e-5)
        return y * self.gamma[:, None, None] + self.beta[:, None, None]


class Generator(nn.Module):
    def __init__(self, dim=64, z=128):
        super().__init__()
        self.dim = dim
        self.input = nn.Linear(z, 4 * 4 * 8 * dim)
        self.blocks = nn.Sequential(UpBlock(8 * dim, 8 * dim), UpBlock(8 * dim, 4 * dim),
                                    UpBlock(4 * dim, 2 * dim), UpBlock(2 * dim, dim))
        self.bn, self.output = nn.BatchNorm2d(dim, track_running_stats=False), nn.Conv2d(dim, 3, 3, padding=1)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.track_running_stats, m.running_mean, m.running_var = False, None, None

    def forward(self, z):
        x = self.blocks(self.input(z).view(-1, 8 * self.dim, 4, 4))
        return torch.tanh(self.output(F.relu(self.bn(x))))


class Critic(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.input = nn.Conv2d(3, dim, 3, padding=1)
        self.blocks = nn.Sequential(DownBlock(dim, 2 * dim), DownBlock(2 * dim, 4 * dim),
                                    DownBlock(4 * dim, 8 * dim), DownBlock(8 * dim, 8 * dim))
        self.output = nn.Linear(4 * 4 * 8 * dim, 1)

    def forward(self, x):
        return self.output(self.blocks(self.input(x)).flatten(1))


def handwritten_wgan(step_batch, device, precision, compiled, n_critic=5, batch=64, dim=64):
    g, d = Generator(dim).to(device), Critic(dim).to(device)
    g, d = g.to(memory_format=torch.channels_last), d.to(memory_format=torch.channels_last)
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-4, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-4, betas=(0.0, 0.9))
    noise = torch.from_numpy(step_batch["noise"]).to(device)
    real = torch.from_numpy(step_batch["real"]).to(device).contiguous(memory_format=torch.channels_last)
    alpha = torch.from_numpy(step_batch["alpha"]).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")

    def generator_loss(z):
        return -d(g(z)).mean()

    def generate(z):
        with torch.no_grad():
            return g(z)

    def scores(fake, x):
        return d(fake).mean() - d(x).mean()

    def penalty(fake, x, a):
        a = a.view(-1, 1, 1, 1)
        mixed = (a * fake + (1 - a) * x).detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(d(mixed).sum(), mixed, create_graph=True)
        return ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()

    if compiled:  # the penalty's double backward stays eager: aot_autograd refuses it
        generator_loss, generate, scores = map(torch.compile, (generator_loss, generate, scores))

    def critic_loss(z, x, a):
        fake = generate(z)
        return scores(fake, x) + 10.0 * penalty(fake, x, a)

    def step():
        for p in d.parameters():
            p.requires_grad_(False)
        opt_g.zero_grad(set_to_none=True)
        with autocast:
            loss = generator_loss(noise[:batch])
        loss.backward()
        opt_g.step()
        for p in d.parameters():
            p.requires_grad_(True)
        for i in range(n_critic):
            rows = slice(i * batch, (i + 1) * batch)
            opt_d.zero_grad(set_to_none=True)
            with autocast:
                loss = critic_loss(noise[batch:][rows], real[rows], alpha[rows])
            loss.backward()
            opt_d.step()
    return [g, d], [opt_g, opt_d], step


def handwritten_inception(batch, device, precision, compiled):
    import torchvision
    net = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False,
                                          dropout=0.5).to(device).to(memory_format=torch.channels_last)
    x = torch.from_numpy(batch["images"]).to(device).contiguous(memory_format=torch.channels_last)
    y = torch.from_numpy(batch["labels"]).long().to(device)
    opt = torch.optim.RMSprop(net.parameters(), lr=0.045, alpha=0.9, eps=1.0, momentum=0.9,
                              weight_decay=4e-5)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")

    def loss_fn():
        logits, aux = net(x)
        return F.cross_entropy(logits, y, label_smoothing=0.1) + \
            0.4 * F.cross_entropy(aux, y, label_smoothing=0.1)
    if compiled:
        loss_fn = torch.compile(loss_fn)
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 2.0, foreach=True)
        opt.step()
    return [net], [opt], step


# -- measuring -------------------------------------------------------------------------------
def held_bytes(modules, optimizers):
    """Parameters, gradients and optimizer state a contender keeps between steps."""
    total = 0
    for m in modules:
        for p in m.parameters():
            total += p.nbytes + (p.grad.nbytes if p.grad is not None else 0)
    for opt in optimizers:
        total += sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    return total


def peak_bytes(step, device):
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def run_cell(model_name, precision, compiled, device, warmup, steps, repeats, attribute=False):
    from tbdzoo.backends.registry import build_native
    tf32 = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    start = time.perf_counter()
    model = build_native(model_name, "torch", device=device, precision=precision,
                         execution="compiled" if compiled else "eager", **SHAPES[model_name])
    batch = model.synthetic_batch(seed=0)
    prepared = model.prepare_batch(batch)
    ours = lambda: model.train_step(prepared, sync=False)  # noqa: E731
    if model_name == "wgan":
        modules, opts, theirs = handwritten_wgan(batch, device, precision, compiled)
    else:
        modules, opts, theirs = handwritten_inception(batch, device, precision, compiled)
    contenders = {"tbdzoo": ours, "handwritten": theirs}
    for step in contenders.values():
        step()
    torch.cuda.synchronize(device)
    alone = {"tbdzoo": peak_bytes(ours, device) - held_bytes(modules, opts),
             "handwritten": peak_bytes(theirs, device) - held_bytes(
                 [model.native], list(model._optimizers.values()))}
    sites = {name: peak_sites(step, device) for name, step in contenders.items()} if attribute else None
    for step in contenders.values():
        for _ in range(warmup):
            step()
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
    result = {"model": model_name, "precision": precision, "execution": "compiled" if compiled else "eager",
              "batch": SHAPES[model_name], "unit": model.model_def.unit, "items_per_step": items,
              "cell_seconds": time.perf_counter() - start}
    for name in contenders:
        median = statistics.median(times[name])
        result[name] = {"step_s": times[name], "step_s_median": median, "throughput": items / median,
                        "peak_bytes": alone[name]}
    result["throughput_ratio"] = result["tbdzoo"]["throughput"] / result["handwritten"]["throughput"]
    result["memory_ratio"] = alone["tbdzoo"] / alone["handwritten"]
    if sites:
        result["peak_sites"] = sites
    del model, modules, opts, contenders, ours, theirs
    torch.cuda.empty_cache()
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="inception_v3,wgan")
    p.add_argument("--precisions", default="tf32,bf16")
    p.add_argument("--executions", default="eager,compiled")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--attribute", action="store_true",
                   help="also replay each contender's allocator trace to its peak and group the "
                        "blocks live then by allocation site")
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu_programs.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs a GPU", file=sys.stderr)
        return 2
    device = "cuda:0"
    results = {"command": " ".join(["benchmarks/gpu_programs.py"] + sys.argv[1:]),
               "environment": environment(), "cells": []}
    for model_name in args.models.split(","):
        for execution in args.executions.split(","):
            for precision in args.precisions.split(","):
                try:
                    cell = run_cell(model_name, precision, execution == "compiled", device,
                                    args.warmup, args.steps, args.repeats, args.attribute)
                except Exception as e:  # a failed cell is recorded, the others still run
                    traceback.print_exc()
                    cell = {"model": model_name, "precision": precision, "execution": execution,
                            "error": "{}: {}".format(type(e).__name__, e)}
                    print(cell, flush=True)
                else:
                    print("{:<13} {:<5} {:<9} {:>10,.0f} {:>10,.0f} {:>7.3f}x speed {:>7.3f}x memory ({:.0f}s)".format(
                        model_name, precision, execution, cell["tbdzoo"]["throughput"],
                        cell["handwritten"]["throughput"], cell["throughput_ratio"],
                        cell["memory_ratio"], cell["cell_seconds"]), flush=True)
                results["cells"].append(cell)
                os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
