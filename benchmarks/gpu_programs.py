"""tbdzoo's training programs on the PyTorch backend against PyTorch baselines, on one GPU.

    python3 -m benchmarks.gpu_programs --models wgan --profile --out benchmarks/results/h200_programs.json
    python3 -m benchmarks.gpu_programs --models inception_v3 --executions eager
    python3 -m benchmarks.gpu_programs --device cpu --tiny --executions eager --precisions tf32 \\
        --steps 1 --rounds 2 --processes 1 --warmup 1 --out /tmp/check.json    # a check that it runs

Run from the repository root. The baselines are written as a PyTorch user who wants speed writes
them, and each is built twice, in plain NCHW layout (``baseline_nchw``) and channels-last
(``baseline_channels_last``): both are timed and the faster is THE baseline of the cell.

- **WGAN-GP**: ``gan_64x64``'s residual generator and critic as ``nn.Module``s, one generator
  update then ``n_critic`` critic updates, Adam (1e-4, betas 0 and 0.9; fused on a GPU) for each
  network, generated images made under ``no_grad`` for the critic's updates. Eager, the penalty
  is ``torch.autograd.grad(create_graph=True)``, the usual idiom. Compiled, ``torch.compile``
  takes the generator's loss and the critic's whole loss, the penalty included: the penalty's
  input gradient is ``torch.func.grad`` of the critic's output sum (through
  ``torch.func.functional_call``) with respect to the interpolates, which Dynamo traces with no
  graph break; the compiled cells record that its parameter gradients equal the eager
  penalty's on the cell's batch (``checks.penalty_grad_rel_diff``).
- **Inception-v3**: torchvision's ``inception_v3`` with its auxiliary head, the loss
  ``CE(main) + 0.4 CE(aux)`` with label smoothing 0.1, ``torch.optim.RMSprop`` (lr 0.045, alpha
  0.9, eps 1.0, momentum 0.9, weight decay 4e-5, foreach) after ``clip_grad_norm_(2.0)``.
  PyTorch's RMSprop puts epsilon and the learning rate outside where tbdzoo's formula has them
  (docs/optimizers.md): the same work per step, different numbers. Batch 128.

Every side starts from tbdzoo's weights (WGAN-GP; Inception-v3 keeps torchvision's own
initialisation, which does not change the work), reads the same synthetic batch, runs under the
same precision (TF32, or bf16 autocast for the whole step) with cuDNN's autotuner on. The first
step's losses of each side go into the JSON (``first_loss``).

The repeat protocol (benchmarks/harness.py): the script runs itself ``--processes`` times (one
fresh interpreter after another, per execution mode), each process builds every contender, takes
one step each (first losses), one step each for peak memory, ``--warmup`` steps each, then
``--rounds`` interleaved rounds of ``--steps`` steps; ``--profile`` adds a torch.profiler summary
of each contender (kernels and device time per step) in the last process. The JSON holds each
cell's medians, spreads, ratios and verdicts, and every round's time.
"""
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import harness

MODELS = ("wgan", "inception_v3")
SHAPES = {"inception_v3": {"batch_size": 128}, "wgan": {"batch_size": 64}}
LAYOUTS = {"baseline_nchw": False, "baseline_channels_last": True}
BASELINES = tuple(LAYOUTS)


# -- WGAN-GP (gan_64x64's GoodGenerator and GoodDiscriminator) -----------------------------------
def batch_norm(c):
    """The generator's BatchNorm normalises by the batch's own statistics, always."""
    return nn.BatchNorm2d(c, track_running_stats=False)


class UpBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.shortcut = nn.Conv2d(cin, cout, 1)
        self.bn1, self.conv1 = batch_norm(cin), nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn2, self.conv2 = batch_norm(cout), nn.Conv2d(cout, cout, 3, padding=1)

    def forward(self, x):
        up = F.interpolate(x, scale_factor=2, mode="nearest")
        y = F.interpolate(F.relu(self.bn1(x)), scale_factor=2, mode="nearest")
        y = self.conv2(F.relu(self.bn2(self.conv1(y))))
        return self.shortcut(up) + y


class ChannelLayerNorm(nn.Module):
    """One mean and variance per example over (C, H, W), affine per channel."""

    def __init__(self, c, eps):
        super().__init__()
        self.eps = eps
        self.gamma, self.beta = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x):
        y = F.layer_norm(x, x.shape[1:], eps=self.eps)
        return y * self.gamma[:, None, None] + self.beta[:, None, None]


class DownBlock(nn.Module):
    def __init__(self, cin, cout, eps):
        super().__init__()
        self.shortcut = nn.Conv2d(cin, cout, 1)
        self.ln1, self.conv1 = ChannelLayerNorm(cin, eps), nn.Conv2d(cin, cin, 3, padding=1, bias=False)
        self.ln2, self.conv2 = ChannelLayerNorm(cin, eps), nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        y = self.conv2(F.relu(self.ln2(self.conv1(F.relu(self.ln1(x))))))
        return self.shortcut(F.avg_pool2d(x, 2)) + F.avg_pool2d(y, 2)


