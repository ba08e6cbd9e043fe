"""DeepLabv3+ with the modified aligned Xception backbone, as the MLPerf reference.

Layer for layer the reference (mlcommons/hpc deepcam, PyTorch,
architecture/deeplab_xception.py), in Keras, NHWC:
- entry flow: 3x3/2 conv 32, 3x3 conv 64, blocks 128/2, 256/2, 728/2;
- middle flow: 16 residual blocks of three 728-channel separable convolutions;
- exit flow: block 728->1024 (+ separable 1024), separable 1536, 1536, 2048 at
  dilation 2 (output stride 16);
- bottleneck (ASPP): 1x1 and 3x3 convolutions at rates 6/12/18 plus image
  pooling (1x1 conv and a trainable affine instead of batch norm), fused 1x1;
- decoder: two 3x3/2 transposed convolutions to stride 4, concatenated with
  the 48-channel reduction of ReLU(block 1's output), two 3x3 convs and a 1x1,
  then two more 3x3/2 transposed convolutions up to the input size.
With 16 input channels: 56,454,720 trainable parameters. The reference
upsamples with transposed convolutions (not bilinear), which the count reflects.

The same function, not only the same shapes:
- every layer holding weights is named after the reference module that holds
  them (`xception_features.block1.rep.0.conv1`, `upsample.deconv1.1.bn`), so
  deepcam.import_reference maps a PyTorch state dict by name;
- padding is PyTorch's, symmetric: TF's "same" pads a strided convolution
  0 before and 1 after, and places a transposed convolution's taps one pixel
  off (see `entry_conv` and `transposed_conv`);
- initialization is per layer as the reference leaves it: kaiming_normal_
  where it calls it (Xception and ASPP convolutions), PyTorch's default
  uniform everywhere else (its DeepLabv3_plus and DeconvUpsampler init
  methods are never called).
`width` scales every channel count for small CPU runs.

Split along height over a spatial group (`mesh`), each layer computes its slab's rows
(common.parallel.spatial_rows, docs/scaling.md), with the unsplit model's variables and names.
"""

import math
from typing import TYPE_CHECKING

import tensorflow as tf
import tf_keras
from tf_keras import layers

from common import cpu

if TYPE_CHECKING:  # split runs only: a data-parallel run does not import the split's layers
    from common.parallel.spatial_rows import RowHalo

# PyTorch's BatchNorm2d defaults. Its momentum 0.1 weighs the new batch
# (running = 0.9 * running + 0.1 * batch); Keras' momentum weighs the old value.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5
ASPP_RATES = (6, 12, 18)  # output stride 16; the first ASPP branch is a 1x1 convolution
EXIT_FLOW_DILATION = 2  # exit flow separable convolutions at output stride 16


class KaimingNormal(tf_keras.initializers.Initializer):
    """torch.nn.init.kaiming_normal_: N(0, 2 / fan_in), not truncated, with PyTorch's fan-in (a
    depthwise 3x3 convolution's is 9, where Keras' he_normal counts 9 x channels)."""

    def __init__(self, fan_in: int):
        self.fan_in = int(fan_in)

    def __call__(self, shape, dtype=None, **kwargs):
        return tf.random.normal(
            shape, stddev=math.sqrt(2.0 / self.fan_in), dtype=dtype or tf.float32
        )

    def get_config(self):
        return {"fan_in": self.fan_in}


class TorchDefaultUniform(tf_keras.initializers.Initializer):
    """PyTorch's default for a convolution's weight and bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in));
    a transposed convolution's fan-in is out_channels x kh x kw."""

    def __init__(self, fan_in: int):
        self.fan_in = int(fan_in)

    def __call__(self, shape, dtype=None, **kwargs):
        bound = 1.0 / math.sqrt(self.fan_in)
        return tf.random.uniform(shape, -bound, bound, dtype=dtype or tf.float32)

    def get_config(self):
        return {"fan_in": self.fan_in}


class TrainableAffine(layers.Layer):
    """Per-channel scale and shift (the reference's TrainableAffine, after the pooling branch's conv)."""

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=input_shape[-1:], initializer="ones")
        self.shift = self.add_weight(name="shift", shape=input_shape[-1:], initializer="zeros")

    def call(self, x):
        return x * tf.cast(self.scale, x.dtype) + tf.cast(self.shift, x.dtype)


