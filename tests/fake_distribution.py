"""A Distribution of one rank without Horovod, for tests that run the Trainer inside pytest's process.

A stand-in only for what a process of its own would give (Horovod initialized once per
process); every collective of one rank is the identity, as Horovod's are at size 1.
"""

import socket

import numpy as np

from common.errors import ConfigError
from common.parallel.distribution import DataParallel, RankGroup


class OneRankDistribution:
    rank, size, local_rank, local_size, node_rank, num_nodes = 0, 1, 0, 1, 0, 1
    is_root = True
    device = "cpu"

    def __init__(self):
        self.hostname = socket.gethostname()
        self.collectives = (
            0  # how many collectives were called (a test can see the trainer used them)
        )

    def _called(self):
        self.collectives += 1

    def controller(self) -> str:
        return "none (in-process)"

    def check_one_rank_per_gpu(self) -> None:
        self._called()

    def barrier(self) -> None:
        self._called()

    def allreduce_sum(self, values) -> np.ndarray:
        self._called()
        return np.asarray(values, dtype=np.float64)

    def allreduce_mean(self, values) -> np.ndarray:
        return self.allreduce_sum(values)

    def allreduce_max(self, values) -> np.ndarray:
        return self.allreduce_sum(values)

    def allgather(self, values) -> np.ndarray:
        self._called()
        return np.asarray(values, dtype=np.float64)[None, ...]

    def broadcast_object(self, obj, root_rank: int = 0):
        self._called()
        return obj

    def broadcast_variables(self, variables, root_rank: int = 0) -> None:
        self._called()

    def average_gradients(self, grads, compression: str = "none", grouped: bool = False):
        return grads

    def average_variables(self, variables) -> None:
        self._called()

    def rank_group(self, group_size: int, what: str = "group size") -> RankGroup:
        if group_size != 1:
            raise ConfigError(f"{what}={group_size} does not divide the 1 rank of this job")
        return RankGroup(1, None)

    def spatial_mesh(self, spatial_ranks: int) -> DataParallel:
        self.rank_group(spatial_ranks, "parallel.spatial_ranks")
        return DataParallel()

    def describe(self) -> str:
        return "1 rank in-process (tests.fake_distribution)"
