"""The aten ops of one training step, tbdzoo's PyTorch model against its hand-written baseline.

    python3 -m benchmarks.step_op_counts --model seq2seq --batch-size 8 --gpu-paths
    python3 -m benchmarks.step_op_counts --model seq2seq --device cuda:0 --precision bf16
    python3 -m benchmarks.step_op_counts --model deepspeech2 --config tiny --by source

Run from the repository root. A step bound by the host costs a kernel launch per op that does
device work, so the count of such ops is the host's share of it; this script counts them for one
step of each side, after ``--warmup`` steps, with torch.profiler. Both sides start from the same
weights and read the same synthetic batch (benchmarks/gpu_recurrent.py's baselines: Seq2Seq,
Deep Speech 2; another model is counted on tbdzoo's side alone).

Counted ops are the innermost aten ops (an op that calls others is counted through them), less
those that launch no kernel (views, allocations, metadata: ``NO_KERNEL``) and the host casts of
Python numbers an op wraps; a multi-tensor op, a recurrence (forward or backward) and a
reduction count as one (``COLLAPSED``), as they are one launch, or one cuDNN call, on a GPU. On
the CPU the count is thus an estimate of a GPU step's launches (a mixed-dtype elementwise op
still shows the CPU's cast of its input, which CUDA does inside the kernel); on a GPU
(``--device cuda:N``) the CUDA kernels the step launched are counted as well.

Each op is put in the phase of the step that ran it, from ranges this script opens around the
step's parts: ``zero_grad``, ``forward``, ``backward``, ``clip``, ``optimizer`` and, for tbdzoo,
``guard`` (the atomic step's finite check and undo: ``_guarded_update`` less the optimizer's
step, the running statistics' copy, ``_zero_unreached``); ``other`` is the rest of tbdzoo's step.
Rows are per op (``--by op``), per source (``--by source``: the innermost function of this
repository that called the op in a forward pass, the autograd node that ran it in the backward
pass) or both.

``--gpu-paths`` runs, on the CPU, the op sequence of a GPU step, by patching for the run:
the guard's finite flag stays a tensor (``Model._checks_on_host`` returns False), both optimizers
are fused (PyTorch has a fused CPU Adam and SGD), unidirectional recurrences read the padded batch
(``_runs_padded``), and the masks and packing computed from a batch's lengths are kept on them
(``_keeps_tables``: on a GPU the prepared batch is a copy nothing writes; on the CPU it may share
the caller's arrays, so they are made again each step).
"""
import argparse
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

# Ops that do no device work: views, allocations, metadata, dispatcher wrappers.
NO_KERNEL = frozenset("aten::" + n for n in (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view",
    "_unsafe_view", "as_strided", "reshape", "_reshape_alias", "t", "transpose", "permute",
    "expand", "expand_as", "unsqueeze", "squeeze", "unsqueeze_", "squeeze_", "slice", "select",
    "narrow", "detach", "detach_", "alias", "split", "split_with_sizes", "_unsafe_split", "chunk",
    "unbind", "lift", "lift_fresh", "resize_", "set_", "result_type", "is_nonzero", "view_as",
    "unflatten", "flatten", "contiguous", "to", "type_as", "requires_grad_", "is_same_size",
    "_has_compatible_shallow_copy_type", "conj", "resolve_conj", "resolve_neg", "broadcast_to",
    "movedim", "unfold", "cudnn_is_acceptable", "record_stream"))
_NODE = "autograd::engine::evaluate_function: "
# Ops counted as one, whatever they call: a multi-tensor op is one launch (or one per chunk of
# tensors) on a GPU where the CPU loops over the tensors; a recurrence is one cuDNN call there,
# and so is its backward pass (oneDNN's on the CPU: a node per layer); a reduction is one kernel
# on a GPU, where the CPU first fills its output.
COLLAPSED = ("aten::_foreach_", "aten::_fused_", "aten::_amp_", "aten::lstm", "aten::gru",
             "aten::_cudnn_rnn", "aten::sum", "aten::any", "aten::mean",
             _NODE + "CudnnRnnBackward0", _NODE + "MkldnnRnnLayerBackward0")
