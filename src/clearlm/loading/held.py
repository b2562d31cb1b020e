"""How a compact load holds each GGUF type (loading/compact/load.py's plan), and the warning
for the types it holds as float32 for want of a compact form."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

NO_PACKER = "float32, no compact form"
HALF_HELD = "compact: 16-bit, as stored"  # F16 / BF16 matrices (loading/compact/half.py)
NOT_READ = "not read: clearlm has no dequantizer for it"
WIDE_HELD = "compact: int8 codes + scales"  # lattice i-quants and TQ (quant/lattice.py)


@dataclass
class FormatUse:
    """How a load holds the tensors of one GGUF type: how many, their bytes in the file and in
    memory, and how (``packed``; HALF_HELD for F16 / BF16 kept 16-bit; ``float32`` where the
    type has no compact form; ``float32, as its module needs`` for a packable type a family
    converts; ``float32, as stored``)."""

    held_as: str
    count: int = 0
    file_bytes: int = 0
    held_bytes: int = 0


def warn_held_above_file(above_file: list[tuple[str, FormatUse]]) -> None:
    """One ``clearlm:`` warning per GGUF type held above the file's bytes for want of a compact
    form at its size (the CLI prints it as a ``warning:`` line): as float32 (NO_PACKER) or as
    int8 codes (WIDE_HELD); the count and the memory above the file's bytes."""
    for qtype, use in above_file:
        extra = use.held_bytes - use.file_bytes
        plural, verb = use.count != 1, "are" if use.count != 1 else "is"
        how = (f"no compact form and {verb} held as float32" if use.held_as == NO_PACKER
               else f"no compact form at the file's size and {verb} held as int8 codes")
        warnings.warn(
            f"clearlm: {use.count} {qtype} tensor{'s' if plural else ''} "
            f"{'have' if plural else 'has'} {how}: {_size(use.held_bytes)} "
            f"instead of the file's {_size(use.file_bytes)} (+{_size(extra)})",
            stacklevel=3)


def _size(n_bytes: int) -> str:
    """Decimal units, as the loading line writes sizes: 3.4 MB, 1.1 GB, 310 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n_bytes} B"
