"""DeepLabv3+ with the modified aligned Xception backbone, as the MLPerf reference.

Layer for layer the reference (mlcommons/hpc deepcam, PyTorch), in Keras, NHWC:
- entry flow: 3x3/2 conv 32, 3x3 conv 64, blocks 128/2, 256/2, 728/2;
- middle flow: 16 residual blocks of three 728-channel separable convolutions;
- exit flow: block 728->1024 (+ separable 1024), separable 1536, 1536, 2048 at
  dilation 2 (output stride 16);
- bottleneck (ASPP): 1x1 and 3x3 convolutions at rates 6/12/18 plus image
  pooling (1x1 conv and a trainable affine instead of batch norm), fused 1x1;
- decoder: two 3x3/2 transposed convolutions to stride 4, concatenated with
  the 48-channel reduction of block 1's output, two 3x3 convs and a 1x1,
  then two more 3x3/2 transposed convolutions up to the input size.
With 16 input channels: 56,454,720 trainable parameters. The reference
upsamples with transposed convolutions (not bilinear), which the count reflects.

Separable convolutions pad symmetrically by their dilation ("same" for odd
kernels) and carry no bias, batch norm follows, as in the reference.
`width` scales every channel count for small CPU runs.
"""

import tensorflow as tf
from tensorflow.keras import layers

from common.sync_batchnorm import GroupBatchNormalization

_INIT = "he_normal"   # the reference's kaiming_normal_ (fan-in, gain sqrt 2)


class _Builder:
    """Layer factory: channel scaling and the batch-norm flavour in one place."""

    def __init__(self, width: float, bn_group):
        self.width = width
        self.bn_group = bn_group

    def ch(self, channels: int) -> int:
        return max(1, int(round(channels * self.width)))

    def bn(self, name):
        if self.bn_group is None or self.bn_group.size == 1:
            return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)
        return GroupBatchNormalization(self.bn_group, momentum=0.9, epsilon=1e-5, name=name)

    @staticmethod
    def sep_conv(x, filters, stride=1, dilation=1, name=None):
        """Depthwise 3x3 then pointwise 1x1, no bias; pad = dilation on each side."""
        if stride == 1:
            x = layers.DepthwiseConv2D(3, padding="same", dilation_rate=dilation, use_bias=False,
                                       depthwise_initializer=_INIT, name=f"{name}_dw")(x)
        else:
            x = layers.ZeroPadding2D(dilation, name=f"{name}_pad")(x)
            x = layers.DepthwiseConv2D(3, strides=stride, dilation_rate=dilation, use_bias=False,
                                       depthwise_initializer=_INIT, name=f"{name}_dw")(x)
        return layers.Conv2D(filters, 1, use_bias=False, kernel_initializer=_INIT, name=f"{name}_pw")(x)

    def block(self, x, filters, reps, stride=1, dilation=1, end_with_relu=True, grow_first=True,
              is_last=False, name="block"):
        """The reference's Xception block: (sep conv, BN, ReLU) x reps without the
        last ReLU, then a strided separable conv (or one more at stride 1 if last),
        plus a (projected) shortcut."""
        inplanes = x.shape[-1]
        planes = self.ch(filters)
        shortcut = x
        if planes != inplanes or stride != 1:
            # A strided 1x1 convolution reads every stride-th pixel; slicing first
            # computes the same and avoids a oneDNN crash in TF 2.15's backward
            # pass of strided 1x1 convolutions on CPU.
            sub = x[:, ::stride, ::stride, :] if stride != 1 else x
            shortcut = layers.Conv2D(planes, 1, use_bias=False, kernel_initializer=_INIT,
                                     name=f"{name}_skip")(sub)
            shortcut = self.bn(f"{name}_skip_bn")(shortcut)
        widths = ([planes] * reps) if grow_first else ([inplanes] * (reps - 1) + [planes])
        for i, w in enumerate(widths):
            x = self.sep_conv(x, w, dilation=dilation, name=f"{name}_sep{i + 1}")
            x = self.bn(f"{name}_bn{i + 1}")(x)
            if i < len(widths) - 1:
                x = layers.ReLU(name=f"{name}_relu{i + 1}")(x)
        if stride != 1:
            x = self.sep_conv(x, planes, stride=stride, name=f"{name}_down")
        elif is_last:
            x = self.sep_conv(x, planes, name=f"{name}_last")
        x = layers.Add(name=f"{name}_add")([x, shortcut])
        return layers.ReLU(name=f"{name}_out")(x) if end_with_relu else x

    def conv_bn_relu(self, x, filters, kernel, dilation=1, name="conv"):
        x = layers.Conv2D(filters, kernel, padding="same", dilation_rate=dilation, use_bias=False,
                          kernel_initializer=_INIT, name=name)(x)
        return layers.ReLU(name=f"{name}_relu")(self.bn(f"{name}_bn")(x))

    def deconv_bn_relu(self, x, filters, name):
        x = layers.Conv2DTranspose(filters, 3, strides=2, padding="same", use_bias=False,
                                   kernel_initializer=_INIT, name=name)(x)
        return layers.ReLU(name=f"{name}_relu")(self.bn(f"{name}_bn")(x))


