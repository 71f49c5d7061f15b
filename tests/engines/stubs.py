"""Stand-ins for packages an engine imports but its attention path never uses.

Only a package named here may be stubbed, each with its reason; nothing of an engine itself is.
A stub module answers every attribute with a placeholder class, which raises when called, so a
stubbed package that a test did reach fails loudly instead of computing anything.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# package -> why it may be stubbed (and only where it is not installed)
STUBBABLE = {
    # sglang.srt.configs (SGLang's LLM model configs: DeepSeek-OCR, InternVL, ...) imports
    # torchvision at import time; `sglang.multimodal_gen`'s server arguments import that
    # package. PyPI's torchvision wheels are built against PyPI's CUDA torch: the release that
    # pairs with CI's CPU torch (torch 2.13.0+cpu) does not load its operators, and installing
    # one with its dependencies replaces torch. The diffusion attention path never calls it.
    "torchvision": "imported by SGLang's LLM model configs; diffusion attention never uses it",
    # vLLM-Omni's CLI module (its `serve` argument parser) imports its OpenAI server, whose audio
    # serving imports torchaudio, and its pipeline registry, whose LLM models import
    # torchvision. PyPI's torchaudio pairs with another torch than CI's; diffusion attention
    # and argument parsing never call either.
    "torchaudio": "imported by vLLM-Omni's audio serving; diffusion attention never uses it",
}


class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        root = cls.__module__.partition(".")[0]
        raise RuntimeError(f"{cls.__qualname__} is a test stub ({STUBBABLE[root]})")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


def _placeholder(qualname: str) -> type:
    module, _, name = qualname.rpartition(".")
    return _Placeholder(name, (), {"__qualname__": qualname, "__module__": module})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return sys.modules.get(f"{self.__name__}.{name}") or _placeholder(
            f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = frozenset(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        # transformers parses the version of an importable torchvision: "0" reads as too old
        # for anything it would use it for.
        module.__version__ = "0"
        return module

    def exec_module(self, module):
        pass


def install(*names: str) -> list[str]:
    """Stub the named packages (keys of STUBBABLE) that are not installed; returns those stubbed.
    Must run before anything imports them."""
    unknown = [n for n in names if n not in STUBBABLE]
    if unknown:
        raise ValueError(f"not stubbable (see STUBBABLE): {unknown}")
    missing = [n for n in names if n not in sys.modules and importlib.util.find_spec(n) is None]
    if missing:
        sys.meta_path.insert(0, _StubFinder(missing))
    return missing
