"""PyTorch's engine for data-parallel training (docs/distributed.md): DistributedDataParallel
for single-loss models, torch.distributed's bucketed all-reduce of each phase's gradients for
training programs; gloo on the CPU, NCCL on CUDA. BatchNorm per replica, or synchronised over
the global batch (--bn-mode sync)."""
import contextlib
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import ops
from .model import Model

ENGINE = "DistributedDataParallel"
BUCKET_BYTES = 25 * 2 ** 20  # DDP's default bucket size, also used for training programs
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)  # the launcher's timeouts act first


# -- launch side ---------------------------------------------------------------------------------
def communication(node):
    return "nccl" if node.device == "cuda" else "gloo"


def check(node):
    """Both BatchNorm modes run here (world.BN_MODES)."""


def rank_environment(world):
    """torchrun's variables: the c10d store on node 0 at the master address."""
    node = world.node
    env = {"MASTER_ADDR": node.master_addr, "MASTER_PORT": node.master_port, "RANK": world.rank,
           "WORLD_SIZE": world.size, "LOCAL_RANK": world.local_rank,
           "LOCAL_WORLD_SIZE": node.nproc, "GROUP_RANK": node.node_rank}
    if node.interface:
        env["GLOO_SOCKET_IFNAME"] = node.interface
        env["NCCL_SOCKET_IFNAME"] = node.interface
    return env


def helpers(node):
    return []


def rank_launcher(node, argv):
    return None


# -- rank side -----------------------------------------------------------------------------------
def init(world):
    if world.node.device == "cuda":
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(communication(world.node), init_method="env://", rank=world.rank,
                            world_size=world.size, timeout=COLLECTIVE_TIMEOUT)
    return world


def finalize(world):
    """A barrier first: no rank leaves while a peer still needs it."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


AGREEMENT = "torch.distributed.broadcast"


def agree(world, value):
    """Rank 0's ``value`` (a number) on every rank: a broadcast from rank 0."""
    device = world.device  # NCCL broadcasts CUDA tensors only; gloo CPU ones
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return float(tensor.item())


def model_class():
    return DistributedModel


def _weighted_all_reduce(world, bucket):
    """DDP's comm hook: this rank's gradient times w_r, summed over ranks (the plain hook
    divides by the world size, which is w_r for equal shards)."""
    tensor = bucket.buffer()
    tensor.mul_(world.gradient_weight)
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda f: f.value()[0])


def all_reduce_gradients(params, weight, bucket_bytes=BUCKET_BYTES):
    """sum_r w_r g_r into every ``param.grad``, in flattened buckets of ``bucket_bytes``."""
    bucket, size = [], 0
    for p in params:
        bucket.append(p)
        size += p.grad.numel() * p.grad.element_size()
        if size >= bucket_bytes:
            _reduce_bucket(bucket, weight)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, weight)


