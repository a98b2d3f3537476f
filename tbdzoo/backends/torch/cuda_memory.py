"""Where a CUDA training step's peak memory goes, from the PyTorch caching allocator's trace.

``memory_trace`` runs one step under the allocator's event history; ``peak_attribution``
replays those events to the moment of the peak and gives every block live then to the
category that owns a tensor inside it. The replay is plain Python over the events, so it is
tested on synthetic traces without a GPU.
"""
import bisect
from collections import OrderedDict


def reset_peak(device):
    """Start a new peak window for ``device`` (the allocator's ``max_memory_allocated``)."""
    import torch
    torch.cuda.reset_peak_memory_stats(device)


def memory_trace(step, device):
    """Run ``step`` under the CUDA caching allocator's event trace; return what replaying needs:
    the blocks live before, the events, and the allocator's own peak for the step (its peak
    counter is reset just before, so the figure is this step's, whatever ran earlier)."""
    import torch
    index = torch.device(device).index or 0
    torch.cuda.synchronize(device)
    live = {b["address"]: b["size"] for seg in torch.cuda.memory._snapshot()["segments"]
            if seg["device"] == index for b in seg["blocks"] if b["state"] == "active_allocated"}
    reset_peak(device)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=4000000)
    try:
        step()
        torch.cuda.synchronize(device)
        events = torch.cuda.memory._snapshot()["device_traces"][index]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return {"live_before": live, "events": events,
            "max_memory_allocated": torch.cuda.max_memory_allocated(device)}


def replay_to_peak(trace):
    """(peak bytes, {address: size} of the blocks live at the peak) from the trace's events.

    The allocator's counters drop at ``free_requested`` (a block freed on its stream), not at
    ``free_completed``, so that is where the replay releases a block."""
    live = dict(trace["live_before"])
    total = peak = sum(live.values())
    peak_live = dict(live)
    for event in trace["events"]:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = size
            total += size
            if total > peak:
                peak, peak_live = total, None
        elif action == "free_requested" and addr in live:
            if peak_live is None:
                peak_live = dict(live)
            total -= live.pop(addr)
    if peak_live is None:
        peak_live = dict(live)
    return peak, peak_live


def peak_attribution(trace, claims):
    """Attribute the blocks live at the replayed peak.

    ``claims`` is an ordered mapping category -> data pointers of that category's tensors. A
    block belongs to the first category, in that order, one of whose pointers lies inside it;
    live blocks no pointer claims are ``workspace``. ``unattributed`` is the allocator's peak
    minus the replayed one (rounding, events the trace missed)."""
    peak, peak_live = replay_to_peak(trace)
    starts = sorted(peak_live)
    owner = {}
    for category, pointers in claims.items():
        for ptr in pointers:
            i = bisect.bisect_right(starts, ptr) - 1
            if i >= 0 and ptr < starts[i] + peak_live[starts[i]] and starts[i] not in owner:
                owner[starts[i]] = category
    out = OrderedDict((k, 0) for k in list(claims) + ["workspace"])
    for addr, size in peak_live.items():
        out[owner.get(addr, "workspace")] += size
    out["replayed_peak"] = peak
    out["unattributed"] = trace["max_memory_allocated"] - peak
    return out
