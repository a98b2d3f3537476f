"""WGAN-GP at 64 x 64 (Gulrajani et al. 2017, ``gan_64x64.py``'s GoodGenerator and
GoodDiscriminator), and the original weight-clipped WGAN (Arjovsky et al. 2017) by a switch.

One graph holds the generator and the critic; the critic runs on real images, on generated
ones and (WGAN-GP) on their random interpolates, sharing its parameters across the three. The
training program alternates: one generator update, then ``n_critic`` critic updates, each on a
batch of its own. The gradient penalty's input gradient is written out as ordinary nodes
(tbdzoo/spec/derivative.py), so every backend trains it by differentiating once.

Values carry their source: [G] ``gan_64x64.py`` of improved_wgan_training, [A] Arjovsky et al.
"""
import numpy as np

from ...spec import Graph
from ...spec.derivative import input_gradient
from ...spec.program import Program, optimizer_of
from .. import metrics
from ..card import Benchmark, Consistency, Measured, Training
from ..constraints import choice, integer, number
from ..registry import register_model

MODES = ("wgan-gp", "wgan")

PAPER = {
    "mode": "wgan-gp",             # [G] MODE; 'wgan' is the weight-clipped original
    "image_size": 64, "dim": 64,   # [G] DIM
    "z_dim": 128,                  # [G] noise of 128
    "n_critic": 5,                 # [G] CRITIC_ITERS
    "gp_weight": 10.0,             # [G] LAMBDA
    "clip_value": 0.01,            # [A] critic weights clipped to [-0.01, 0.01] ('wgan' mode)
    "bn_eps": 1e-5, "ln_eps": 1e-5,  # [G] fused_batch_norm and Layernorm epsilons
    "batch_size": 64,              # [G] BATCH_SIZE
    # [G] Adam 1e-4, betas (0, 0.9), TF1's epsilon 1e-8, for both networks ('wgan-gp');
    # [A] RMSProp 5e-5 ('wgan'): TF1's RMSPropOptimizer defaults decay 0.9, epsilon 1e-10.
    "optimizer": "adam", "lr": 1e-4, "beta1": 0.0, "beta2": 0.9, "eps": 1e-8,
    "alpha": 0.9, "momentum": 0.0, "centered": False,   # read by RMSProp only
    "weight_decay": 0.0, "lr_schedule": "constant",
}

# [A] the original WGAN: weight clipping instead of the penalty, RMSProp 5e-5.
ORIGINAL = dict(PAPER, mode="wgan", optimizer="rmsprop", lr=5e-5, eps=1e-10)

# Four residual blocks need a 64-pixel image (4 x 4 after four halvings); the tiny config keeps
# the size and the blocks and narrows every layer.
TINY = dict(PAPER, dim=4, z_dim=8, batch_size=3, n_critic=2)
TINY_ORIGINAL = dict(ORIGINAL, dim=4, z_dim=8, batch_size=3, n_critic=2)

RULES = {
    "mode": choice(*MODES), "image_size": choice(64), "dim": integer(1), "z_dim": integer(1),
    "n_critic": integer(1), "gp_weight": number(0.0), "clip_value": number(0.0, open_low=True),
    "bn_eps": number(0.0, open_low=True), "ln_eps": number(0.0, open_low=True),
}


def _uniform(stdev):
    """tflib draws U(-stdev sqrt 3, stdev sqrt 3)."""
    return ("uniform", float(stdev * np.sqrt(3.0)))


def _conv_init(cin, cout, k, he):
    """tflib's Conv2D: stdev sqrt(4 / (fan_in + fan_out)) with He init, sqrt(2 / ...) without."""
    fan_in, fan_out = cin * k * k, cout * k * k
    return _uniform(np.sqrt((4.0 if he else 2.0) / (fan_in + fan_out)))


