"""tbdzoo's ResNet-50 train step against the framework's own model, one backend per process.

    .venv/bin/python benchmarks/native_resnet50.py                 # all three, a table, JSON
    .venv/bin/python benchmarks/native_resnet50.py --backend torch # one, in this process

What users would pick instead: torchvision ``resnet50`` (v1.5), ``keras.applications.ResNet50``
and the Gluon model zoo's ``resnet50_v1`` (both v1: the stride on the 1x1 convolution). Against
the v1 models we time tbdzoo's v1 variant too (``stride_in_1x1=True``), the like-for-like
comparison; v1.5 does about 7% more arithmetic. Same batch, same input size, same optimizer
(SGD, momentum 0.9, weight decay 1e-4, lr 0.1), synthetic data, the loss read back every step
in both. The two are interleaved: each repeat times a few steps of one, then of the other, so
drifts in the machine's speed hit both alike. Each backend runs in its own process (TensorFlow
and torchvision cannot share one).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

NATIVE = {"torch": "torchvision.models.resnet50", "tensorflow": "keras.applications.ResNet50",
          "mxnet": "gluon.model_zoo.vision.resnet50_v1"}
NATIVE_VARIANT = {"torch": "v1.5", "tensorflow": "v1", "mxnet": "v1"}


def native_step_torch(batch):
    import torch
    import torchvision
    net = torchvision.models.resnet50()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = torch.from_numpy(batch["images"]), torch.from_numpy(batch["labels"]).long()
    loss_fn = torch.nn.CrossEntropyLoss()
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def native_step_tensorflow(batch):
    import keras
    import numpy as np
    net = keras.applications.ResNet50(weights=None, classifier_activation=None)
    net.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, weight_decay=1e-4),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.ascontiguousarray(batch["images"].transpose(0, 2, 3, 1))  # Keras wants NHWC
    y = batch["labels"]

    def step():
        return float(net.train_on_batch(x, y))
    return step


def native_step_mxnet(batch):
    import numpy
    if not hasattr(numpy, "bool"):
        numpy.bool = bool
    import mxnet as mx
    from mxnet import autograd, gluon
    net = gluon.model_zoo.vision.resnet50_v1()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = mx.nd.array(batch["images"]), mx.nd.array(batch["labels"])
    n = len(batch["labels"])

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(n)
        return float(loss.mean().asscalar())
    return step


def tbdzoo_step(backend, batch_size, stride_in_1x1):
    from tbdzoo.backends.registry import build_native
    model = build_native("resnet50", backend, batch_size=batch_size, stride_in_1x1=stride_in_1x1)
    prepared = model.prepare_batch(model.synthetic_batch(seed=0))
    return lambda: model.train_step(prepared)


def timed(step, steps):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def run_backend(backend, batch_size, warmup, steps, repeats):
    """Interleaved timings in this process; returns one dict per comparison."""
    from tbdzoo.datasets import synthetic
    batch = synthetic.image_classification(batch_size, 3, 224, 1000, seed=0)
    contenders = {"native": globals()["native_step_" + backend](batch),
                  "tbdzoo v1.5": tbdzoo_step(backend, batch_size, False)}
    if NATIVE_VARIANT[backend] == "v1":
        contenders["tbdzoo v1"] = tbdzoo_step(backend, batch_size, True)
    for step in contenders.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, step in contenders.items():
            times[name].append(timed(step, steps))
    native = statistics.median(times["native"])
    rows = []
    for name in contenders:
        median = statistics.median(times[name])
        rows.append({"backend": backend, "model": name if name != "native" else NATIVE[backend],
                     "variant": NATIVE_VARIANT[backend] if name == "native" else name.split()[1],
                     "batch_size": batch_size, "step_s_median": median,
                     "step_s": times[name], "images_per_s": batch_size / median,
                     "ratio_to_native": native / median})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=sorted(NATIVE), help="run one backend in this process")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results", "native_resnet50.json"))
    args = p.parse_args()
    knobs = ["--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
             "--steps", str(args.steps), "--repeats", str(args.repeats)]
    if args.backend:
        print(json.dumps(run_backend(args.backend, args.batch_size, args.warmup, args.steps,
                                     args.repeats)))
        return 0
    rows = []
    for backend in ("torch", "tensorflow", "mxnet"):
        print("timing {} ...".format(backend), file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, "--backend", backend] + knobs,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        if proc.returncode != 0:
            print("{} failed:\n{}".format(backend, proc.stderr[-3000:]), file=sys.stderr)
            continue
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    print("{:<11} {:<38} {:>8} {:>10} {:>9}".format("backend", "model", "variant", "images/s",
                                                     "vs native"))
    for r in rows:
        print("{:<11} {:<38} {:>8} {:>10.2f} {:>8.3f}x".format(
            r["backend"], r["model"], r["variant"], r["images_per_s"], r["ratio_to_native"]))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([os.path.relpath(__file__)] + knobs),
                   "cpus": os.cpu_count(), "rows": rows}, f, indent=1)
    print("written to", os.path.relpath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
