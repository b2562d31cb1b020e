"""``python -m clearlm.quant.build [-v]``: compile the quantized kernel now (``make kernels``).

Exit status 0 when the kernel is built (or already cached), 1 when it cannot be (no g++ or
ninja): clearlm then computes compact layers with the slower pure-torch fallback."""

from __future__ import annotations

import sys

from clearlm.quant.kernels import build_dir, load_kernels


def main() -> int:
    mod = load_kernels(verbose="-v" in sys.argv)
    print(f"kernel: {'ready in ' + str(build_dir()) if mod else 'unavailable (torch fallback)'}")
    return 0 if mod else 1


if __name__ == "__main__":
    sys.exit(main())
