"""Decode's HiSparse kernels: vLLM's own compiled ops, or the project's registered under vLLM's names.

vLLM 0.33's HiSparse decode calls four ops, ``torch.ops._C_cache_ops.hisparse_*``, which its wheel's
``vllm/_C_stable_libtorch`` registers (callers: ``vllm/v1/hisparse/runtime.py``). ``hisparse_kernels``
implements each with the same schema and semantics in ``torch.ops.hisparse.vllm_*``
(``hisparse_kernels.ops.vllm_names.OURS_FOR_VLLM``). ``install("hisparse")`` makes vLLM's names
dispatch to ours, in this process, for one dispatch key:

1. vLLM's ops are loaded first (the module vLLM's CUDA platform imports), so that vLLM's own
   registration cannot come after ours and silently win;
2. ours are loaded (``hisparse_kernels.ops.ensure_loaded()``);
3. every pair's schemas are compared argument by argument (name, type, default, keyword-only,
   whether the op writes it) and the returns; one difference raises :class:`KernelSwapError` and
   nothing is registered;
4. one ``torch.library.Library(vllm_ns, "IMPL")``, kept alive by this module, registers a Python
   kernel per op that counts the call and forwards every argument to ours.

``install("vllm")`` registers nothing (and removes an earlier registration: vLLM's kernel, which the
dispatcher kept under ours, serves again). :func:`verify` proves a registration took effect with one
real call through vLLM's name; :func:`calls` counts the calls that reached ours.

The vLLM general plugin installs the choice ``HISPARSE_DECODE_KERNELS`` names (rendered from
``spec.decode.hisparse.kernels``) in every vLLM process; preflight installs and verifies it before vLLM
starts. A Python kernel adds a little host time per eager call; a replayed CUDA graph runs the kernels
captured through it and no Python at all.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, get_args

# The name table is pure data (no torch): the kernels' compiled ops are loaded only by ``install``.
from hisparse_kernels.ops.vllm_names import OUR_NAMESPACE, OURS_FOR_VLLM, VLLM_NAMESPACE

from hisparse_runtime.engine.env import HISPARSE_DECODE_KERNELS
from hisparse_runtime.engine.hisparse import DecodeKernels

__all__ = [
    "CHOICES",
    "ENV",
    "VLLM_OPS_MODULE",
    "KernelSwap",
    "KernelSwapError",
    "Verification",
    "calls",
    "choice_from_env",
    "install",
    "installed",
    "schema_differences",
    "verify",
]

log = logging.getLogger(__name__)

ENV: Final = HISPARSE_DECODE_KERNELS
CHOICES: Final[tuple[str, ...]] = get_args(DecodeKernels)
"""``vllm``: vLLM's own compiled ops; ``hisparse``: the project's, under vLLM's op names (the values of
``hisparse.kernels``)."""

VLLM_OPS_MODULE: Final = "vllm._C_stable_libtorch"
"""The extension that registers ``torch.ops._C_cache_ops`` (vLLM's CUDA platform imports it at import
time and again in ``import_kernels``)."""

DISPATCH_KEYS: Final = {"CUDA": "cuda", "CPU": "cpu"}
"""Dispatch keys a swap can be installed for, and the device :func:`verify` runs on."""


class KernelSwapError(RuntimeError):
    """The project's kernels cannot serve vLLM's op names here: an op is missing, a schema differs, a
    registration failed or did not take effect. Nothing of a failed :func:`install` stays registered."""


@dataclass(frozen=True)
class KernelSwap:
    """What :func:`install` did in this process."""

    requested: str
    """The choice asked for (``vllm`` or ``hisparse``)."""
    active: str
    """Which kernels now serve vLLM's op names for ``dispatch_key``."""
    ops: tuple[str, ...]
    """vLLM's ops (``namespace::name``) whose ``dispatch_key`` kernel is ours; empty for ``vllm``."""
    dispatch_key: str
    """The dispatch key the kernels were registered for (``CUDA`` in production)."""


@dataclass(frozen=True)
class Verification:
    """Evidence that a call through vLLM's name ran our kernel and computed what the op specifies."""

    op: str
    calls_before: int
    calls_after: int
    output: list[list[int]]
    expected: list[list[int]]


