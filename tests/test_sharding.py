import h5py
import numpy as np
import pytest

from common.errors import InputError
from common.inputs.pipeline import check_divisible, list_files, select_and_shard


def test_shards_are_disjoint_cover_the_selection_and_agree_across_ranks():
    files = [f"f{i:03d}" for i in range(100)]
    shards = [select_and_shard(files, 96, rank, 4, seed=11, key="n_train") for rank in range(4)]
    flat = [f for s in shards for f in s]
    assert len(flat) == 96 and len(set(flat)) == 96
    # The same seed gives the same selection whatever rank computes it.
    assert select_and_shard(files, 96, 2, 4, seed=11, key="n_train") == shards[2]
    # The selection is shuffled, not the first 96 in name order.
    assert flat != sorted(flat)
    other = [f for r in range(4) for f in select_and_shard(files, 96, r, 4, seed=12, key="n_train")]
    assert other != flat


def test_shards_are_consecutive_slices_of_one_selection_so_node_blocks_are_contiguous():
    """What common.inputs.pipeline promises: the seeded selection does not depend on the number of
    ranks, rank r reads its r-th consecutive slice, so the ranks of a node (numbered node by
    node) read one contiguous block of it: the block the node stages, which is exactly what
    sharding the selection over the nodes gives that node."""
    files = [f"f{i:03d}" for i in range(40)]
    selection = select_and_shard(files, 32, 0, 1, seed=5, key="n")  # one rank reads it all
    assert sorted(selection) != selection and len(set(selection)) == 32  # shuffled, no repeats
    for size in (2, 4, 8):
        per_rank = [select_and_shard(files, 32, r, size, seed=5, key="n") for r in range(size)]
        for rank, shard in enumerate(per_rank):
            assert shard == selection[rank * 32 // size : (rank + 1) * 32 // size], (size, rank)
    # 2 nodes x 4 ranks: node k's ranks 4k..4k+3 read the k-th half, in rank order.
    per_rank = [select_and_shard(files, 32, r, 8, seed=5, key="n") for r in range(8)]
    for node in range(2):
        block = sum(per_rank[4 * node : 4 * node + 4], [])
        assert block == selection[16 * node : 16 * (node + 1)]
        assert block == select_and_shard(files, 32, node, 2, seed=5, key="n")
    # Uneven (evaluation) shards are consecutive slices too, the first ranks one longer.
    uneven = [select_and_shard(files, 30, r, 4, seed=5, key="n", even=False) for r in range(4)]
    assert sum(uneven, []) == select_and_shard(files, 30, 0, 1, seed=5, key="n", even=False)


def test_indivisible_counts_name_the_key():
    with pytest.raises(
        InputError, match=r"n_train=100 is not divisible by ranks x local batch = 2 x 8 = 16"
    ):
        check_divisible(100, 2, 8, "n_train")
    check_divisible(96, 2, 8, "n_train")


def test_too_few_files_and_missing_dir(tmp_path):
    with pytest.raises(InputError, match="n_valid=10 but only 3 files"):
        select_and_shard(["a", "b", "c"], 10, 0, 1, 0, "n_valid")
    with pytest.raises(InputError, match="data directory not found: .*nowhere"):
        list_files(tmp_path / "nowhere", (".tfrecord",))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no .tfrecord files"):
        list_files(tmp_path / "empty", (".tfrecord",))


def test_uneven_shards_cover_every_file_once():
    files = [f"f{i}" for i in range(10)]
    shards = [
        select_and_shard(files, 10, r, 4, seed=3, key="n_valid", even=False) for r in range(4)
    ]
    assert [len(s) for s in shards] == [3, 3, 2, 2]
    assert sorted(sum(shards, [])) == sorted(files)


def test_deepcam_logs_the_whole_training_set_and_validates_every_file(tmp_path):
    from common.config import load_config
    from deepcam.config import DeepCAMConfig
    from deepcam.task import DeepCAMTask

    # Samples of the default sizes with their data never written (h5py allocates it on first write):
    # shard reads the header of its first training file.
    for split, n in (("train", 11), ("validation", 5)):
        (tmp_path / split).mkdir()
        for i in range(n):
            with h5py.File(tmp_path / split / f"s{i}.h5", "w") as f:
                f.create_dataset("climate/data", (768, 1152, 16), np.float32)
                f.create_dataset("climate/labels_0", (768, 1152), np.float32)
    # The statistics are read with the file lists (the input normalization, before the steps are traced).
    with h5py.File(tmp_path / "stats.h5", "w") as f:
        f["climate/minval"], f["climate/maxval"] = np.zeros(16), np.ones(16)
    cfg = load_config(
        DeepCAMConfig, None, {"data.data_dir": str(tmp_path), "data.local_batch_size": 1}
    )
    shards = [DeepCAMTask(cfg).shard(r, 4) for r in range(4)]
    assert shards[0].n_train == 8 and shards[0].train_set_size == 11  # 11 // 4 * 4 per epoch
    assert sorted(len(s.valid_files) for s in shards) == [1, 1, 1, 2]
    assert len({f for s in shards for f in s.valid_files}) == 5
