"""Every code block of the README and of docs/*.md, as a user would copy it.

``python`` blocks run as written, each in a fresh process, with the names a block takes from its
surroundings predefined at tiny shapes: ``q, k, v`` (bf16 [1, 256, 2, 64], layout NHD) and
``pipe`` (an object with ``.transformer``, a tiny diffusers Wan transformer). On a GPU machine
these live on the GPU and the kernels run compiled, as a user's would (a block that builds CPU
tensors beside them fails there as it would for that user); without a GPU, on CPU tensors
through the interpreter. The README's ``bash`` block holds the two commands a new user runs; CI must
run them verbatim (``.ci/run``), so that what passes in CI passes for that user.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEVICE

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)

# What a block may use without defining it.
PRELUDE = """\
import torch
torch.manual_seed(0)
_device = "cuda" if torch.cuda.is_available() else "cpu"
q, k, v = (torch.randn(1, 256, 2, 64, device=_device).bfloat16() for _ in range(3))


class _Pipe:  # a pipeline's shape, as fp8dit.enable sees it: .transformer
    def __init__(self):
        import diffusers

        self.transformer = diffusers.WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64, in_channels=4,
            out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=1,
            rope_max_seq_len=32).to(_device, torch.bfloat16).eval()


pipe = _Pipe()
"""


def blocks(language: str):
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == language:
                line = text[: m.start()].count("\n") + 1
                found.append(pytest.param(m.group(2), id=f"{page.name}:{line}"))
    return found


PYTHON_BLOCKS = blocks("python")


def test_the_readme_has_python_blocks():
    assert any("README.md" in p.id for p in PYTHON_BLOCKS)


@pytest.mark.parametrize("code", PYTHON_BLOCKS)
def test_python_block_runs_as_written(code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(PRELUDE + "\n# --- the block, as written ---\n" + code)
    env = dict(os.environ)
    # The interpreter only without a GPU: on the GPU machine the kernels run compiled (and that
    # machine's numpy may not run Triton 3.6's interpreter at all).
    if DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert res.returncode == 0, f"the block failed:\n{code}\n--- stderr ---\n{res.stderr[-3000:]}"


def test_ci_runs_the_readme_commands_verbatim():
    readme = ROOT / "README.md"
    bash = [b.values[0] for b in blocks("bash") if b.id.startswith("README.md:")]
    assert bash, "the README has no bash block with its commands"
    commands = [line.split("#")[0].strip() for line in bash[0].splitlines()]
    commands = [c for c in commands if c]
    ci = (ROOT / ".ci" / "run").read_text()
    missing = [c for c in commands if c not in ci]
    assert not missing, f"{readme.name}'s commands not run verbatim by .ci/run: {missing}"
