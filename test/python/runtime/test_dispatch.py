"""kf.runtime._launcher's call path (runtime/_launcher_dispatch.c, _launcher_lane.c): key(), dispatch(), Lane.

Without a GPU: key() builds exactly the tuple compiler/api.py's _fast_key builds (so
either can fill the table the other reads), equal where a call may share a program and
unequal across shape, dtype, device, contiguity, constants and container types;
dispatch() answers MISS for everything that is not a plain call (a tensor requiring
grad in grad mode, a torch dispatch mode, autocast, an argument it cannot key, a key
not in the table) and calls the table's entry otherwise; a Lane sends every uncommon
call to its slow path, and (against the stand-in libcuda.so.1 of test_launcher.py, in a
child process) launches the common one with the right pointers, outputs and result.
"""

from __future__ import annotations

import collections
import enum
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kf import api

_launcher = pytest.importorskip("kf.runtime._launcher", reason="kf.runtime._launcher is not built")
if not hasattr(_launcher, "dispatch"):
    pytest.skip("kf.runtime._launcher predates dispatch(): rebuild it (pip install -e .)", allow_module_level=True)

# the stand-in driver and the child process that loads it, from test_launcher.py
_spec = importlib.util.spec_from_file_location("kf_test_launcher", Path(__file__).with_name("test_launcher.py"))
_test_launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_test_launcher)
_run_with, fake_driver = _test_launcher._run_with, _test_launcher.fake_driver

MISS = _launcher.MISS
CHECK_OP, CHECK_AUTOCAST = _launcher.CHECK_OP, _launcher.CHECK_AUTOCAST


class Color(enum.IntEnum):
    RED = 1


Pair = collections.namedtuple("Pair", "a b")


def _calls():
    """Argument tuples of every kind _fast_key distinguishes."""
    x = torch.randn(4, 6)
    return [
        (), (x,), (x, x), (x.t(),), (x[:, :3],), (x.double(),), (x.to(torch.bfloat16),), (torch.randn(6, 4),),
        (torch.randn(4, 6, device="meta"),), (torch.tensor(1.0),), (torch.empty(0, 6),),
        (x, None), (x, True), (x, 1), (x, 1.0), (x, "1"), (x, 2**70), (x, -0.0), (x, float("inf")), (x, Color.RED),
        (x, [x, x]), (x, (x, x)), (x, [x.t(), x]), ([x],), ((x,),),
        (x, []), (x, ()), (x, [1, 2]), (x, [x, 1]), (x, (1, x)), (x, {"a": x}), (x, object()), (x, torch.float32),
        (x, x.requires_grad_(False)), (torch.nn.Parameter(torch.randn(3)),),
    ]


@pytest.mark.parametrize("i", range(len(_calls())))
def test_key_is_fast_key(i):
    """key(args) == _fast_key(args), element for element, and hashes the same."""
    args = _calls()[i]
    c, py = _launcher.key(args), api._fast_key(args)
    assert c == py
    assert type(c[0]) is type(py[0]) and (c[0] is None or hash(c[0]) == hash(py[0]))
    assert all(a is b for a, b in zip(c[1], py[1])) and len(c[1]) == len(py[1])


def test_key_tells_apart_what_a_program_depends_on():
    x = torch.randn(4, 6)
    keys = [_launcher.key(a)[0] for a in [
        (x,), (x.t().contiguous().t(),), (torch.randn(6, 4),), (x.double(),), (torch.randn(4, 6, device="meta"),),
        (x, 1), (x, True), (x, 1.0), (x, "1"), (x, None), (x, 2), (x, [x]), (x, (x,)), (x, [x, x]),
    ]]
    assert len(set(keys)) == len(keys)
    # the same signature from other tensors: one key
    assert _launcher.key((x, 1))[0] == _launcher.key((torch.randn(4, 6), 1))[0]
    assert _launcher.key((x.t(),))[0] == _launcher.key((torch.randn(4, 6).t(),))[0]


