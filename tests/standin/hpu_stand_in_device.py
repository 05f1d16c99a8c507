"""The stand-in's "device": tensors that report ``device.type == "hpu"`` and refuse to mix with CPU ones.

The real bridge (HabanaAI/gaudi-pytorch-bridge, python_packages/habana_frameworks/torch/__init__.py)
loads a C++ plugin that registers the HPU device: a device guard, ATen hooks, kernels for every
aten op and for the c10d collectives on the HPU dispatch key. This module does the same for a
CPU-only torch, so that code which is wrong on a Gaudi is wrong here too:

- a tiny C++ extension registers a DeviceGuardImpl and HPUHooks for HPU (torch needs them for
  ``.to("hpu")`` without an index and for autograd on non-CPU tensors);
- ``HpuTensor``, a wrapper subclass holding CPU storage (the way FakeTensor and DTensor report a
  device they do not compute on), runs each aten op on its CPU data and wraps the result;
  an op that mixes it with a CPU tensor (other than a 0-dim scalar, as on CUDA) raises torch's
  "Expected all tensors to be on the same device" error, as the hardware does;
- empty/empty_strided/_copy_from kernels on the HPU key, so factories and ``.to("hpu")`` work;
- c10d collectives on hpu tensors go to the group's "hpu" backend only: hccl is registered for
  device "hpu" alone (distributed/hccl/__init__.py: ``register_backend("hccl", ..., devices=["hpu"])``),
  so a CPU tensor handed to an hccl group fails with torch's "No backend type associated with
  device type cpu". Collectives complete before returning (they are ordered on the device stream
  on Gaudi; the host never sees a half-reduced buffer there either);
- bf16 autocast for ``torch.autocast("hpu")``: the op lists are read from
  PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST once, when the bridge
  loads (as the real one does), with a short default list when unset.

Tests only. Needs a C++ compiler and ninja (the [dev] extra); the build is cached by torch.
A top-level module, not part of the habana_frameworks package: tests purge that package between
tests (a fresh "bridge" each time), while a device can be registered with torch once per process.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map

HPU = torch.device("hpu", 0)

_GUARD_SOURCE = r"""
#include <ATen/detail/HPUHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
namespace {
C10_REGISTER_GUARD_IMPL(HPU, c10::impl::FakeGuardImpl<c10::DeviceType::HPU>);
}
#include <atomic>
// Off until the stand-in bridge loads (and again when a test forgets it): torch then sees no
// accelerator, so tests of other paths in the same process are not steered to "hpu".
static std::atomic<bool> hpu_active{false};
void set_hpu_active(bool active) { hpu_active = active; }
namespace at {
struct HPUHooks : at::HPUHooksInterface {  // the registry key is the class name: "HPUHooks"
  HPUHooks(at::HPUHooksArgs) {}
  void init() const override {}
  bool hasHPU() const override { return hpu_active; }
  bool isBuilt() const override { return hpu_active; }
  bool isAvailable() const override { return hpu_active; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  c10::Device getDeviceFromPtr(void*) const override { return c10::Device(c10::DeviceType::HPU, 0); }
};
REGISTER_HPU_HOOKS(HPUHooks);
}
int hpu_stand_in_registered() { return 1; }
"""

# Used when the env names no list; a short version of the bridge's documented defaults.
DEFAULT_BF16_OPS = ("addmm", "addbmm", "baddbmm", "bmm", "conv1d", "conv2d", "dot", "linear", "matmul", "mm", "mv")
DEFAULT_FP32_OPS = ("cross_entropy", "log_softmax", "nll_loss", "softmax")

_ext = None  # the C++ extension, once registered
_libs: list[Any] = []  # torch.library registrations live as long as their Library object


def _is_hpu(x: Any) -> bool:
    return x is not None and not isinstance(x, (int, float)) and torch.device(x).type == "hpu"


class HpuTensor(torch.Tensor):
    """A tensor on the stand-in HPU: reports device hpu:0, computes on the CPU tensor it wraps."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        assert type(elem) is torch.Tensor and elem.device.type == "cpu", type(elem)
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=HPU,
            requires_grad=elem.requires_grad,
        )
        out.elem = elem
        return out

    # A traceable wrapper subclass: Module.to() swaps parameters in place instead of set_data.
    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return HpuTensor(inner["elem"])

    def __repr__(self) -> str:  # no grad_fn noise, and never a device-mixing op
        return f"HpuTensor({self.elem!r})"

    def tolist(self):  # a device-to-host copy, as on Gaudi (torch refuses tolist on subclasses itself)
        value = self.elem.tolist()
        _host_read("tolist", value)
        return value

    def __reduce_ex__(self, protocol):
        # torch.save of hpu tensors works on Gaudi (storage copied to the host); keep that possible.
        return (_rebuild, (self.elem.detach().clone(), self.requires_grad))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _rebuild(elem: torch.Tensor, requires_grad: bool) -> HpuTensor:
    return HpuTensor(elem.requires_grad_(requires_grad))


