"""How far Inception-v3's gradients at small inputs agree across backends, and why they part.

    .venv/bin/python -m benchmarks.inception_small_input_gradients --size 75 --batch 8 --seed 1

The tiny config without the auxiliary head (channels / 16, dropout 0) at ``--size`` pixels:
PyTorch's weights and synthetic batch, then the loss and every gradient on PyTorch with those
weights perturbed by ``--perturb`` (relative, about float32 rounding at 1e-7: the network's own
conditioning) and on each backend of ``--backends`` from the same weights. One line each: the
loss difference, the lowest and median gradient cosine to PyTorch's, how many of the gradients
fall below the 0.9999 of docs/consistency.md, and the lowest cosine of the last block and
classifier against that of the stem and the first blocks. docs/consistency.md has the results.
"""
import argparse

import numpy as np

import tbdzoo.backends.tensorflow.framework  # noqa: F401  (first: it orders the triton import)
from tbdzoo import consistency
from tbdzoo.backends.registry import build, build_native


def loss_and_gradients(model, weights, batch):
    model.set_weights(weights)
    loss, grads = model.loss_and_gradients(batch)
    loss = loss["total"] if isinstance(loss, dict) else loss
    return float(loss), {k: np.asarray(v, np.float64) for k, v in grads.items()}


def line(name, args, loss, grads, ref_loss, ref_grads):
    cos = {k: consistency.cosine(grads[k], ref_grads[k]) for k in ref_grads}
    late = min(c for k, c in cos.items() if k.startswith(("Mixed_7c", "fc")))
    early = min(c for k, c in cos.items() if k.startswith(("Conv2d", "Mixed_5")))
    return ("{:>12}  size {} batch {} seed {}: loss diff {:+.1e}, cosine min {:.5f} median "
            "{:.6f}, {} of {} < 0.9999; Mixed_7c+fc min {:.5f}, stem+Mixed_5 min {:.5f}").format(
        name, args.size, args.batch, args.seed, loss - ref_loss, min(cos.values()),
        float(np.median(list(cos.values()))), sum(c < 0.9999 for c in cos.values()), len(cos),
        late, early)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=75)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--perturb", type=float, default=1e-7)
    p.add_argument("--backends", default="tensorflow,mxnet,cntk")
    args = p.parse_args()
    hp = dict(config="tiny", image_size=args.size, aux_head=False, batch_size=args.batch,
              dropout=0.0)
    ref = build_native("inception_v3", "torch", seed=args.seed, device="cpu", **hp)
    weights, batch = ref.get_weights(), ref.synthetic_batch(seed=args.seed)
    ref_loss, ref_grads = loss_and_gradients(ref, weights, batch)
    rng = np.random.RandomState(args.seed + 100)
    nudged = {k: (v * (1 + args.perturb * rng.standard_normal(v.shape))).astype(v.dtype)
              if v.dtype.kind == "f" else v for k, v in weights.items()}
    print(line("torch+{:g}".format(args.perturb), args,
               *loss_and_gradients(ref, nudged, batch), ref_loss, ref_grads), flush=True)
    for backend in filter(None, args.backends.split(",")):
        if backend == "cntk":   # in its worker process, as every CNTK model runs
            model = build("inception_v3", backend, seed=args.seed + 1, isolate=True, **hp)
        else:
            extra = {"execution": "eager"} if backend == "tensorflow" else {}
            model = build_native("inception_v3", backend, seed=args.seed + 1, **hp, **extra)
        try:
            print(line(backend, args, *loss_and_gradients(model, weights, batch), ref_loss,
                       ref_grads), flush=True)
        finally:
            getattr(model, "close", lambda: None)()


if __name__ == "__main__":
    main()