# Ops that launch their own kernel besides those of the ops they call (counted with them).
OWN_WORK = frozenset(("aten::nll_loss_backward", "aten::nll_loss2d_backward"))
PHASES = ("zero_grad", "forward", "backward", "clip", "guard", "optimizer", "other")


def kernel_ops(prof):
    """[(event, phase, source)] of the step's innermost aten ops that do device work."""
    out = []
    for e in prof.events():
        if not (e.name.startswith("aten::") or _collapsed(e.name)) or _under_collapsed(e) \
                or not _counted(e):
            continue
        phase, node = "other", None
        if e.name.startswith(_NODE):
            node = e.name[len(_NODE):]
        parent = e.cpu_parent
        while parent is not None:
            name = parent.name
            if node is None and name.startswith(_NODE):
                node = name[len(_NODE):]
            if name.startswith("step::"):
                phase = name[len("step::"):]
                break
            parent = parent.cpu_parent
        if node is not None:
            phase = "backward" if phase in ("other", "forward", "backward") else phase
        out.append((e, phase, node or _source(e) or phase))
    return out


def _collapsed(name):
    return name.startswith(COLLAPSED)


def _under_collapsed(e):
    parent = e.cpu_parent
    while parent is not None:
        if _collapsed(parent.name):
            return True
        parent = parent.cpu_parent
    return False


def _counted(e):
    """An op that does device work and calls no other op that does (one op for a collapsed
    one, whatever it calls)."""
    if _collapsed(e.name) or e.name in OWN_WORK:
        return True
    if e.name in NO_KERNEL or _scalar_conversion(e):
        return False
    return not any(_does_work(c) for c in e.cpu_children)


def _does_work(e):
    if _scalar_conversion(e):
        return False
    if _collapsed(e.name) or (e.name.startswith("aten::") and e.name not in NO_KERNEL):
        return True
    return any(_does_work(c) for c in e.cpu_children)


def _scalar_conversion(e):
    """A cast of a 0-d tensor inside another op: a Python number the op wrapped, converted on
    the host (on a GPU too), or a copy inside one."""
    inside = e
    while inside is not None and inside.name in ("aten::copy_", "aten::_to_copy", "aten::to"):
        if inside.name == "aten::to":
            parent = inside.cpu_parent
            shapes = inside.input_shapes or [[None]]
            return parent is not None and parent.name.startswith("aten::") and shapes[0] == []
        inside = inside.cpu_parent
    return False


def _source(event):
    """The innermost Python function of this repository (not this script) the op ran under,
    as path:function (the profiler's Python frames are the op's ancestors)."""
    here = os.path.basename(__file__)
    parent = event.cpu_parent
    while parent is not None:
        frame = parent.name
        path = frame.split("(")[0].replace(os.sep, "/")
        for root in ("tbdzoo/", "benchmarks/"):
            if root in path and not path.endswith(here) and "): " in frame:
                return "{}:{}".format(path[path.index(root):], frame.rsplit("): ", 1)[-1])
        parent = parent.cpu_parent
    return None


def count(step, device, warmup):
    """Profile one call of ``step`` after ``warmup`` calls: (ops [(event, phase, source)],
    CUDA kernels launched or None)."""
    for _ in range(warmup):
        step()
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_stack=True, record_shapes=True) as prof:
        step()
        if cuda:
            torch.cuda.synchronize(device)
    kernels = None
    if cuda:
        from torch.autograd import DeviceType
        kernels = sum(e.count for e in prof.key_averages() if e.device_type == DeviceType.CUDA)
    return kernel_ops(prof), kernels


