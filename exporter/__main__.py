"""`python -m exporter ...` == `optimum-cli export neuron ...` (same arguments)."""

import sys

from exporter.cli import build_parser
from exporter.export import run

if __name__ == "__main__":
    sys.exit(run(build_parser("python -m exporter").parse_args()))
