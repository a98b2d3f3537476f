"""A3C's actor-critic (Mnih et al. 2016) and its update as a training program.

The network maps an observation to a softmax policy's logits and a linear value; the graph's
output concatenates them, (N, A + 1), so one forward pass serves the actor (``predict``). The
update reads a recorded rollout, flattened to T * n examples: the observations, the actions
taken, the n-step advantages and returns computed in NumPy (environments/ beside this file), so
the value estimate inside an advantage is a constant: the paper's stop-gradient. Its objective is
``policy_gradient - entropy_weight * entropy + value_weight * squared_error``.

Atari frames enter as float32 holding the raw 0..255 bytes and are scaled to [0, 1] by the
graph's first node: every backend divides the same exact integers, and a rollout file's uint8
frames feed it unchanged but for the cast.

Values carry their source: [M] Mnih et al. 2016 (Asynchronous Methods for Deep Reinforcement
Learning, its Experimental Setup), [D] Mnih et al. 2013 / 2015 (the DQN network it reuses),
[B] OpenAI Baselines' a2c (defaults of a2c.learn), [S] Stable-Baselines3's A2C with its default
MlpPolicy, [U] universe-starter-agent's a3c.py, [Z] rl-baselines3-zoo's tuned A2C settings
(hyperparams/a2c.yml). Valid Python 3.6: the CNTK worker imports it.
"""
import numpy as np

from ...spec import Graph
from ...spec.program import Program, optimizer_of, schedule_of
from .. import metrics
from ..card import Consistency, Measured, Training
from ..constraints import Rule, boolean, choice, integer, integers, number
from ..registry import register_model

NETWORKS = ("atari", "mlp")

PAPER = {
    "env": "pong",                  # any Atari game of its environments/; Pong as the default
    "network": "atari",             # [M] [D] 2013's: conv 16 8x8/4, conv 32 4x4/2, fc 256
    "observation_shape": (4, 84, 84),  # [D] 4 stacked 84 x 84 grey frames
    "num_actions": 6,               # Pong's full action set; the trainer checks it against the game
    "conv_filters": (16, 32), "conv_kernels": (8, 4), "conv_strides": (4, 2),  # [M], [D] 2013
    "hidden": (256,),               # [M] fully connected 256, every hidden layer followed by a ReLU
    "shared_hidden": True,          # [M] one torso for both heads; False: the value's own layers
    "learners": 16,                 # [M] 16 actor-learner threads
    "t_max": 5,                     # [M] t_max = 5: an update every 5 actions
    "batch_size": 80,               # learners * t_max: a synthetic update's examples (tbd run);
                                    # the trainer's updates hold learners * t_max whatever it says
    "gamma": 0.99,                  # [M] discount 0.99
    "reward_clip": 1.0,             # [D] rewards clipped to [-1, 1] ([M] keeps [D]'s Atari setup)
    "entropy_weight": 0.01,         # [M] entropy regularisation beta = 0.01
    "value_weight": 1.0,            # on 0.5 * mean squared error: [B] vf_coef 0.5 on the MSE
    # [M] RMSProp with statistics shared across learners, decay alpha 0.99, epsilon 0.1 inside
    # the root (the paper's eq. 9; docs/optimizers.md); [B] lr 7e-4 ([M] sampled each run's lr
    # from LogUniform(1e-4, 1e-2)), annealed linearly to 0 ([M]).
    "optimizer": "rmsprop", "lr": 7e-4, "alpha": 0.99, "eps": 0.1, "momentum": 0.0,
    "centered": False, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999,
    "lr_schedule": "linear",
    # an assumption: annealed over 80 million frames, 80e6 / (4 frames x 80 steps per update);
    # [M] anneals over its whole run, [B] over its total_timesteps 80e6
    "anneal_steps": 250000,
    "grad_clip_norm": 40.0,         # [U] clip_by_global_norm(grads, 40.0)
}