_lock = threading.Lock()
_libraries: dict[tuple[str, str], Any] = {}
"""(vLLM namespace, dispatch key) -> the ``torch.library.Library`` holding our registration. Dropping
it would unregister our kernels (the library's finalizer resets its registrations)."""
_installed: dict[tuple[str, str], KernelSwap] = {}
_calls: Counter[str] = Counter()


def choice_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The kernels ``HISPARSE_DECODE_KERNELS`` names (unset or empty: ``vllm``). Raises ValueError on others."""
    value = (environ.get(ENV) or "").strip() or "vllm"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r} names no decode kernels; use one of {', '.join(CHOICES)} "
                         "(vllm: vLLM's own ops; hisparse: the project's, under vLLM's op names)")  # fmt: skip
    return value


def calls() -> dict[str, int]:
    """Calls that reached our kernels through vLLM's names, per op (``namespace::name``), in this process.

    Eager calls only: a CUDA graph captured through our kernel counts once at capture, and its replays
    run the captured CUDA kernels without any Python."""
    return dict(_calls)


def installed(*, vllm_ns: str = VLLM_NAMESPACE, dispatch_key: str = "CUDA") -> KernelSwap | None:
    """What :func:`install` left in place for ``vllm_ns`` and ``dispatch_key`` (None: never called)."""
    with _lock:
        return _installed.get((vllm_ns, dispatch_key))


# --- schemas ---------------------------------------------------------------------------------------


def _describe(arg: Any) -> str:
    alias = arg.alias_info
    written = bool(alias and alias.is_write)
    default = f" = {arg.default_value!r}" if arg.has_default_value() else ""
    kw = "keyword-only " if arg.kwarg_only else ""
    return f"{kw}{arg.type} {arg.name}{default} ({'written' if written else 'read only'})"


def _key(arg: Any) -> tuple[str, str, bool, Any, bool, bool]:
    alias = arg.alias_info
    return (arg.name, str(arg.type), arg.has_default_value(), arg.default_value, bool(arg.kwarg_only),
            bool(alias and alias.is_write))  # fmt: skip


def schema_differences(theirs: Any, ours: Any) -> list[str]:
    """How ``ours`` (a ``torch.FunctionSchema``) differs from ``theirs``, argument by argument and in
    its returns: name, type, default, keyword-only and whether the op writes it. Empty: none."""
    out = []
    a, b = list(theirs.arguments), list(ours.arguments)
    for i in range(max(len(a), len(b))):
        mine = b[i] if i < len(b) else None
        their = a[i] if i < len(a) else None
        if mine is not None and their is not None and _key(mine) == _key(their):
            continue
        name = (their or mine).name
        out.append(f"argument {i} {name!r}: vLLM's is "
                   f"{_describe(their) if their is not None else 'absent'}, ours is "
                   f"{_describe(mine) if mine is not None else 'absent'}")  # fmt: skip
    ra = [(str(r.type), bool(r.alias_info and r.alias_info.is_write)) for r in theirs.returns]
    rb = [(str(r.type), bool(r.alias_info and r.alias_info.is_write)) for r in ours.returns]
    if ra != rb:
        out.append(f"returns: vLLM's are {ra or '()'}, ours are {rb or '()'}")
    return out


def _op(torch: Any, ns: str, name: str) -> Any:
    try:
        return getattr(getattr(torch.ops, ns), name).default
    except (AttributeError, RuntimeError) as exc:
        raise KernelSwapError(f"torch.ops.{ns}.{name} is not registered in this process ({exc})") from exc


# --- install ---------------------------------------------------------------------------------------


def _load(vllm_ns: str, ours_ns: str) -> None:
    # vLLM's ops first. In a vLLM worker the general plugins run in init_worker, and nothing guarantees
    # that vLLM's CUDA platform module (which imports vllm._C_stable_libtorch) was imported before: a
    # registration of ours for an op its .so has not registered yet would be followed by the .so's own
    # registration, which the dispatcher puts on top, and vLLM's kernel would silently serve decode.
    # Importing the module here, once, registers vLLM's kernels now; vLLM's later imports of the same
    # module are no-ops, so ours stay on top.
    if vllm_ns == VLLM_NAMESPACE:
        try:
            importlib.import_module(VLLM_OPS_MODULE)
        except Exception as exc:
            raise KernelSwapError(f"vLLM's compiled ops ({VLLM_OPS_MODULE}) do not load: {type(exc).__name__}: "
                                  f"{exc}") from exc  # fmt: skip
    if ours_ns == OUR_NAMESPACE:
        try:
            from hisparse_kernels.ops import ensure_loaded

            ensure_loaded()
        except Exception as exc:
            raise KernelSwapError(f"the project's kernels (hisparse_kernels) do not load: {type(exc).__name__}: "
                                  f"{exc}") from exc  # fmt: skip


def _forwarder(counter_key: str, target: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        _calls[counter_key] += 1
        return target(*args, **kwargs)

    kernel.__name__ = kernel.__qualname__ = f"hisparse_kernels_for_{counter_key.replace('::', '__')}"
    return kernel


def install(choice: str, *, vllm_ns: str = VLLM_NAMESPACE, ours_ns: str = OUR_NAMESPACE,
            dispatch_key: str = "CUDA") -> KernelSwap:  # fmt: skip
    """Make ``choice``'s kernels serve vLLM's HiSparse op names (in ``vllm_ns``) for ``dispatch_key``.

    ``vllm``: registers nothing (an earlier registration of ours is removed). ``hisparse``: loads vLLM's
    ops and ours, compares all four pairs of schemas, then registers ours for every vLLM name, or raises
    :class:`KernelSwapError` with nothing registered. Idempotent: the same call again does nothing more.
    The namespaces and key are parameters so tests can stand in for vLLM's ops on CPU.
    """
    if choice not in CHOICES:
        raise ValueError(f"unknown decode kernels {choice!r}; use one of {', '.join(CHOICES)}")
    if dispatch_key not in DISPATCH_KEYS:
        raise ValueError(f"dispatch key {dispatch_key!r} is not one of {', '.join(DISPATCH_KEYS)}")
    where = (vllm_ns, dispatch_key)
    with _lock:
        current = _installed.get(where)
        if choice == "vllm":
            library = _libraries.pop(where, None)
            if library is not None:
                library._destroy()  # vLLM's kernel, kept under ours by the dispatcher, serves again
                log.info("HiSparse decode kernels: vLLM's own ops serve %s again (%s)", vllm_ns, dispatch_key)
            swap = KernelSwap(requested="vllm", active="vllm", ops=(), dispatch_key=dispatch_key)
            _installed[where] = swap
            return swap
        if current is not None and current.active == "hisparse":
            return current
        return _install_ours(vllm_ns, ours_ns, dispatch_key)


def _install_ours(vllm_ns: str, ours_ns: str, dispatch_key: str) -> KernelSwap:
    import torch

    _load(vllm_ns, ours_ns)
    pairs = []
    problems = []
    for theirs_name, ours_name in OURS_FOR_VLLM.items():
        theirs, ours = _op(torch, vllm_ns, theirs_name), _op(torch, ours_ns, ours_name)
        problems += [f"{vllm_ns}::{theirs_name} vs {ours_ns}::{ours_name}: {d}"
                     for d in schema_differences(theirs._schema, ours._schema)]  # fmt: skip
        pairs.append((theirs_name, ours))
    if problems:
        raise KernelSwapError("the project's kernels do not take vLLM's arguments, so none was registered: "
                              + "; ".join(problems))  # fmt: skip
    library = torch.library.Library(vllm_ns, "IMPL")
    registered = []
    try:
        for theirs_name, ours in pairs:
            key = f"{vllm_ns}::{theirs_name}"
            # Overriding vLLM's kernel for this key is the point (allow_override, torch.library's switch for
            # it, says so explicitly): the dispatcher keeps vLLM's kernel beneath ours and serves it again
            # when this library is destroyed. Whatever torch warns while registering is logged here, where
            # it belongs, without touching the process's warning filters.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                library.impl(theirs_name, _forwarder(key, ours), dispatch_key, allow_override=True)
            for w in caught:
                log.info("HiSparse decode kernels: registering %s for %s: %s", key, dispatch_key, w.message)
            registered.append(key)
    except Exception as exc:
        library._destroy()  # unregisters the ones already done: all four or none
        raise KernelSwapError(f"registering the project's kernels for {vllm_ns} ({dispatch_key}) failed after "
                              f"{len(registered)} of {len(pairs)} ops: {type(exc).__name__}: {exc}") from exc  # fmt: skip
    _libraries[(vllm_ns, dispatch_key)] = library
    swap = KernelSwap(requested="hisparse", active="hisparse", ops=tuple(registered), dispatch_key=dispatch_key)
    _installed[(vllm_ns, dispatch_key)] = swap
    log.info("HiSparse decode kernels: the project's kernels (%s) serve %s for %s", ours_ns,
             ", ".join(registered), dispatch_key)  # fmt: skip
    return swap


# --- verify ----------------------------------------------------------------------------------------

VERIFY_OP: Final = "hisparse_invalidate_written_slots"

# device_global_indices[state] holds the global slot cached in each hot slot; the step wrote slots 7
# (token 0, request row 0 -> state 1) and 9 (token 1, request row 1 -> state 0); token 2 wrote nothing
# (-1). Entries equal to a written slot in that token's state row become -1; the 7 in state 0 stays,
# since no token of state 0 wrote slot 7 (an op that read the request row instead would drop it).
_VERIFY_DGI: Final = ((5, 7, 9, 7), (7, 3, -1, 11))
_VERIFY_RSI: Final = (1, 0)
_VERIFY_REQ: Final = (0, 1, 0)
_VERIFY_WRITTEN: Final = (7, 9, -1)
VERIFY_EXPECTED: Final = [[5, 7, -1, 7], [-1, 3, -1, 11]]
"""What ``hisparse_invalidate_written_slots`` must leave in the verification's state (see above)."""


