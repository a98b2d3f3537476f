"""tbdzoo's asynchronous A3C on the PyTorch backend against two hand-written PyTorch A3Cs: frames/s.

    python3 -m benchmarks.gpu_a3c --device cpu --learners 1,4,16 --out benchmarks/results/h200_a3c_cpu.json
    python3 -m benchmarks.gpu_a3c --device cuda --learners 1,4,16 --out benchmarks/results/h200_a3c_cuda.json
    python3 -m benchmarks.gpu_a3c --device cpu --config cartpole --env CartPole-v1 --learners 2 \\
        --seconds 3 --rounds 2 --processes 1 --out /tmp/check.json        # a check that it runs

Run from the repository root. Three contenders, each ``--learners`` actor-learner processes
(``torch.multiprocessing``: fork on the CPU, spawn with CUDA; ``torch.set_num_threads(1)`` each)
on one model and one RMSProp whose parameters and square averages are in host shared memory,
with the same network (tbdzoo's config: for Pong the paper's conv 16 8x8/4, conv 32 4x4/2, fc 256
with ReLUs, a softmax policy and a linear value), initial weights (tbdzoo's), hyperparameters
(t_max 5, gamma 0.99, entropy 0.01, value 0.5, RMSProp alpha 0.99 and epsilon 0.1 inside the
root, lr 7e-4 annealed linearly by frames, ``clip_grad_norm`` 40, rewards clipped to [-1, 1]) and
environments (``tbdzoo.models.a3c.environments.make``: Gymnasium's AtariPreprocessing and
FrameStackObservation, frame skip 4), learner i seeded seed + i; updates are lock-free:

- ``tbdzoo``: ``tbdzoo.rl.train_a3c("torch", ...)`` (docs/a3c.md).
- ``classic``: the loop as A3C's public implementations write it: each rollout reloads the
  shared model into the learner's own copy (``load_state_dict``), acts with autograd on and
  keeps the log probabilities, entropies and values of the acting passes (no second forward
  pass), reads every action back with ``int(action)`` (a device synchronisation per step under
  CUDA), computes the returns as scalar tensors in a Python loop, backpropagates, hands the
  gradients to the shared parameters (``shared.grad = local.grad``) and steps the shared
  RMSProp parameter by parameter.
- ``hogwild``: what a PyTorch user who wants speed writes (the Hogwild pattern of PyTorch's
  own example): the learner acts with the shared model itself, in host shared memory, under
  ``torch.inference_mode``, samples the action in NumPy from the policy's probabilities, keeps
  the rollout's observations, actions and rewards in preallocated NumPy arrays and computes the
  n-step returns there (bootstrapped from V(s_T) unless the episode ended), then takes the
  gradients of the rollout's loss in one batched forward and backward pass
  (``torch.autograd.grad``), clips them to global norm 40 and steps the shared RMSProp with
  foreach operations. On the CPU nothing is copied: the shared model is the learner's model.
  With ``--device cuda`` the learner still acts on the host (an action is needed on the host
  every step; acting on the GPU would cost one synchronisation per step) and learns on its copy
  on the GPU: the shared parameters copied in once per rollout, the rollout in one copy, the
  gradients back in one copy each.

Protocol (benchmarks/harness.py's repeat protocol): ``--processes`` fresh processes, one after
the other; in each, for every learner count, ``--rounds`` rounds, each running every contender
in turn (the order rotating from round to round) for ``--seconds`` after every learner is ready.
Frames/s is the frames all learners stepped (skipped frames counted) over the seconds from the
common start to the last learner's stop. The JSON holds every round of every process and, per
learner count, each contender's median frames/s with its spread, and the ratios of tbdzoo's
frames/s to each baseline's with their spread and verdict (PARITY where the spread reaches
1.0). ``--device cuda`` puts each learner's copy on the GPU (tbdzoo and classic also act there);
the shared model and the RMSProp state stay in host shared memory on every side.
"""
import argparse
import functools
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))

import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from benchmarks import harness
from tbdzoo.models import get_model
from tbdzoo.models.a3c import environments