class DilatedConv2D(layers.Conv2D):
    """Conv2D whose dilated convolution is one Conv2D op with `dilations`, not Keras'
    SpaceToBatchND detour, which ran 4-17x slower under oneDNN on the ASPP's small maps
    (bench/deepcam_vs_reference.py). Taken only where oneDNN runs the convolutions (`direct`) or
    on a GPU: TensorFlow's own CPU kernels have no dilated backward pass."""

    def __init__(self, *args, direct: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.direct = bool(direct)

    def convolution_op(self, inputs, kernel):
        if not self.direct:
            return super().convolution_op(inputs, kernel)
        return tf.nn.conv2d(
            inputs,
            kernel,
            strides=list(self.strides),
            padding=self.padding.upper(),
            dilations=list(self.dilation_rate),
            data_format="NHWC",
        )

    def get_config(self):
        return super().get_config() | {"direct": self.direct}


def direct_dilation_supported(dtype=tf.float32) -> bool:
    """Whether a dilated Conv2D op of `dtype` has a backward pass here: oneDNN runs it (its kernels on,
    and for bfloat16 an AVX-512 CPU: elsewhere TensorFlow falls back to its Eigen kernels, which have
    none), or a GPU."""
    if tf.config.list_logical_devices("GPU"):
        return True
    return bool(cpu.onednn_enabled()) and (
        tf.as_dtype(dtype) != tf.bfloat16 or cpu.onednn_runs_bfloat16()
    )


def entry_conv(x, filters: int, name: str, b: "LayerBuilder | None" = None):
    """The reference's first convolution: 3x3, stride 2, padding 1 on each side, kaiming normal.

    TF's "same" pads a stride-2 3x3 convolution of an even size 0 before and
    1 after: output pixel o would read inputs 2o..2o+2 instead of 2o-1..2o+1.
    """
    fan_in = 9 * x.shape[-1]
    b = b or LayerBuilder(1.0, None)
    x, halo = b.strided_padding(x, 1, name=f"{name}_pad")
    return b.conv2d(
        filters,
        3,
        halo,
        strides=2,
        use_bias=False,
        kernel_initializer=KaimingNormal(fan_in),
        name=name,
    )(x)


class TorchConvTranspose2D(layers.Conv2DTranspose):
    """PyTorch's ConvTranspose2d(k=3, stride=2, padding=1, output_padding=1): output 2H x 2W.

    There input i reaches output o = 2i - 1 + k through tap k. That is the
    transpose of a stride-2 convolution whose input (the 2H output here) is
    padded by one row and column on each side, which tf.nn.conv2d_transpose
    takes as explicit padding. TF's "same" would place the taps one pixel
    off. "valid" then cropping the first row and column computes the same,
    but over a (2H + 1) x (2W + 1) map, plus a slice and its gradient: 2 to
    2.5 times slower, forward and backward, than this on a 2-core AVX2 EPYC
    (oneDNN's filter gradient over the odd-sized map was the slow part; TF
    keeps explicitly padded transposed convolutions on its own kernels).

    On a height slab (`row_halo`: one row below), the last output row also takes the first input
    row of the slab below (o = 2i - 1 with k = 0): the input then carries that row last, and the
    padding after it grows by one, so the output is still 2 x the slab's own rows.
    """

    def __init__(self, filters: int, row_halo: "RowHalo | None" = None, **kwargs):
        super().__init__(filters, 3, strides=2, padding="valid", **kwargs)
        self.row_halo = row_halo

    def call(self, inputs):
        batch = tf.shape(inputs)[0]
        height, width = inputs.shape[1], inputs.shape[2]
        output_shape = tf.stack([batch, 2 * height, 2 * width, self.filters])
        below = self.row_halo.bottom if self.row_halo is not None else 0
        padding = [[0, 0], [1, 1 + below], [1, 1], [0, 0]]

        def convolve(x, kernel):
            return tf.nn.conv2d_transpose(x, kernel, output_shape, strides=2, padding=padding)

        if self.row_halo is None:
            outputs = convolve(inputs, self.kernel)
        else:
            outputs = self.row_halo.convolve(inputs, self.kernel, convolve, name=self.name)
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, self.bias)
        return tf.ensure_shape(outputs, [None, 2 * height, 2 * width, self.filters])

    def compute_output_shape(self, input_shape):
        shape = tf.TensorShape(input_shape).as_list()
        return tf.TensorShape([shape[0], 2 * shape[1], 2 * shape[2], self.filters])

    def get_config(self):
        config = super().get_config()
        for key in ("kernel_size", "strides", "padding"):
            config.pop(key)
        return config


