"""What a dotted path rooted at an import names, checked step by step against a policy.

``torch.nn.functional.relu`` is walked member by member on the judge's own import of each allowed
module (nothing of the candidate runs): a member that is a module must be allowed itself, so
``torch.os``, ``torch.jit`` or ``tl.core.builtins`` are refused however the candidate spells the
import. Modules declared with a member list (``cupy``) are checked by name and never imported.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
from dataclasses import dataclass
from typing import Any

from core.api.policy import StaticPolicy

MISSING = object()


@dataclass(frozen=True)
class Ref:
    """What an expression names.

    :ivar kind: ``module`` (an allowed module, ``path`` its name), ``transit`` (a private step on the
        way to an exact allowed path), ``object`` (a member reached through allowed modules), or
        ``refused`` (``rule`` and ``why`` say which rule and what).
    """

    kind: str
    path: str = ""
    rule: str = ""
    why: str = ""

    @property
    def refused(self) -> bool:
        return self.kind == "refused"


def refuse(rule: str, why: str) -> Ref:
    return Ref("refused", rule=rule, why=why)


@functools.lru_cache(maxsize=64)
def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception:  # not installed here: such members are checked by name only
        return None


@functools.lru_cache(maxsize=8192)
def member(module_name: str, attr: str) -> Any:
    """``module_name.attr`` on the judge's import, without running module ``__getattr__`` hooks:
    the object, a submodule's name (a ``str``) when it exists but is not imported, ``MISSING``, or
    ``None`` when the module itself cannot be imported here."""
    mod = _import(module_name)
    if mod is None:
        return None
    found = vars(mod).get(attr, MISSING)
    if found is not MISSING:
        return found
    try:
        spec = importlib.util.find_spec(f"{module_name}.{attr}")
    except (ImportError, ValueError, AttributeError):
        spec = None
    return f"{module_name}.{attr}" if spec is not None else MISSING


def step(policy: StaticPolicy, ref: Ref, attr: str) -> Ref:
    """The reference ``ref.attr`` (``ref`` names a module or a transit path)."""
    full = f"{ref.path}.{attr}"
    if full in policy.module_names:
        return Ref("module", full)
    if ref.kind == "transit" or attr.startswith("_"):
        if full in policy.exact_paths:
            return Ref("object", full)
        if any(p.startswith(full + ".") for p in policy.exact_paths):
            return Ref("transit", full)
        if attr.startswith("_"):
            return refuse("private-attribute", f"{full} is private to {ref.path}")
        return refuse("private-attribute", f"{full} is inside the private {ref.path}, where the {policy.backend} "
                                           f"policy allows only {', '.join(sorted(policy.exact_paths)[:4])}")
    rule = policy.rule(ref.path)
    assert rule is not None, ref.path
    reason = rule.barred_reason(attr)
    if reason:
        return refuse("module-member", f"{full}: {reason}")
    if rule.members is not None:
        if attr in rule.members:
            return Ref("object", full)
        return refuse("module-member", f"{full} is not among the members of {ref.path} the {policy.backend} "
                                       f"policy allows ({', '.join(sorted(rule.members)[:12])})")
    found = member(ref.path, attr)
    if found is None:  # the module cannot be imported in the judge: trust the name
        return Ref("object", full)
    if found is MISSING:
        return refuse("module-member", f"{ref.path} has no member {attr!r}")
    if isinstance(found, str):
        name = found
    elif isinstance(found, types.ModuleType):
        name = found.__name__ if isinstance(getattr(found, "__name__", None), str) else full
    else:
        return Ref("object", full)
    if policy.rule(name) is not None:
        return Ref("module", name)
    shown = name if name == full else f"module {name}"
    return refuse("module-member", f"{full} is {shown}, a module the {policy.backend} policy does not allow")


def walk(policy: StaticPolicy, root: Ref, attrs: list[str]) -> tuple[Ref, int]:
    """Follow ``attrs`` from ``root`` while it names modules; returns the last reference and how
    many attributes were consumed (the rest are members of an object)."""
    ref = root
    for i, attr in enumerate(attrs):
        if ref.kind not in ("module", "transit"):
            return ref, i
        ref = step(policy, ref, attr)
        if ref.refused:
            return ref, i + 1
    return ref, len(attrs)


def real_object(path: str) -> Any:
    """The object at ``path`` (a module, then members), or ``MISSING``."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        mod = _import(".".join(parts[:cut])) if ".".join(parts[:cut]) else None
        if mod is None:
            continue
        obj: Any = mod
        for attr in parts[cut:]:
            obj = vars(obj).get(attr, MISSING) if isinstance(obj, types.ModuleType) else getattr(obj, attr, MISSING)
            if obj is MISSING:
                return MISSING
        return obj
    return MISSING