def _reduce_bucket(params, weight):
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat.mul_(weight)
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def _global_moments(x, dims):
    """Per-channel mean and biased variance of ``x`` over every rank's batch, in two passes
    (the mean, then the mean squared deviation from it), and the global count. The
    all-reduces are differentiable: their backward sums the ranks' gradients."""
    from torch.distributed.nn.functional import all_reduce
    count = torch.tensor(float(x.numel() // x.shape[1]), device=x.device, dtype=x.dtype)
    sums = all_reduce(torch.cat([x.sum(dims), count.view(1)]))
    n = sums[-1]
    mean = sums[:-1] / n
    shape = [1, -1] + [1] * (x.dim() - 2)
    squares = all_reduce((x - mean.view(shape)).square().sum(dims))
    return mean, squares / n, n


def sync_batchnorm(inputs, p, a, training):
    """BatchNorm whose training statistics are the global batch's (--bn-mode sync); the
    running statistics move by the spec's rule with the global unbiased variance, the same on
    every rank. Inference is the single-process op."""
    x = inputs[0]
    if not training and a["track_running_stats"]:
        return ops.batchnorm(inputs, p, a, training)
    dims = [0] + list(range(2, x.dim()))
    shape = [1, -1] + [1] * (x.dim() - 2)
    mean, var, n = _global_moments(x.float(), dims)
    if training and p.get("running_mean") is not None:
        with torch.no_grad():
            m = a["momentum"]
            p["running_mean"].mul_(1 - m).add_(m * mean.detach())
            p["running_var"].mul_(1 - m).add_(m * var.detach() * n / (n - 1))
    scale = p["gamma"] * torch.rsqrt(var + a["eps"])
    y = (x - mean.view(shape)) * scale.view(shape) + p["beta"].view(shape)
    return y.to(x.dtype)


def sync_sequence_batchnorm(inputs, p, a, training):
    """sequence_batchnorm (statistics over the valid steps only) whose training statistics are
    every rank's valid steps (--bn-mode sync): the masked sums and the count of valid steps are
    all-reduced, the mean first, then the squared deviations from it, as one process's op
    computes them over the global batch. Inference is the single-process op."""
    from torch.distributed.nn.functional import all_reduce
    x, lengths = inputs
    if not training and a["track_running_stats"]:
        return ops.sequence_batchnorm(inputs, p, a, training)
    dtype = x.dtype
    x = x.float()
    mask = ops.valid_mask(lengths, x.shape[1], x.dtype)  # (N, T)
    sums = all_reduce(torch.cat([torch.einsum("nt,ntc->c", mask, x), mask.sum().view(1)]))
    n = sums[-1]
    mean = sums[:-1] / n
    centred = x - mean
    var = all_reduce(torch.einsum("nt,ntc->c", mask, centred * centred)) / n
    if training and a["track_running_stats"]:
        with torch.no_grad():
            m = a["momentum"]
            p["running_mean"].mul_(1 - m).add_(mean.detach(), alpha=m)
            p["running_var"].mul_(1 - m).add_(var.detach() * n / (n - 1).clamp(min=1), alpha=m)
    y = torch.addcmul(p["beta"], centred, torch.rsqrt(var + a["eps"]) * p["gamma"])
    return (y * mask[:, :, None]).to(dtype)


SYNC_OPS = {"batchnorm": sync_batchnorm, "sequence_batchnorm": sync_sequence_batchnorm}


class DistributedModel(Model):
    """The PyTorch model as one replica of ``world``."""

    def __init__(self, model_def, hparams, seed=0, device=None, world=None):
        self.world = world
        self.communicate = True
        self._ddp = None
        Model.__init__(self, model_def, hparams, seed, device=device)

    def _build(self, weights):
        Model._build(self, weights)
        if self.world.bn_mode == "sync":
            self.native.set_op_overrides(SYNC_OPS)
        if self.program is not None:
            return  # a phase's gradients are reduced in _reduce_gradients
        cuda = self.device.startswith("cuda")
        self._ddp = DistributedDataParallel(
            self.native, device_ids=[torch.device(self.device).index] if cuda else None,
            broadcast_buffers=True, bucket_cap_mb=BUCKET_BYTES / 2 ** 20)
        self._ddp.register_comm_hook(self.world, _weighted_all_reduce)

    def _loss(self, *tensors):
        """The single-process loss with the forward pass through DDP, whose hooks reduce the
        gradients during backward."""
        features, labels = tensors[:-1], tensors[-1]
        logits = self._ddp(*features)
        return ops.softmax_cross_entropy(logits, labels, self.spec.loss,
                                         overwrite_logits=self._loss_may_overwrite_logits)

    def _train_step_async(self, prepared, lr):
        no_sync = self._ddp.no_sync() if not self.communicate else contextlib.nullcontext()
        with no_sync:
            return Model._train_step_async(self, prepared, lr)

    def _reduce_gradients(self, params):
        if self.communicate:
            all_reduce_gradients(params, self.world.gradient_weight)
        return params
