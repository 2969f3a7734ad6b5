"""torch_neuronx.utils of the stand-in: the target and LNC queries (instance info, no runtime start)."""

import os

TARGET_ENV = "ONP_TEST_PLATFORM_TARGET"  # the stand-in instance's type (default trn2)
UNREADABLE = "unreadable"  # TARGET_ENV value: the runtime cannot read the instance info (e.g. the driver is not loaded)


def get_platform_target() -> str:
    target = os.environ.get(TARGET_ENV, "trn2")
    if target == UNREADABLE:
        raise RuntimeError("nrt_get_instance_info failed")
    return target


def get_logical_neuron_cores() -> str:
    return os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2")