def test_key_leaves_container_subclasses_to_python():
    x = torch.randn(3)
    assert _launcher.key((x, Pair(x, x))) is MISS
    assert _launcher.key((x, type("L", (list,), {})([x]))) is MISS
    assert api._fast_key((x, Pair(x, x)))[0] is not None  # Python keys them (its own way)


def test_key_raises_what_reading_the_tensor_raises():
    class Bad(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            raise RuntimeError("no shape for you")

    bad = torch.randn(3).as_subclass(Bad)
    with pytest.raises(RuntimeError, match="no shape for you"):
        _launcher.key((bad,))
    with pytest.raises(RuntimeError, match="no shape for you"):
        api._fast_key((bad,))
    assert _launcher.dispatch({}, (bad,), 3) is MISS  # dispatch leaves it to the Python path
    with pytest.raises(TypeError, match="takes a tuple"):
        _launcher.key([bad])


def _table(args, entry):
    return {_launcher.key(args)[0]: entry}


def test_dispatch_calls_the_entry_with_the_flat_tensors():
    x, y = torch.randn(3), torch.randn(2)
    seen = []
    table = _table((x, [y, x], 2.5), lambda ts: seen.append(ts) or "result")
    assert _launcher.dispatch(table, (x, [y, x], 2.5), 3) == "result"
    assert len(seen) == 1 and type(seen[0]) is list and [id(t) for t in seen[0]] == [id(x), id(y), id(x)]
    assert _launcher.dispatch(table, (x, [y, x], 2.0), 3) is MISS  # another constant
    assert _launcher.dispatch(table, (x.double(), [y, x], 2.5), 3) is MISS
    assert _launcher.dispatch(table, (x, [y, x], 2.5, 1), 3) is MISS
    assert _launcher.dispatch(table, (x, [y, x], object()), 3) is MISS
    assert len(seen) == 1


def test_dispatch_routes_grad_like_needs_op():
    """checks & CHECK_OP: a tensor that requires grad (also inside a list) in grad mode is
    the op's (MISS), as torch_ops.needs_op says; under no_grad, or without the check, not."""
    from kf import torch_ops

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    for args in [(x, w), (x, [x, w]), (w,)]:
        table = _table(args, lambda ts: "fast")
        assert torch_ops.needs_op(args, {})
        assert _launcher.dispatch(table, args, CHECK_OP) is MISS
        assert _launcher.dispatch(table, args, CHECK_AUTOCAST) == "fast"
        assert _launcher.dispatch(table, args, 0) == "fast"
        with torch.no_grad():
            assert not torch_ops.needs_op(args, {})
            assert _launcher.dispatch(table, args, CHECK_OP | CHECK_AUTOCAST) == "fast"
        with torch.inference_mode():
            assert _launcher.dispatch(table, args, CHECK_OP) == "fast"


def test_dispatch_leaves_modes_and_autocast_to_python():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(3)
    table = _table((x,), lambda ts: "fast")
    with Mode():
        assert _launcher.dispatch(table, (x,), CHECK_OP) is MISS
        assert _launcher.dispatch(table, (x,), CHECK_AUTOCAST) == "fast"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _launcher.dispatch(table, (x,), CHECK_AUTOCAST) is MISS
        assert _launcher.dispatch(table, (x,), CHECK_OP) == "fast"
    assert _launcher.dispatch(table, (x,), CHECK_OP | CHECK_AUTOCAST) == "fast"


def test_dispatch_entry_errors_propagate_and_the_table_may_change():
    x = torch.randn(3)
    table = {}

    def entry(ts):
        table.clear()  # the entry's own reference is held for the call
        raise ValueError("from the entry")

    table.update(_table((x,), entry))
    with pytest.raises(ValueError, match="from the entry"):
        _launcher.dispatch(table, (x,), 3)
    assert _launcher.dispatch(table, (x,), 3) is MISS
    for bad in [([], (x,), 3), ({}, [x], 3), ({}, (x,), "3"), ({}, (x,))]:
        with pytest.raises(TypeError):
            _launcher.dispatch(*bad)


def test_unconfigured_module_says_so():
    script = ("from kf.runtime import _launcher\n"
              "try:\n    _launcher.key(())\nexcept RuntimeError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "configure(torch.Tensor, ...) has not been called" in r.stdout, r.stdout + r.stderr


def test_no_reference_leaks():
    """Hits, misses, grad MISS and key() leave every reference count as it was."""
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)

    def entry(ts):
        return ts[0]

    table = _table((x, [x, x], 1.5), entry)
    args_hit, args_miss, args_grad = (x, [x, x], 1.5), (x, [x, x], 2.5), (w, [x, x], 1.5)
    watched = [x, w, entry, args_hit[1], 1.5]
    for _ in range(10):  # warm up: caches, interned values
        _launcher.dispatch(table, args_hit, 3), _launcher.dispatch(table, args_miss, 3)
        _launcher.dispatch(table, args_grad, 3), _launcher.key(args_hit)
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(1000):
        assert _launcher.dispatch(table, args_hit, 3) is x
        assert _launcher.dispatch(table, args_miss, 3) is MISS
        assert _launcher.dispatch(table, args_grad, 3) is MISS
        _launcher.key(args_hit)
    assert [sys.getrefcount(o) for o in watched] == before


# ----------------------------------------------------------------------------- Lane


_KERNEL_FIELDS = ("handles", "grid", "block", "shared_bytes", "order", "failed")


def _lane(**changes):
    """A Lane of one kernel over CPU tensors (device -1) whose common case needs a driver:
    the tests here reach only its slow paths (or its argument checks). The kernel's
    fields (_KERNEL_FIELDS) are given as keywords too."""
    calls = []
    kw = dict(handles={-1: 0xF00}, grid=(1, 1, 1), block=(32, 1, 1), shared_bytes=0, order=(0, 1), n_in=1,
              outputs=(((4,), (1,), torch.float32),), alloc=torch._C._dynamo.guards._empty_strided_cpu,
              current_device=(-1).__int__, raw_stream=abs, failed=lambda err: None,
              slow=lambda ts: calls.append(ts) or "slow", first=0, program="the program")
    kw.update(changes)
    kernel = tuple(kw.pop(f) for f in _KERNEL_FIELDS)
    kw.setdefault("kernels", (kernel,))
    return _launcher.Lane(**kw), calls


def test_lane_slow_paths():
    x = torch.randn(4)
    odd = torch.randn(5)[1:]  # 4 bytes past an aligned address
    globals_ = {"_PROFILE": None}
    cases = [
        (dict(), [odd]),  # a view that is not 16-byte aligned
        (dict(current_device=(0).__int__), [x]),  # not the current device
        (dict(handles={}), [x]),  # not bound on this device yet
        (dict(kernels=(({-1: 0xF00}, (1, 1, 1), (32, 1, 1), 0, (0, 1), abs), ({}, (1, 1, 1), (32, 1, 1), 0, (1,), abs))),
         [x]),  # a second kernel not bound yet
        (dict(profile_globals={"_PROFILE": object()}, profile_name="_PROFILE"), [x]),  # kf.profile
        (dict(profiler_enabled=lambda: True), [x]),  # torch.profiler
        (dict(), [x, x]),  # not the lane's inputs
        (dict(), (x,)),  # not a list
        (dict(alignment=2**40), [x]),  # a stricter alignment than the allocator's
    ]
    for changes, tensors in cases:
        lane, calls = _lane(**changes)
        assert lane(tensors) == "slow", changes
        assert len(calls) == 1 and calls[0] is tensors
    lane, _ = _lane(profile_globals=globals_, profile_name="_PROFILE")
    assert lane.program == "the program" and lane.launch_dims == (((1, 1, 1), (32, 1, 1), 0),)
    assert lane.outputs == (((4,), (1,), torch.float32),)


@pytest.mark.parametrize("changes, error", [
    (dict(n_in=0), ValueError), (dict(n_in=64), ValueError), (dict(order=(0, 2)), ValueError),
    (dict(grid=(1, 1)), TypeError), (dict(block=(2**32, 1, 1)), OverflowError), (dict(shared_bytes=-1), OverflowError),
    (dict(alloc=None), TypeError), (dict(slow=None), TypeError), (dict(first=1), ValueError),
    (dict(first=-1), TypeError), (dict(outputs=((4,),)), TypeError), (dict(handles=[]), TypeError),
    (dict(profile_globals={}, profile_name=None), TypeError), (dict(alignment=0), ValueError),
    (dict(failed=None), TypeError), (dict(kernels=()), ValueError), (dict(kernels=((),)), TypeError),
    (dict(temporaries=(((64,), (1,), torch.uint8),)), TypeError),
    (dict(temporaries=(((64,), (1,), torch.uint8), tuple(range(63)))), ValueError),  # 65 buffers
])
def test_lane_checks_its_arguments(changes, error):
    with pytest.raises(error):
        _lane(**changes)


def test_lane_launches_against_the_stand_in_driver(fake_driver):
    """The common case: outputs from alloc of the given shapes and dtypes, the buffers in
    the kernel's parameter order, grid/block/shared bytes, the raw stream of the device,
    output `first` or unflatten(tree, outputs) back; a failed launch calls failed(err)."""
    _run_with(fake_driver, """
        import torch
        from kf.runtime import _launcher
        from kf.results import unflatten
        alloc = torch._C._dynamo.guards._empty_strided_cpu
        made = []
        def tracked(shape, stride, dtype):
            made.append(alloc(shape, stride, dtype))
            return made[-1]
        streams = []
        def raw_stream(device):
            streams.append(device)
            return 0x5300
        class Failed(Exception):
            pass
        def failed(err):
            raise Failed(err)
        outputs = (((4, 8), (8, 1), torch.float32), ((4,), (1,), torch.int32))
        a, b = torch.randn(4, 8), torch.randn(8)
        order = (3, 0, 2, 1)
        tree = ("tuple", [("tensor", 1), ("list", [("tensor", 0)])])
        lane = _launcher.Lane((({-1: 0xf03}, (4, 2, 1), (64, 1, 1), 512, order, failed),), 2, outputs, tracked,
                              (-1).__int__, raw_stream, lambda ts: "slow", -1, tree, unflatten)
        fake("kf_fake_nparams").value = 4
        o1, (o0,) = lane([a, b])
        assert (o0.shape, o0.stride(), o0.dtype, o1.shape, o1.dtype) == ((4, 8), (8, 1), torch.float32, (4,), torch.int32)
        assert o0 is made[-2] and o1 is made[-1]
        bufs = [a, b, o0, o1]
        assert recorded(4) == (0xf03, (4, 2, 1, 64, 1, 1, 512), 0x5300, [bufs[i].data_ptr() for i in order])
        assert streams == [-1]
        first = _launcher.Lane((({-1: 0xf04}, (1, 1, 1), (32, 1, 1), 0, (0, 1, 2, 3), failed),), 2, outputs, alloc,
                               (-1).__int__, raw_stream, lambda ts: "slow", 1)
        fake("kf_fake_nparams").value = 4
        out = first([a, b])
        assert out.dtype == torch.int32 and recorded(4)[3][3] == out.data_ptr()
        fake("kf_fake_result").value = 719
        try:
            first([a, b])
        except Failed as e:
            assert e.args == (719,)
        else:
            raise AssertionError("a failed launch did not call failed()")
        fake("kf_fake_result").value = 0
        import sys
        ts = [a, b]
        watched = [a, b, first, ts, raw_stream, alloc]
        first(ts)
        before = [sys.getrefcount(o) for o in watched]
        for _ in range(500):
            first(ts)
        assert [sys.getrefcount(o) for o in watched] == before
        print("ok")
    """)


@pytest.mark.parametrize("dispatch", ["auto", "python"])
def test_program_c_lane_through_a_kf_function(fake_driver, tmp_path, monkeypatch, dispatch):
    """CudaProgram.c_lane through CompiledProgram.matched_call, in a KfFunction's table:
    f(x) launches from C, a misaligned view takes the general path; KF_DISPATCH=python
    keeps the Python lane and dispatch, with the same launches."""
    monkeypatch.setenv("KF_DISPATCH", dispatch)
    (tmp_path / "k.ptx").write_text("// the stand-in driver never reads it\\n")
    script = f"""
        import os, torch, kf
        from kf import api
        from kf.programs import CompiledProgram
        from kf.runtime import cuda as kcuda, programs, _launcher
        from kf.runtime.abi import KernelABI, ProgramABI, TensorArg
        programs._output_allocator = lambda: (torch._C._dynamo.guards._empty_strided_cpu, (-1).__int__)
        kcuda._raw_stream_getter = lambda: (lambda device: 0x5400)
        kernel = KernelABI("add_one", (0, 1), (1, 1, 1), (32, 1, 1), 0, "k.ptx")
        abi = ProgramABI("cuda", (TensorArg("x", (16,), "f32"),), (TensorArg("0", (16,), "f32"),), (), (kernel,), (-1,))
        prog = programs.CudaProgram(abi, {str(tmp_path)!r}, {{}})
        k = prog.kernels[0][0]
        k._bound[-1], k._handles[-1] = kcuda._Bound(None, 0xf05), 0xf05
        k._raw_stream = kcuda._raw_stream_getter()
        compiled = CompiledProgram(prog, ("tensor", 0), {{}}, {str(tmp_path)!r})
        f = kf.jit(lambda x: x + 1)
        x = torch.randn(16)
        lane = compiled.matched_call(True)
        python = os.environ.get("KF_DISPATCH") == "python"
        assert (type(lane) is _launcher.Lane) != python, type(lane)
        assert (api._c_dispatch is None) == python
        assert lane.program is compiled
        f._fast[api._fast_key((x,))[0]] = lane
        fake("kf_fake_nparams").value = 2
        out = f(x)
        assert recorded(2) == (0xf05, (1, 1, 1, 32, 1, 1, 0), 0x5400, [x.data_ptr(), out.data_ptr()])
        assert out.shape == (16,) and fake("kf_fake_calls").value == 1
        odd = torch.randn(17)[1:]
        fake("kf_fake_nparams").value = 2
        f(odd)  # an aligned copy, through the general path
        sent = recorded(2)[3]
        assert sent[0] != odd.data_ptr() and sent[0] % 16 == 0 and fake("kf_fake_calls").value == 2
        print("ok")
    """
    assert _run_with(fake_driver, script).strip() == "ok"


#: the lane tests' prelude: kf's pieces, an allocator that keeps what it made (``made``)
#: on CPU tensors, and torch's raw stream as a constant
_RECORDING_LANE = """        from kf import api
        from kf.programs import CompiledProgram
        from kf.runtime import cuda as kcuda, programs, _launcher
        from kf.runtime.abi import KernelABI, ProgramABI, TensorArg
        made = []
        def alloc(shape, stride, dtype):
            made.append(torch._C._dynamo.guards._empty_strided_cpu(shape, stride, dtype))
            return made[-1]
        programs._output_allocator = lambda: (alloc, (-1).__int__)
        kcuda._raw_stream_getter = lambda: (lambda device: 0x5400)
"""


@pytest.mark.parametrize("dispatch", ["auto", "python"])
def test_program_lane_of_several_kernels(fake_driver, tmp_path, monkeypatch, dispatch):
    """A program of two kernels and two temporaries (fp8 attention's shape: a kernel
    makes what the next reads) takes the fast lane too, in C and in Python: the
    temporaries are one allocation at 256-byte offsets, and the kernels launch in order,
    each with its buffers."""
    monkeypatch.setenv("KF_DISPATCH", dispatch)
    (tmp_path / "k.ptx").write_text("// the stand-in driver never reads it\\n")
    script = f"""
        import os, torch, kf
{_RECORDING_LANE}        # buffers: 0 x, 1 the output, 2 and 3 temporaries
        first = KernelABI("stage", (0, 2, 3), (2, 1, 1), (32, 1, 1), 0, "k.ptx")
        second = KernelABI("finish", (3, 2, 1), (1, 1, 1), (64, 1, 1), 128, "k.ptx")
        abi = ProgramABI("cuda", (TensorArg("x", (16,), "f32"),), (TensorArg("0", (16,), "f32"),),
                         (TensorArg("t0", (3,), "f32"), TensorArg("t1", (100,), "f32")), (first, second), (-1,))
        prog = programs.CudaProgram(abi, {str(tmp_path)!r}, {{}})
        for (k, _), fn in zip(prog.kernels, (0xa1, 0xa2)):
            k._bound[-1], k._handles[-1] = kcuda._Bound(None, fn), fn
            k._raw_stream = kcuda._raw_stream_getter()
        compiled = CompiledProgram(prog, ("tensor", 0), {{}}, {str(tmp_path)!r})
        lane = compiled.matched_call(True)
        python = os.environ.get("KF_DISPATCH") == "python"
        assert (type(lane) is _launcher.Lane) != python, type(lane)
        if not python:
            assert lane.launch_dims == (((2, 1, 1), (32, 1, 1), 0), ((1, 1, 1), (64, 1, 1), 128))
        x = torch.randn(16)
        fake("kf_fake_nparams").value = 3
        out = lane([x])
        assert fake("kf_fake_calls").value == 2
        temp = made[-1]
        assert out is made[-2] and out.shape == (16,)
        assert temp.dtype == torch.uint8 and temp.shape == (256 + 512,), temp.shape  # 12 -> 256, 400 -> 512 bytes
        t0, t1 = temp.data_ptr(), temp.data_ptr() + 256
        assert logged(2, 3) == [(0xa1, [x.data_ptr(), t0, t1]), (0xa2, [t1, t0, out.data_ptr()])]
        print("ok")
    """
    assert _run_with(fake_driver, script).strip() == "ok"


@pytest.mark.parametrize("dispatch", ["auto", "python"])
def test_program_with_run_time_sizes_has_a_lane_per_signature(fake_driver, tmp_path, monkeypatch, dispatch):
    """A program with run-time sizes takes the fast lane too, in C and in Python, one for
    each call signature's shapes (api._matched hands them over): outputs of the call's
    shapes, the sized kernel on its grid for them with its size slots' buffer (made once,
    kept by the lane) as its last argument, and a static kernel on its own grid."""
    monkeypatch.setenv("KF_DISPATCH", dispatch)
    (tmp_path / "k.ptx").write_text("// the stand-in driver never reads it\\n")
    script = f"""
        import ctypes, gc, os, torch, kf
{_RECORDING_LANE}        from kf.runtime.abi import DYN
        # buffers: 0 x [s0, 8], 1 the output [s0, 8], 2 a temporary [2*s0]; 3 the slots (sized kernels)
        rows = KernelABI("rows", (0, 2, 1), (1, 1, 1), (128, 1, 1), 0, "k.ptx", sizes=("s0", "8*s0"),
                         grid_sizes=("FloorDiv(k0 + 3, 4)", "1", "1"))
        tail = KernelABI("tail", (1,), (2, 1, 1), (32, 1, 1), 0, "k.ptx")
        abi = ProgramABI("cuda", (TensorArg("x", (DYN, 8), "f32", ("s0", "8")),),
                         (TensorArg("0", (DYN, 8), "f32", ("s0", "8")),),
                         (TensorArg("t", (DYN,), "f32", ("2*s0",)),), (rows, tail), (-1,))
        prog = programs.CudaProgram(abi, {str(tmp_path)!r}, {{}})
        prog._slot_buffer = lambda slots, dev: torch.tensor(slots, dtype=torch.int32, device=dev)
        for (k, _), fn in zip(prog.kernels, (0xb1, 0xb2)):
            k._bound[-1], k._handles[-1] = kcuda._Bound(None, fn), fn
            k._raw_stream = kcuda._raw_stream_getter()
        compiled = CompiledProgram(prog, ("tensor", 0), {{}}, {str(tmp_path)!r})
        python = os.environ.get("KF_DISPATCH") == "python"
        for n, blocks in ((13, 4), (300, 75)):
            x = torch.randn(n, 8)
            lane = api._matched(compiled, [x])
            assert (type(lane) is _launcher.Lane) != python, type(lane)
            if not python:
                assert lane.launch_dims == (((blocks, 1, 1), (128, 1, 1), 0), ((2, 1, 1), (32, 1, 1), 0))
            gc.collect()  # the slots' buffer lives as long as the lane
            fake("kf_fake_nparams").value = 4
            out = lane([x])
            temp = made[-1]
            assert out is made[-2] and out.shape == (n, 8) and temp.shape == (-(-8 * n // 256) * 256,)
            (f1, (p0, p1, p2, slots)), (f2, (q0, *_)) = logged(fake("kf_fake_calls").value, 4)[-2:]
            assert (f1, p0, p1, p2, f2, q0) == (0xb1, x.data_ptr(), temp.data_ptr(), out.data_ptr(), 0xb2, out.data_ptr())
            values = (ctypes.c_int32 * 2).from_address(slots)
            assert list(values) == [n, 8 * n], list(values)
        print("ok")
    """
    assert _run_with(fake_driver, script).strip() == "ok"


# ----------------------------------------------------------------------------- on a GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")


@gpu
def test_c_lane_on_the_gpu_matches_torch():
    """Calls through the C dispatch and lane: fresh outputs of the right layout each call,
    a tuple of two outputs rebuilt from the flat list, on a side stream too, and a
    requires_grad input still differentiated through the op."""
    import kf
    from kf.runtime import cuda as kcuda

    f = kf.jit(lambda x, y: x * y + 1)
    g = kf.jit(lambda x: (x + 1, x * 2))
    outs = []
    for _ in range(3):
        x, y = torch.randn(300, 7, device="cuda"), torch.randn(300, 7, device="cuda")
        out = f(x, y)
        torch.testing.assert_close(out, x * y + 1)
        assert out.stride() == (7, 1) and out.device == x.device and all(out.data_ptr() != o.data_ptr() for o in outs)
        outs.append(out)
        a, b = g(x)
        torch.testing.assert_close(a, x + 1)
        torch.testing.assert_close(b, x * 2)
    if kcuda._c_launch is not None and api._c_dispatch is not None:
        assert type(next(iter(f._fast.values()))) is _launcher.Lane
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        side = f(x, y)
    s.synchronize()
    torch.testing.assert_close(side, x * y + 1)
    xg = x.clone().requires_grad_()
    f(xg, y).sum().backward()
    torch.testing.assert_close(xg.grad, y)


@gpu
def test_c_lane_of_several_kernels_on_the_gpu():
    """A program of several kernels with temporaries (x / x.abs().amax(): the split
    reduction's two stages, then the division) takes the lane too, and every call
    computes from its own inputs: the temporaries of one call are never another's."""
    import kf
    from kf.runtime import cuda as kcuda

    f = kf.jit(lambda x: x / x.abs().amax())
    xs = [torch.randn(1024, 4096, device="cuda") * (i + 1) for i in range(3)]
    for _ in range(2):
        outs = [f(x) for x in xs]  # queued back to back, sharing the allocator's blocks
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, x / x.abs().amax())
    program = next(iter(f._fast.values()))
    if kcuda._c_launch is not None and api._c_dispatch is not None:
        assert type(program) is _launcher.Lane and len(program.launch_dims) > 1, program
