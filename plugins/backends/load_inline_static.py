"""The static stage of the ``cuda_inline`` backend: what a candidate's text says, with no code run.

A ``cuda_inline`` candidate is a KernelBench solution whose ``ModelNew`` calls functions of a module
built by ``torch.utils.cpp_extension.load_inline(name, cpp_sources, cuda_sources, functions=[...])``
(KernelBench's own CUDA format). :func:`analyse_source` finds the ``load_inline`` calls and resolves
their arguments from literals and module-level names (through the ``cuda`` backend's resolver), so
the compile-only stage can compile the CUDA translation unit without executing the module.

:func:`source_findings` is the C++ side of the static policy: the Python side of a candidate is
judged by the static checks like every backend's, but its C++ and CUDA text runs in the worker
unseen by the Python audit hook. The ATen audit still sees every op the C++ *dispatches*
(``at::relu``, ``torch::matmul``, ``x.add(y)``); what it cannot see is named here and refused:
calling kernels below the dispatcher (``at::native::``, ``redispatch``, dispatch-key guards),
vendor libraries doing the arithmetic (cuBLAS, cuDNN, cuFFT, Thrust), host computation (copies to
the host, host or managed memory), Python from C++, processes, threads, files and the dynamic
loader, and build flags that pull in outside code.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from core.api.evidence import parse_python
from plugins.backends.cuda_backend import kernel_names
from plugins.backends.cuda_static import _StringResolver

MAX_SOURCE_BYTES = 200_000
LOAD_INLINE = "load_inline"

# load_inline's parameters in order (torch.utils.cpp_extension.load_inline), for positional calls.
PARAMETERS = ("name", "cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags",
              "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags", "extra_include_paths",
              "build_directory", "verbose", "with_cuda", "with_sycl", "is_python_module",
              "with_pytorch_error_handling", "keep_intermediates", "use_pch", "no_implicit_headers")


@dataclass
class InlineExtension:
    """One ``load_inline`` call's arguments, as the build sees them (strings become one-item lists)."""

    name: str
    cpp_sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_paths: tuple[str, ...] = ()
    no_implicit_headers: bool = False
    origin: str = ""  # "line 12" (read from the text) or "recorded" (the worker saw the call)

    @property
    def kernels(self) -> list[str]:
        return [k for src in self.cuda_sources for k in kernel_names(src)]

    def key(self) -> tuple[Any, ...]:
        return (self.name, self.cpp_sources, self.cuda_sources, self.functions, self.extra_cuda_cflags,
                self.no_implicit_headers)

    @classmethod
    def from_arguments(cls, arguments: dict[str, Any], origin: str = "recorded") -> "InlineExtension":
        """From ``load_inline``'s bound arguments (``inspect.signature(...).bind``)."""
        functions = arguments.get("functions") or ()
        if isinstance(functions, dict):
            functions = tuple(functions)
        return cls(
            name=str(arguments.get("name", "")),
            cpp_sources=_strings(arguments.get("cpp_sources")),
            cuda_sources=_strings(arguments.get("cuda_sources")),
            functions=_strings(functions),
            extra_cflags=_strings(arguments.get("extra_cflags")),
            extra_cuda_cflags=_strings(arguments.get("extra_cuda_cflags")),
            extra_ldflags=_strings(arguments.get("extra_ldflags")),
            extra_include_paths=_strings(arguments.get("extra_include_paths")),
            no_implicit_headers=bool(arguments.get("no_implicit_headers", False)),
            origin=origin,
        )


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


@dataclass
class InlineReport:
    """What the static stage found. ``extensions`` is None when some call's arguments are not
    statically known (the worker records them when the module runs)."""

    ok: bool
    problems: list[str] = field(default_factory=list)
    calls: int = 0
    extensions: list[InlineExtension] | None = None

    @property
    def detail(self) -> str:
        if not self.ok:
            return "; ".join(self.problems)
        how = (f"{len(self.extensions)} extension(s) read from literals" if self.extensions is not None
               else "extension arguments built at run time (recorded in the worker)")
        return f"ModelNew defined, {self.calls} load_inline call(s), {how}"


def is_load_inline(call: ast.Call) -> bool:
    """``load_inline(...)`` or ``<anything>.load_inline(...)``."""
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == LOAD_INLINE) or (
        isinstance(func, ast.Name) and func.id == LOAD_INLINE)


