"""Registers `optimum-cli export neuron` (optimum-neuron-plugin). Kept tiny: optimum imports every module
in this namespace at CLI startup, so heavy imports (torch, transformers) happen only inside the command's run()."""

from optimum.commands.export.base import ExportCommand

from exporter.command import NeuronExportCommand

REGISTER_COMMANDS = [(NeuronExportCommand, ExportCommand)]