class Generator(nn.Module):
    def __init__(self, dim, z):
        super().__init__()
        self.dim = dim
        self.input = nn.Linear(z, 4 * 4 * 8 * dim)
        for i, (cin, cout) in enumerate(((8 * dim, 8 * dim), (8 * dim, 4 * dim), (4 * dim, 2 * dim),
                                         (2 * dim, dim))):
            setattr(self, "res{}".format(i + 1), UpBlock(cin, cout))
        self.output_bn, self.output = batch_norm(dim), nn.Conv2d(dim, 3, 3, padding=1)

    def forward(self, z):
        x = self.input(z).view(-1, 8 * self.dim, 4, 4)
        x = self.res4(self.res3(self.res2(self.res1(x))))
        return torch.tanh(self.output(F.relu(self.output_bn(x))))


class Critic(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.input = nn.Conv2d(3, dim, 3, padding=1)
        for i, (cin, cout) in enumerate(((dim, 2 * dim), (2 * dim, 4 * dim), (4 * dim, 8 * dim),
                                         (8 * dim, 8 * dim))):
            setattr(self, "res{}".format(i + 1), DownBlock(cin, cout, eps))
        self.output = nn.Linear(4 * 4 * 8 * dim, 1)

    def forward(self, x):
        x = self.res4(self.res3(self.res2(self.res1(self.input(x)))))
        return self.output(x.flatten(1))


def wgan_state(weights, prefix):
    """tbdzoo's weights of one network (``generator`` or ``critic``) as its module's state dict."""
    state = {}
    for name, value in weights.items():
        if not name.startswith(prefix + "."):
            continue
        key = name[len(prefix) + 1:]
        if prefix == "generator":  # BatchNorm's affine parameters are weight and bias in nn
            key = key.replace(".gamma", ".weight").replace(".beta", ".bias")
        state[key] = torch.as_tensor(value)
    return state


def adam(params, hp, device):
    return torch.optim.Adam(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            **fast_optimizer(device))


def fast_optimizer(device):
    """Fused on a GPU, foreach elsewhere."""
    return {"fused": True} if str(device).startswith("cuda") else {"foreach": True}


class WganBaseline:
    """One layout's generator, critic, optimizers and compiled or eager losses."""

    def __init__(self, hp, weights, batch, device, precision, compiled, channels_last):
        self.hp, self.batch_size, self.device = hp, hp["batch_size"], device
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        g, d = Generator(hp["dim"], hp["z_dim"]), Critic(hp["dim"], hp["ln_eps"])
        g.load_state_dict(wgan_state(weights, "generator"))
        d.load_state_dict(wgan_state(weights, "critic"))
        self.g, self.d = g.to(device, memory_format=fmt), d.to(device, memory_format=fmt)
        self.opt_g, self.opt_d = adam(self.g.parameters(), hp, device), adam(self.d.parameters(), hp, device)
        self.noise = torch.from_numpy(batch["noise"]).to(device)
        self.real = torch.from_numpy(batch["real"]).to(device).contiguous(memory_format=fmt)
        self.alpha = torch.from_numpy(batch["alpha"]).to(device)
        self.autocast = torch.autocast(str(device).split(":")[0], dtype=torch.bfloat16,
                                       enabled=precision == "bf16")
        self.generator_loss, self.critic_loss = self._generator_loss, self.critic_loss_autograd
        if compiled:
            self.generator_loss = torch.compile(self._generator_loss)
            self.critic_loss = torch.compile(self.critic_loss_func)

    def _generator_loss(self, z):
        return -self.d(self.g(z)).mean()

    def _mixed(self, z, x, a):
        with torch.no_grad():
            fake = self.g(z)
        a = a.view(-1, 1, 1, 1)
        return fake, a * fake + (1 - a) * x

    def _penalty(self, grad):
        return self.hp["gp_weight"] * ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()

    def critic_loss_autograd(self, z, x, a):
        """The eager idiom: the penalty's input gradient by autograd.grad(create_graph=True)."""
        fake, mixed = self._mixed(z, x, a)
        mixed = mixed.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(self.d(mixed).sum(), mixed, create_graph=True)
        return self.d(fake).mean() - self.d(x).mean() + self._penalty(grad)

    def critic_loss_func(self, z, x, a):
        """The same loss with the input gradient by torch.func.grad: it compiles whole."""
        fake, mixed = self._mixed(z, x, a)
        params = dict(self.d.named_parameters())

        def output_sum(inputs):
            return torch.func.functional_call(self.d, params, (inputs,)).sum()
        grad = torch.func.grad(output_sum)(mixed)
        return self.d(fake).mean() - self.d(x).mean() + self._penalty(grad)

    def critic_rows(self, i):
        b = self.batch_size
        rows = slice(i * b, (i + 1) * b)
        return self.noise[b:][rows], self.real[rows], self.alpha[rows]

    def step(self):
        b = self.batch_size
        for p in self.d.parameters():
            p.requires_grad_(False)
        self.opt_g.zero_grad(set_to_none=True)
        with self.autocast:
            g_loss = self.generator_loss(self.noise[:b])
        g_loss.backward()
        self.opt_g.step()
        for p in self.d.parameters():
            p.requires_grad_(True)
        for i in range(self.hp["n_critic"]):
            self.opt_d.zero_grad(set_to_none=True)
            with self.autocast:
                d_loss = self.critic_loss(*self.critic_rows(i))
            d_loss.backward()
            self.opt_d.step()
        return {"generator": g_loss.detach(), "critic": d_loss.detach()}

    def penalty_gradient_check(self):
        """Relative difference between the critic's parameter gradients of ``critic_loss`` (the
        step's own: compiled torch.func when compiled) and of the eager autograd.grad penalty,
        on the first critic batch, from the same weights. Leaves no gradients behind."""
        grads = []
        for fn in (self.critic_loss, self.critic_loss_autograd):
            self.opt_d.zero_grad(set_to_none=True)
            with self.autocast:
                loss = fn(*self.critic_rows(0))
            loss.backward()
            grads.append(torch.cat([p.grad.float().flatten() for p in self.d.parameters()]))
        self.opt_d.zero_grad(set_to_none=True)
        return float((grads[0] - grads[1]).norm() / grads[1].norm())

    def held(self):
        return harness.held_bytes([self.g, self.d], [self.opt_g, self.opt_d])


# -- Inception-v3 ---------------------------------------------------------------------------------
class InceptionBaseline:
    def __init__(self, hp, weights, batch, device, precision, compiled, channels_last):
        import torchvision
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.net = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False,
                                                   dropout=0.5).to(device, memory_format=fmt)
        self.x = torch.from_numpy(batch["images"]).to(device).contiguous(memory_format=fmt)
        self.y = torch.from_numpy(batch["labels"]).long().to(device)
        self.opt = torch.optim.RMSprop(self.net.parameters(), lr=0.045, alpha=0.9, eps=1.0,
                                       momentum=0.9, weight_decay=4e-5, foreach=True)
        self.autocast = torch.autocast(str(device).split(":")[0], dtype=torch.bfloat16,
                                       enabled=precision == "bf16")
        self.loss = torch.compile(self._loss) if compiled else self._loss
        self.net.train()

    def _loss(self):
        logits, aux = self.net(self.x)
        return F.cross_entropy(logits, self.y, label_smoothing=0.1) + \
            0.4 * F.cross_entropy(aux, self.y, label_smoothing=0.1)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        with self.autocast:
            loss = self.loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 2.0, foreach=True)
        self.opt.step()
        return loss.detach()

    def held(self):
        return harness.held_bytes([self.net], [self.opt])


