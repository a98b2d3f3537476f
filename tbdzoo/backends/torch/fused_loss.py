"""Label-smoothed softmax cross-entropy that keeps only the logits for its backward pass.

``F.cross_entropy`` keeps its log-softmax output (one more tensor the size of the logits) and
its backward pass allocates up to three more (the NLL gradient, the smoothing gradient and the
log-softmax gradient). For the Transformer's 32k-word output these are 2 GB each at a batch of
16k target positions, and they sit on top of every saved activation at the start of the
backward pass, the step's peak.

This function computes the same loss, mean over counted positions of -sum_k q_k log p_k with
q = (1 - eps) onehot(y) + eps / K, row block by row block (a float32 log-softmax of one block at a
time), and keeps only the logits. Its backward pass recomputes the softmax block by block and
writes (p - q) * g / count into a new tensor or, where the caller owns the logits, over the
logits themselves. It reads and writes the logits about as often as ``F.cross_entropy`` does.
Only rounding differs.
"""
import torch
import torch.nn.functional as F

# Rows per block: a float32 block stays near 512 MiB for a 32k vocabulary (4 blocks at 16k rows):
# few launches for an eager step, a quarter of the float32 logits.
BLOCK_BYTES = 512 * 2 ** 20


def _block_rows(classes):
    return max(1, BLOCK_BYTES // (4 * max(classes, 1)))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Few ops a step, each a kernel launch on a GPU: the labels index the logits as they are
    where the ignored id is a class (a pad id of 0), the loss of a block is ``nll_loss`` of its
    log-softmax, and with no smoothing and one block the loss is that one ``nll_loss``'s mean."""

    @staticmethod
    def forward(ctx, logits, labels, ignore_index, smoothing, overwrite):
        classes = logits.shape[1]
        rows = _block_rows(classes)
        ignored = -100 if ignore_index is None else ignore_index  # nll_loss's own default
        counted = labels != ignored
        # labels to gather and scatter at: an ignored row's own id where that is a class
        safe_labels = (labels if 0 <= ignored < classes else torch.where(counted, labels, 0))[:, None]
        if smoothing == 0.0 and logits.shape[0] <= rows:
            log_p = torch.log_softmax(logits, dim=1, dtype=torch.float32)
            loss = F.nll_loss(log_p, labels, ignore_index=ignored)  # mean over counted rows
            count = None
        else:
            # -sum_k q_k log p_k = -(1 - eps) log p_y - eps/K sum_k log p_k, summed per block
            total = None
            for x, y, c in zip(logits.split(rows), labels.split(rows), counted.split(rows)):
                log_p = torch.log_softmax(x, dim=1, dtype=torch.float32)
                block = F.nll_loss(log_p, y, ignore_index=ignored, reduction="sum") \
                    .mul_(1.0 - smoothing)
                if smoothing:
                    block = block.sub_(torch.where(c, log_p.sum(dim=1), 0.0).sum(),
                                       alpha=smoothing / classes)
                total = block if total is None else total.add_(block)
            count = counted.sum()
            loss = total / count
        ctx.save_for_backward(logits, safe_labels, counted, count)
        ctx.smoothing, ctx.overwrite = smoothing, overwrite
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, labels, counted, count = ctx.saved_tensors
        classes = logits.shape[1]
        rows = _block_rows(classes)
        grad = logits if ctx.overwrite else torch.empty_like(logits)
        if count is None:
            count = counted.sum()
        scale = counted[:, None] * (grad_loss / count)  # g / count, 0 where not counted
        shift = scale * -(ctx.smoothing / classes) if ctx.smoothing else None
        for k, (x, y, g, s) in enumerate(zip(logits.split(rows), labels.split(rows),
                                             grad.split(rows), scale.split(rows))):
            p = torch.softmax(x, dim=1, dtype=torch.float32)
            p.scatter_(1, y, -(1.0 - ctx.smoothing), reduce="add")
            # (p - (1 - eps) onehot) g/count - eps/K g/count, written where the gradient goes
            if shift is None:
                torch.mul(p, s, out=g)
            else:
                torch.addcmul(shift[k * rows:(k + 1) * rows], p, s, out=g)
        return grad, None, None, None, None


def smoothed_cross_entropy(logits, labels, ignore_index, smoothing, overwrite_logits=False):
    """Mean label-smoothed cross-entropy of (M, K) ``logits`` against (M,) ``labels``, positions
    labelled ``ignore_index`` not counted. ``overwrite_logits``: the backward pass may write the
    gradient over the logits (only when nothing else reads them after the loss)."""
    return _SmoothedCrossEntropy.apply(logits, labels, ignore_index, float(smoothing),
                                       bool(overwrite_logits))
