"""The CPU kernels of the norm, activation and rotation ops (models/layers.py): `onp::rms_norm`,
`onp::gated_activation` and `onp::rope`, each its definition's arithmetic in one pass over a row (csrc/pointwise.cpp,
built by cpu_kernels.py) where the plain form runs one aten op per step, each a pass over the tensor: 4-6 passes per
norm, 2 per gated activation, 6 per rotation. They differ from the definitions by fp32 rounding only (the sum of
squares of a norm runs in another order; a product and a sum may fuse), bf16 rounding steps included
(tests/core/test_pointwise_kernels.py).
"""

from __future__ import annotations

import torch

from ..models.layers import gated_activation, rms_norm_op, rope_op
from . import cpu_kernels

cpu_kernels.load()
rms_norm_cpu = torch.ops.onp_cpu.rms_norm.default
gated_activation_cpu = torch.ops.onp_cpu.gated_activation.default
rope_cpu = torch.ops.onp_cpu.rope.default
rms_norm_op.register_kernel("cpu")(rms_norm_cpu)
gated_activation.register_kernel("cpu")(gated_activation_cpu)
rope_op.register_kernel("cpu")(rope_cpu)