# CartPole-v1 for the synchronous trainer on a CPU; docs/models/a3c.md has the runs that chose it,
# docs/environments.md those that reach 475 (benchmarks/results/a3c_cartpole.json).
# [S]: MlpPolicy's separate policy and value networks of two tanh layers of 64, global-norm
# clip 0.5, no reward clipping. Chosen by runs: 16 learners x 5 steps (8 oscillated), Adam 1e-3
# (epsilon 1e-5) annealed linearly to 0 over 4,000 updates (320,000 frames); RMSProp 7e-4
# ([S]'s default) and a constant rate collapsed after reaching 250-300. No entropy bonus:
# [Z] rl-baselines3-zoo's A2C for CartPole-v1 (ent_coef 0.0); 475 needs a nearly deterministic
# policy, and at 0.01 two runs of seven hovered at 420-470 until the rate reached 0.
CARTPOLE = dict(PAPER, env="CartPole-v1", network="mlp", observation_shape=(4,), num_actions=2,
                hidden=(64, 64), shared_hidden=False, learners=16, batch_size=80,
                optimizer="adam", lr=1e-3, eps=1e-5, lr_schedule="linear", anneal_steps=4000,
                grad_clip_norm=0.5, reward_clip=0.0, entropy_weight=0.0)

# The consistency tests' config: both convolutions on a 2 x 20 x 20 input (20 -> 4 -> 1 pixels)
# and two learners of t_max 3, so every path of the paper's network runs in milliseconds.
TINY = dict(PAPER, observation_shape=(2, 20, 20), num_actions=3, conv_filters=(3, 4),
            hidden=(8,), learners=2, t_max=3, batch_size=6, anneal_steps=100)

RULES = {
    "env": Rule(str), "network": choice(*NETWORKS), "observation_shape": integers(1),
    "num_actions": integer(2), "conv_filters": integers(1), "conv_kernels": integers(1),
    "conv_strides": integers(1), "hidden": integers(1), "shared_hidden": boolean(),
    "learners": integer(1), "t_max": integer(1), "gamma": number(0.0, 1.0),
    "reward_clip": number(0.0), "entropy_weight": number(0.0), "value_weight": number(0.0),
}