CONTENDERS = ("tbdzoo", "classic", "hogwild")
KEY = ("model", "device", "learners")


# -- the hand-written A3C ------------------------------------------------------------------------
class ActorCritic(nn.Module):
    """tbdzoo's a3c network for the config ``hp``, with the same parameter names."""

    def __init__(self, hp):
        super().__init__()
        self.atari = hp["network"] == "atari"
        act = nn.ReLU() if self.atari else nn.Tanh()
        if self.atari:
            c, h, w = hp["observation_shape"]
            self.conv1 = nn.Conv2d(c, hp["conv_filters"][0], hp["conv_kernels"][0],
                                   hp["conv_strides"][0])
            self.conv2 = nn.Conv2d(hp["conv_filters"][0], hp["conv_filters"][1],
                                   hp["conv_kernels"][1], hp["conv_strides"][1])
            with torch.no_grad():
                width = self.conv2(self.conv1(torch.zeros(1, c, h, w))).numel()
        else:
            width = hp["observation_shape"][0]
        self.act, sizes = act, [width] + list(hp["hidden"])
        for i in range(len(hp["hidden"])):
            setattr(self, "fc{}".format(i + 1), nn.Linear(sizes[i], sizes[i + 1]))
            if not hp["shared_hidden"]:
                setattr(self, "value_fc{}".format(i + 1), nn.Linear(sizes[i], sizes[i + 1]))
        self.layers, self.shared_hidden = len(hp["hidden"]), hp["shared_hidden"]
        self.policy = nn.Linear(sizes[-1], hp["num_actions"])
        self.value = nn.Linear(sizes[-1], 1)

    def forward(self, x):
        if self.atari:
            x = x / 255.0
            x = F.relu(self.conv2(F.relu(self.conv1(x)))).flatten(1)
        h = x
        for i in range(self.layers):
            h = self.act(getattr(self, "fc{}".format(i + 1))(h))
        v = h
        if not self.shared_hidden:
            v = x
            for i in range(self.layers):
                v = self.act(getattr(self, "value_fc{}".format(i + 1))(v))
        return self.policy(h), self.value(v)


class SharedRMSprop(torch.optim.Optimizer):
    """RMSProp with its square averages in shared memory (epsilon inside the root)."""

    def __init__(self, params, lr, alpha, eps):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["square_avg"] = torch.zeros_like(p).share_memory_()

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                v = self.state[p]["square_avg"]
                v.mul_(group["alpha"]).addcmul_(p.grad, p.grad, value=1 - group["alpha"])
                p.addcdiv_(p.grad, v.add(group["eps"]).sqrt_(), value=-group["lr"])


def classic_learner(index, hp, shared, optimizer, counts, barrier, env_id, seed, seconds,
                    anneal_frames, device):
    """The classic loop, as A3C's public implementations write it."""
    torch.set_num_threads(1)
    torch.manual_seed(seed + index)
    env = environments.make(env_id, seed + index)
    model = ActorCritic(hp).to(device)
    obs, _ = env.reset()
    barrier.wait()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        model.load_state_dict(shared.state_dict())
        log_probs, entropies, values, rewards = [], [], [], []
        done = False
        for _ in range(hp["t_max"]):
            logits, value = model(torch.as_tensor(np.asarray(obs, np.float32), device=device)[None])
            prob, log_prob = F.softmax(logits, -1), F.log_softmax(logits, -1)
            action = prob.multinomial(1).detach()
            obs, reward, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
            log_probs.append(log_prob.gather(1, action))
            entropies.append(-(log_prob * prob).sum(1, keepdim=True))
            values.append(value)
            rewards.append(max(-hp["reward_clip"], min(hp["reward_clip"], reward))
                           if hp["reward_clip"] else reward)
            counts[0, index] += 4 if model.atari else 1
            if done:
                obs, _ = env.reset()
                break
        R = torch.zeros(1, 1, device=device)
        if not done:
            with torch.no_grad():
                R = model(torch.as_tensor(np.asarray(obs, np.float32), device=device)[None])[1]
        policy_loss = value_loss = entropy = 0
        for t in reversed(range(len(rewards))):
            R = hp["gamma"] * R + rewards[t]
            advantage = R - values[t]
            value_loss = value_loss + 0.5 * advantage.pow(2)
            policy_loss = policy_loss - log_probs[t] * advantage.detach()
            entropy = entropy + entropies[t]
        n = len(rewards)
        loss = (policy_loss - hp["entropy_weight"] * entropy + hp["value_weight"] * value_loss) / n
        model.zero_grad()
        loss.sum().backward()
        nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip_norm"])
        for p, s in zip(model.parameters(), optimizer.param_groups[0]["params"]):
            s.grad = p.grad.to("cpu")
        for group in optimizer.param_groups:
            group["lr"] = hp["lr"] * max(0.0, 1.0 - float(counts[0].sum()) / anneal_frames)
        optimizer.step()
        counts[1, index] += 1
    counts[2, index] = time.monotonic()
    env.close()


