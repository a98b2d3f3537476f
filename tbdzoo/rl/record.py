"""What an A3C run measured (RunResult, synchronous or asynchronous), and the runs of ``python
-m tbdzoo.rl --record FILE.json``: one JSON file holding every run's backend, seed, frames,
seconds and whether it reached its target, with the command that reproduces it
(benchmarks/results/a3c_cartpole.json, docs/environments.md)."""
import datetime
import fcntl
import json
import os
import platform

import numpy as np


class RunResult:
    """What an A3C run measured: frames (skipped frames counted), updates and seconds,
    frames/s and updates/s, every finished episode's return in order, the mean of the last
    ``window`` of them at each log (``history``) and the (frames, seconds, updates) at which
    the target mean return was first reached (``solved_at``, None if never). An asynchronous
    run (train_a3c: ``learners`` set) adds each learner's frames, updates and CPU utilisation
    (CPU seconds over the run's seconds; 1.0 is one core busy), from the common start to the
    last learner's stop, and the shared state at the end: weights, RMSProp square averages and
    each learner's update count as the shared optimizer recorded it."""

    def __init__(self, env_id, window=100, backend=None, learners=None, how=None):
        self.env_id, self.window = env_id, window
        self.backend, self.learners, self.how = backend, learners, how
        self.frames = self.updates = 0
        self.seconds = 0.0
        self.episode_returns = []
        self.history = []          # (frames, seconds, mean return of the window)
        self.solved_at = None      # (frames, seconds, updates)
        self.losses = []
        self.frames_by_learner, self.updates_by_learner = [], []
        self.cpu_utilisation, self.cpu_seconds = [], []
        self.weights = self.initial_weights = self.square_averages = None
        self.optimizer_updates = []

    @property
    def frames_per_second(self):
        return self.frames / self.seconds if self.seconds else float("nan")

    @property
    def updates_per_second(self):
        return self.updates / self.seconds if self.seconds else float("nan")

    @property
    def frames_per_cpu_second(self):
        """Frames over the CPU seconds all learners used: what a learner's framework costs per
        frame, whatever else shares the machine's cores."""
        used = sum(self.cpu_seconds)
        return self.frames / used if used > 0 else float("nan")

    def mean_return(self, last=None):
        """Mean of the last ``last`` (default: ``window``) episodes' returns; NaN before any."""
        tail = self.episode_returns[-(last or self.window):]
        return float(np.mean(tail)) if tail else float("nan")

    def finish(self, counters, start, cpu):
        """Fill an asynchronous run's counts and rates from the learners' counters and CPU
        seconds."""
        self.frames_by_learner = [int(f) for f in counters.frames]
        self.updates_by_learner = [int(u) for u in counters.updates]
        self.frames, self.updates = sum(self.frames_by_learner), sum(self.updates_by_learner)
        self.seconds = max(float(f) for f in counters.finished) - start
        self.cpu_utilisation = [c / (float(f) - start) if float(f) > start else float("nan")
                                for c, f in zip(cpu, counters.finished)]
        self.cpu_seconds = list(cpu)
        return self

    def record(self):
        """An asynchronous run's figures as a JSON-ready dict (the sweep's records carry it as
        ``asynchronous``)."""
        # Rates and their inputs are stored unrounded: a short run lasts tens of milliseconds,
        # where rounding the seconds to 1e-4 alone moves frames/seconds by 0.1 %.
        cpu = list(self.cpu_utilisation)
        return {"learners": self.learners, "execution": self.how, "env": self.env_id,
                "frames": self.frames, "updates": self.updates, "seconds": self.seconds,
                "frames_per_second": self.frames_per_second,
                "updates_per_second": self.updates_per_second,
                "cpu_utilisation_per_learner": cpu,
                "mean_cpu_utilisation": float(np.mean(cpu)) if cpu else float("nan"),
                "cpu_seconds_per_learner": list(self.cpu_seconds),
                "frames_per_cpu_second": self.frames_per_cpu_second,
                "episodes": len(self.episode_returns), "mean_return": self.mean_return()}

    def summary(self):
        if self.learners is not None:
            cpu = self.cpu_utilisation
            return ("{} on {} ({}), {} learners: {} frames, {} updates in {:.1f} s ({:.0f} "
                    "frames/s, {:.1f} updates/s); CPU per learner {:.2f} (min {:.2f}, max "
                    "{:.2f}); {} episodes, mean return {:.1f}".format(
                        self.env_id, self.backend, self.how, self.learners, self.frames,
                        self.updates, self.seconds, self.frames_per_second,
                        self.updates_per_second, float(np.mean(cpu)) if cpu else float("nan"),
                        min(cpu) if cpu else float("nan"), max(cpu) if cpu else float("nan"),
                        len(self.episode_returns), self.mean_return()))
        solved = "not reached" if self.solved_at is None else \
            "reached at {} frames, {:.1f} s".format(self.solved_at[0], self.solved_at[1])
        return ("{}: {} frames, {} updates in {:.1f} s ({:.0f} frames/s, {:.1f} updates/s); "
                "{} episodes, mean return of the last {}: {:.1f}; target {}".format(
                    self.env_id, self.frames, self.updates, self.seconds,
                    self.frames_per_second, self.updates_per_second, len(self.episode_returns),
                    self.window, self.mean_return(), solved))


def run_record(result, backend, config, seed, target, overrides, hparams, command, load):
    """One run as plain JSON values: at the target if it was reached, else at the end."""
    reached = result.solved_at is not None
    frames, seconds, updates = result.solved_at if reached else \
        (result.frames, result.seconds, result.updates)
    return {
        "backend": backend, "config": config, "seed": seed, "overrides": overrides,
        "hparams": json.loads(json.dumps(hparams, default=str)),
        "target": target, "reached": reached, "frames": int(frames),
        "seconds": round(float(seconds), 1), "updates": int(updates),
        "frames_run": int(result.frames), "seconds_run": round(float(result.seconds), 1),
        "frames_per_second": round(result.frames_per_second, 1),
        "episodes": len(result.episode_returns),
        "final_mean_return": round(result.mean_return(), 2),
        "history": [[int(f), round(float(s), 1), round(float(m), 1)]
                    for f, s, m in result.history],
        "load_average": [round(x, 2) for x in load],
        "cpus": os.cpu_count(), "machine": platform.machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
    }


def dumps(data):
    """The file's text: its fields, then one run a line, so a diff shows the runs added."""
    head = dict((k, v) for k, v in data.items() if k != "runs")
    lines = ["{"] + ["  {}: {},".format(json.dumps(k), json.dumps(v)) for k, v in head.items()]
    runs = ",\n".join("    " + json.dumps(run) for run in data["runs"])
    return "\n".join(lines) + '\n  "runs": [\n' + runs + "\n  ]\n}\n"


def add_run(path, result, **fields):
    """Appends the run to ``path`` under an exclusive lock (parallel runs share one file);
    a reader that wants a consistent view takes the same lock (``fcntl.LOCK_SH``)."""
    record = run_record(result, **fields)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        data = json.loads(text) if text.strip() else {"runs": []}
        data["runs"].append(record)
        f.seek(0)
        f.truncate()
        f.write(dumps(data))
    return record