def conv_sizes(hp):
    """The spatial sizes after each convolution (no padding, as in [D])."""
    sizes = [tuple(hp["observation_shape"][1:])]
    for k, s in zip(hp["conv_kernels"], hp["conv_strides"]):
        sizes.append(tuple((d - k) // s + 1 for d in sizes[-1]))
    return sizes[1:]


def _check_network(hp):
    """The observation shape must fit the network: (C, H, W) large enough for every
    convolution, or (D,) for the MLP."""
    shape = tuple(hp["observation_shape"])
    if hp["network"] == "mlp":
        if len(shape) != 1:
            return ("observation_shape {} cannot feed the mlp network, which takes a vector "
                    "(D,); fix: network=atari for (C, H, W) frames".format(shape))
        return None
    if len(shape) != 3:
        return ("observation_shape {} cannot feed the atari network, which takes (C, H, W) "
                "frames; fix: network=mlp for a vector such as CartPole's (4,)".format(shape))
    layers = [len(hp[k]) for k in ("conv_filters", "conv_kernels", "conv_strides")]
    if len(set(layers)) != 1:
        return "conv_filters, conv_kernels and conv_strides must have one entry per layer, " \
               "got {} entries".format(layers)
    small = [s for s in conv_sizes(hp) if min(s) < 1]
    if small:
        return ("observation_shape {} is too small for convolutions of kernels {} and strides "
                "{} (the frames shrink to {}); fix: a larger frame, such as the paper's (4, 84, "
                "84)".format(shape, list(hp["conv_kernels"]), list(hp["conv_strides"]),
                             conv_sizes(hp)))
    return None


def _batch(hp, batch_size, seed):
    """A valid recorded-rollout update: frames of bytes (or N(0, 1) vectors), actions in range,
    advantages and returns as an update computes them from some rewards."""
    rng = np.random.RandomState(seed)
    shape = (batch_size,) + tuple(hp["observation_shape"])
    if hp["network"] == "atari":
        observations = rng.randint(0, 256, shape).astype(np.float32)
    else:
        observations = rng.standard_normal(shape).astype(np.float32)
    returns = rng.standard_normal((batch_size, 1)).astype(np.float32)
    return {"observations": observations,
            "actions": rng.randint(0, hp["num_actions"], batch_size).astype(np.int32),
            "advantages": rng.standard_normal(batch_size).astype(np.float32),
            "returns": returns}


def _hidden(g, prefix, x, sizes, activation):
    for i, units in enumerate(sizes):
        x = g.add("{}{}".format(prefix, i + 1), "dense", x, units=units)
        x = g.add("{}{}.{}".format(prefix, i + 1, activation), activation, x)
    return x


def _frames(hp, batch):
    """Emulator frames an update's agent steps stand for: Atari repeats each action over 4
    frames ([D]; docs/environments.md), classic control steps once."""
    return len(batch["actions"]) * (4 if hp["network"] == "atari" else 1)


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# Trained in its environments, not from a data folder (tbdzoo/training/a3c_task.py); the
# proxy is the cartpole config as it is: an MLP, 16 synchronous learners. Its rollouts have
# no data set to share between ranks.
TRAINING = Training(metrics=(metrics.RETURN,), target="return=475", eval_every=10,
                    runner="tbdzoo.training.a3c_task:run_a2c", base_config="cartpole", proxy={})
# A recorded rollout's update.
CONSISTENCY = Consistency()
MEASURED = Measured(parameters=677943, flops_per_example=5972064)   # Pong, 6 actions


# The name the registry, rl/ (A3C's trainers) and the suite's asynchronous runs use.
NAME = "a3c"


@register_model(NAME, domain="reinforcement learning",
                configs={"paper": PAPER, "cartpole": CARTPOLE, "tiny": TINY},
                unit="frames/s", items=_frames,
                synthetic_batch=_batch, rules=RULES, checks=(_check_network,),
                training=TRAINING, consistency=CONSISTENCY, measured=MEASURED)
def build(hp):
    g = Graph("a3c")
    g.block("", "ActorCritic")
    x = g.input("observations", tuple(hp["observation_shape"]))
    if hp["network"] == "atari":
        x = g.add("scale", "scale", x, factor=1.0 / 255.0)   # bytes to [0, 1]
        for i, (f, k, s) in enumerate(zip(hp["conv_filters"], hp["conv_kernels"],
                                          hp["conv_strides"])):
            x = g.add("conv{}".format(i + 1), "conv2d", x, filters=f, kernel=k, stride=s,
                      padding=0, use_bias=True)
            x = g.add("conv{}.relu".format(i + 1), "relu", x)
        x = g.add("flatten", "flatten", x)
        activation = "relu"
    else:
        activation = "tanh"   # [S] MlpPolicy's activation
    trunk = _hidden(g, "fc", x, hp["hidden"], activation)
    logits = g.add("policy", "dense", trunk, units=hp["num_actions"])
    if not hp["shared_hidden"]:   # [S] the value function's own layers of the same sizes
        trunk = _hidden(g, "value_fc", x, hp["hidden"], activation)
    value = g.add("value", "dense", trunk, units=1)
    g.set_output(g.add("policy_and_value", "concat", [logits, value], axis=0))
    actions = g.input("actions", (), dtype="int32", role="target")
    advantages = g.input("advantages", (), role="target")
    returns = g.input("returns", (1,), role="target")

    p = Program()
    p.loss("policy", "policy_gradient", logits=logits, actions=actions, advantages=advantages)
    p.loss("entropy", "entropy", logits=logits)
    p.loss("value", "squared_error", prediction=value, target=returns)
    p.objective("a3c", [("policy", 1.0), ("entropy", -hp["entropy_weight"]),
                        ("value", hp["value_weight"])])
    clip = {"kind": "global_norm", "value": hp["grad_clip_norm"]} if hp["grad_clip_norm"] else None
    p.group("all", "*", optimizer_of(hp), schedule_of(hp), clip)
    p.phase("update", "a3c", "all")
    g.set_program(p.check(g))
    return g
