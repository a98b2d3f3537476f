"""tbdzoo's asynchronous A3C on the PyTorch backend against a hand-written PyTorch A3C: frames/s.

    python3 benchmarks/gpu_a3c.py --device cuda --out benchmarks/results/h200_a3c_cuda.json
    python3 benchmarks/gpu_a3c.py --device cpu --out benchmarks/results/h200_a3c_cpu.json
    python3 benchmarks/gpu_a3c.py --device cpu --learners 2 --seconds 30 --repeats 2 \\
        --out benchmarks/results/cpu_a3c.json                                # a check on any CPU

The hand-written contender is A3C as PyTorch users write it: one ``nn.Module`` actor-critic
(the same network as tbdzoo's config: for Pong the paper's conv 16 8x8/4, conv 32 4x4/2, fc 256
with ReLUs, a softmax policy and a linear value) whose parameters are in shared memory
(``share_memory()``); one process per learner (``torch.multiprocessing``, fork on the CPU,
spawn with CUDA), each with ``torch.set_num_threads(1)``, its own environment and its own copy
loaded from the shared model (``load_state_dict``) before each rollout; the rollout's log
probabilities, entropies and values kept from the acting forward passes and backpropagated at
the end (no second forward pass); the n-step returns bootstrapped from V(s_T) unless the
episode ended; ``clip_grad_norm_(40)``; the local gradients handed to the shared parameters
(``shared.grad = local.grad``) and a shared RMSProp (a ``torch.optim.Optimizer`` whose square
averages are in shared memory) stepped, without locks. Both sides use the same hyperparameters
(tbdzoo's config: t_max 5, gamma 0.99, entropy 0.01, RMSProp alpha 0.99 and epsilon 0.1 inside
the root, lr 7e-4 annealed linearly by frames, rewards clipped to [-1, 1]), the same initial
weights (tbdzoo's) and the same environments (``tbdzoo.environments.make``: Gymnasium's
AtariPreprocessing and FrameStackObservation, frame skip 4), learner i seeded seed + i.

Protocol: for each of ``--repeats`` rounds, each side in turn (alternating which goes first)
runs ``--learners`` learners for ``--seconds`` after every learner is ready; frames/s is the
frames all learners stepped (skipped frames counted) over the seconds from the common start to
the last learner's stop. The JSON holds every round, the medians and the ratio
tbdzoo / hand-written (the target: at least 1.00). ``--device cuda`` puts each learner's copy
on the GPU (the shared model stays in host shared memory); ``--device cpu`` is the usual A3C
on the host's cores.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from tbdzoo import environments  # noqa: E402
from tbdzoo.models import get_model  # noqa: E402


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


def handwritten_learner(index, hp, shared, optimizer, counts, barrier, env_id, seed, seconds,
                        anneal_frames, device):
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


def run_handwritten(hp, learners, env_id, seed, seconds, device):
    shared = ActorCritic(hp)
    shared.load_state_dict(initial_weights(hp, seed))
    shared.share_memory()
    optimizer = SharedRMSprop(shared.parameters(), hp["lr"], hp["alpha"], hp["eps"])
    counts = torch.zeros(3, learners, dtype=torch.float64).share_memory_()
    frames_per_step = 4 if hp["network"] == "atari" else 1
    anneal = hp["anneal_steps"] * hp["learners"] * hp["t_max"] * frames_per_step
    ctx = mp.get_context("spawn" if device.startswith("cuda") else "fork")
    barrier = ctx.Barrier(learners + 1)
    procs = [ctx.Process(target=handwritten_learner, args=(
        i, hp, shared, optimizer, counts, barrier, env_id, seed, seconds, anneal, device))
        for i in range(learners)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.monotonic()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError("a hand-written learner exited with code {}".format(p.exitcode))
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


def environment(device):
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "host_cpus": os.cpu_count(), "device": device,
           "load_average_at_start": os.getloadavg()}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="paper", help="tbdzoo's a3c config (default: paper)")
    p.add_argument("--env", default="pong", help="environment (default: ALE Pong)")
    p.add_argument("--learners", type=int, default=16, help="actor-learners (default 16)")
    p.add_argument("--seconds", type=float, default=45.0, help="per side and round (default 45)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of both sides (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="the learners' device: cuda or cpu")
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu_a3c.json"))
    args = p.parse_args()
    if args.learners < 1:
        p.error("--learners {}: A3C needs at least one actor-learner".format(args.learners))
    device = "cuda:0" if args.device == "cuda" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu to check the script", file=sys.stderr)
        return 2
    hp = get_model("a3c").hparams(args.config)
    env_id = environments.resolve(args.env)
    results = {"command": " ".join(["benchmarks/gpu_a3c.py"] + sys.argv[1:]),
               "environment": environment(device), "config": args.config, "env": env_id,
               "learners": args.learners, "seconds_per_round": args.seconds, "rounds": []}
    sides = {"tbdzoo": lambda: run_tbdzoo(args.config, {}, args.learners, env_id, args.seed,
                                          args.seconds, device),
             "handwritten": lambda: run_handwritten(hp, args.learners, env_id, args.seed,
                                                    args.seconds, device)}
    for round_index in range(args.repeats):
        order = ["tbdzoo", "handwritten"] if round_index % 2 == 0 else ["handwritten", "tbdzoo"]
        for side in order:
            r = sides[side]()
            r.update(side=side, round=round_index)
            results["rounds"].append(r)
            print("round {} {:<12} {:>10,.0f} frames/s {:>8.1f} updates/s ({} frames in {:.1f} s)"
                  .format(round_index, side, r["frames_per_second"], r["updates_per_second"],
                          r["frames"], r["seconds"]), flush=True)
            median = {s: statistics.median(x["frames_per_second"] for x in results["rounds"]
                                           if x["side"] == s)
                      for s in sides if any(x["side"] == s for x in results["rounds"])}
            results["median_frames_per_second"] = median
            if len(median) == 2:
                results["ratio_tbdzoo_over_handwritten"] = median["tbdzoo"] / median["handwritten"]
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:   # rewritten after every side: a cut run keeps it
                json.dump(results, f, indent=1)
    print("tbdzoo / hand-written frames/s: {:.3f}x".format(
        results["ratio_tbdzoo_over_handwritten"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
