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

# xDiT and cache-dit with their dependencies; SGLang's light dependencies; one transformers for
# all three (SGLang's pin).
"${PIP[@]}" -c "$pin" \
    "xfuser==0.7.0" "cache-dit==1.5.3" "transformers==5.19.0" \
    "accelerate==1.16.0" "peft==0.21.2" "yunchang==0.6.4" "DistVAE==0.1.0" "einops==0.8.2" \
    "sentencepiece==0.2.1" "av==18.1.0" \
    "orjson==3.13.0" "pybase64==1.5.1" "msgspec==0.23.0" "pyzmq==27.3.0" "ipython==9.18.1" \
    "aiohttp==3.14.5" "addict==2.4.0" "apache-tvm-ffi==0.1.11" "dill==0.4.1" \
    "compressed-tensors==0.18.0" "loguru==0.7.3" "gguf==0.19.0" "imageio==2.36.0" \
    "openai==2.8.0" "partial-json-parser==0.2.1.1.post7" "uvicorn==0.55.0" "fastapi" \
    "imageio-ffmpeg==0.5.1" "python-multipart==0.0.34"
