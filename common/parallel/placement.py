"""Whether groups of K consecutive ranks fit a job's nodes. Standard library only.

A spatial group (common.parallel.spatial_mesh.SpatialMesh) is K consecutive ranks. It keeps
its halo exchanges on a node's links, or spans whole nodes, only if two things hold: K divides
the ranks of a node or is a multiple of them (`group_span`), and the ranks are numbered node by
node, as srun's block distribution and horovodrun's -H list number them; srun's cyclic
distribution deals ranks 0, 1, 2, ... to nodes in turn, so that every group would straddle
nodes in every layer (`group_spans`). The projection (offline.projection.spatial) applies the
same rule to a machine's devices per node.
"""

import dataclasses
import itertools

from common.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RankPlace:
    """Where one rank runs, as Horovod sees it."""

    host: str  # the node's name Horovod was given (common.parallel.spatial_mesh.horovod_host)
    local_size: int  # the ranks Horovod counts on that node


@dataclasses.dataclass(frozen=True)
class NodeBlock:
    """A run of consecutive ranks on one node."""

    host: str
    first: int
    count: int


def group_span(k: int, per_node: int, asked: str, unit: str = "ranks per node") -> int:
    """Nodes that a group of `k` consecutive ranks spans on nodes of `per_node` ranks each.

    1 where `k` divides `per_node`; `k // per_node` where it is a multiple of it.

    Raises:
      ConfigError: neither (a group would hold part of one node and part of another); `asked`
        names what set k (e.g. 'parallel.spatial_ranks=3').
    """
    if per_node % k == 0:
        return 1
    if k % per_node == 0:
        return k // per_node
    raise ConfigError(
        f"{asked} neither divides nor is a multiple of the {per_node} {unit}: a group of {k} "
        f"consecutive ranks must sit on one node or span whole nodes"
    )


def node_blocks(places: list[RankPlace]) -> list[NodeBlock]:
    """The ranks (list index = rank) as runs of consecutive ranks on one host.

    Raises:
      ConfigError: a host holds two runs (ranks not numbered node by node), or a run is not the
        number of ranks Horovod counts on its node.
    """
    blocks, first = [], 0
    for host, run in itertools.groupby(places, key=lambda place: place.host):
        blocks.append(NodeBlock(host, first, len(list(run))))
        first += blocks[-1].count
    for a, b in itertools.combinations(blocks, 2):
        if a.host == b.host:
            raise ConfigError(
                f"ranks are not numbered node by node: host {a.host} holds ranks {a.first} and "
                f"{b.first} but not those between (srun's cyclic distribution?); spatial groups "
                f"are consecutive ranks: launch with block distribution (srun -m block)"
            )
    for block in blocks:
        if places[block.first].local_size != block.count:
            raise ConfigError(
                f"host {block.host} holds {block.count} rank(s) but Horovod counts "
                f"{places[block.first].local_size} on that node: the host names do not tell nodes apart"
            )
    return blocks


def group_spans(places: list[RankPlace], k: int, asked: str) -> tuple[int, ...]:
    """The nodes each group of `k` consecutive ranks spans, group by group.

    Every rank computes it from the same gathered `places`, so all ranks accept or refuse together.

    Raises:
      ConfigError: the ranks are not in node blocks, `k` neither divides nor is a multiple of a
        node's ranks, or a group holds part of a node (uneven nodes).
    """
    blocks = node_blocks(places)
    for block in blocks:
        group_span(k, block.count, asked)
    spans = []
    for first in range(0, len(places), k):
        inside = [b for b in blocks if b.first < first + k and first < b.first + b.count]
        whole = inside[0].first == first and inside[-1].first + inside[-1].count == first + k
        if len(inside) > 1 and not whole:
            raise ConfigError(
                f"{asked}: the group of ranks {first}-{first + k - 1} holds part of a node "
                f"(host {inside[0].host}: ranks {inside[0].first}-{inside[0].first + inside[0].count - 1}, "
                f"host {inside[-1].host}: ranks {inside[-1].first}-{inside[-1].first + inside[-1].count - 1})"
            )
        spans.append(len(inside))
    return tuple(spans)