class _Nets:
    def __init__(self, g, hp):
        self.g, self.hp = g, hp

    def conv(self, name, x, cout, k, he, bias, share=None):
        g = self.g
        cin = g.shape_of(x)[0]
        pad = (k - 1) // 2   # tflib's 'SAME' at stride 1 with odd kernels: symmetric
        kw = {"shared": {s: share + "." + s for s in (("weight", "bias") if bias else ("weight",))}} \
            if share else {}
        return g.add(name, "conv2d", x, filters=cout, kernel=k, padding=pad, use_bias=bias,
                     weight_init=_conv_init(cin, cout, k, he), **kw)

    # -- generator -----------------------------------------------------------------------
    def generator(self, z):
        g, hp, d = self.g, self.hp, self.hp["dim"]
        x = g.add("generator.input", "dense", z, units=4 * 4 * 8 * d,
                  init=_uniform(np.sqrt(2.0 / (hp["z_dim"] + 4 * 4 * 8 * d))))
        x = g.add("generator.reshape", "reshape", x, shape=(8 * d, 4, 4))
        for i, (_, cout) in enumerate(((8 * d, 8 * d), (8 * d, 4 * d), (4 * d, 2 * d), (2 * d, d))):
            x = self.up_block("generator.res{}".format(i + 1), x, cout)
        x = self.bn("generator.output_bn", x)
        x = g.add("generator.output_relu", "relu", x)
        x = self.conv("generator.output", x, 3, 3, he=True, bias=True)
        return g.add("generator.tanh", "tanh", x)

    def bn(self, name, x):
        """The generator's BatchNorm always normalises by the batch ([G] fused_batch_norm in
        training mode, also when sampling)."""
        return self.g.add(name, "batchnorm", x, eps=self.hp["bn_eps"], track_running_stats=False)

    def up_block(self, p, x, cout):
        g = self.g
        g.block(p, "UpBlock")
        short = g.add(p + ".shortcut_up", "upsample_nearest", x, factor=2)
        short = self.conv(p + ".shortcut", short, cout, 1, he=False, bias=True)
        y = self.bn(p + ".bn1", x)
        y = g.add(p + ".relu1", "relu", y)
        y = g.add(p + ".up", "upsample_nearest", y, factor=2)
        y = self.conv(p + ".conv1", y, cout, 3, he=True, bias=False)
        y = self.bn(p + ".bn2", y)
        y = g.add(p + ".relu2", "relu", y)
        y = self.conv(p + ".conv2", y, cout, 3, he=True, bias=True)
        return g.add(p + ".add", "add", [short, y])

    # -- critic ------------------------------------------------------------------------
    def critic(self, prefix, x, owner=None):
        """The critic as nodes ``prefix.*``; with ``owner``, every parameter is shared with the
        instance of that prefix (the same network applied to another input)."""
        g, d = self.g, self.hp["dim"]
        share = (lambda name: owner + name) if owner else (lambda name: None)
        if owner is None:
            g.block(prefix, "Critic")
            for i in range(4):
                g.block("{}.res{}".format(prefix, i + 1), "DownBlock")
        x = self.conv(prefix + ".input", x, d, 3, he=False, bias=True, share=share(".input"))
        for i, (_, cout) in enumerate(((d, 2 * d), (2 * d, 4 * d), (4 * d, 8 * d), (8 * d, 8 * d))):
            x = self.down_block(prefix, ".res{}".format(i + 1), x, cout, share)
        x = g.add(prefix + ".flatten", "reshape", x, shape=(4 * 4 * 8 * d,))
        kw = {"shared": {"weight": owner + ".output.weight", "bias": owner + ".output.bias"}} \
            if owner else {}
        return g.add(prefix + ".output", "dense", x, units=1,
                     init=_uniform(np.sqrt(2.0 / (4 * 4 * 8 * d + 1))), **kw)

    def ln(self, name, x, share):
        kw = {"shared": {"gamma": share + ".gamma", "beta": share + ".beta"}} if share else {}
        return self.g.add(name, "channel_layernorm", x, eps=self.hp["ln_eps"], **kw)

    def down_block(self, prefix, p, x, cout, share):
        g = self.g
        cin = g.shape_of(x)[0]
        short = g.add(prefix + p + ".shortcut_pool", "avgpool2d", x, kernel=2)
        short = self.conv(prefix + p + ".shortcut", short, cout, 1, he=False, bias=True,
                          share=share(p + ".shortcut"))
        y = self.ln(prefix + p + ".ln1", x, share(p + ".ln1"))
        y = g.add(prefix + p + ".relu1", "relu", y)
        y = self.conv(prefix + p + ".conv1", y, cin, 3, he=True, bias=False, share=share(p + ".conv1"))
        y = self.ln(prefix + p + ".ln2", y, share(p + ".ln2"))
        y = g.add(prefix + p + ".relu2", "relu", y)
        y = self.conv(prefix + p + ".conv2", y, cout, 3, he=True, bias=True, share=share(p + ".conv2"))
        y = g.add(prefix + p + ".pool", "avgpool2d", y, kernel=2)
        return g.add(prefix + p + ".add", "add", [short, y])