def load_inline_calls(tree: ast.Module) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and is_load_inline(n)]


def detect_kernels(tree: ast.Module) -> list[str]:
    """``__global__`` kernels in the candidate's strings, if it calls ``load_inline``."""
    if not load_inline_calls(tree):
        return []
    names: list[str] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "__global__" in n.value:
            names += [k for k in kernel_names(n.value) if k not in names]
    return names


def _argument(call: ast.Call, parameter: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == parameter:
            return kw.value
    position = PARAMETERS.index(parameter)
    return call.args[position] if len(call.args) > position else None


def _resolve_list(resolver: _StringResolver, node: ast.expr | None) -> tuple[str, ...] | None:
    """A string, or a list/tuple of strings, known from the text; ``()`` when absent; else None."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return ()
    single = resolver.resolve(node)
    if single is not None:
        return (single,)
    return resolver.resolve_strings(node)


def _extension_of(call: ast.Call, resolver: _StringResolver) -> InlineExtension | None:
    name = resolver.resolve(_argument(call, "name"))
    values: dict[str, tuple[str, ...] | None] = {
        p: _resolve_list(resolver, _argument(call, p))
        for p in ("cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
                  "extra_ldflags", "extra_include_paths")}
    implicit = _argument(call, "no_implicit_headers")
    no_implicit: bool | None = False
    if implicit is not None:
        no_implicit = implicit.value if isinstance(implicit, ast.Constant) and isinstance(implicit.value, bool) else None
    if name is None or no_implicit is None or any(v is None for v in values.values()):
        return None
    return InlineExtension(name=name, no_implicit_headers=no_implicit, origin=f"line {call.lineno}",
                           **{k: v for k, v in values.items() if v is not None})


def analyse_source(source: str) -> InlineReport:
    """The static stage for a ``cuda_inline`` candidate: the AST is read, nothing runs."""
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        return InlineReport(False, [f"source is {len(source)} bytes; the limit is {MAX_SOURCE_BYTES}"])
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        return InlineReport(False, [f"Python syntax error at line {exc.lineno}: {exc.msg}"])
    problems: list[str] = []
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        problems.append("no top-level `class ModelNew(nn.Module)` found; the candidate must define ModelNew")
    calls = load_inline_calls(tree)
    if not calls:
        problems.append("no torch.utils.cpp_extension.load_inline(...) call found")
    resolver = _StringResolver(tree)
    extensions: list[InlineExtension] | None = []
    for call in calls:
        ext = _extension_of(call, resolver)
        if ext is None:
            extensions = None
        elif extensions is not None:
            extensions.append(ext)
    if extensions is not None:
        for ext in extensions:
            problems += extension_problems(ext)
    return InlineReport(not problems, problems, calls=len(calls), extensions=extensions)


def extension_problems(ext: InlineExtension) -> list[str]:
    """What makes one extension unbuildable or not a CUDA kernel, before any compiler runs."""
    where = f"load_inline(name={ext.name!r}) ({ext.origin})"
    problems = []
    if not ext.cuda_sources:
        problems.append(f"{where} has no cuda_sources; backend 'cuda_inline' builds CUDA kernels")
    elif not ext.kernels:
        problems.append(f"{where}: its cuda_sources define no `__global__` kernel")
    if not ext.functions:
        problems.append(f"{where} binds no functions (functions=[...]); ModelNew has nothing to call")
    declared = "\n".join(ext.cpp_sources + ext.cuda_sources)
    for fn in ext.functions:
        if not re.search(rf"\b{re.escape(fn)}\s*\(", declared):
            problems.append(f"{where}: function {fn!r} in functions= is not declared in cpp_sources "
                            f"(declare its signature there, e.g. `torch::Tensor {fn}(torch::Tensor x);`)")
    return problems


# --------------------------------------------------------------------------- the C++ side of the policy

# (pattern, what it is) for the text of cpp_sources and cuda_sources; comments are stripped first.
_BARRED_SOURCE: tuple[tuple[str, str], ...] = (
    (r"\bat::native::", "calls an ATen kernel below the dispatcher (at::native::), where the ATen audit cannot see it"),
    (r"\bredispatch\b", "redispatches an ATen op past the audit's dispatch key"),
    (r"\bc10::impl::", "reaches c10's dispatcher internals (c10::impl::)"),
    (r"\b(?:Exclude|Include)DispatchKey\w*Guard\b|\bAutoDispatch\w*\b|\bDispatchKeySet\b",
     "changes which dispatch keys run (it would hide ops from the ATen audit)"),
    (r"\bcublas\w*|\bcublasLt\w*|\bat::cuda::blas\b", "uses cuBLAS: the arithmetic must be the candidate's own kernels"),
    (r"\bcudnn\w*", "uses cuDNN: the arithmetic must be the candidate's own kernels"),
    (r"\bcufft\w*|\bcusparse\w*|\bcusolver\w*", "uses a CUDA math library: the arithmetic must be the candidate's own kernels"),
    (r"\bthrust::", "uses Thrust's algorithms: the arithmetic must be the candidate's own kernels"),
    (r"\bkCPU\b|\.cpu\s*\(|\bcudaMemcpyDeviceToHost\b|\bcudaMemcpyDefault\b",
     "moves data to the host: host computation outside the kernels"),
    (r"\bcudaMallocHost\b|\bcudaHostAlloc\b|\bcudaMallocManaged\b|\bcudaHostRegister\b",
     "allocates host-visible memory: host computation outside the kernels"),
    (r"\bcudaStreamCreate\w*|\bcudaDeviceReset\b|\bcudaSetDevice\b|\bcudaGraph\w*",
     "manages streams, graphs or devices itself: launch on PyTorch's current stream"),
    (r"\bpybind11::module_?::import\b|\bpy::module_?::import\b|\bpy::(?:eval|exec)\b|\bPyRun_\w*|\bPyImport_\w*"
     r"|\bPyEval_\w*|\bPy_CompileString\w*", "calls Python from C++ (outside the static policy)"),
    (r"\bsystem\s*\(|\bpopen\s*\(|\bfork\s*\(|\bvfork\s*\(|\bexec[lv]p?e?\s*\(|\bposix_spawn\w*",
     "starts processes"),
    (r"\bdlopen\b|\bdlsym\b|\bLoadLibrary\w*", "uses the dynamic loader"),
    (r"\bstd::thread\b|\bpthread_create\b|\bstd::async\b|\bstd::jthread\b|#\s*include\s*<thread>",
     "starts threads: work outside the measured launch"),
    (r"\bfopen\s*\(|\bstd::[io]?fstream\b|#\s*include\s*<fstream>|\bopen\s*\(\s*\"",
     "opens files"),
    (r"\bsignal\s*\(|\bsigaction\b|\bkill\s*\(|\bexit\s*\(|\babort\s*\(|\b_exit\s*\(",
     "ends the process or handles signals"),
    (r"##", "pastes tokens in the preprocessor (it can spell any name this policy refuses)"),
)

# Build flags that pull code from outside the candidate's text or change what is linked.
_BARRED_FLAG = re.compile(r"^(?:-I|-isystem|-include|--pre-include|-L|-l(?!ineinfo$)|-Wl|-Xlinker|-B|-fplugin|-ccbin|"
                          r"--compiler-bindir|-specs|--linker-options|-Xnvlink|@)")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def source_findings(ext: InlineExtension) -> list[str]:
    """The C++/CUDA constructs and build flags of one extension that the policy refuses."""
    findings: list[str] = []
    for part, texts in (("cpp_sources", ext.cpp_sources), ("cuda_sources", ext.cuda_sources)):
        for text in texts:
            body = _strip_comments(text)
            for pattern, what in _BARRED_SOURCE:
                m = re.search(pattern, body)
                if m:
                    line = body.count("\n", 0, m.start()) + 1
                    findings.append(f"{part} of {ext.name!r}, line {line}: `{m.group(0).strip()}` {what}")
    for flags_name, flags in (("extra_cflags", ext.extra_cflags), ("extra_cuda_cflags", ext.extra_cuda_cflags),
                              ("extra_ldflags", ext.extra_ldflags)):
        for flag in flags:
            if flag.strip() and _BARRED_FLAG.match(flag.strip()):
                findings.append(f"{flags_name} of {ext.name!r}: {flag.strip()!r} pulls in code or libraries from "
                                "outside the candidate")
    if any(p.strip() for p in ext.extra_include_paths):
        findings.append(f"extra_include_paths of {ext.name!r}: headers from outside the candidate")
    return findings
