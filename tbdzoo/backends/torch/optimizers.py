"""The normalized optimizers (tbdzoo/backends/common/optimizers.py). PyTorch's SGD and Adam with
coupled weight decay are exactly those formulas, so the native ones are used."""
import torch

from ..common import optimizers as normalized


def make(params, hp, fused=False):
    """``fused``: one kernel for the whole update on a GPU (same formula, fewer launches)."""
    kw = {"fused": True} if fused else {}
    name, o = normalized.check(hp), normalized.hyperparameters(hp)
    if name == "sgd":
        return torch.optim.SGD(params, lr=hp["lr"], momentum=o["momentum"],
                               nesterov=o["nesterov"], weight_decay=o["weight_decay"], **kw)
    return torch.optim.Adam(params, lr=hp["lr"], betas=(o["beta1"], o["beta2"]),
                            eps=o["eps"], weight_decay=o["weight_decay"], **kw)


def set_learning_rate(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr


def make_group(params, spec, fused=False):
    """The optimizer of a program's parameter group (docs/optimizers.md)."""
    kind = spec["kind"]
    if kind == "rmsprop":
        return RMSProp(params, lr=spec["lr"], alpha=spec["alpha"], eps=spec["eps"],
                       momentum=spec["momentum"], centered=spec["centered"],
                       weight_decay=spec["weight_decay"])
    hp = dict(spec, optimizer=kind)
    hp.setdefault("nesterov", False)
    return make(params, hp, fused=fused)


class RMSProp(torch.optim.Optimizer):
    """RMSProp with epsilon inside the root and the learning rate inside the momentum buffer,
    as TensorFlow and Keras define it (docs/optimizers.md); PyTorch's RMSprop puts both
    outside. Multi-tensor (foreach) arithmetic, no host synchronisation."""

    def __init__(self, params, lr, alpha, eps, momentum, centered, weight_decay):
        defaults = dict(lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)

    def initialise(self):
        """Every parameter's slots, zero (as before the first step)."""
        for group in self.param_groups:
            for p in group["params"]:
                s = self.state[p]
                if not s:
                    s["square_avg"] = torch.zeros_like(p)
                    s["momentum_buffer"] = torch.zeros_like(p)
                    if group["centered"]:
                        s["grad_avg"] = torch.zeros_like(p)

    def share_square_averages(self, square_averages=None):
        """Put the square averages in shared memory, so that processes each stepping their own
        RMSProp over the same shared parameters share them without a lock (A3C's shared
        statistics); ``square_averages``: ones already there, one per parameter in order. The
        momentum buffer stays each optimizer's own. Returns the square averages."""
        params = [p for group in self.param_groups for p in group["params"]]
        if square_averages is None:
            square_averages = [torch.zeros_like(p).share_memory_() for p in params]
        self.initialise()
        for p, v in zip(params, square_averages):
            self.state[p]["square_avg"] = v
        return list(square_averages)

    @torch.no_grad()
    def step(self):
        self.initialise()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if group["weight_decay"]:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            state = [self.state[p] for p in params]
            square = [s["square_avg"] for s in state]
            alpha = group["alpha"]
            torch._foreach_mul_(square, alpha)
            torch._foreach_addcmul_(square, grads, grads, value=1 - alpha)
            if group["centered"]:
                average = [s["grad_avg"] for s in state]
                torch._foreach_mul_(average, alpha)
                torch._foreach_add_(average, grads, alpha=1 - alpha)
                denom = torch._foreach_addcmul(square, average, average, value=-1)
                torch._foreach_add_(denom, group["eps"])
            else:  # one pass over the state: a copy with eps added
                denom = torch._foreach_add(square, group["eps"])
            torch._foreach_sqrt_(denom)
            buffers = [s["momentum_buffer"] for s in state]
            torch._foreach_mul_(buffers, group["momentum"])
            torch._foreach_addcdiv_(buffers, grads, denom, value=group["lr"])
            torch._foreach_sub_(params, buffers)


def clip_gradients(params, clip, norm=False):
    """Global-norm or element-wise clipping of a group's gradients (docs/optimizers.md).
    Returns the global norm of the gradients before clipping (a device scalar) where global-
    norm clipping computes it, or where ``norm`` asks for it before element-wise clipping;
    else None."""
    if clip is None:
        return None
    grads = [p for p in params if p.grad is not None]
    if clip["kind"] == "global_norm":
        return torch.nn.utils.clip_grad_norm_(grads, clip["value"], foreach=True)
    total = gradient_norm(grads) if norm and grads else None
    torch.nn.utils.clip_grad_value_(grads, clip["value"], foreach=True)
    return total


def gradient_norm(params):
    """The global L2 norm of ``params``' gradients, a device scalar (no host wait)."""
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None],
                                         foreach=True)


@torch.no_grad()
def clip_weights(params, value):
    """The original WGAN's hook: every weight of the group into [-value, value]."""
    for p in params:
        p.clamp_(-value, value)