torch.serialization.add_safe_globals([_rebuild])  # checkpoints of hpu tensors load with weights_only


# Ops the host must wait for, each a step marker (the pending graph runs) then a device-to-host copy,
# in the bridge's lazy kernels (habana_kernels/lazy_kernels.cpp, 1.19): a scalar read (.item(),
# bool(t), float(t), ``if t:``: _local_scalar_dense_hpu, "step marker due to local scalar"); a copy
# to the host (.cpu(), .tolist(), .numpy() after it, print: d2h_maybe_eval); ops whose output shape
# depends on the values, which read a count back (nonzero, unique: "step marker due to non zero",
# "... due to unique"); boolean-mask indexing, which goes through nonzero (index_put with a bool
# index: "step marker due to index_put_frontend_impl_hpu_lazy").
_HOST_SYNCS = (
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::equal",
    "aten::nonzero",
    "aten::nonzero_numpy",
    "aten::masked_select",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
)
_BOOL_INDEXED = ("aten::index.Tensor", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_")


def _record(name: str, **details) -> None:
    hf = sys.modules.get("habana_frameworks")  # the call log of the stand-in bridge loaded now
    if hf is not None:
        hf.record(name, **details)


# HPU graphs (tests/standin/habana_frameworks/torch/hpu/graphs.py) set this while they capture or
# replay. A capture runs the Python forward once: its host reads happen then, and the values read
# (a branch taken, a shape) are baked into the graph. A replay runs no Python and reads nothing, so
# its reads are not host syncs; the stand-in still computes the forward, and compares what it would
# have read with what the capture read (a different value: the real replay computes something else).
graph_reads: Optional[list] = None
graph_mode: Optional[str] = None  # "capture" or "replay"


def _host_read(op: str, value: Any) -> None:
    if graph_reads is not None:
        graph_reads.append((op, value))
    if graph_mode != "replay":
        _record("host_sync", op=op, **({"in_capture": True} if graph_mode == "capture" else {}))


def _bool_indexed(func, args: tuple) -> bool:
    if func.name() not in _BOOL_INDEXED or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()) if i is not None)


_TRANSFERS = ("aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize")


def _run(func, args: tuple, kwargs: dict[str, Any]):
    if func.namespace == "c10d":
        return _collective(func, args, kwargs)
    cpu = []

    def unwrap(x):
        if isinstance(x, HpuTensor):
            return x.elem
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            cpu.append(x)
        return x

    uargs, ukwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    if cpu and func.name() not in _TRANSFERS:
        raise RuntimeError(
            f"{func}: Expected all tensors to be on the same device, but found at least two devices, hpu:0 and cpu!"
        )
    to_host = func.name() == "aten::_to_copy" and "device" in kwargs and not _is_hpu(kwargs["device"])
    if _is_hpu(ukwargs.get("device")):
        ukwargs["device"] = torch.device("cpu")
    out = func(*uargs, **ukwargs)
    if to_host or func.name() in _HOST_SYNCS or _bool_indexed(func, args):
        _host_read(func.name(), out.detach().clone() if isinstance(out, torch.Tensor) else out)
    if to_host:
        return out
    wrapped = tree_map(lambda x: HpuTensor(x) if type(x) is torch.Tensor else x, out)
    return return_and_correct_aliasing(func, args, kwargs, wrapped)


# ----------------------------------------------------------------------------------------------
# Collectives: what the bridge's ProcessGroupHCCL serves, on the group's "hpu" backend.


def _backend(boxed_group):
    group = dist.ProcessGroup.unbox(boxed_group)
    return group._get_backend(HPU)  # raises, as torch does, when no backend serves hpu


