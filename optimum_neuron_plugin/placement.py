"""Which NeuronCore and how many host threads one rank gets, from its data-parallel and tensor-parallel place.

A server runs dp_size engines (data parallel) of tp_size ranks each (tensor parallel): dp_size x tp_size
ranks on one host. Rank (dp, tp) is the host's rank number dp * tp_size + tp. On Neuron it takes that
NeuronCore among the server's cores (NEURON_RT_VISIBLE_CORES when set, else every core), so ranks never
share a core; on the CPU backend the server's intra-op threads are split evenly between the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rank:
    """One worker's place: engine dp_rank of dp_size (host-local), rank tp_rank of its engine's tp_size."""

    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.dp_rank < self.dp_size and 0 <= self.tp_rank < self.tp_size):
            raise ValueError(f"{self} is not a rank of {self.dp_size} engine(s) of {self.tp_size} rank(s)")

    @property
    def index(self) -> int:
        """This rank's number among the host's ranks."""
        return self.dp_rank * self.tp_size + self.tp_rank

    @property
    def count(self) -> int:
        """Ranks on the host."""
        return self.dp_size * self.tp_size


def parse_cores(text: str) -> list[int]:
    """NEURON_RT_VISIBLE_CORES: one core id or one inclusive range ("0-3"; "0,1,2,3" reads the same). The Neuron
    runtime takes a single contiguous, increasing run of cores (runtime configuration guide), so a list with a gap
    or out of order ("0-3,8") is refused with the value to write instead."""
    cores: list[int] = []
    for part in text.replace(" ", "").split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(
                f"NEURON_RT_VISIBLE_CORES={text!r} is not a core list: write one core or one range, e.g. 0-3"
            )
        low, high = int(first), int(last or first)
        cores.extend(range(low, high + 1) if low <= high else (low, high))  # a falling range is refused below
    if cores != list(range(cores[0], cores[0] + len(cores))):
        raise ValueError(
            f"NEURON_RT_VISIBLE_CORES={text!r} is not one contiguous, increasing range of cores, which is all the Neuron "
            f"runtime accepts: write {_first_run(cores)} (and give other cores to another server)"
        )
    return cores


def _first_run(cores: list[int]) -> str:
    """The contiguous increasing run that starts the list, as NEURON_RT_VISIBLE_CORES syntax."""
    end = 1
    while end < len(cores) and cores[end] == cores[end - 1] + 1:
        end += 1
    return str(cores[0]) if end == 1 else f"{cores[0]}-{cores[end - 1]}"


def neuron_core(rank: Rank, visible: str | None = None) -> int:
    """The NeuronCore of `rank`: the rank.index-th of `visible` (NEURON_RT_VISIBLE_CORES), else core rank.index."""
    if not visible:
        return rank.index
    cores = parse_cores(visible)
    if rank.index >= len(cores):
        raise ValueError(
            f"{rank.count} rank(s) (data parallel {rank.dp_size} x tensor parallel {rank.tp_size}) need "
            f"{rank.count} NeuronCores but NEURON_RT_VISIBLE_CORES={visible!r} lists {len(cores)}: list more cores, "
            "or lower --data-parallel-size"
        )
    return cores[rank.index]


def cpu_threads(rank: Rank, total: int) -> int:
    """The rank's share of `total` intra-op threads (the first total % count ranks get one more); at least 1."""
    share, extra = divmod(total, rank.count)
    return max(1, share + int(rank.index < extra))
