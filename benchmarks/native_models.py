"""tbdzoo's train step against the framework's own model, one backend per process.

    .venv/bin/python benchmarks/native_models.py --model inception_v3            # all three
    .venv/bin/python benchmarks/native_models.py --model resnet50 --backend torch  # one, here

What users would pick instead, trained the framework's idiomatic way (a PyTorch loop,
``train_on_batch``, a Gluon ``Trainer``), on the same synthetic batch, the loss read back every
step on both sides. The two are interleaved: each repeat times a few steps of every contender in
turn (the order rotating from repeat to repeat), so drifts in the machine's speed hit all alike;
the median repeat is compared. Each backend runs in its own process (TensorFlow and torchvision
cannot share one). Where the architectures differ, tbdzoo's variant matching the framework's
model is timed too (the like-for-like comparison), beside its paper config.

ResNet-50: torchvision ``resnet50`` (v1.5), ``keras.applications.ResNet50`` and Gluon's
``resnet50_v1`` (both v1: the stride on the 1x1 convolution; tbdzoo's ``stride_in_1x1=True``).
v1.5 does about 7% more arithmetic. SGD, momentum 0.9, weight decay 1e-4, lr 0.1.

Inception-v3: torchvision ``inception_v3`` has the auxiliary head, as tbdzoo's paper config
(parameter for parameter); ``keras.applications.InceptionV3`` and Gluon's ``inception_v3`` have
none (tbdzoo's ``aux_head=False``). RMSProp (lr 0.045, decay 0.9, momentum 0.9, eps 1.0, weight
decay 4e-5), global-norm clipping at 2.0 (``clip_grad_norm_``, Keras' ``global_clipnorm``,
``gluon.utils.clip_global_norm``), label smoothing 0.1, the auxiliary loss at weight 0.4.
What still differs: Keras' BatchNorm has no gamma (``scale=False``) and Keras' model no dropout
(tbdzoo's and Gluon's drop 0.5 of a 4 x 2048 matrix: negligible); each framework's RMSProp keeps
its own formula (PyTorch: eps outside the root; Keras: eps inside, lr in the momentum buffer,
decoupled weight decay, tbdzoo's formula on every backend, docs/optimizers.md); Gluon's RMSProp
has no momentum unless centered, so Gluon's update is lighter than tbdzoo's by one buffer per
parameter (the comparison slightly favours Gluon).
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

BACKENDS = ("torch", "tensorflow", "mxnet")


# -- ResNet-50 as each framework's users write it ----------------------------------------------
def resnet50_torch(batch):
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


def resnet50_tensorflow(batch):
    import keras
    net = keras.applications.ResNet50(weights=None, classifier_activation=None)
    net.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, weight_decay=1e-4),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _nhwc(batch["images"]), batch["labels"]
    return lambda: float(net.train_on_batch(x, y))


def resnet50_mxnet(batch):
    mx, autograd, gluon = _mxnet()
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


# -- Inception-v3 as each framework's users write it -------------------------------------------
RMSPROP = {"lr": 0.045, "decay": 0.9, "momentum": 0.9, "eps": 1.0, "weight_decay": 4e-5}
CLIP_NORM, SMOOTHING, AUX_WEIGHT = 2.0, 0.1, 0.4


def inception_v3_torch(batch):
    import torch
    import torchvision
    net = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False)
    opt = torch.optim.RMSprop(net.parameters(), lr=RMSPROP["lr"], alpha=RMSPROP["decay"],
                              eps=RMSPROP["eps"], momentum=RMSPROP["momentum"],
                              weight_decay=RMSPROP["weight_decay"])
    x, y = torch.from_numpy(batch["images"]), torch.from_numpy(batch["labels"]).long()
    ce = torch.nn.functional.cross_entropy
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        logits, aux = net(x)
        loss = ce(logits, y, label_smoothing=SMOOTHING) + \
            AUX_WEIGHT * ce(aux, y, label_smoothing=SMOOTHING)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP_NORM)
        opt.step()
        return loss.item()
    return step


def inception_v3_tensorflow(batch):
    import keras
    import numpy as np
    net = keras.applications.InceptionV3(weights=None, classifier_activation=None)
    net.compile(optimizer=keras.optimizers.RMSprop(
        learning_rate=RMSPROP["lr"], rho=RMSPROP["decay"], momentum=RMSPROP["momentum"],
        epsilon=RMSPROP["eps"], weight_decay=RMSPROP["weight_decay"], global_clipnorm=CLIP_NORM),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=SMOOTHING))
    x = _nhwc(batch["images"])
    y = np.eye(1000, dtype="float32")[batch["labels"]]  # Keras smooths one-hot labels only
    return lambda: float(net.train_on_batch(x, y))


def inception_v3_mxnet(batch):
    import numpy as np
    mx, autograd, gluon = _mxnet()
    net = gluon.model_zoo.vision.inception_v3()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    trainer = gluon.Trainer(params, "rmsprop", {
        "learning_rate": RMSPROP["lr"], "gamma1": RMSPROP["decay"], "epsilon": RMSPROP["eps"],
        "wd": RMSPROP["weight_decay"], "centered": False})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    one_hot = np.eye(1000, dtype="float32")[batch["labels"]]
    x = mx.nd.array(batch["images"])
    y = mx.nd.array(one_hot * (1 - SMOOTHING) + SMOOTHING / 1000)

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y).mean()
        loss.backward()
        gluon.utils.clip_global_norm([p.grad() for p in params], CLIP_NORM)
        trainer.step(1)
        return float(loss.asscalar())
    return step


def _nhwc(images):
    import numpy as np
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1))  # Keras wants NHWC


def _mxnet():
    import numpy
    if not hasattr(numpy, "bool"):  # MXNet 1.9 still reads numpy.bool
        numpy.bool = bool
    import mxnet as mx
    from mxnet import autograd, gluon
    return mx, autograd, gluon


# -- what is compared --------------------------------------------------------------------------
# Per model: the batch, each backend's native (name, variant, step builder), and tbdzoo's
# variants as hyperparameter overrides; the first variant is the paper config.
MODELS = {
    "resnet50": {
        "batch_size": 16, "image_size": 224,
        "native": {"torch": ("torchvision.models.resnet50", "v1.5", resnet50_torch),
                   "tensorflow": ("keras.applications.ResNet50", "v1", resnet50_tensorflow),
                   "mxnet": ("gluon.model_zoo.vision.resnet50_v1", "v1", resnet50_mxnet)},
        "tbdzoo": {"v1.5": {}, "v1": {"stride_in_1x1": True}},
    },
    "inception_v3": {
        "batch_size": 4, "image_size": 299,  # tbdzoo.suite.CPU_BATCH_SIZES
        "native": {"torch": ("torchvision.models.inception_v3", "aux", inception_v3_torch),
                   "tensorflow": ("keras.applications.InceptionV3", "no aux", inception_v3_tensorflow),
                   "mxnet": ("gluon.model_zoo.vision.inception_v3", "no aux", inception_v3_mxnet)},
        "tbdzoo": {"aux": {}, "no aux": {"aux_head": False}},
    },
}


def tbdzoo_step(model_name, backend, batch_size, overrides):
    from tbdzoo.backends.registry import build_native
    model = build_native(model_name, backend, batch_size=batch_size, **overrides)
    prepared = model.prepare_batch(model.synthetic_batch(seed=0))
    return lambda: model.train_step(prepared)


def timed(step, steps):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def contenders(model_name, backend, batch_size):
    """name -> (variant, step): the native model, tbdzoo's like-for-like variant, then the
    paper config where that differs."""
    from tbdzoo.datasets import synthetic
    spec = MODELS[model_name]
    batch = synthetic.image_classification(batch_size, 3, spec["image_size"], 1000, seed=0)
    _, native_variant, build = spec["native"][backend]
    out = {"native": (native_variant, build(batch))}
    paper = next(iter(spec["tbdzoo"]))
    for variant in dict.fromkeys([native_variant, paper]):
        out["tbdzoo " + variant] = (variant, tbdzoo_step(model_name, backend, batch_size,
                                                         spec["tbdzoo"][variant]))
    return out


def run_backend(model_name, backend, batch_size, warmup, steps, repeats):
    """Interleaved timings in this process; returns one row per contender."""
    steppers = contenders(model_name, backend, batch_size)
    names = list(steppers)
    for name in names:
        for _ in range(warmup):
            steppers[name][1]()
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(steppers[name][1], steps))
        print("{} repeat {}: {}".format(backend, r + 1, ", ".join(
            "{} {:.2f} s".format(n, t[-1]) for n, t in times.items())), file=sys.stderr, flush=True)
    native = statistics.median(times["native"])
    rows = []
    for name in names:
        median = statistics.median(times[name])
        rows.append({"backend": backend,
                     "model": MODELS[model_name]["native"][backend][0] if name == "native" else name,
                     "variant": steppers[name][0], "batch_size": batch_size,
                     "step_s_median": median, "step_s": times[name],
                     "images_per_s": batch_size / median, "ratio_to_native": native / median,
                     # the same repeat's native time over this one's, then the median: a drift
                     # that lasts a repeat cancels
                     "ratio_to_native_paired": statistics.median(
                         a / b for a, b in zip(times["native"], times[name]))})
    return rows


def main(argv=None, default_model=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default=default_model,
                   required=default_model is None)
    p.add_argument("--backend", choices=BACKENDS, help="run one backend in this process")
    p.add_argument("--batch-size", type=int, help="default: the model's (see MODELS)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="default: benchmarks/results/native_<model>.json")
    args = p.parse_args(argv)
    batch_size = args.batch_size or MODELS[args.model]["batch_size"]
    out = args.out or os.path.join(HERE, "results", "native_{}.json".format(args.model))
    knobs = ["--model", args.model, "--batch-size", str(batch_size), "--warmup", str(args.warmup),
             "--steps", str(args.steps), "--repeats", str(args.repeats)]
    if args.backend:
        print(json.dumps(run_backend(args.model, args.backend, batch_size, args.warmup,
                                     args.steps, args.repeats)))
        return 0
    rows = []
    for backend in BACKENDS:
        print("timing {} ...".format(backend), file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--backend", backend] + knobs,
                              stdout=subprocess.PIPE, universal_newlines=True)
        if proc.returncode != 0:
            print("{} failed (its error is above)".format(backend), file=sys.stderr)
            continue
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    print("{:<11} {:<38} {:>8} {:>10} {:>9} {:>8}".format("backend", "model", "variant",
                                                           "images/s", "vs native", "paired"))
    for r in rows:
        print("{:<11} {:<38} {:>8} {:>10.2f} {:>8.3f}x {:>7.3f}x".format(
            r["backend"], r["model"], r["variant"], r["images_per_s"], r["ratio_to_native"],
            r["ratio_to_native_paired"]))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"command": " ".join([os.path.relpath(__file__)] + knobs),
                   "cpus": os.cpu_count(), "rows": rows}, f, indent=1)
    print("written to", os.path.relpath(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
