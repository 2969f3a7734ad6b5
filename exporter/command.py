"""The optimum-cli command class. Importing this module costs only optimum.commands.base and argparse."""

from __future__ import annotations

import sys

from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

from exporter.cli import add_arguments


class NeuronExportCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(
        name="neuron",
        help="Compile a decoder LLM for AWS Neuron (chunked prefill) or the CPU reference backend.",
    )

    @staticmethod
    def parse_args(parser):
        add_arguments(parser)

    def run(self):
        from exporter.export import run

        code = run(self.args)
        if code:
            sys.exit(code)
