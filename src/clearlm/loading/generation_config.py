"""Read a Hugging Face folder's ``generation_config.json`` into sampling defaults.

What the file's keys mean, as transformers reads them, is explained in
:mod:`clearlm.sampling.defaults` (which also says in what order a call's settings are taken:
the caller, this file, clearlm's defaults). A GGUF file carries no sampling defaults that
clearlm reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clearlm.errors import InvalidModelFileError, SamplingParamsError
from clearlm.loading.hf import read_json
from clearlm.sampling.defaults import (
    FILE,
    HF_DEFAULTS,
    TRANSFORMERS,
    UNSUPPORTED,
    FileDefaults,
)
from clearlm.sampling.params import validate


def read_generation_config(folder: str | Path) -> FileDefaults:
    """Read ``folder/generation_config.json`` into sampling defaults (see the module docstring).

    Raises:
        InvalidModelFileError: the file is not a JSON object, or a value it uses is out of
            range (the message names the file, the key and the valid range).
    """
    path = Path(folder) / FILE
    if not path.is_file():
        return FileDefaults()
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise InvalidModelFileError(f"{path} must hold a JSON object")
    do_sample = raw.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        # transformers would read "yes" as greedy (`do_sample is not True`): refuse, not guess
        raise InvalidModelFileError(
            f"{path}: do_sample = {do_sample!r} is invalid: it must be true or false"
        )
    sampling = do_sample is True  # transformers: `do_sample is not True` -> greedy
    ignored = tuple(
        f"{key}={raw[key]!r}"
        for key, (off, sampling_only) in UNSUPPORTED.items()
        if raw.get(key) is not None and raw[key] != off and (sampling or not sampling_only)
    )
    if all(raw.get(k) is None for k in ("do_sample", *HF_DEFAULTS)):
        return FileDefaults(ignored=ignored, path=str(path))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, default in HF_DEFAULTS.items():
        if raw.get(key) is None:  # absent or null: transformers fills the gap
            values[key], sources[key] = default, TRANSFORMERS
        elif key != "temperature" or sampling:  # a greedy file's temperature is not used
            try:
                validate(key, raw[key])
            except SamplingParamsError as e:
                raise InvalidModelFileError(f"{path}: {e}") from None
            values[key], sources[key] = raw[key], FILE
    if not sampling:
        said = "false" if do_sample is False else "null" if "do_sample" in raw else "absent"
        values["temperature"], sources["temperature"] = 0.0, f"{FILE} (do_sample {said}: greedy)"
    return FileDefaults(values, sources, ignored, str(path))
