"""Optimizers with the semantics of the PyTorch references (Adam, AdamW, LAMB), chosen by name.

Keras' Adam(weight_decay=...) decays weights decoupled from the gradient, like
AdamW; PyTorch's Adam adds weight_decay * w to the gradient (an L2 term).
`AdamL2` restores that, so a recipe tuned on the reference means the same here.
LAMB follows NVIDIA apex FusedLAMB, the reference's: bias-corrected Adam moments
with gradient averaging, decoupled weight decay, a per-tensor trust ratio
||w|| / ||update|| (applied when weight decay is on, as apex does), and the
global gradient norm clipped to `max_grad_norm` before anything else.

A config names its optimizer; OPTIMIZERS maps that name to the class (TF Model Garden's
OPTIMIZERS_CLS), and `build_optimizer` passes it the config's hyperparameters. A config
accepts the optimizers that take every hyperparameter it sets (`names_taking`). A new
optimizer is its class here, its entry in OPTIMIZERS and its test.
"""

import dataclasses

import tensorflow as tf
import tf_keras

from common.errors import ConfigError


class AdamL2(tf_keras.optimizers.Adam):
    """Adam with PyTorch's coupled weight decay: g <- g + weight_decay * w."""

    def __init__(self, l2: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.l2 = float(l2)

    def update_step(self, gradient, variable):
        if self.l2:
            gradient = gradient + tf.cast(self.l2, variable.dtype) * variable
        super().update_step(gradient, variable)

    def get_config(self):
        return super().get_config() | {"l2": self.l2}


class LAMB(tf_keras.optimizers.Optimizer):
    """Layer-wise adaptive moments (You et al. 2019), apex FusedLAMB flavour.

    The update is written per variable, as Keras' optimizers are; where Keras would compile it (a
    GPU), TrainStep compiles every variable's update, the clip and the finiteness check as one XLA
    function, whose kernels XLA's GPU backend can fuse across variables (common/run/steps.py).

    Args:
      learning_rate: float or schedule.
      beta_1, beta_2, epsilon: Adam moments; epsilon is added to sqrt(v_hat).
      weight_decay_rate: decoupled decay added to the update before the trust ratio.
      max_grad_norm: gradients are scaled so their global norm is at most this.
    """

    def __init__(
        self,
        learning_rate=1e-3,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        weight_decay_rate=0.0,
        max_grad_norm=1.0,
        name="LAMB",
        **kwargs,
    ):
        # weight_decay=None: Keras' own decoupled decay (its default here is 0) would multiply every
        # variable by 0 each step, as the step starts (it waits for no gradient).
        super().__init__(
            name=name, global_clipnorm=max_grad_norm or None, weight_decay=None, **kwargs
        )
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.weight_decay_rate = weight_decay_rate
        self.max_grad_norm = max_grad_norm

    def build(self, var_list):
        super().build(var_list)
        if hasattr(self, "_built") and self._built:
            return
        self._built = True
        self._m = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._v = [self.add_variable_from_reference(v, "v") for v in var_list]

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        lr = tf.cast(self.learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        index = self._index_dict[self._var_key(variable)]
        m, v = self._m[index], self._v[index]
        # Every term the size of the variable comes from the gradient or after it: a graph runs an op
        # once its inputs are ready, and one of the slots or weights alone (b1 * m, decay * w) would
        # run as the step starts and be held through forward and backward (1.2 GiB more at the peak
        # of DeepCAM's step at 768 x 1152 fp32 on a 2-core AVX2 EPYC: docs/figures.md).
        m.assign_add((gradient - m) * (1.0 - b1))  # b1 m + (1 - b1) g
        v.assign_add((tf.square(gradient) - v) * (1.0 - b2))  # b2 v + (1 - b2) g^2
        m_hat = m / (1.0 - tf.pow(b1, step))
        v_hat = v / (1.0 - tf.pow(b2, step))
        update = m_hat / (tf.sqrt(v_hat) + tf.cast(self.epsilon, dtype))
        if self.weight_decay_rate:
            with tf.control_dependencies([update]):
                update += tf.cast(self.weight_decay_rate, dtype) * variable
                w_norm = tf.norm(variable)
            u_norm = tf.norm(update)
            ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, tf.ones_like(w_norm))
        else:
            ratio = tf.constant(1.0, dtype)
        variable.assign_sub(lr * ratio * update)

    def get_config(self):
        config = super().get_config()
        config.pop("global_clipnorm", None)
        return config | {
            "learning_rate": self._serialize_hyperparameter(self._learning_rate),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "weight_decay_rate": self.weight_decay_rate,
            "max_grad_norm": self.max_grad_norm,
        }


@dataclasses.dataclass(frozen=True)
class OptimizerEntry:
    """An optimizer class and the hyperparameters it takes.

    Hyperparameters go by Keras' names (learning_rate, momentum, beta_1, beta_2, epsilon,
    weight_decay) and max_grad_norm, whatever the class calls them.

    Attributes:
      cls: the optimizer class.
      takes: the hyperparameters it uses; others given to `build` are not passed to it.
      renamed: (hyperparameter, the class's keyword for it) pairs, where the two differ.
    """

    cls: type
    takes: tuple[str, ...]
    renamed: tuple[tuple[str, str], ...] = ()

    def build(self, **hyperparameters) -> tf_keras.optimizers.Optimizer:
        keywords = dict(self.renamed)
        return self.cls(
            **{
                keywords.get(key, key): value
                for key, value in hyperparameters.items()
                if key in self.takes
            }
        )


_ADAM = ("learning_rate", "beta_1", "beta_2", "epsilon", "weight_decay")
# Named as the configs and the MLPerf log's opt_name spell them.
OPTIMIZERS = {
    "SGD": OptimizerEntry(tf_keras.optimizers.SGD, takes=("learning_rate", "momentum")),
    # PyTorch's Adam: weight decay as an L2 term of the gradient.
    "Adam": OptimizerEntry(AdamL2, takes=_ADAM, renamed=(("weight_decay", "l2"),)),
    "AdamW": OptimizerEntry(tf_keras.optimizers.AdamW, takes=_ADAM),
    "LAMB": OptimizerEntry(
        LAMB, takes=(*_ADAM, "max_grad_norm"), renamed=(("weight_decay", "weight_decay_rate"),)
    ),
}


def names_taking(*hyperparameters: str) -> tuple[str, ...]:
    """The optimizers of OPTIMIZERS that take every one of these hyperparameters."""
    return tuple(
        name for name, entry in OPTIMIZERS.items() if set(hyperparameters) <= set(entry.takes)
    )


def check_name(name: str, hyperparameters) -> None:
    """A config's check of its optimizer.name: an optimizer of OPTIMIZERS taking every one of
    `hyperparameters` (those the config sets for every run).

    Raises:
      ConfigError: it names another (the message lists those that would do).
    """
    usable = names_taking(*hyperparameters)
    if name not in usable:
        raise ConfigError(
            f"config key 'optimizer.name'={name!r}: choose one of {', '.join(usable)} (the "
            f"optimizers of common/optimizers.py taking {', '.join(hyperparameters)})"
        )


def build_optimizer(name: str, **hyperparameters) -> tf_keras.optimizers.Optimizer:
    """The optimizer of OPTIMIZERS called `name`, built with the hyperparameters it takes.

    Raises:
      ConfigError: no optimizer has that name (the message lists those that do).
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name].build(**hyperparameters)
