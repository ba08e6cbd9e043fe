import pytest

from common.errors import InputError
from common.sharding import check_divisible, list_files, select_and_shard


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


def test_node_blocks_are_contiguous():
    files = [f"f{i:03d}" for i in range(16)]
    per_rank = [select_and_shard(files, 16, r, 4, 0, "n") for r in range(4)]
    node0 = per_rank[0] + per_rank[1]
    node1 = per_rank[2] + per_rank[3]
    assert not set(node0) & set(node1)


def test_indivisible_counts_name_the_key():
    with pytest.raises(InputError, match=r"n_train=100 is not divisible by ranks x local batch = 2 x 8 = 16"):
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
    shards = [select_and_shard(files, 10, r, 4, seed=3, key="n_valid", even=False) for r in range(4)]
    assert [len(s) for s in shards] == [3, 3, 2, 2]
    assert sorted(sum(shards, [])) == sorted(files)


def test_deepcam_logs_the_whole_training_set_and_validates_every_file(tmp_path):
    from common.config import load_config
    from deepcam.config import DeepCAMConfig
    from deepcam.task import shard
    for split, n in (("train", 11), ("validation", 5)):
        (tmp_path / split).mkdir()
        for i in range(n):
            (tmp_path / split / f"s{i}.h5").write_bytes(b"")
    cfg = load_config(DeepCAMConfig, None, {"data.data_dir": str(tmp_path), "data.local_batch_size": 1})
    shards = [shard(cfg, r, 4) for r in range(4)]
    assert shards[0].n_train == 8 and shards[0].train_set_size == 11     # 11 // 4 * 4 per epoch
    assert sorted(len(s.valid_files) for s in shards) == [1, 1, 1, 2]
    assert len({f for s in shards for f in s.valid_files}) == 5
