"""Run the real Triton kernels through the interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is imported, hence at the top of conftest.
"""

import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if _HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _clean_fp8dit_env(monkeypatch):
    for var in ("FP8DIT_BACKEND", "FP8DIT_DISABLE", "FP8DIT_RECIPE", "FP8DIT_PLAN_CACHE"):
        monkeypatch.delenv(var, raising=False)