class _Affine(layers.Layer):
    """Per-channel scale and shift (the reference's TrainableAffine)."""

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=input_shape[-1:], initializer="ones")
        self.shift = self.add_weight(name="shift", shape=input_shape[-1:], initializer="zeros")

    def call(self, x):
        return x * tf.cast(self.scale, x.dtype) + tf.cast(self.shift, x.dtype)


def _xception(b: _Builder, x, middle_blocks: int):
    x = layers.Conv2D(b.ch(32), 3, strides=2, padding="same", use_bias=False, kernel_initializer=_INIT,
                      name="entry_conv1")(x)
    x = layers.ReLU(name="entry_relu1")(b.bn("entry_bn1")(x))
    x = b.conv_bn_relu(x, b.ch(64), 3, name="entry_conv2")
    x = b.block(x, 128, reps=2, stride=2, end_with_relu=False, name="entry_block1")
    low_level = x
    x = layers.ReLU(name="entry_block1_relu")(x)
    x = b.block(x, 256, reps=2, stride=2, name="entry_block2")
    x = b.block(x, 728, reps=2, stride=2, is_last=True, name="entry_block3")
    for i in range(middle_blocks):
        x = b.block(x, 728, reps=3, name=f"middle_block{i + 1}")
    x = b.block(x, 1024, reps=2, end_with_relu=False, grow_first=False, is_last=True, name="exit_block")
    for i, filters in enumerate((1536, 1536, 2048)):
        x = b.sep_conv(x, b.ch(filters), dilation=2, name=f"exit_sep{i + 1}")
        x = layers.ReLU(name=f"exit_relu{i + 1}")(b.bn(f"exit_bn{i + 1}")(x))
    return x, low_level


def _bottleneck(b: _Builder, x, rates=(6, 12, 18)):
    c = b.ch(256)
    branches = [b.conv_bn_relu(x, c, 1, name="aspp1")]
    branches += [b.conv_bn_relu(x, c, 3, dilation=r, name=f"aspp{i + 2}") for i, r in enumerate(rates)]
    pooled = layers.GlobalAveragePooling2D(keepdims=True, name="aspp_pool")(x)
    pooled = layers.Conv2D(c, 1, use_bias=False, kernel_initializer=_INIT, name="aspp_pool_conv")(pooled)
    pooled = layers.ReLU(name="aspp_pool_relu")(_Affine(name="aspp_pool_affine")(pooled))
    # Broadcasting the 1x1 pooled map is what the reference's bilinear
    # upsampling of a 1x1 map (and its later tile) computes.
    pooled = layers.UpSampling2D((x.shape[1], x.shape[2]), name="aspp_pool_tile")(pooled)
    x = layers.Concatenate(name="aspp_concat")(branches + [pooled])
    return b.conv_bn_relu(x, c, 1, name="aspp_fuse")


def _decoder(b: _Builder, x, low_level, n_classes: int):
    c = b.ch(256)
    low_level = b.conv_bn_relu(low_level, b.ch(48), 1, name="low_level")
    x = b.deconv_bn_relu(x, c, name="up1a")
    x = b.deconv_bn_relu(x, c, name="up1b")
    x = layers.Concatenate(name="decoder_concat")([x, low_level])
    x = b.conv_bn_relu(x, c, 3, name="decoder_conv1")
    x = b.conv_bn_relu(x, c, 3, name="decoder_conv2")
    x = layers.Conv2D(c, 1, kernel_initializer=_INIT, name="decoder_conv3")(x)   # with bias, as the reference
    x = b.deconv_bn_relu(x, c, name="up2")
    # No bias or batch norm on the last transposed convolution (reference).
    return layers.Conv2DTranspose(n_classes, 3, strides=2, padding="same", use_bias=False,
                                  kernel_initializer=_INIT, dtype="float32", name="logits")(x)


def build_model(height: int, width: int, in_channels: int, n_classes: int = 3, *, width_multiplier: float = 1.0,
                middle_blocks: int = 16, bn_group=None) -> tf.keras.Model:
    """DeepLabv3+ (output stride 16) mapping [B, H, W, C] fields to [B, H, W, classes] logits (float32)."""
    b = _Builder(width_multiplier, bn_group)
    inputs = tf.keras.Input((height, width, in_channels), name="fields")
    x, low_level = _xception(b, inputs, middle_blocks)
    x = _bottleneck(b, x)
    logits = _decoder(b, x, low_level, n_classes)
    return tf.keras.Model(inputs, logits, name="deeplabv3plus_xception")


def from_config(cfg, bn_group=None) -> tf.keras.Model:
    d, m = cfg.data, cfg.model
    return build_model(d.height, d.width, len(d.channels), 3, width_multiplier=m.width,
                       middle_blocks=m.middle_blocks, bn_group=bn_group)
