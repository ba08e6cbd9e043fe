"""Spatial groups against the nodes of a job (common.parallel.placement): K consecutive ranks on one
node or over whole nodes, ranks numbered node by node. Pure functions: no Horovod."""

import pytest

from common.errors import ConfigError
from common.parallel.placement import RankPlace, group_span, group_spans

ASKED = "parallel.spatial_ranks"


def places(*hosts: str) -> list[RankPlace]:
    """Rank r on hosts[r]; each host's local size is the ranks it holds, as Horovod counts them."""
    return [RankPlace(h, hosts.count(h)) for h in hosts]


def test_block_placement_gives_groups_on_one_node_or_over_whole_nodes():
    block = places("a", "a", "b", "b")
    assert group_spans(block, 2, ASKED) == (1, 1)
    assert group_spans(block, 4, ASKED) == (2,)
    one_per_node = places("a", "b", "c", "d")
    assert group_spans(one_per_node, 2, ASKED) == (2, 2)
    assert group_spans(one_per_node, 4, ASKED) == (4,)


def test_cyclic_placement_is_refused_whatever_k():
    cyclic = places("a", "b", "a", "b")  # srun -m cyclic: ranks dealt to the nodes in turn
    for k in (2, 4):
        with pytest.raises(
            ConfigError, match="not numbered node by node: host a holds ranks 0 and 2"
        ):
            group_spans(cyclic, k, f"{ASKED}={k}")


def test_uneven_nodes_take_groups_that_fit_them():
    uneven = places("a", "a", "a", "a", "b", "b", "c", "c")
    assert group_spans(uneven, 2, ASKED) == (1, 1, 1, 1)
    assert group_spans(uneven, 4, ASKED) == (1, 2)  # one group inside a, one over b and c
    # 2 then 4 ranks: K=4 suits each node alone, but the first group takes half of the second node.
    with pytest.raises(
        ConfigError,
        match=r"ranks 0-3 holds part of a node \(host a: ranks 0-1, host b: ranks 2-5\)",
    ):
        group_spans(places("a", "a", "b", "b", "b", "b"), 4, f"{ASKED}=4")
    # 1 then 3 ranks: K=2 suits the first, not the second.
    with pytest.raises(
        ConfigError, match="=2 neither divides nor is a multiple of the 3 ranks per node"
    ):
        group_spans(places("a", "b", "b", "b"), 2, f"{ASKED}=2")


def test_k_must_divide_or_be_a_multiple_of_the_ranks_per_node():
    assert [group_span(k, 4, ASKED) for k in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 4]
    for k in (3, 6):
        with pytest.raises(
            ConfigError, match=f"={k} neither divides nor is a multiple of the 4 ranks per node"
        ):
            group_span(k, 4, f"{ASKED}={k}")


def test_host_names_that_disagree_with_horovod_are_refused():
    # Two machines of the same name: Horovod counts 2 ranks on each node, the names say 4.
    with pytest.raises(ConfigError, match="host a holds 4 rank\\(s\\) but Horovod counts 2"):
        group_spans([RankPlace("a", 2)] * 4, 2, ASKED)


def test_the_mesh_says_how_many_nodes_a_group_spans():
    from common.parallel.spatial_mesh import SpatialMesh

    assert (
        SpatialMesh(2, groups=2).describe()
        == "2-way spatial x 2 data-parallel group(s), each on one node"
    )
    assert SpatialMesh(4, groups=1, group_nodes=(2,)).describe().endswith(", each across 2 nodes")
    assert SpatialMesh(4, groups=2, group_nodes=(1, 2)).describe().endswith(", across 1 to 2 nodes")
