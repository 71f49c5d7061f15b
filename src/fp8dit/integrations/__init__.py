"""Thin adapters to model libraries (no kernel logic here).

Each adapter imports its library lazily, so ``import fp8dit`` never needs it:

- :mod:`fp8dit.integrations.diffusers`: an attention backend named ``"fp8dit"`` in diffusers'
  dispatcher, and ``enable(pipe_or_model)``.
"""