def transposed_conv(x, filters: int, name: str, dtype=None, b: "LayerBuilder | None" = None):
    """PyTorch's ConvTranspose2d(k=3, stride=2, padding=1, output_padding=1), no bias, default init."""
    return TorchConvTranspose2D(
        filters,
        row_halo=b.transposed_halo() if b is not None else None,
        use_bias=False,
        kernel_initializer=TorchDefaultUniform(9 * filters),
        dtype=dtype,
        name=name,
    )(x)


class LayerBuilder:
    """Layer factory: channel scaling and the batch-norm flavour in one place; a height split's
    layers come from its subclass, deepcam.height_split.SplitBuilder."""

    def __init__(self, width: float, bn_group):
        self.width = width
        self.bn_group = bn_group
        # Built under the run's dtype policy: the layers compute in its dtype.
        self.direct_dilation = direct_dilation_supported(
            tf_keras.mixed_precision.global_policy().compute_dtype
        )

    def same_padding(self, x, halo: int, name: str):
        """(input, RowHalo or None, padding) for a stride-1 layer padded `halo` on each side."""
        return x, None, "same"

    def strided_padding(self, x, pad: int, name: str):
        """(input, RowHalo or None) for a stride-2 layer of kernel 2 * pad + 1 padded symmetrically,
        then "valid"."""
        return layers.ZeroPadding2D(pad, name=name)(x), None

    def transposed_halo(self) -> "RowHalo | None":
        """The row_halo of a TorchConvTranspose2D."""
        return None

    def conv2d(
        self, filters: int, kernel: int, row_halo: "RowHalo | None", dilation: int = 1, **kwargs
    ):
        """The Conv2D layer: Keras' (DilatedConv2D where dilated)."""
        if dilation != 1:
            direct = self.direct_dilation
            return DilatedConv2D(filters, kernel, dilation_rate=dilation, direct=direct, **kwargs)
        return layers.Conv2D(filters, kernel, **kwargs)

    def depthwise(self, row_halo: "RowHalo | None", **kwargs):
        """The 3x3 DepthwiseConv2D layer (no bias)."""
        return layers.DepthwiseConv2D(3, use_bias=False, **kwargs)

    def pooled_mean(self, x, name: str):
        """The mean over every pixel of the sample, [B, 1, 1, C]."""
        return layers.GlobalAveragePooling2D(keepdims=True, name=name)(x)

    def ch(self, channels: int) -> int:
        return max(1, int(round(channels * self.width)))

    def bn(self, x, name):
        """Batch norm named after the reference's GBN wrapper: the BatchNorm2d inside is `.bn`."""
        kwargs = dict(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=f"{name}.bn")
        if self.bn_group is None or self.bn_group.size == 1:
            return layers.BatchNormalization(**kwargs)(x)
        from common.parallel.sync_batchnorm import GroupBatchNormalization  # batch-norm groups

        return GroupBatchNormalization(self.bn_group, **kwargs)(x)

    def conv(self, x, filters, kernel, name, init, dilation=1, use_bias=False):
        """Stride-1 convolution; "same" pads odd kernels symmetrically, as PyTorch's padding=dilation*(k-1)/2."""
        fan_in = kernel * kernel * x.shape[-1]
        x, halo, padding = self.same_padding(x, dilation * (kernel // 2), name)
        return self.conv2d(
            filters,
            kernel,
            halo,
            dilation,
            padding=padding,
            use_bias=use_bias,
            kernel_initializer=init(fan_in),
            bias_initializer=TorchDefaultUniform(fan_in),
            name=name,
        )(x)

    def sep_conv(self, x, filters, name, stride=1, dilation=1):
        """The reference's SeparableConv2d_same: depthwise 3x3 (`.conv1`) then pointwise 1x1, no bias,
        padded by the dilation on each side, both kaiming normal with PyTorch's per-group fan-in."""
        # A dilated depthwise convolution stays on Keras' SpaceToBatchND route: it is
        # cheap here, and DepthwiseConv2dNative with a `dilations` attribute gave
        # input and filter gradients unlike this route's (TF 2.15, oneDNN on).
        if stride == 1:
            x, halo, padding = self.same_padding(x, dilation, f"{name}.conv1")
        else:
            (x, halo), padding = self.strided_padding(x, dilation, name=f"{name}_pad"), "valid"
        x = self.depthwise(
            halo,
            strides=stride,
            padding=padding,
            dilation_rate=dilation,
            depthwise_initializer=KaimingNormal(9),
            name=f"{name}.conv1",
        )(x)
        return layers.Conv2D(
            filters,
            1,
            use_bias=False,
            kernel_initializer=KaimingNormal(x.shape[-1]),
            name=f"{name}.pointwise",
        )(x)

    def block(
        self,
        x,
        filters,
        reps,
        name,
        stride=1,
        dilation=1,
        end_with_relu=True,
        grow_first=True,
        is_last=False,
    ):
        """The reference's Xception Block: `rep` holds (sep conv, BN, ReLU) x reps without the last
        ReLU, then a strided separable conv (or one more at stride 1 if last); plus a shortcut,
        projected by a 1x1 conv and BN when the shape changes."""
        inplanes = x.shape[-1]
        planes = self.ch(filters)
        shortcut = x
        if planes != inplanes or stride != 1:
            # A strided 1x1 convolution reads every stride-th pixel from index 0 (as
            # PyTorch's); slicing first computes the same and avoids a oneDNN crash in
            # TF 2.15's backward pass of strided 1x1 convolutions on CPU.
            sub = x[:, ::stride, ::stride, :] if stride != 1 else x
            shortcut = layers.Conv2D(
                planes,
                1,
                use_bias=False,
                kernel_initializer=KaimingNormal(inplanes),
                name=f"{name}.skip",
            )(sub)
            shortcut = self.bn(shortcut, f"{name}.skipbn")
        widths = ([planes] * reps) if grow_first else ([inplanes] * (reps - 1) + [planes])
        # Indices as in the reference's nn.Sequential: sep conv 3i, BN 3i+1, ReLU 3i+2.
        for i, w in enumerate(widths):
            x = self.sep_conv(x, w, dilation=dilation, name=f"{name}.rep.{3 * i}")
            x = self.bn(x, f"{name}.rep.{3 * i + 1}")
            if i < len(widths) - 1:
                x = layers.ReLU(name=f"{name}.rep.{3 * i + 2}")(x)
        # The reference passes no dilation to these two.
        if stride != 1:
            x = self.sep_conv(x, planes, stride=stride, name=f"{name}.rep.{3 * reps - 1}")
        elif is_last:
            x = self.sep_conv(x, planes, name=f"{name}.rep.{3 * reps - 1}")
        x = layers.Add(name=f"{name}_add")([x, shortcut])
        return layers.ReLU(name=f"{name}_relu")(x) if end_with_relu else x


def _xception(b: LayerBuilder, x, middle_blocks: int):
    """Returns (features at stride 16, low-level features at stride 4)."""
    p = "xception_features"
    x = entry_conv(x, b.ch(32), name=f"{p}.conv1", b=b)
    x = layers.ReLU(name=f"{p}.relu1")(b.bn(x, f"{p}.bn1"))
    x = b.conv(x, b.ch(64), 3, name=f"{p}.conv2", init=KaimingNormal)
    x = layers.ReLU(name=f"{p}.relu2")(b.bn(x, f"{p}.bn2"))
    x = b.block(x, 128, reps=2, stride=2, end_with_relu=False, name=f"{p}.block1")
    # The reference keeps `low_level_feat = x`, then applies an in-place ReLU
    # to x: the decoder's low-level features are ReLU(block1) too.
    x = layers.ReLU(name=f"{p}.block1_relu")(x)
    low_level = x
    x = b.block(x, 256, reps=2, stride=2, name=f"{p}.block2")
    x = b.block(x, 728, reps=2, stride=2, is_last=True, name=f"{p}.block3")
    for i in range(middle_blocks):
        x = b.block(x, 728, reps=3, name=f"{p}.block{4 + i}")
    # block20 in the reference (16 middle blocks); no ReLU after it.
    x = b.block(
        x,
        1024,
        reps=2,
        end_with_relu=False,
        grow_first=False,
        is_last=True,
        name=f"{p}.block{4 + middle_blocks}",
    )
    for i, filters in enumerate((1536, 1536, 2048), start=3):
        x = b.sep_conv(x, b.ch(filters), dilation=EXIT_FLOW_DILATION, name=f"{p}.conv{i}")
        x = layers.ReLU(name=f"{p}.relu{i}")(b.bn(x, f"{p}.bn{i}"))
    return x, low_level


def _bottleneck(b: LayerBuilder, x):
    p = "bottleneck"
    c = b.ch(256)
    branches = []
    for i, rate in enumerate((1,) + ASPP_RATES, start=1):
        y = b.conv(
            x,
            c,
            1 if rate == 1 else 3,
            dilation=rate,
            init=KaimingNormal,
            name=f"{p}.aspp{i}.atrous_convolution",
        )
        branches.append(layers.ReLU(name=f"{p}.aspp{i}.relu")(b.bn(y, f"{p}.aspp{i}.bn")))
    g = f"{p}.global_avg_pool.global_average_pool"
    pooled = b.pooled_mean(x, name=f"{g}.0")
    pooled = b.conv(pooled, c, 1, init=TorchDefaultUniform, name=f"{g}.1")
    pooled = layers.ReLU(name=f"{g}.3")(TrainableAffine(name=f"{g}.2")(pooled))
    # The reference tiles the 1x1 map to 48x72, its feature size at 768x1152;
    # repeating it to the feature size is the same there and works at any size.
    pooled = layers.UpSampling2D((x.shape[1], x.shape[2]), name=f"{p}.global_avg_pool_tile")(pooled)
    x = layers.Concatenate(name=f"{p}.concat")(branches + [pooled])
    x = b.conv(x, c, 1, init=TorchDefaultUniform, name=f"{p}.conv")
    return layers.ReLU(name=f"{p}.relu")(b.bn(x, f"{p}.bn"))


def _decoder(b: LayerBuilder, x, low_level, n_classes: int):
    c = b.ch(256)
    low_level = b.conv(low_level, b.ch(48), 1, init=TorchDefaultUniform, name="conv2")
    low_level = layers.ReLU(name="relu")(b.bn(low_level, "bn2"))
    p = "upsample"
    for i in (0, 3):
        x = transposed_conv(x, c, name=f"{p}.deconv1.{i}", b=b)
        x = layers.ReLU(name=f"{p}.deconv1.{i + 2}")(b.bn(x, f"{p}.deconv1.{i + 1}"))
    x = layers.Concatenate(name=f"{p}.concat")([x, low_level])
    for i in (0, 3):
        x = b.conv(x, c, 3, init=TorchDefaultUniform, name=f"{p}.conv1.{i}")
        x = layers.ReLU(name=f"{p}.conv1.{i + 2}")(b.bn(x, f"{p}.conv1.{i + 1}"))
    x = b.conv(
        x, c, 1, init=TorchDefaultUniform, use_bias=True, name=f"{p}.conv1.6"
    )  # bias, as the reference
    x = transposed_conv(x, c, name=f"{p}.deconv2.0", b=b)
    x = layers.ReLU(name=f"{p}.deconv2.2")(b.bn(x, f"{p}.deconv2.1"))
    # No bias or batch norm on the last transposed convolution (reference).
    return transposed_conv(x, n_classes, name=f"{p}.last_deconv.0", dtype="float32", b=b)


def build_model(
    height: int,
    width: int,
    in_channels: int,
    n_classes: int = 3,
    *,
    width_multiplier: float = 1.0,
    middle_blocks: int = 16,
    bn_group=None,
    mesh=None,
) -> tf_keras.Model:
    """DeepLabv3+ (output stride 16) mapping [B, H, W, C] fields to [B, H, W, classes] logits (float32).

    With a split `mesh`, `height` is the whole sample's and the input (and output) a slab of
    height / K rows; `bn_group` must then hold the mesh's group (the trainer's is K x
    batchnorm_group_size ranks)."""
    if mesh is not None and mesh.is_split:
        from deepcam.height_split import SplitBuilder  # split runs only

        b, rows = SplitBuilder(width_multiplier, bn_group, mesh), height // mesh.size
    else:
        b, rows = LayerBuilder(width_multiplier, bn_group), height
    inputs = tf_keras.Input((rows, width, in_channels), name="fields")
    x, low_level = _xception(b, inputs, middle_blocks)
    x = _bottleneck(b, x)
    logits = _decoder(b, x, low_level, n_classes)
    return tf_keras.Model(inputs, logits, name="deeplabv3plus_xception")


def from_config(cfg, bn_group=None, mesh=None) -> tf_keras.Model:
    d, m = cfg.data, cfg.model
    return build_model(
        d.height,
        d.width,
        len(d.channels),
        3,
        width_multiplier=m.width,
        middle_blocks=m.middle_blocks,
        bn_group=bn_group,
        mesh=mesh,
    )
