"""Moved to :mod:`core.api.policy` (the public contract: backends and coders read it too); this path
is kept for one release and goes in the next."""

from core.api.policy import (  # noqa: F401
    ATTRIBUTE_FAMILIES,
    BASE_BARRED_ATTRIBUTES,
    CLASS_DUNDERS,
    DEVICE_BUILTINS,
    GRID_BUILTINS,
    GRID_FUNCTIONS,
    GRID_METHODS,
    LAUNCH_HOOK_KEYWORDS,
    MODULE_DUNDERS,
    SAFE_BUILTINS,
    STRICTEST,
    TORCH_MODULES,
    TRITON_HOOK_ATTRIBUTES,
    TYPING,
    ModuleRule,
    StaticPolicy,
    module,
)
