"""Load a Hugging Face model folder: config.json + safetensors (single file or sharded).

Only safetensors are read: ``.bin``/``.pt`` checkpoints are Python pickles, which can run
arbitrary code when loaded, so clearlm refuses them with a message saying how to convert.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError, ModelNotFoundError, UnsupportedModelError
from clearlm.families import family_for
from clearlm.families.base import Family, HFConfig
from clearlm.loading.compact.half import half_state_keys, swap_half_modules
from clearlm.loading.config_values import check_hf_values, config_errors
from clearlm.loading.load import LoadedModel, TensorInfo, assemble, skeleton

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file as a dict. Raises InvalidModelFileError naming the file if it is not JSON
    or not a JSON object."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))  # bytes: no newline translation
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise InvalidModelFileError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise InvalidModelFileError(
            f"{path} must hold a JSON object ({{...}}), not a JSON {type(data).__name__}"
        )
    return data


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a folder: the shards an index names, or model.safetensors.

    Raises:
        UnsupportedModelError: only pickle checkpoints (.bin/.pt) are present.
        InvalidModelFileError: the index names a missing shard.
        ModelNotFoundError: no weights at all.
    """
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(read_json(index).get("weight_map", {}).values()))
        files = [folder / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise InvalidModelFileError(f"{index} names missing shard {missing[0]}")
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(folder.glob("*.safetensors"))
    if others:
        return others
    if any(p.suffix in PICKLE_SUFFIXES for p in folder.iterdir()):
        raise UnsupportedModelError(
            f"{folder} has only pickle weights (.bin/.pt), which can run code when loaded; "
            "clearlm reads safetensors only: convert with transformers' save_pretrained"
        )
    raise ModelNotFoundError(f"{folder} has no model.safetensors or safetensors index")


def read_safetensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], list[TensorInfo]]:
    """Every tensor of every file (name → tensor as stored) and its TensorInfo."""
    state: dict[str, torch.Tensor] = {}
    infos: list[TensorInfo] = []
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    t = sf.get_tensor(name)
                    state[name] = t
                    infos.append(
                        TensorInfo(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
                    )
        except Exception as e:  # safetensors raises its own SafetensorError on bad bytes
            raise InvalidModelFileError(f"{f} is not a readable safetensors file ({e})") from None
    return state, infos


def inspect_hf(folder: str | Path) -> tuple[ModelConfig, dict[str, Any], list[TensorInfo]]:
    """config.json → ModelConfig, and the tensor list from the safetensors headers (no weights
    are read). Raises ModelNotFoundError, InvalidModelFileError, UnsupportedModelError."""
    folder = Path(folder)
    family, config, raw = _config(folder)
    infos = []
    for f in safetensors_files(folder):
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    sl = sf.get_slice(name)
                    infos.append(TensorInfo(name, sl.get_dtype(), tuple(sl.get_shape())))
        except Exception as e:  # safetensors raises its own SafetensorError on bad bytes
            raise InvalidModelFileError(f"{f} is not a readable safetensors file ({e})") from None
    return config, {"hf.config": raw}, infos


def _config(folder: Path) -> tuple[Family, ModelConfig, dict[str, Any]]:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelNotFoundError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    raw = read_json(cfg_path)
    check_hf_values(raw, str(cfg_path))
    family = family_for(raw.get("model_type"), str(cfg_path))
    safetensors_files(folder)  # refuse pickles before reading anything else
    with config_errors(str(cfg_path)):
        config = family.build_config(HFConfig(raw, str(cfg_path)), raw["model_type"])
    return family, config, raw


def load_hf_model(folder: str | Path, dtype: torch.dtype = torch.float32,
                  compact: bool = False) -> LoadedModel:
    """config.json → ModelConfig (through the family) → safetensors → rename → convert →
    cast → tie → check shapes → assign.

    Args:
        folder: a directory holding config.json and safetensors weights.
        dtype: parameter dtype.
        compact: with dtype float32, keep float16 / bfloat16 matrices of plain linear and
            embedding layers 16-bit as stored (loading/compact/half.py: HalfLinear /
            HalfEmbedding, the file's bytes) instead of casting them.

    Raises:
        ModelNotFoundError, InvalidModelFileError, UnsupportedModelError.
    """
    folder = Path(folder)
    family, config, raw = _config(folder)
    state, infos = read_safetensors(safetensors_files(folder))
    state = {family.rename(k): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if k}  # "" marks tensors we do not use
    state = family.convert(state, config)
    keep = half_state_keys(state, skeleton(config)) if compact and dtype == torch.float32 else ()
    state = {k: v if k in keep else v.to(dtype) for k, v in state.items()}
    model = assemble(config, state, folder.name)
    mode = "compact" if keep and swap_half_modules(model) else "float32"
    return LoadedModel(model, config, {"hf.config": raw}, infos, mode)