# -- the two sides, with ranges around the parts of a step --------------------------------------
def _ranged(name, fn):
    def run(*args, **kwargs):
        with record_function("step::" + name):
            return fn(*args, **kwargs)
    return run


class _Patches:
    """Attributes set for the run and put back after."""

    def __init__(self):
        self.saved = []

    def set(self, obj, name, value):
        self.saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self):
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)


def tbdzoo_side(args, patches):
    """tbdzoo's model, its step and its batch, the parts of its step in ranges."""
    import tbdzoo
    from tbdzoo.backends.torch import model as torch_model
    from tbdzoo.backends.torch import ops as torch_ops
    from tbdzoo.backends.torch import optimizers as torch_optimizers

    if args.gpu_paths:
        patches.set(torch_model.Model, "_checks_on_host", lambda self: False)
        patches.set(torch_ops, "_runs_padded", lambda x, attrs: not attrs["bidirectional"])
        patches.set(torch_ops, "_keeps_tables", lambda lengths: True)
        for name in ("make", "make_group"):
            fn = getattr(torch_optimizers, name)
            patches.set(torch_optimizers, name,
                        lambda *a, _fn=fn, **kw: _fn(*a, **dict(kw, fused=True)))
    patches.set(torch.Tensor, "backward", _ranged("backward", torch.Tensor.backward))
    patches.set(torch_optimizers, "clip_gradients", _ranged("clip", torch_optimizers.clip_gradients))
    for name in ("_guarded_update", "_save_statistics", "_put_statistics"):
        patches.set(torch_model.Model, name, _ranged("guard", getattr(torch_model.Model, name)))
    patches.set(torch_model, "_zero_unreached", _ranged("guard", torch_model._zero_unreached))

    sizes = {} if args.batch_size is None else {"batch_size": args.batch_size}
    model = tbdzoo.build(args.model, backend="torch", config=args.config, device=args.device,
                         precision=args.precision, execution="eager", **sizes)
    batch = model.synthetic_batch(seed=0)
    prepared = model.prepare_batch(batch)
    if model.program is not None:
        model._objectives = [_ranged("forward", f) for f in model._objectives]
        optimizers_held = list(model._optimizers.values())
    else:
        model._forward_loss = _ranged("forward", model._forward_loss)
        optimizers_held = [model.optimizer]
    for optimizer in optimizers_held:
        optimizer.step = _ranged("optimizer", optimizer.step)
        optimizer.zero_grad = _ranged("zero_grad", optimizer.zero_grad)
    return model, batch, lambda: model.train_step(prepared, sync=False)


def baseline_side(args, model, batch, patches):
    """benchmarks/gpu_recurrent.py's hand-written step of the same weights and batch, or None."""
    from benchmarks import gpu_recurrent
    if args.model not in gpu_recurrent.HANDWRITTEN:
        return None
    if args.gpu_paths:
        patches.set(gpu_recurrent, "fast_optimizer", lambda device: {"fused": True})
    for name in ("clip_grad_norm_", "clip_grad_value_"):
        patches.set(torch.nn.utils, name, _ranged("clip", getattr(torch.nn.utils, name)))
    precision = "tf32" if args.precision in ("fp32", "tf32") else args.precision
    net, opt, step = gpu_recurrent.handwritten_step(args.model, model.hparams, model.get_weights(),
                                                    batch, args.device, precision, False)
    net.forward = _ranged("forward", net.forward)
    opt.step = _ranged("optimizer", opt.step)
    opt.zero_grad = _ranged("zero_grad", opt.zero_grad)
    return step


# -- the table ----------------------------------------------------------------------------------
def tables(counted, by):
    """{side: Counter of (phase, key)} with key the op name, the source, or both."""
    out = collections.OrderedDict()
    for side, (ops, _) in counted.items():
        c = collections.Counter()
        for e, phase, source in ops:
            name = e.name[len(_NODE):] if e.name.startswith(_NODE) else e.name
            key = {"op": name, "source": source, "both": "{}  {}".format(source, name)}[by]
            c[(phase, key)] += 1
        out[side] = c
    return out