def hogwild_learner(index, hp, shared, optimizer, counts, barrier, env_id, seed, seconds,
                    anneal_frames, device):
    """The performance-aware loop: act with the shared model under inference_mode, the
    rollout and its returns in NumPy, one batched forward and backward pass per update."""
    torch.set_num_threads(1)
    torch.manual_seed(seed + index)
    rng = np.random.default_rng(seed + index)
    env = environments.make(env_id, seed + index)
    group = optimizer.param_groups[0]
    shared_params = list(group["params"])  # the shared model's, in its order
    learner = shared if device == "cpu" else ActorCritic(hp).to(device)
    params = list(learner.parameters())
    square_avgs = [optimizer.state[p]["square_avg"] for p in shared_params]
    alpha, eps, clip = group["alpha"], group["eps"], hp["grad_clip_norm"]
    t_max, gamma, reward_clip = hp["t_max"], hp["gamma"], hp["reward_clip"]
    frames_per_step = 4 if shared.atari else 1
    obs, _ = env.reset()
    observations = np.empty((t_max,) + tuple(np.shape(obs)), np.float32)
    actions, rewards = np.empty(t_max, np.int64), np.empty(t_max, np.float32)
    returns = np.empty(t_max, np.float32)
    barrier.wait()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        done, n = False, 0
        with torch.inference_mode():
            for t in range(t_max):
                observations[t] = obs
                logits = shared(torch.from_numpy(observations[t:t + 1]))[0][0]
                p = torch.softmax(logits, -1).numpy().astype(np.float64)
                action = min(int(np.searchsorted(np.cumsum(p), rng.random() * p.sum())), len(p) - 1)
                obs, reward, terminated, truncated, _ = env.step(action)
                actions[t] = action
                rewards[t] = max(-reward_clip, min(reward_clip, reward)) if reward_clip else reward
                n = t + 1
                done = terminated or truncated
                if done:
                    obs, _ = env.reset()
                    break
            R = 0.0 if done else float(shared(torch.from_numpy(
                np.asarray(obs, np.float32)[None]))[1][0, 0])
        for t in range(n - 1, -1, -1):
            R = rewards[t] + gamma * R
            returns[t] = R
        counts[0, index] += n * frames_per_step
        if learner is not shared:
            with torch.no_grad():
                for mine, theirs in zip(params, shared_params):
                    mine.copy_(theirs, non_blocking=True)
        x = torch.from_numpy(observations[:n]).to(device, non_blocking=True)
        a = torch.from_numpy(actions[:n]).to(device, non_blocking=True)
        ret = torch.from_numpy(returns[:n]).to(device, non_blocking=True)
        logits, values = learner(x)
        log_p = F.log_softmax(logits, -1)
        advantage = ret - values[:, 0]
        policy_loss = -(log_p.gather(1, a[:, None])[:, 0] * advantage.detach()).sum()
        entropy = -(log_p.exp() * log_p).sum()
        value_loss = 0.5 * advantage.pow(2).sum()
        loss = (policy_loss - hp["entropy_weight"] * entropy + hp["value_weight"] * value_loss) / n
        grads = list(torch.autograd.grad(loss, params))
        if clip:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            torch._foreach_mul_(grads, torch.clamp(clip / (norm + 1e-6), max=1.0))
        if learner is not shared:
            grads = [g.to("cpu") for g in grads]
        lr = hp["lr"] * max(0.0, 1.0 - float(counts[0].sum()) / anneal_frames)
        with torch.no_grad():
            torch._foreach_mul_(square_avgs, alpha)
            torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - alpha)
            denominators = torch._foreach_add(square_avgs, eps)
            torch._foreach_sqrt_(denominators)
            torch._foreach_addcdiv_(shared_params, grads, denominators, value=-lr)
        counts[1, index] += 1
    counts[2, index] = time.monotonic()
    env.close()


