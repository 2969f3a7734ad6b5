"""A stand-in for the neuronx-cc package: present, so the plugin's package checks pass."""