def render(counted, by):
    sides = list(counted)
    per_key = tables(counted, by)
    width = max([len(k) for c in per_key.values() for _, k in c] + [30])
    lines = ["{:<10} {:<{w}} ".format("phase", by, w=width) + "".join(
        "{:>12}".format(s) for s in sides) + ("{:>8}".format("diff") if len(sides) == 2 else "")]
    for phase in PHASES:
        keys = sorted({k for c in per_key.values() for p, k in c if p == phase},
                      key=lambda k: (-sum(c[(phase, k)] for c in per_key.values()), k))
        for k in keys:
            values = [per_key[s][(phase, k)] for s in sides]
            lines.append("{:<10} {:<{w}} ".format(phase, k, w=width) + "".join(
                "{:>12}".format(v) for v in values) + (
                "{:>+8}".format(values[0] - values[1]) if len(sides) == 2 else ""))
    lines.append("")
    lines.append("{:<10} {:<{w}} ".format("phase", "total", w=width) + "".join(
        "{:>12}".format(s) for s in sides))
    for phase in PHASES + ("all",):
        values = [sum(v for (p, _), v in per_key[s].items() if phase in ("all", p)) for s in sides]
        if any(values):
            lines.append("{:<10} {:<{w}} ".format(phase, "", w=width) + "".join(
                "{:>12}".format(v) for v in values) + (
                "{:>+8}".format(values[0] - values[1]) if len(sides) == 2 else ""))
    kernels = [counted[s][1] for s in sides]
    if any(k is not None for k in kernels):
        lines.append("{:<10} {:<{w}} ".format("cuda", "kernels launched", w=width) + "".join(
            "{:>12}".format(k) for k in kernels))
    return "\n".join(lines)


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="seq2seq", help="a tbdzoo model (default seq2seq)")
    p.add_argument("--backend", default="torch", choices=("torch",),
                   help="the backend counted (only torch: the ops are PyTorch's)")
    p.add_argument("--config", default="paper", help="the model's config (default paper)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="batch size of both sides (default: the config's; the counts of a step "
                        "over padded batches do not depend on it)")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    p.add_argument("--precision", default=None, choices=("fp32", "tf32", "bf16"),
                   help="default: tf32 on a GPU, fp32 on the CPU")
    p.add_argument("--gpu-paths", action="store_true",
                   help="on the CPU, the op sequence of a GPU step (see above)")
    p.add_argument("--warmup", type=int, default=2, help="steps before the counted one (default 2)")
    p.add_argument("--by", default="op", choices=("op", "source", "both"),
                   help="rows per op name, per source (frame, autograd node or range), or both")
    args = p.parse_args(argv)
    if args.precision is None:
        args.precision = "tf32" if args.device.startswith("cuda") else "fp32"
    if args.gpu_paths and args.device != "cpu":
        p.error("--gpu-paths is for the CPU; on a GPU the step takes its own paths")
    return args


def main(argv=None):
    args = arguments(argv)
    torch.manual_seed(0)
    patches = _Patches()
    try:
        model, batch, ours = tbdzoo_side(args, patches)
        theirs = baseline_side(args, model, batch, patches)
        counted = collections.OrderedDict([("tbdzoo", count(ours, args.device, args.warmup))])
        if theirs is not None:
            counted["handwritten"] = count(theirs, args.device, args.warmup)
    finally:
        patches.undo()
    print("{} {} config={} batch={} device={} precision={}{}".format(
        args.model, args.backend, args.config, model.hparams["batch_size"], args.device,
        args.precision, " (GPU paths on the CPU)" if args.gpu_paths else ""))
    print(render(counted, args.by))
    return 0


if __name__ == "__main__":
    sys.exit(main())
