"""The options that say where a command's model runs: ``--device``, ``--tensor-parallel``,
``--pipeline-parallel``, ``--dist-timeout`` (clearlm.runtime.devices, clearlm.runtime.parallel).

Parallel runs start one process per rank with torchrun::

    torchrun --nproc-per-node 2 -m clearlm generate "Hello" --tensor-parallel 2

Every rank runs the same command; only rank 0 prints (text, statistics, the loading line).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any

import typer

DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        help="Where the model runs: cpu, cuda, cuda:N, mps, or auto (CUDA when present).",
    ),
]
TensorParallelOpt = Annotated[
    int,
    typer.Option(
        "--tensor-parallel",
        min=1,
        help="Split every layer's matrices over N ranks (start N processes with torchrun).",
    ),
]
PipelineParallelOpt = Annotated[
    int,
    typer.Option(
        "--pipeline-parallel",
        min=1,
        help="Split the blocks into N contiguous stages, one per rank (torchrun; any hosts).",
    ),
]
DistTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--dist-timeout",
        min=0.1,
        help="Seconds a rank waits for the others (rendezvous, each transfer) before it ends "
        "with an error.",
    ),
]


@dataclass(frozen=True)
class Placement:
    """Where the model runs, as the options gave it."""

    device: str = "cpu"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    dist_timeout: float = 30.0

    @property
    def parallel(self) -> bool:
        return max(self.tensor_parallel, self.pipeline_parallel) > 1

    @property
    def prints(self) -> bool:
        """Whether this process prints: always alone; only rank 0 of a parallel run."""
        from clearlm.runtime.parallel.launch import is_output_rank

        return not self.parallel or is_output_rank()

    def load_kwargs(self) -> dict[str, Any]:
        """The keywords ``clearlm.load`` takes (the timeout travels in the environment).

        Raises:
            DistributedError: started by torchrun with several processes but not asked to
                split the model (each rank would run the whole command and print it).
        """
        world = os.environ.get("WORLD_SIZE", "1")
        if not self.parallel and world.isdigit() and int(world) > 1:
            from clearlm.errors import DistributedError

            raise DistributedError(
                f"torchrun started {world} processes but the model is not split over them; "
                f"add --tensor-parallel {world} or --pipeline-parallel {world}, or run "
                "without torchrun"
            )
        os.environ["CLEARLM_DIST_TIMEOUT"] = str(self.dist_timeout)
        return dict(
            device=self.device,
            tensor_parallel=self.tensor_parallel,
            pipeline_parallel=self.pipeline_parallel,
        )