BASELINE_CLASS = {"wgan": WganBaseline, "inception_v3": InceptionBaseline}


def as_floats(value):
    if isinstance(value, dict):
        return {k: float(v) for k, v in value.items()}
    return float(value)


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
    sizes = dict(SHAPES[model_name])
    if args.batch_size:
        sizes["batch_size"] = args.batch_size
    ours_precision = precision if cuda or precision != "tf32" else "fp32"
    model = build_native(model_name, "torch", config="tiny" if args.tiny else "paper", device=device,
                         precision=ours_precision, execution="compiled" if compiled else "eager", **sizes)
    batch = model.synthetic_batch(seed=0)
    prepared = model.prepare_batch(batch)
    weights = model.get_weights()
    baselines = {name: BASELINE_CLASS[model_name](model.hparams, weights, batch, device, precision,
                                                  compiled, channels_last)
                 for name, channels_last in LAYOUTS.items()}
    checks = {}
    if compiled and model_name == "wgan":
        checks["penalty_grad_rel_diff"] = {name: b.penalty_gradient_check() for name, b in baselines.items()}
    contenders = {"tbdzoo": lambda: model.train_step(prepared, sync=False)}
    contenders.update({name: b.step for name, b in baselines.items()})
    held = {"tbdzoo": lambda: harness.held_bytes([model.native], model.torch_optimizers)}
    held.update({name: b.held for name, b in baselines.items()})
    first = {name: as_floats(model.train_step(prepared) if name == "tbdzoo" else step())
             for name, step in contenders.items()}  # a synchronised step returns tbdzoo's losses
    peaks = harness.peak_memory(contenders, held, device)
    times = harness.warm_and_time(contenders, device, args.warmup, args.steps, args.rounds)
    cell = harness.cell_record(args, device, contenders, start, model, batch, model_name, precision,
                               "compiled" if compiled else "eager", times, peaks, first, checks)
    return cell


def worker(args, device):
    return harness.run_cells(args, device, run_cell)


def arguments(argv=None):
    p = harness.comparison_parser(__doc__, "gpu_programs.json", warmup=3, models=MODELS)
    harness.add_process_options(p, "gpu_programs.json")
    args = p.parse_args(argv)
    harness.check_choices(p, args, models=MODELS)
    return p, args


def main(argv=None):
    return harness.main("benchmarks.gpu_programs", arguments, worker, argv)


if __name__ == "__main__":
    sys.exit(main())
