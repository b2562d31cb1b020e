"""Where a model runs: one device, or split over the ranks of a torchrun launch.

``load_placed(ckpt, dtype, device, tensor_parallel, pipeline_parallel)`` is what
``clearlm.load`` calls once the header is read:
- one process: the checkpoint's own loading chain, then the model moved to ``device``;
- N ranks: join the process group (launch.py), build the rank's model on the meta device
  (PipelineStage or TensorParallelModel), read only the rank's tensors (slicing.py), check
  their shapes and assign them, on the rank's device (``cuda`` → ``cuda:LOCAL_RANK``).
"""

from __future__ import annotations

import os

import torch

from clearlm.errors import DistributedError, InvalidModelFileError
from clearlm.families.transforms import tie_head
from clearlm.loading.checkpoint import Checkpoint, GGUFCheckpoint
from clearlm.loading.load import LoadedModel
from clearlm.model.transformer import Transformer
from clearlm.runtime.parallel import launch
from clearlm.runtime.parallel.pipeline import PipelineStage, stage_plan
from clearlm.runtime.parallel.slicing import Plan, read_gguf_part, read_hf_part
from clearlm.runtime.parallel.tensor import TensorParallelModel, shard_plan


def check_sizes(tensor_parallel: int, pipeline_parallel: int) -> None:
    """Raise DistributedError unless both sizes are integers ≥ 1 and at most one is > 1."""
    for name, n in (("tensor", tensor_parallel), ("pipeline", pipeline_parallel)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise DistributedError(f"--{name}-parallel must be an integer ≥ 1, got {n!r}")
    if tensor_parallel > 1 and pipeline_parallel > 1:
        raise DistributedError(
            "use --tensor-parallel or --pipeline-parallel, not both (combined is not supported)"
        )


def load_placed(
    ckpt: Checkpoint,
    dtype: torch.dtype,
    device: torch.device,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    weights: str = "float32",
    timeout_s: float | None = None,
) -> LoadedModel:
    """The checkpoint's model on ``device``, whole or this rank's share.

    Raises:
        DistributedError: bad sizes, a launch whose world size differs from the asked
            parallelism, a rendezvous not reached; and what loading raises.
    """
    check_sizes(tensor_parallel, pipeline_parallel)
    n = max(tensor_parallel, pipeline_parallel)
    if n == 1:
        loaded = ckpt.load(dtype, weights)  # weights: "compact" only on the CPU (load_options)
        loaded.model.to(device)
        return loaded
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    rank, world = launch.init(device, launch.dist_timeout() if timeout_s is None else timeout_s)
    if world != n:
        mode = "tensor" if tensor_parallel > 1 else "pipeline"
        raise DistributedError(
            f"--{mode}-parallel {n} needs {n} processes, but torchrun started {world}; "
            f"use --nproc-per-node {n} (times --nnodes)"
        )
    config = ckpt.config
    if tensor_parallel > 1:
        plan = shard_plan(config, rank, world)
        with torch.device("meta"):
            model: Transformer = TensorParallelModel(config)
            model.shard(rank, world)
    else:
        plan = stage_plan(config, rank, world)
        with torch.device("meta"):
            model = PipelineStage(config)
        model.setup_stage(rank, world)
    if isinstance(ckpt, GGUFCheckpoint):
        state = read_gguf_part(ckpt.reader, config, plan, ckpt.source)
    else:
        state = read_hf_part(ckpt.path, config, plan)
    if plan("lm_head.weight") is not None:
        state = tie_head(state, config)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    _assign(model, state, plan, ckpt.source)
    with torch.device(device):
        model.init_derived()  # RoPE / sinusoid tables, made on the rank's device
    return LoadedModel(model.eval(), config, ckpt.metadata, ckpt.tensors)


def _assign(model: Transformer, state: dict[str, torch.Tensor], plan: Plan, source: str) -> None:
    """Check that the rank got exactly its tensors, in the shapes its modules expect, and
    assign them (the meta parameters of other ranks' parts stay meta).

    Raises:
        InvalidModelFileError: a missing tensor or a shape that differs."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if plan(k) is not None}
    for name, shape in expected.items():
        if name not in state:
            raise InvalidModelFileError(f"{source}: tensor for {name} is missing")
        if tuple(state[name].shape) != shape:
            raise InvalidModelFileError(
                f"{source}: tensor {name} has shape {tuple(state[name].shape)} on this rank, "
                f"expected {shape}"
            )
    model.load_state_dict({k: state[k] for k in expected}, strict=False, assign=True)
    if model.config.tie_word_embeddings and plan("lm_head.weight") is not None:
        model.lm_head.weight = model.embed_tokens.weight