def _elems(tensors: list[HpuTensor]) -> list[torch.Tensor]:
    bad = [t for t in tensors if not isinstance(t, HpuTensor)]
    if bad:
        raise RuntimeError("hccl: tensors must be on the same device (hpu)")
    return [t.elem for t in tensors]


def _done(work):
    work.wait()  # device-ordered on Gaudi: no half-reduced buffer is ever visible
    return work.boxed()


# A fault to inject (tests): HPU_STAND_IN_HANG=1 makes this process's collectives never start nor return,
# as on a card whose scale-out link carries nothing, while the host NIC works. The bridge's wait has no
# limit either (gaudi-pytorch-bridge 1.19, python_packages/habana_frameworks/torch/distributed/hccl/
# ProcessGroupHCCL.cpp WorkHCCL::wait and process_group_eager_hccl.cpp WorkEager::wait ignore their
# timeout, "abort API is not implemented"), so nothing inside the process ends it: only a kill.
HANG = "HPU_STAND_IN_HANG"


def _collective(func, args, kwargs):
    name = func.name()
    a = list(args)
    while os.environ.get(HANG) == "1":
        time.sleep(3600)
    if name == "c10d::allreduce_":
        tensors, group = a[0], a[1]
        opts = c10d.AllreduceOptions()
        opts.reduceOp = (
            a[2] if isinstance(a[2], dist.ReduceOp) else dist.ReduceOp(dist.ReduceOp.RedOpType(a[2].op()))
        )  # a boxed c10d.ReduceOp
        return tensors, _done(_backend(group).allreduce(_elems(tensors), opts))
    if name == "c10d::broadcast_":
        tensors, group, root_rank, root_tensor = a[0], a[1], a[2], a[3]
        opts = c10d.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root_rank, root_tensor
        return tensors, _done(_backend(group).broadcast(_elems(tensors), opts))
    if name == "c10d::allgather_":
        outputs, inputs, group = a[0], a[1], a[2]
        work = _backend(group).allgather([_elems(o) for o in outputs], _elems(inputs), c10d.AllgatherOptions())
        return outputs, _done(work)
    if name == "c10d::_allgather_base_":
        output, input_, group = a[0], a[1], a[2]
        work = _backend(group)._allgather_base(_elems([output])[0], _elems([input_])[0], c10d.AllgatherOptions())
        return output, _done(work)
    if name == "c10d::barrier":
        return _done(_backend(a[1]).barrier(c10d.BarrierOptions()))
    raise NotImplementedError(
        f"hccl stand-in: {name} is not implemented; add it in tests/standin/hpu_stand_in_device.py"
    )


# ----------------------------------------------------------------------------------------------
# Autocast


def _read_ops(var: str, default: tuple[str, ...]) -> tuple[str, ...]:
    path = os.environ.get(var)
    if not path:
        return default
    with open(path) as f:  # the bridge fails on a list it cannot read; so does this
        return tuple(line.strip() for line in f if line.strip())


def _autocast_kernel(op, dtype: torch.dtype) -> Callable:
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastHPU)

    def cast(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        return x

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*tree_map(cast, args), **tree_map(cast, kwargs))

    return kernel


def _register_autocast(lib, ops: tuple[str, ...], dtype: torch.dtype) -> list[str]:
    done = []
    for name in ops:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            qualified = name if overload == "default" else f"{name}.{overload}"
            try:
                lib.impl(qualified, _autocast_kernel(op, dtype), "AutocastHPU")
            except RuntimeError:
                continue  # already registered by an earlier name in the list
            done.append(qualified)
    return done


# ----------------------------------------------------------------------------------------------
# Loading


