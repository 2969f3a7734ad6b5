"""The CPU kernels of the norm and activation ops (models/layers.py): `onp::rms_norm` and `onp::gated_activation`,
each its definition's arithmetic in one pass over a row (csrc/pointwise.cpp, built by cpu_kernels.py) where the plain
form runs one aten op per step, each a pass over the tensor: 4-6 passes per norm, 2 per gated activation. The sum of
squares of a norm runs in another order than aten's reduction, so a norm differs by fp32 rounding only
(tests/core/test_pointwise_kernels.py).
"""

from __future__ import annotations

import torch

from ..models.layers import gated_activation, rms_norm_op
from . import cpu_kernels

cpu_kernels.load()
rms_norm_cpu = torch.ops.onp_cpu.rms_norm.default
gated_activation_cpu = torch.ops.onp_cpu.gated_activation.default
rms_norm_op.register_kernel("cpu")(rms_norm_cpu)
gated_activation.register_kernel("cpu")(gated_activation_cpu)
