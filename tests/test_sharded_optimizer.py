"""The optimizer sharded over a spatial group (parallel.shard_optimizer,
common.parallel.sharded_optimizer): on 2 real Horovod ranks, the same weights bit for bit as the
unsharded update with LAMB's global-norm clip active, half the slots on each rank, and a checkpoint
that resumes each rank's part (tests/sharded_optimizer_probe.py). Negative controls: without the
allgather of the updated variables, and with one rank's slots not restored. And, in one process
with TensorFlow's allocator counting its bytes, the variables assigned from the allgather keep none
of its buffer (negative control: the slices assigned uncopied)."""

import json
import textwrap

import numpy as np
import pytest

from common.parallel.sharded_optimizer import assign_owners
from tests import helpers


@pytest.fixture(scope="module")
def probe(two_rank_probe):
    out = two_rank_probe("sharded_optimizer")
    return (
        [np.load(out / f"rank-{r:05d}.npz") for r in (0, 1)],
        [json.loads((out / f"rank-{r:05d}.json").read_text()) for r in (0, 1)],
    )


def _variant(arrays, variant):
    return {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith(variant + "/")}


@pytest.mark.parametrize("update", ["", "-xla"], ids=["cpu", "xla"])
def test_sharded_update_gives_the_unsharded_weights_bit_for_bit(probe, update):
    ranks, _ = probe
    for arrays in ranks:
        whole, sharded = _variant(arrays, "whole" + update), _variant(arrays, "sharded" + update)
        assert len(whole) > 4 and sorted(whole) == sorted(sharded)
        assert all(np.array_equal(whole[k], sharded[k]) for k in whole), [
            k for k in whole if not np.array_equal(whole[k], sharded[k])
        ]
    # The negative control: without the allgather, a rank keeps its stale copy of the variables the
    # other owns (and the next steps' gradients, taken with them, move its own too).
    _, facts = probe
    whole, unshared = _variant(ranks[0], "whole"), _variant(ranks[0], "no-share")
    stale = {int(k.split("_")[1]) for k in whole if not np.array_equal(whole[k], unshared[k])}
    assert set(range(len(whole))) - set(facts[0]["sharded"]["owned"]) <= stale


def test_each_rank_holds_the_slots_of_its_own_variables_only(probe):
    _, facts = probe
    whole = facts[0]["whole"]["slot_elements"]
    assert whole == facts[1]["whole"]["slot_elements"] > 0
    shares = [f["sharded"]["slot_elements"] for f in facts]
    assert sum(shares) == whole and max(shares) <= 0.6 * whole, shares
    owned = [set(f["sharded"]["owned"]) for f in facts]
    assert not owned[0] & owned[1] and len(owned[0] | owned[1]) == len(
        _variant(probe[0][0], "whole")
    )


def test_a_sharded_checkpoint_resumes_every_rank_s_part(probe):
    ranks, facts = probe
    for arrays, fact in zip(ranks, facts):
        assert fact["resumed"]["global_step"] == 2
        sharded, resumed = _variant(arrays, "sharded"), _variant(arrays, "resumed")
        assert all(np.array_equal(sharded[k], resumed[k]) for k in sharded)
        # The negative control: rank 1's slots lost, its variables' updates differ (on both ranks).
        lost = _variant(arrays, "slots-lost")
        assert any(not np.array_equal(sharded[k], lost[k]) for k in sharded)


def test_owners_balance_the_elements_and_agree_on_every_rank():
    sizes = [1000, 10, 400, 400, 10, 180]
    owner = assign_owners(sizes, 2)
    assert owner == assign_owners(list(sizes), 2)
    loads = [sum(s for s, o in zip(sizes, owner) if o == r) for r in (0, 1)]
    assert loads == [1000, 1000], loads
    assert assign_owners(sizes, 1) == [0] * len(sizes)
    # More ranks than variables: some own nothing, every variable one owner.
    assert sorted(assign_owners([5, 3], 4)) == [0, 1]


# Four variables of 1 MiB; rank 0 of 2 owns two. The allgather is a stub (tf.pad: rank 0's flat
# variables, then zeros), so its output is one 4 MiB buffer, as Horovod's is. Prints the bytes
# TensorFlow's CPU allocator holds before a share, after it, and after two more.
_HELD_AFTER_SHARE = textwrap.dedent("""
    import sys
    import common
    import tensorflow as tf
    from common.parallel import sharded_optimizer
    if sys.argv[1] == "aliased":
        sharded_optimizer.own_buffer = lambda part: part
    variables = [tf.Variable(tf.ones([256, 1024])) for _ in range(4)]
    shard = sharded_optimizer.ShardedUpdate(variables, 0, 2, lambda flat: tf.pad(flat, [[0, 2**20 - flat.shape[0]]]))
    share = tf.function(shard.share)
    held = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
    before = held()
    share()
    first = held()
    share()
    share()
    print(before, first, held(), float(tf.reduce_sum(sum(variables))))
""")


@pytest.mark.parametrize("variant", ["copied", "aliased"])
def test_the_variables_assigned_from_the_allgather_keep_none_of_its_buffer(variant):
    environ = dict(
        helpers.env(), TF_CPU_ALLOCATOR_USE_BFC="true"
    )  # the allocator's own count of bytes in use
    proc = helpers.run(
        [helpers.PYTHON, "-c", _HELD_AFTER_SHARE, variant], environ=environ, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, first, later, total = proc.stdout.split()[-4:]
    grown = [int(first) - int(before), int(later) - int(before)]
    assert float(total) == 2 * 2**18  # rank 0's two variables kept their ones, the other two zeros
    if variant == "copied":
        assert max(grown) < 2**18, grown
    else:  # the negative control: the other rank's two variables keep the whole 4 MiB gathered buffer
        assert min(grown) >= 2 * 2**20 - 2**16, grown
