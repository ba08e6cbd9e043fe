"""One projection run: the node counts asked for, each projected or refused in one line."""

import dataclasses

from offline.projection import inputs, model, rcp
from offline.projection.model import Dataset, Machine, ModelCosts


@dataclasses.dataclass(frozen=True)
class Request:
    """One projection asked for: a benchmark on a machine at each of `nodes` node counts."""

    benchmark: str
    machine: Machine
    nodes: tuple
    global_batch: int | None
    local_batch: int
    precision: str
    instances: int
    staging_timed: bool
    means: dict
    spatial_ranks: int = 1  # K > 1: the costs are a device's share (spatial.py)
    exchange_s_for: object = (
        None  # local batch -> seconds of the split layers' collectives per step
    )
    dataset: Dataset | None = None  # None: the benchmark's (inputs.DATASETS)
    memory: object = None  # a spatial.Memory: node counts whose batch does not fit fail

    def global_batch_for(self, nodes: int) -> int:
        # A fixed local batch is per group of K devices (a sample per group, split K ways).
        return (
            self.global_batch
            or nodes * self.machine.devices_per_node // self.spatial_ranks * self.local_batch
        )

    def project(self, costs: ModelCosts, nodes: int) -> model.Projection:
        """Raises ValueError where model.project does, and where the local batch does not fit."""
        batch = self.global_batch_for(nodes)
        p = model.project(
            self.machine,
            costs,
            self.dataset or inputs.DATASETS[self.benchmark],
            self.benchmark,
            nodes,
            batch,
            rcp.rcp_epochs(self.means, batch),
            self.precision,
            self.instances,
            self.staging_timed,
            self.spatial_ranks,
            self.exchange_s_for,
        )
        device = self.machine.device_memory_bytes
        if self.memory is not None and device and self.memory.total_at(p.local_batch) > device:
            raise ValueError(
                f"does not fit: local batch {p.local_batch:g} needs "
                f"{self.memory.total_at(p.local_batch) / 1e9:.1f} GB per device, more than its "
                f"{device / 1e9:.0f} GB"
            )
        return p

    def rows(self, costs: ModelCosts) -> list:
        """A Projection per node count, or the one-line reason it cannot be projected."""
        rows = []
        for nodes in self.nodes:
            try:
                rows.append(self.project(costs, nodes))
            except ValueError as e:
                rows.append(f"{nodes:>6} {e}")
        return rows
