"""Named accuracy recipes: how Q, K, V are quantized and how PV is accumulated.

A recipe is data: the launcher turns its fields into kernel constexprs. ``DEFAULT_RECIPE`` is
what ``fp8dit.attention`` uses unless ``recipe=`` or ``FP8DIT_RECIPE`` names another.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import env


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    qk: str = "int8"  # "int8" (IGMMA, 7-bit mantissa-equivalent) or "fp8" (QGMMA, 3 bits)
    smooth_k: bool = True  # subtract K's per-channel mean over tokens before quantizing
    center_v: bool = True  # subtract V's per-channel mean, add it back after PV


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "int8qk-fp8pv",
            "Q int8 per token, K smoothed + int8 per kv block, V centered + fp8 per channel, "
            "P fp8 scaled to [0, 256], PV accumulated per block into fp32",
        ),
        Recipe(
            "fp8",
            "as int8qk-fp8pv with Q and K in fp8 e4m3 (QGMMA for both matmuls)",
            qk="fp8",
        ),
        Recipe(
            "fp8-plain",
            "fp8 QK and PV without K smoothing or V centering (to measure what they buy)",
            qk="fp8",
            smooth_k=False,
            center_v=False,
        ),
    )
}

DEFAULT_RECIPE = "int8qk-fp8pv"


def get_recipe(name: str | None) -> Recipe:
    """Recipe by name; ``None`` means ``FP8DIT_RECIPE`` or the default."""
    if name is None:
        name = env.default_recipe() or DEFAULT_RECIPE
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(
            f"recipe: expected one of {', '.join(sorted(RECIPES))}, got {name!r}"
        ) from None
