"""The optimizer's state sharded over a spatial group, by whole variables (ZeRO stages 1 and 2).

The ranks of a spatial group hold the same weights and, after the allreduce, the same gradients:
without sharding each keeps the optimizer's slots for every variable (LAMB: two, 0.42 GiB for
DeepCAM in fp32) and updates every variable, the same update K times. Sharded, each variable has
one owner in the group: only the owner builds its slots and updates it, then the group's ranks
allgather the updated variables they own (one collective per step), so every rank starts the next
step with the same weights. Where the update runs op by op (Keras' choice on a CPU), a gradient of a
variable the rank does not own is read for the step's global norm and finiteness and freed at once,
so only the owned half of the gradients waits for the update (at K = 2); compiled as one function
(on a GPU: common.run.steps.TrainStep), the update starts once every gradient is there.

Whole variables, not slices: LAMB's trust ratio is a norm per variable, which a slice would split.
The update is the unsharded one: the global-norm clip and the finiteness check still see every
gradient (ShardedUpdate.prepare), and the owner runs the same update step on the same values.
"""

import tensorflow as tf

from common.run.steps import apply_or_skip


def assign_owners(sizes, ranks: int) -> list:
    """For each variable (by its element count), the group index that owns it: largest first, each to
    the rank owning the fewest elements so far (ties to the lower index). Every rank computes the
    same assignment from the same model."""
    owned = [0] * ranks
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(ranks), key=lambda r: (owned[r], r))
        owner[i] = rank
        owned[rank] += sizes[i]
    return owner


class ShardedUpdate:
    """Which variables this rank updates, and the step's exchange of the updated ones.

    Args:
      variables: the model's trainable variables, in the order every rank builds them.
      index, size: this rank's place in its spatial group and the group's size.
      allgather: tensor -> the group's tensors concatenated along axis 0, in group order
        (Horovod's allgather over the group's process set; a stub in bench/).
    """

    def __init__(self, variables, index: int, size: int, allgather):
        self.variables = list(variables)
        dtypes = {v.dtype for v in self.variables}
        if len(dtypes) > 1:
            raise ValueError(
                f"a sharded optimizer needs one dtype of trainable variables, found {sorted(map(str, dtypes))}"
            )
        self.index, self.size = index, size
        self._allgather = allgather
        self._sizes = [int(v.shape.num_elements()) for v in self.variables]
        self.owner = assign_owners(self._sizes, size)
        self.owned = [i for i, o in enumerate(self.owner) if o == index]

    def owned_variables(self) -> list:
        return [self.variables[i] for i in self.owned]

    def prepare(self, grads, clip_norm):
        """All gradients -> (the owned ones, clipped as the global-norm clip over all of them would,
        a scalar bool: every gradient finite). The others reduce to a norm and a flag as they arrive."""
        finite = [tf.reduce_all(tf.math.is_finite(g)) for g in grads]
        owned = [grads[i] for i in self.owned]
        if clip_norm:
            # tf.clip_by_global_norm's own arithmetic on the owned gradients, with the norm of all:
            # the values the optimizer's clip over every gradient would give them.
            owned, _ = tf.clip_by_global_norm(
                owned, clip_norm, use_norm=tf.linalg.global_norm(grads)
            )
        return owned, tf.reduce_all(tf.stack(finite))

    def update(self, optimizer, grads, clip_norm, scaled: bool) -> None:
        """This rank's variables updated as the unsharded update would (`share` then sets every
        variable to its owner's value); `scaled`: the optimizer is a LossScaleOptimizer."""
        owned, finite = self.prepare(grads, clip_norm)
        pairs = list(zip(owned, self.owned_variables()))
        if scaled:
            # The loss scale skips and shrinks on its own check, which sees only this rank's gradients:
            # a non-finite gradient of another rank's variable reaches it as NaN, so every rank agrees.
            poison = tf.where(finite, 0.0, float("nan"))
            optimizer.apply_gradients([(g + tf.cast(poison, g.dtype), v) for g, v in pairs])
        else:
            apply_or_skip(optimizer, pairs, finite)

    def share(self) -> None:
        """After this rank's update of its variables: every variable set to its owner's value."""
        mine = [tf.reshape(self.variables[i], [-1]) for i in self.owned]
        flat = tf.concat(mine, axis=0) if mine else tf.zeros([0], self.variables[0].dtype)
        whole = self._allgather(flat)
        offset = 0
        for rank in range(self.size):
            for i in (i for i, o in enumerate(self.owner) if o == rank):
                if rank != self.index:
                    part = own_buffer(whole[offset : offset + self._sizes[i]])
                    self.variables[i].assign(
                        tf.reshape(part, self.variables[i].shape), read_value=False
                    )
                offset += self._sizes[i]


def own_buffer(part):
    """A copy of a slice of the allgathered tensor in a buffer of its own. A slice along axis 0 shares
    its input's buffer, and a variable assigned a tensor nothing else refers to takes that tensor's
    buffer as its storage: uncopied, the variables of the other ranks would keep the whole gathered
    buffer alive (every variable's bytes, the owned ones a second time) until the next step's share,
    0.1 GiB more held per rank for DeepCAM at K = 2."""
    return tf.raw_ops.DeepCopy(x=part)


def optimizer_shard(model, mesh) -> ShardedUpdate:
    """This rank's share of `model`'s variables for the optimizer (parallel.shard_optimizer), the
    updated weights allgathered over the spatial group `mesh`."""
    return ShardedUpdate(
        model.trainable_variables,
        mesh.index,
        mesh.size,
        lambda flat: mesh.allgather(flat, "sharded_optimizer.weights"),
    )
