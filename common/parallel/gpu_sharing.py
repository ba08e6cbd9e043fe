"""The rule that no two ranks of a host share a GPU, checked at init by a job of several ranks
(common.parallel.distribution.Distribution.check_one_rank_per_gpu) on every rank's
common.parallel.gpus.RankGpu. Imports neither TensorFlow nor Horovod.
"""

import collections


def sharing_error(ranks) -> str | None:
    """One line naming the ranks, host and GPU when two ranks of a host would use one GPU, else
    None; `ranks` is every rank's RankGpu (an allgather: the same answer on every rank)."""
    users = collections.defaultdict(list)
    for r in ranks:
        if r.uuid is not None:
            users[(r.host, r.uuid)].append(r.rank)
    shared = [(where, sorted(who)) for where, who in users.items() if len(who) > 1]
    advice = (
        "launch at most one rank per GPU of a node (--ntasks-per-node no more than its GPUs); each "
        "rank takes its local rank's GPU among those it sees (docs/scaling.md#gpus-and-cpu-binding)"
    )
    if shared:
        (host, uuid), who = min(shared, key=lambda s: s[1])
        more = f" ({len(shared) - 1} more GPU(s) shared likewise)" if len(shared) > 1 else ""
        return f"ranks {_and(who)} on {host} would share GPU {uuid}{more}: {advice}"
    # Without NVML (no UUIDs), a rank whose local rank wraps past several GPUs is certain to share.
    wrapped = (r for r in ranks if r.uuid is None and r.visible > 1 and r.local_rank >= r.visible)
    r = min(wrapped, key=lambda r: r.rank, default=None)
    if r is not None:
        return (
            f"rank {r.rank} on {r.host} is local rank {r.local_rank} but sees {r.visible} GPUs, so "
            f"it would share local rank {r.local_rank % r.visible}'s: {advice}"
        )
    return None


def _and(items) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