def _batch(hp, batch_size, seed):
    """Real images in [-1, 1] ([G] scales bytes to 2 (x / 255 - 0.5)), noise N(0, 1), and the
    interpolation weights U[0, 1) of the penalty."""
    rng = np.random.RandomState(seed)
    size = hp["image_size"]
    pixels = rng.randint(0, 256, (batch_size, 3, size, size))
    return {"real": (2.0 * (pixels / 255.0 - 0.5)).astype(np.float32),
            "noise": rng.standard_normal((batch_size, hp["z_dim"])).astype(np.float32),
            "alpha": rng.uniform(0.0, 1.0, (batch_size, 1)).astype(np.float32)}


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# The proxy: the residual generator and critic at 64 x 64 with every layer 16 times narrower
# (dim 4), batch 16; the paper's Adam (betas 0 and 0.9) and five critic updates a step, at lr
# 1e-3: at the paper's 1e-4 a seed in three reached no target within 6 minutes on any backend
# (reports/2026-12-time-to-accuracy.md, "Measured: WGAN"). Its task draws batches for one process: no
# data-parallel training to a target.
TRAINING = Training(metrics=(metrics.FRECHET,), target="frechet=30", eval_every=20,
                    task="tbdzoo.training.gan_task:GanTask", proxy={"dim": 4, "batch_size": 16, "lr": 1e-3})
# A batch that keeps a full-size training step to seconds on a small CPU.
BENCHMARK = Benchmark(cpu_batch_size=2)
# The generator's and the critic's objectives, the gradient penalty included. Seed 1: at seed
# 0 inputs of the generator's ReLUs sit within float32 rounding of zero (docs/consistency.md),
# so which side they land on follows the order of float32 sums. The loss (both configs): the
# critic's mean D(fake) - mean D(real), about -0.53 from terms of about 1.05 and 1.6, and every
# backend's critic output is a few float32 roundings off (6.4e-7 to 7.1e-7 of its largest on
# CNTK and TensorFlow, layer by layer as PyTorch's): the difference keeps their absolute
# error, about 1e-6 (CNTK: 2e-6 relative on the original WGAN's critic). atol 3e-6 holds that
# and still fails any of its losses 2e-5 off.
CONSISTENCY = Consistency(seed=1, tolerances={"loss": {"rtol": 1e-6, "atol": 3e-6}})
MEASURED = Measured(parameters=16032324, flops_per_example=93003476992)


@register_model("wgan", domain="adversarial learning", configs={"paper": PAPER, "tiny": TINY, "original": ORIGINAL,
                         "tiny_original": TINY_ORIGINAL},
                unit="images/s", items=lambda hp, batch: len(batch["noise"]), synthetic_batch=_batch,
                rules=RULES,
                training=TRAINING, benchmark=BENCHMARK, consistency=CONSISTENCY, measured=MEASURED)
def build(hp):
    if hp["mode"] not in MODES:
        raise ValueError("mode {!r}: known {}".format(hp["mode"], ", ".join(MODES)))
    g = Graph("wgan")
    g.block("", "WGAN")
    g.block("generator", "Generator")
    size = hp["image_size"]
    noise = g.input("noise", (hp["z_dim"],))
    real = g.input("real", (3, size, size))
    nets = _Nets(g, hp)
    fake = nets.generator(noise)
    g.set_output(fake)
    real_score = nets.critic("critic", real)
    fake_score = nets.critic("critic@fake", fake, owner="critic")

    p = Program()
    p.loss("fake_score", "mean", x=fake_score)
    p.loss("real_score", "mean", x=real_score)
    critic_terms = [("fake_score", 1.0), ("real_score", -1.0)]
    if hp["mode"] == "wgan-gp":
        alpha = g.input("alpha", (1,))
        mixed = g.add("interpolates", "lerp", [fake, real, alpha])
        mixed_score = nets.critic("critic@mixed", mixed, owner="critic")
        grad = input_gradient(g, mixed_score, mixed, "penalty")
        p.loss("gradient_penalty", "norm_penalty", x=grad, target=1.0)
        critic_terms.append(("gradient_penalty", hp["gp_weight"]))
    p.objective("generator", [("fake_score", -1.0)])
    p.objective("critic", critic_terms)
    optimizer = _optimizer(hp)
    p.group("generator", ["generator"], optimizer)
    p.group("critic", ["critic"], optimizer)
    p.phase("generator", "generator", "generator")
    hooks = [{"kind": "clip_weights", "group": "critic", "value": hp["clip_value"]}] \
        if hp["mode"] == "wgan" else []
    p.phase("critic", "critic", "critic", repeat=hp["n_critic"], hooks=hooks)
    g.set_program(p)
    return g


def _optimizer(hp):
    return optimizer_of(hp)
