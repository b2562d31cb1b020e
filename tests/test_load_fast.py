"""Load time: `clearlm generate` on a compact GGUF imports only what generating needs.

torch._dynamo alone costs ~0.7 s of CPU time at start (``python -X importtime``); transformers,
the server and the web UI pieces even more. They stay out of a plain generate run: the module
list is read from the very process that ran the command."""

from __future__ import annotations

import json
import subprocess
import sys

from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_llama

# imported only by the paths that need them: torch.compile, the reference, the server/UI
NOT_AT_RUN_TIME = (
    "torch._dynamo", "transformers", "fastapi", "uvicorn", "matplotlib", "sympy",
    "torch.utils.cpp_extension", "setuptools",
)  # fmt: skip

RUN = """
import json, runpy, sys
sys.argv = ["clearlm", "generate", "-m", sys.argv[1], "Hi", "-n", "2", "-q"]
try:
    runpy.run_module("clearlm", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def test_generate_imports_only_what_it_needs(tmp_path):
    path = write_tiny_llama(tmp_path / "q.gguf", matrix_type=Q.Q8_0)  # compact: quant/ops runs
    done = subprocess.run([sys.executable, "-c", RUN, str(path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert "clearlm.quant.ops" in loaded  # the compact path really ran
    assert sorted(m for m in NOT_AT_RUN_TIME if m in loaded) == []
