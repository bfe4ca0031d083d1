"""The static policy a backend declares: the modules, members, builtins and attributes its candidates may use.

A :class:`StaticPolicy` is an allow-list. Everything a candidate names must be on it: the modules it
imports (exact names), the members of those modules it reaches (every public member, or a list),
the builtins it calls. The few deny-lists left are inside an allowed module (``torch.from_numpy`` in
``torch``) or are attribute names no honest kernel needs on any object (``.numpy()``), each with the
reason a user reads in the rejection.

Backends declare theirs as ``static_policy`` (see ``core.contracts.OPTIONAL_MEMBERS``); one that
declares none gets :data:`STRICTEST` (torch and math only). The rules that check a candidate against a
policy are the static check's (``plugins.verifiers.policy``); the declaration is public, since every
backend and the coders that vet their own output read it.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field, replace
from typing import Iterable


@dataclass(frozen=True)
class ModuleRule:
    """What a candidate may use of one module.

    :param name: the module's dotted name (``"torch.nn"``).
    :param members: ``None``: every public member (checked against the real module, so a member that
        is itself a module must have a rule of its own); else only these names.
    :param barred: members refused although ``members`` is ``None``, mapped to the reason.
    :param submodules: every public submodule (``name.x.y``) is allowed too, under this same rule
        (device DSLs such as ``triton.language``).
    :param device: names of this module may appear inside kernels (device code).
    """

    name: str
    members: frozenset[str] | None = None
    barred: tuple[tuple[str, str], ...] = ()
    submodules: bool = False
    device: bool = False

    def barred_reason(self, member: str) -> str | None:
        return dict(self.barred).get(member)


def module(name: str, members: Iterable[str] | None = None, barred: dict[str, str] | None = None,
           submodules: bool = False, device: bool = False) -> ModuleRule:
    """A :class:`ModuleRule` from plain collections."""
    return ModuleRule(name, None if members is None else frozenset(members), tuple(sorted((barred or {}).items())),
                      submodules, device)


# Builtins host code may call: values, containers, iteration and arithmetic. Left out on purpose:
# dynamic code and names (eval, exec, compile, __import__, globals, locals, vars, dir), files and
# consoles (open, input, breakpoint, help, exit, quit), raw memory (memoryview, bytearray) and
# descriptors (property: a read of an attribute would run candidate code inside a launch).
SAFE_BUILTINS = frozenset("""
abs all any ascii bin bool bytes callable chr classmethod complex dict divmod enumerate filter float
format frozenset getattr hasattr hash hex id int isinstance issubclass iter len list map max min next
object oct ord pow print range repr reversed round set setattr delattr slice sorted staticmethod str sum
super tuple type zip True False None NotImplemented Ellipsis
ArithmeticError AssertionError AttributeError Exception IndexError KeyError LookupError
NotImplementedError OverflowError RuntimeError StopIteration TypeError ValueError ZeroDivisionError
""".split())

# Every builtin exception and warning class is harmless to name (raise, except, isinstance).
SAFE_BUILTINS |= frozenset(name for name, obj in vars(builtins).items()
                           if isinstance(obj, type) and issubclass(obj, BaseException))

# Builtins a kernel body may use (Triton folds them on constexprs or lowers them itself).
DEVICE_BUILTINS = frozenset({"range", "min", "max", "float", "int", "bool", "len", "abs", "tuple", "print",
                             "isinstance", "enumerate", "zip", "True", "False", "None"})

# Functions a launch grid may call (besides arithmetic): the dotted paths, and the builtins.
GRID_FUNCTIONS = frozenset({"triton.cdiv", "triton.next_power_of_2", "math.ceil", "math.floor", "math.prod",
                            "torch.cuda.get_device_properties"})
GRID_BUILTINS = frozenset({"max", "min", "int", "abs", "len", "tuple", "list", "round"})
# Tensor methods a grid may call, unless the candidate defines a function or method of that name.
GRID_METHODS = frozenset({"numel", "size", "stride", "dim", "element_size"})

# Attribute names refused on any object, with the family each belongs to.
ATTRIBUTE_FAMILIES: dict[str, str] = {
    "numpy": "a numpy bridge: host computation outside the kernels",
    "tolist": "a Python-list bridge: host computation outside the kernels",
    "apply_": "a Python callback over a tensor's elements: host computation outside the kernels",
    "map_": "a Python callback over a tensor's elements: host computation outside the kernels",
    "map2_": "a Python callback over a tensor's elements: host computation outside the kernels",
    "to_dlpack": "a DLPack bridge: another library computes on the tensor's memory",
    "from_dlpack": "a DLPack bridge: another library computes on the tensor's memory",
    "as_subclass": "a tensor subclass: it can compute when the judge first touches the output",
    "from_file": "a file-backed storage: data from outside the process",
    "backward": "autograd: the engine runs backward functions on threads of its own",
    "data_ptr": "a raw device pointer: Triton kernels take tensors",
    "untyped_storage": "raw storage: host reads and writes of a tensor's bytes",
    "storage": "raw storage: host reads and writes of a tensor's bytes",
    "launch_host_func": "a host callback the CUDA driver runs on a thread of its own: host computation outside the kernels",
    "add_callback": "a host callback the CUDA driver runs on a thread of its own: host computation outside the kernels",
}
_HOOK = "a launch hook: it runs inside the launch, where the audit does not look"
# Attributes that install code a Triton launch runs (kernel and autotune-config hooks).
TRITON_HOOK_ATTRIBUTES = ("add_pre_run_hook", "pre_run_hooks", "pre_hook", "post_hook", "prune_configs_by",
                          "early_config_prune", "perf_model", "do_bench")
ATTRIBUTE_FAMILIES.update({name: _HOOK for name in TRITON_HOOK_ATTRIBUTES})
BASE_BARRED_ATTRIBUTES = frozenset(ATTRIBUTE_FAMILIES) - {"data_ptr", *TRITON_HOOK_ATTRIBUTES}

# Keywords of launch configurators whose values run inside the launch.
LAUNCH_HOOK_KEYWORDS = frozenset({"pre_hook", "post_hook", "do_bench", "prune_configs_by", "perf_model",
                                  "early_config_prune"})

# Special methods a candidate's classes may define; every other one is a hook the judge, a launcher
# or torch would run (conversions, attribute lookup, finalisers, the torch and array protocols).
CLASS_DUNDERS = frozenset({"__init__", "__repr__"})
MODULE_DUNDERS = frozenset({"__all__", "__doc__"})

_TORCH_BARRED = {
    "from_numpy": "a numpy bridge: host computation outside the kernels",
    "from_dlpack": "a DLPack bridge: another library computes on the tensor's memory",
    "frombuffer": "a raw-buffer bridge: host computation outside the kernels",
    "load": "torch.load unpickles, which can run arbitrary code",
    "compile": "torch.compile generates and runs kernels that are not the candidate's",
}
_NN_BARRED = {
    "DataParallel": "nn.DataParallel runs its replicas on threads",
    "DistributedDataParallel": "distributed training starts processes and threads",
}

# The torch every backend's candidates use: tensors, modules and their parameters, dtypes, the
# current stream. Submodules are allowed one by one; the rest of torch (jit, multiprocessing,
# utils, library, ops, backends, testing ...) is not.
TORCH_MODULES: tuple[ModuleRule, ...] = (
    module("torch", barred=_TORCH_BARRED),
    module("torch.nn", barred=_NN_BARRED),
    module("torch.nn.functional"),
    module("torch.nn.init"),
    module("torch.nn.parameter"),
    module("torch.cuda", members={
        "is_available", "current_stream", "default_stream", "synchronize", "Stream", "ExternalStream", "stream",
        "Event", "current_device", "device_count", "device", "get_device_capability", "get_device_properties",
        "get_device_name", "is_bf16_supported", "set_device"}),
    module("torch.autograd", members={"Function", "no_grad", "enable_grad", "set_grad_enabled", "inference_mode"}),
    module("math", device=True),
    module("__future__", members={"annotations"}),
)

TYPING = module("typing", members={
    "Any", "Callable", "Dict", "Iterable", "List", "Literal", "Mapping", "Optional", "Sequence", "Tuple",
    "Type", "Union", "TYPE_CHECKING"})


@dataclass(frozen=True)
class StaticPolicy:
    """A backend's allow-list for candidate source; read by the static check (``plugins.verifiers.static``).

    :param modules: the modules a candidate may import or name, each with its members.
    :param exact_paths: dotted paths allowed verbatim though private (a teacher's generated code).
    :param builtins: builtins host code may use; :param device_builtins: those a kernel may use.
    :param barred_attributes: attribute names refused on any object (see :data:`ATTRIBUTE_FAMILIES`).
    :param device_barred_attributes: attribute names refused inside kernels (``handle``: in the
        Triton interpreter, a tensor's numpy storage).
    :param class_bases: the library classes a candidate's classes may derive from (and their subclasses).
    :param kernel_decorators: dotted paths of decorators that make a function a kernel (device code).
    :param device_constants: calls whose result a kernel may read as a module global (``tl.constexpr``).
    :param launch_configurators: dotted paths of calls whose callables run inside a launch
        (heuristics, autotune configs): their lambdas must be launch arithmetic and
        :data:`LAUNCH_HOOK_KEYWORDS` are refused; ``callable_configurators`` take a dict of callables
        (``triton.heuristics``), each of which must be one.
    :param kernel_factories: calls that build a launchable kernel object (``cupy.RawKernel``);
        :param kernel_getters: methods that return one (``get_function``). Launches of those take
        ``(grid, block, args)``, and grid and block must be launch arithmetic.
    """

    backend: str = "default"
    modules: tuple[ModuleRule, ...] = TORCH_MODULES
    exact_paths: frozenset[str] = frozenset()
    builtins: frozenset[str] = SAFE_BUILTINS
    device_builtins: frozenset[str] = DEVICE_BUILTINS
    barred_attributes: frozenset[str] = BASE_BARRED_ATTRIBUTES
    device_barred_attributes: frozenset[str] = frozenset({"handle"})
    class_bases: frozenset[str] = frozenset({"torch.nn.Module", "torch.autograd.Function"})
    kernel_decorators: frozenset[str] = frozenset()
    device_constants: frozenset[str] = frozenset()
    launch_configurators: frozenset[str] = frozenset()
    callable_configurators: frozenset[str] = frozenset()
    kernel_factories: frozenset[str] = frozenset()
    kernel_getters: frozenset[str] = frozenset()
    grid_functions: frozenset[str] = GRID_FUNCTIONS
    _index: dict[str, ModuleRule] = field(default=None, init=False, repr=False, compare=False, hash=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {r.name: r for r in self.modules})

    def rule(self, name: str) -> ModuleRule | None:
        """The rule for module ``name``: its own, or that of an enclosing module declared with
        ``submodules=True`` (no private segment below it)."""
        found = self._index.get(name)
        if found is not None:
            return found
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            parent = self._index.get(".".join(parts[:cut]))
            if parent is not None and parent.submodules and not any(p.startswith("_") for p in parts[cut:]):
                return ModuleRule(name, parent.members, parent.barred, True, parent.device)
        return None

    @property
    def module_names(self) -> frozenset[str]:
        """The modules declared (an import allow-list for a runtime guard; ``submodules`` rules
        also cover the public modules below them)."""
        return frozenset(self._index)

    def with_modules(self, *rules: ModuleRule) -> "StaticPolicy":
        """This policy with more modules allowed (or rules replaced by name)."""
        kept = tuple(r for r in self.modules if r.name not in {n.name for n in rules})
        return replace(self, modules=kept + tuple(rules))


# A backend that declares no policy: torch and math only.
STRICTEST = StaticPolicy(backend="strictest")