def verify(*, vllm_ns: str = VLLM_NAMESPACE, dispatch_key: str = "CUDA") -> Verification:
    """Prove the registration took effect: one small call of ``hisparse_invalidate_written_slots``
    through vLLM's name, on the dispatch key's device, must reach our kernel (its counter goes up by one)
    and leave exactly the state the op specifies. Raises :class:`KernelSwapError` otherwise.

    It allocates tensors on the device: the vLLM plugin never calls it (a CUDA context in vLLM's API
    server before it starts its engine processes would break them); preflight does."""
    import torch

    swap = installed(vllm_ns=vllm_ns, dispatch_key=dispatch_key)
    if swap is None or swap.active != "hisparse":
        raise KernelSwapError(f"the project's kernels are not installed for {vllm_ns} ({dispatch_key}) in this "
                              "process: install('hisparse') first")  # fmt: skip
    device = torch.device(DISPATCH_KEYS[dispatch_key])
    i32 = {"dtype": torch.int32, "device": device}
    dgi = torch.tensor(_VERIFY_DGI, **i32)
    args = (dgi, torch.tensor(_VERIFY_RSI, **i32), torch.tensor(_VERIFY_REQ, **i32),
            torch.tensor(_VERIFY_WRITTEN, dtype=torch.int64, device=device))  # fmt: skip
    key = f"{vllm_ns}::{VERIFY_OP}"
    before = _calls[key]
    try:
        _op(torch, vllm_ns, VERIFY_OP)(*args)
    except KernelSwapError:
        raise
    except Exception as exc:
        raise KernelSwapError(f"{key} failed on {device}: {type(exc).__name__}: {exc}") from exc
    after = _calls[key]
    output = dgi.cpu().tolist()
    if after != before + 1:
        raise KernelSwapError(f"{key} on {device} did not reach the project's kernel (its calls went {before} -> "
                              f"{after}): another kernel serves vLLM's name")  # fmt: skip
    if output != VERIFY_EXPECTED:
        raise KernelSwapError(f"{key} on {device} reached the project's kernel but left device_global_indices "
                              f"{output}, not {VERIFY_EXPECTED}")  # fmt: skip
    return Verification(op=key, calls_before=before, calls_after=after, output=output, expected=VERIFY_EXPECTED)
