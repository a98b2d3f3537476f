"""The runs of ``python -m tbdzoo.rl --record FILE.json``: one JSON file holding every run's
backend, seed, frames, seconds and whether it reached its target, with the command that
reproduces it (benchmarks/results/a3c_cartpole.json, docs/environments.md)."""
import datetime
import fcntl
import json
import os
import platform


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
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
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
