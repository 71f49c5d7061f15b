#!/usr/bin/env bash
# The serving engines that fp8dit's engine tests drive (tests/test_engine_*.py), at the releases
# of fp8dit's extras (pyproject.toml), into the current python ($PYTHON, default python3), on a
# CPU-only machine. PyPI only; the installed torch is kept (pinned as a constraint, so a package
# that wants another torch fails the install instead of replacing it). Run after
# `pip install -e ".[test,diffusers]"`.
set -euo pipefail
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install -q --disable-pip-version-check --no-warn-conflicts)
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
"$PY" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' >"$pin"  # a local label (+cu130) would not match pip's own caps

# SGLang 0.5.23: its wheel declares SGLang's whole GPU serving stack (torch==2.14.1, flashinfer,
# flash-attn-4, cutlass-dsl, deep-gemm, ...), none of which installs on a CPU machine or is
# needed here: the wheel alone (--no-deps), then below what `sglang.multimodal_gen`'s plugin
# loader, server arguments, attention layers, distributed state and diffusers pipeline import,
# and what the modules of `sglang generate` and `sglang serve` import (imageio-ffmpeg,
# python-multipart), at SGLang's own pins where it declares one. Left out: torchvision, which
# SGLang's LLM model configs import and diffusion attention never uses (PyPI's builds need
# PyPI's CUDA torch): the SGLang test stubs it (tests/engines/stubs.py).
"${PIP[@]}" --no-deps "sglang==0.5.23"

# vLLM-Omni 0.30.0 and the vLLM release it runs on: their wheels declare vLLM's GPU serving stack
# (torch==2.13.0, flashinfer, cutlass-dsl, tilelang, ...) and vLLM-Omni's model zoo (onnxruntime,
# whisper, audio tokenizers, ...), none of which is needed here: the wheels alone (--no-deps),
# then below what its plugin loader, config and selector, attention layer and parallel
# strategies import (through vLLM's config, logger and distributed state), and what its CLI's
# argument parser imports (websockets to pydantic-settings), at vLLM's pins where it declares
# one. Left out: torchvision and torchaudio, which the CLI module imports for its models and
# audio serving (stubbed by the vLLM-Omni test, tests/engines/stubs.py).
"${PIP[@]}" --no-deps "vllm-omni==0.30.0" "vllm==0.30.0"

# xDiT and cache-dit with their dependencies; SGLang's and vLLM-Omni's light dependencies; one
# transformers for all four (SGLang's pin); one openai for both SGLang (which pins 2.8.0, its
# diffusion path runs on either) and vLLM (>= 2.25: its tool parsers, imported with its config).
"${PIP[@]}" -c "$pin" \
    "xfuser==0.7.0" "cache-dit==1.5.3" "transformers==5.19.0" \
    "accelerate==1.16.0" "peft==0.21.2" "yunchang==0.6.4" "DistVAE==0.1.0" "einops==0.8.2" \
    "sentencepiece==0.2.1" "av==18.1.0" \
    "orjson==3.13.0" "pybase64==1.5.1" "msgspec==0.23.0" "pyzmq==27.3.0" "ipython==9.18.1" \
    "aiohttp==3.14.5" "addict==2.4.0" "apache-tvm-ffi==0.1.11" "dill==0.4.1" \
    "compressed-tensors==0.18.0" "loguru==0.7.3" "gguf==0.19.0" "imageio==2.36.0" \
    "partial-json-parser==0.2.1.1.post7" "uvicorn==0.55.0" "fastapi" \
    "imageio-ffmpeg==0.5.1" "python-multipart==0.0.34" \
    "aenum==3.1.16" "omegaconf==2.4.0" "prettytable==3.19.0" "cbor2==6.3.0" \
    "cachetools==8.0.3" "cloudpickle==3.1.3" "uvloop==0.23.0" "py-cpuinfo==9.0.0" \
    "prometheus_client==0.26.0" "openai-harmony==0.0.8" "tiktoken==0.14.0" \
    "llguidance==1.7.6" "xgrammar==0.2.9" \
    "websockets==17.4" "soundfile==0.14.0" "watchfiles==1.3.0" \
    "model-hosting-container-standards==0.1.16" "janus==2.0.0" "ijson==3.6.0" \
    "mistral_common==1.13.1" "pydantic-settings==2.16.3" "openai==2.25.0"
