"""The CPU kernels of the norm, activation and rotation ops (models/layers.py): `onp::rms_norm`,
`onp::gated_activation` and `onp::rope`, each its definition's arithmetic in one pass over a row (csrc/pointwise.cpp,
built by cpu_kernels.py) where the plain form runs one aten op per step, each a pass over the tensor: 4-6 passes per
norm, 2 per gated activation, 6 per rotation. They differ from the definitions by fp32 rounding only (the sum of
squares of a norm runs in another order; a product and a sum may fuse), bf16 rounding steps included
(tests/core/test_pointwise_kernels.py).
"""

from __future__ import annotations

import torch

from . import cpu_kernels

cpu_kernels.load()
# On CPU tensors the ops run their C++ kernels.
rms_norm_cpu = torch.ops.onp.rms_norm.default
gated_activation_cpu = torch.ops.onp.gated_activation.default
rope_cpu = torch.ops.onp.rope.default