def _factory(make):
    def kernel(*args, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory")}
        return HpuTensor(make(*args, device="cpu", **kwargs))

    return kernel


def _copy_from(self, dst, non_blocking=False):
    target = dst.elem if isinstance(dst, HpuTensor) else dst
    target.copy_(self.elem if isinstance(self, HpuTensor) else self)
    return dst


_EXT_NAME = "gaudi_launch_hpu_stand_in"


def guard_extension_paths() -> tuple[str, str]:
    """Where the guard is built and its finished module: one per source, torch and Python version."""
    import hashlib

    key = hashlib.sha256(f"{_GUARD_SOURCE}|{torch.__version__}|{sys.version_info[:2]}|-O0".encode()).hexdigest()[:16]
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    home = os.path.join(root, f"{_EXT_NAME}-{key}")
    return home, os.path.join(home, f"{_EXT_NAME}.so")


def _guard_extension() -> Any:
    """The C++ guard: built once per source, torch and Python, then imported with no build lock.

    torch's load_inline takes a lock file in its build directory in every process, even when nothing
    is to be built, and a process that finds the lock waits for it to go, for ever (FileBaton has no
    timeout and records no owner). The launcher's tests kill ranks while they start, so one rank
    killed inside that window hung every later rank, and a test session here stuck in collection.
    Here a build happens in a directory of its own process and its result is renamed into place, so
    nobody waits on anybody, and a finished build is simply imported.
    """
    import importlib.util
    import shutil

    from torch.utils.cpp_extension import load_inline

    home, built = guard_extension_paths()
    if os.path.exists(built):
        spec = importlib.util.spec_from_file_location(_EXT_NAME, built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    workdir = os.path.join(home, f"build-{os.getpid()}")
    os.makedirs(workdir, exist_ok=True)
    module = load_inline(
        _EXT_NAME,
        cpp_sources=[_GUARD_SOURCE],
        functions=["hpu_stand_in_registered", "set_hpu_active"],
        extra_cflags=["-O0"],
        build_directory=workdir,
        verbose=False,
    )
    # atomic: a reader sees no .so or a whole one; this process keeps its mapping of the moved file
    os.replace(os.path.join(workdir, f"{_EXT_NAME}.so"), built)
    shutil.rmtree(workdir, ignore_errors=True)
    return module


def register_device() -> None:
    """Register the stand-in HPU device with torch, once per process (inactive until load()).

    It must come before anything asks torch which accelerator it has: torch caches the HPU hooks
    on that first question. Subprocesses get it at ``import torch`` through the entry point in
    gaudi_launch_hpu_stand_in-0.dist-info (as the real bridge's autoload), the test process from
    tests/conftest.py.
    """
    global _ext
    if _ext is not None:
        return
    _ext = _guard_extension()
    aten = torch.library.Library("aten", "IMPL")
    aten.impl("empty.memory_format", _factory(torch.empty), "HPU")
    aten.impl("empty_strided", _factory(torch.empty_strided), "HPU")
    aten.impl("_copy_from", _copy_from, "HPU")
    # torch's scaled_dot_product_attention asks the device which kernel to use: the math one
    # (SDPBackend.math == 0), built from ordinary ops, runs on HpuTensor.
    aten.impl("_fused_sdp_choice", lambda *args, **kwargs: 0, "HPU")
    fallback = torch.library.Library("_", "IMPL")
    # Ops outside the lists run in their own dtype under autocast("hpu").
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastHPU")
    _libs.extend([aten, fallback])


def activate(active: bool) -> None:
    if _ext is not None:
        _ext.set_hpu_active(active)


def load() -> dict[str, Any]:
    """The stand-in bridge loading: the device on, and the autocast op lists of the current
    environment registered (again at each fresh import of the stand-in bridge in tests); returns
    the lists in force."""
    global _autocast_lib
    register_device()
    activate(True)
    if _autocast_lib is not None:
        _autocast_lib._destroy()
    bf16 = _read_ops("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", DEFAULT_BF16_OPS)
    fp32 = _read_ops("PT_HPU_AUTOCAST_FP32_OPS_LIST", DEFAULT_FP32_OPS)
    _autocast_lib = torch.library.Library("aten", "IMPL")
    return {
        "bf16": _register_autocast(_autocast_lib, bf16, torch.bfloat16),
        "fp32": _register_autocast(_autocast_lib, fp32, torch.float32),
    }


def autoload() -> None:
    """torch's device-backend entry point, called during ``import torch``. As the bridge's
    habana_frameworks/autoload/__init__.py (1.19): PT_HPU_AUTOLOAD=1/0 decides; unset, the bridge
    loads with torch in eager mode only (PT_HPU_LAZY_MODE=0), not in lazy mode."""
    register_device()
    if any(name.startswith("habana_frameworks.torch") for name in sys.modules):
        return  # already loaded, or loading (the real autoload's is_loaded)
    flag = os.getenv("PT_HPU_AUTOLOAD", "-1")
    if flag == "1" or (flag != "0" and os.getenv("PT_HPU_LAZY_MODE", "1") != "1"):
        import habana_frameworks.torch  # noqa: F401


_autocast_lib = None


def is_hpu_tensor(x: Any) -> bool:
    return isinstance(x, HpuTensor)
