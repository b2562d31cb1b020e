"""Which torch device a model runs on: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or
``"auto"`` (CUDA when torch sees a GPU, else the CPU).

The check happens once, before any weight is read, so a device this machine lacks is one
typed line (``DeviceError``) naming it and what is available, never a CUDA traceback later.
"""

from __future__ import annotations

import torch

from clearlm.errors import DeviceError

DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N", "mps")


def available_devices() -> list[str]:
    """The devices torch can use here, e.g. ``["cpu", "cuda:0", "cuda:1"]``."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a torch.device that exists here; None and "auto" pick CUDA when present.

    Raises:
        DeviceError: an unknown name, or a device this machine or torch build does not have
            (the message lists the available ones).
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(
            f"unknown device {device!r}; use one of {', '.join(DEVICE_NAMES)}"
        ) from None
    have = ", ".join(available_devices())
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {device!r} is not available: no CUDA here (have: {have})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"device {device!r} is not available (have: {have})")
    elif dev.type == "mps":
        if "mps" not in available_devices():
            raise DeviceError(f"device {device!r} is not available (have: {have})")
    elif dev.type != "cpu":
        raise DeviceError(
            f"device {device!r} is not supported; use one of {', '.join(DEVICE_NAMES)}"
        )
    return dev
