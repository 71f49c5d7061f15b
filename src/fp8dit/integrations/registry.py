"""Adding a backend to an engine's closed list of backends, which every adapter has to do.

diffusers, SGLang, xDiT and cache-dit each name their attention backends by an ``Enum`` and
offer no public way to add one: the adapters add a member in place and check first that the
private parts of ``Enum`` and of the engine's functions they rely on are still there, so that a
release that changes them fails with a list of what moved instead of inside a forward.
"""

from __future__ import annotations

import enum
import inspect

_ENUM_TABLES = (("_member_map_", dict), ("_value2member_map_", dict), ("_member_names_", list))


def params(fn) -> list[str]:
    """``fn``'s parameter names, in order."""
    return list(inspect.signature(fn).parameters)


def enum_problems(where: str, names, *, str_valued: bool = False) -> list[str]:
    """What :func:`add_member` needs of the Enum ``names`` (found at ``where``) and did not find.
    ``str_valued``: its members must also be strings (a ``str`` Enum)."""
    kind = "a str Enum" if str_valued else "an Enum"
    if not isinstance(names, enum.EnumMeta) or (str_valued and not issubclass(names, str)):
        return [f"{where} is no longer {kind}"]
    return [f"{names.__name__}.{attr} is not a {typ.__name__}" for attr, typ in _ENUM_TABLES
            if not isinstance(getattr(names, attr, None), typ)]


def add_member(names, name: str, value):
    """The member ``name = value`` of the Enum ``names``, added in place when neither the name
    nor the value is one yet (idempotent). ``Enum`` guards its class attributes, hence
    ``type.__setattr__``."""
    member = names._member_map_.get(name)
    if member is None:
        member = names._value2member_map_.get(value)
    if member is not None:
        return member
    member = str.__new__(names, value) if issubclass(names, str) else object.__new__(names)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = names
    names._member_names_.append(name)
    names._member_map_[name] = member
    names._value2member_map_[value] = member
    type.__setattr__(names, name, member)
    return member


def import_engine(module: str, engine: str, dist: str, version: str, extra: str):
    """Import ``module`` of an engine, or raise ImportError saying which release and extra the
    adapter needs."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"fp8dit's {engine} adapter needs {dist}=={version} "
                          f"(pip install 'fp8dit[{extra}]'): {e}") from e


def raise_if_unfit(problems: list[str], engine: str, dist: str, version: str,
                   adapter: str) -> None:
    """Raise RuntimeError listing ``problems`` (what moved in the installed engine) when there
    are any, naming the installed release and the one the adapter was written against."""
    if not problems:
        return
    from importlib import metadata

    try:  # the distribution's metadata: importing the engine again could fail on its own
        installed = metadata.version(dist)
    except metadata.PackageNotFoundError:
        installed = "?"
    raise RuntimeError(
        f"fp8dit's {engine} adapter does not fit {dist} {installed} (written against "
        f"{version}): " + "; ".join(problems)
        + f". Install {dist}=={version} or update fp8dit/integrations/{adapter}.py."
    )


BACKEND_CLASSES = ("Fp8ditAttentionBackend", "Fp8ditAttentionImpl")


def publish(module: str, store: dict, backend, impl) -> tuple:
    """Name an engine's backend and impl classes, built inside a function, as attributes of the
    adapter ``module`` (where the engine resolves them by import path) and keep them in
    ``store``; returns (backend, impl)."""
    for cls in (backend, impl):
        cls.__module__, cls.__qualname__ = module, cls.__name__
    store.update(backend=backend, impl=impl)
    return backend, impl


def lazy_classes(module: str, build):
    """A module ``__getattr__`` that resolves :data:`BACKEND_CLASSES` through ``build()``: an
    engine resolves them by import path once it is importable, without importing the engine
    when fp8dit's adapter module is imported."""
    def __getattr__(name):
        if name in BACKEND_CLASSES:
            return build()[BACKEND_CLASSES.index(name)]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__