def run_handwritten(learner, hp, learners, env_id, seed, seconds, device):
    """``learners`` processes of ``learner`` (classic_learner or hogwild_learner) on one shared
    model and shared RMSProp; frames/s from the common start to the last learner's stop."""
    shared = ActorCritic(hp)
    shared.load_state_dict(initial_weights(hp, seed))
    shared.share_memory()
    optimizer = SharedRMSprop(shared.parameters(), hp["lr"], hp["alpha"], hp["eps"])
    counts = torch.zeros(3, learners, dtype=torch.float64).share_memory_()
    frames_per_step = 4 if hp["network"] == "atari" else 1
    anneal = hp["anneal_steps"] * hp["learners"] * hp["t_max"] * frames_per_step
    ctx = mp.get_context("spawn" if device.startswith("cuda") else "fork")
    barrier = ctx.Barrier(learners + 1)
    procs = [ctx.Process(target=learner, args=(
        i, hp, shared, optimizer, counts, barrier, env_id, seed, seconds, anneal, device))
        for i in range(learners)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.monotonic()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError("a {} learner exited with code {}".format(learner.__name__, p.exitcode))
    elapsed = float(counts[2].max()) - start
    return {"frames": int(counts[0].sum()), "updates": int(counts[1].sum()), "seconds": elapsed,
            "frames_per_second": float(counts[0].sum()) / elapsed,
            "updates_per_second": float(counts[1].sum()) / elapsed}


def initial_weights(hp, seed):
    from tbdzoo.backends.base import check_buildable
    from tbdzoo.spec.init import initial_weights as spec_weights
    spec = check_buildable(get_model("a3c"), hp, "torch")
    return {n: torch.from_numpy(np.array(v)) for n, v in spec_weights(spec, seed).items()}


def run_tbdzoo(config, overrides, learners, env_id, seed, seconds, device):
    from tbdzoo.rl import train_a3c
    r = train_a3c("torch", config, learners=learners, seconds=seconds, seed=seed, env=env_id,
                  device=device, **overrides)
    return {"frames": r.frames, "updates": r.updates, "seconds": r.seconds,
            "frames_per_second": r.frames_per_second, "updates_per_second": r.updates_per_second,
            "cpu_utilisation_per_learner": r.cpu_utilisation}


def run_contender(name, args, hp, env_id, learners, device):
    if name == "tbdzoo":
        return run_tbdzoo(args.config, {}, learners, env_id, args.seed, args.seconds, device)
    learner = classic_learner if name == "classic" else hogwild_learner
    return run_handwritten(learner, hp, learners, env_id, args.seed, args.seconds, device)


def run_cell(learners, device, args, hp, env_id):
    """Rounds of every contender at one learner count; each round's figure is seconds per frame
    (the harness's "step time" with one frame as the item), so its ratios are frames/s ratios."""
    names = list(args.contenders.split(","))
    times, rounds = {name: [] for name in names}, []
    for r in range(args.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            result = run_contender(name, args, hp, env_id, learners, device)
            result.update(contender=name, round=r)
            rounds.append(result)
            times[name].append(1.0 / result["frames_per_second"])
            print("  {} learners round {} {:<8} {:>10,.0f} frames/s {:>8.1f} updates/s".format(
                learners, r, name, result["frames_per_second"], result["updates_per_second"]), flush=True)
    return {"model": "a3c", "device": device, "learners": learners, "precision": "fp32",
            "execution": "asynchronous", "config": args.config, "unit": "frames/s", "items_per_step": 1,
            "warmup": 0, "steps": 1, "times": times, "peak_bytes": {name: None for name in names},
            "first_loss": {}, "checks": {},
            "details": {"env": env_id, "seconds_per_round": args.seconds, "rounds": rounds}}


def worker(args, device):
    hp = get_model("a3c").hparams(args.config)
    env_id = environments.resolve(args.env)
    env = harness.environment(device)
    env["load_average_at_start"] = os.getloadavg()
    cells = [({"model": "a3c", "device": device, "learners": learners},
              functools.partial(run_cell, learners, device, args, hp, env_id))
             for learners in [int(v) for v in args.learners.split(",")]]
    return harness.record_cells(args, env, cells)


def row(cell):
    """One line of a learner count's summary for the terminal."""
    if "contenders" not in cell:
        return "a3c {} learners FAILED {}".format(cell["learners"], cell.get("error"))
    fps = {name: c["throughput"] for name, c in cell["contenders"].items()}
    ratios = "  ".join("vs {} {:.3f}x [{:.3f}-{:.3f}] {}".format(
        b, r["speed"], min(r["speed_rounds"] + r["speed_processes"]),
        max(r["speed_rounds"] + r["speed_processes"]), r["speed_verdict"].upper())
        for b, r in cell["ratios"].items())
    return "a3c {:>3} learners  ".format(cell["learners"]) + "  ".join(
        "{} {:,.0f}".format(n, v) for n, v in fps.items()) + " frames/s  " + ratios


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="paper", help="tbdzoo's a3c config (default: paper)")
    p.add_argument("--env", default="pong", help="environment (default: ALE Pong)")
    p.add_argument("--learners", default="16", help="learner counts, e.g. 1,4,16 (default 16)")
    p.add_argument("--contenders", default=",".join(CONTENDERS),
                   help="of {} (default: all; tbdzoo is required)".format(", ".join(CONTENDERS)))
    p.add_argument("--seconds", type=float, default=20.0, help="per contender and round (default 20)")
    p.add_argument("--rounds", type=int, default=harness.ROUNDS_AT_LEAST, help="rounds per process")
    p.add_argument("--processes", type=int, default=harness.PROCESSES_AT_LEAST,
                   help="separate processes, one after the other")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="the learners' device: cuda, cuda:N or cpu")
    harness.add_process_options(p, "gpu_a3c.json")
    args = p.parse_args(argv)
    try:
        counts = [int(v) for v in args.learners.split(",")]
    except ValueError:
        counts = [0]
    if min(counts) < 1:
        p.error("--learners {}: learner counts are integers >= 1, e.g. 1,4,16".format(args.learners))
    names = args.contenders.split(",")
    if "tbdzoo" not in names or not set(names) <= set(CONTENDERS) or len(names) < 2:
        p.error("--contenders {}: tbdzoo and at least one of classic, hogwild".format(args.contenders))
    if args.seconds <= 0:
        p.error("--seconds {}: must be above 0".format(args.seconds))
    harness.check_choices(p, args)
    return p, args


def main(argv=None):
    _p, args = arguments(argv)
    device = harness.device_of(args, "--device cpu")
    if device is None:
        return 2
    if args.process_out:
        return worker(args, device)
    argv = list(sys.argv[1:] if argv is None else argv)
    command = harness.command_of("benchmarks.gpu_a3c", argv, args.out)
    protocol = {"processes": args.processes, "rounds_per_process": args.rounds,
                "seconds_per_round": args.seconds,
                "speed_ratio": "tbdzoo frames/s / baseline frames/s (above 1: tbdzoo faster)",
                "verdict": "ahead or behind only when every round's and every process's ratio is on one side of 1.0"}
    work = args.work_dir or tempfile.mkdtemp(prefix="tbdzoo-a3c-")

    def save(records):
        return harness.write_result(args.out, harness.aggregate(records, command, protocol, key=KEY))

    records = harness.run_processes("benchmarks.gpu_a3c", argv, args.processes, work, on_process=save)
    for cell in save(records)["cells"]:
        print(row(cell))
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
