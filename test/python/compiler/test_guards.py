"""What a kf function reads besides its arguments (guards.py): every program is
specialized to it, each call checks it is unchanged, and the tensors it reaches are
read at every call. Each case is checked against torch eager on fresh random inputs,
with the C guards (kf.runtime._launcher.Guarded) and the Python ones (PyGuarded)."""

from __future__ import annotations

import enum
import functools
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import kf
from kf import api, guards  # api: configures the extension with torch.Tensor

_launcher = pytest.importorskip("kf.runtime._launcher", reason="kf.runtime._launcher is not built")


def _pythonpath(first) -> str:
    """PYTHONPATH for a child process: ``first``, then the caller's PYTHONPATH, which may be
    where kf's dependencies are (an install with ``pip --target``)."""
    return os.pathsep.join([str(first), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture(params=["c", "python"])
def guard_kind(request, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kf_cache_guards"))
    kind = _launcher.Guarded if request.param == "c" else guards.PyGuarded
    monkeypatch.setattr(guards, "guarded_type", lambda: kind)
    return kind


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- item 1: callables, slices


def _activation(act):
    def f(x):
        return act(x) * 2

    return f


def test_closed_over_callables_are_told_apart(guard_kind):
    """Each callable by what it is: builtins by name, Python functions by code, partials
    by function and arguments, bound methods by function and object."""
    x = torch.randn(257)

    def cube(t):
        return t * t * t

    class Scale:
        def __init__(self, k):
            self.k = k

        def apply(self, t):
            return t * self.k

    acts = [torch.relu, torch.sigmoid, torch.tanh, cube, lambda t: t - 1, lambda t: t + 1,
            functools.partial(torch.clamp, min=-0.5), functools.partial(torch.clamp, min=0.25),
            Scale(3.0).apply, Scale(-2.0).apply, torch.nn.functional.gelu, torch.nn.functional.silu]
    for act in acts:
        _close(kf.jit(_activation(act), target="cpu")(x), act(x) * 2)


def _calling(op, *args, **kwargs):
    def call(x):
        return op(x, *args, **kwargs)

    return call


def test_library_functions_of_one_code_are_told_apart():
    """Library functions are not followed into, but one library code makes many
    functions: their closures and defaults tell them apart in the key (torch.unique and
    torch.unique_consecutive are both boolean_dispatch's ``fn``; a library lambda closes
    over a parameter), and so do a library object's settings held in containers (a
    jiterator function's extra arguments). Each pair had one disk cache entry."""
    from torch._jit_internal import boolean_dispatch

    assert torch.unique.__code__ is torch.unique_consecutive.__code__
    pairs = [(torch.unique, torch.unique_consecutive),
             (torch.nn.functional.max_pool1d, torch.nn.functional.adaptive_max_pool1d)]
    pairs.append(_dispatched())
    jit = torch.cuda.jiterator._create_jit_fn
    pairs.append((jit("template <typename T> T f(T x, T a) { return x * a; }", a=1.0),
                  jit("template <typename T> T f(T x, T a) { return x * a; }", a=2.0)))
    for a, b in pairs:
        ka, kb = (guards.walk(_calling(op, flag=True)) for op in (a, b))
        assert ka.persistent and kb.persistent
        assert ka.fingerprint != kb.fingerprint, (a, b)
    same = [guards.walk(_calling(torch.unique, flag=True)) for _ in range(2)]
    assert same[0].fingerprint == same[1].fingerprint


def _dispatched():
    """Two functions of torch's boolean_dispatch (library code) that differ only in the
    branch they call when the flag is set."""
    from torch._jit_internal import boolean_dispatch

    return (boolean_dispatch("flag", 1, False, lambda x, flag=False: x * 3, lambda x, flag=False: x, None, "f"),
            boolean_dispatch("flag", 1, False, lambda x, flag=False: x - 3, lambda x, flag=False: x, None, "f"))


def test_library_closures_do_not_share_a_disk_cache_entry(tmp_path, monkeypatch):
    """Two kf functions of one code calling two boolean_dispatch functions: the second
    loaded the first's program from the disk cache (one key) and returned x * 3."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.randn(257)
    for op in _dispatched():
        _close(kf.jit(_calling(op, flag=True), target="cpu")(x), op(x, flag=True))


def test_the_same_function_specializes_on_its_closure_and_globals(guard_kind):
    """One kf function whose cell and global change between calls: each call runs the
    program of what it reads now (in process: the guards fail, the walk compiles anew)."""
    x = torch.randn(5, 31)
    act = torch.relu
    s = slice(0, 5)

    @kf.jit(target="cpu")
    def f(x):
        return act(x[:, s])

    for act, s in [(torch.relu, slice(0, 5)), (torch.sigmoid, slice(0, 5)), (torch.sigmoid, slice(5, 10)),
                   (torch.sigmoid, slice(1, 30, 3)), (torch.relu, slice(0, 5))]:
        _close(f(x), act(x[:, s]))
    assert len(f._table) == 4  # the fifth call is the first's program again
    _close(f(x, ), torch.relu(x[:, 0:5]))


SLICE = slice(0, 5)


def test_a_global_slice_is_part_of_the_key(guard_kind):
    global SLICE
    x = torch.randn(13)

    @kf.jit(target="cpu")
    def f(x):
        return x[SLICE] + 1

    for SLICE in (slice(0, 5), slice(5, 10), slice(None, None, 2), slice(0, 5)):
        _close(f(x), x[SLICE] + 1)


class Mode(enum.Enum):
    ADD = 1
    MUL = 2


def test_enums_dtypes_and_nested_containers(guard_kind):
    x = torch.randn(7, 3)
    cfg = {"mode": Mode.ADD, "dtype": torch.float32, "dims": [0], "scale": (2.0, {"k": 3})}

    @kf.jit(target="cpu")
    def f(x):
        y = x + cfg["scale"][0] if cfg["mode"] is Mode.ADD else x * cfg["scale"][1]["k"]
        return y.sum(dim=cfg["dims"][0]).to(cfg["dtype"])

    def ref():
        y = x + cfg["scale"][0] if cfg["mode"] is Mode.ADD else x * cfg["scale"][1]["k"]
        return y.sum(dim=cfg["dims"][0]).to(cfg["dtype"])

    changes = [lambda: None, lambda: cfg.update(mode=Mode.MUL), lambda: cfg["scale"][1].update(k=5),
               lambda: cfg.update(dtype=torch.float64), lambda: cfg["dims"].__setitem__(0, 1),
               lambda: cfg.update(scale=(2.0, {"k": -1.5})), lambda: cfg.update(extra=1)]
    for change in changes:
        change()
        out = f(x)
        assert out.dtype == ref().dtype
        _close(out, ref())


# ----------------------------------------------------------------------------- item 2: what the code reads


CONFIG = types.SimpleNamespace(scale=2.0, shift=1)


def _helper(x):
    return x * CONFIG.scale + HELPER_K


HELPER_K = 3


def test_attributes_helpers_and_their_globals_are_guarded(guard_kind):
    global HELPER_K
    x = torch.randn(64)

    @kf.jit(target="cpu")
    def f(x):
        return _helper(x) - CONFIG.shift

    def ref():
        return x * CONFIG.scale + HELPER_K - CONFIG.shift

    _close(f(x), ref())
    CONFIG.scale = -0.5
    _close(f(x), ref())
    CONFIG.shift = 7
    _close(f(x), ref())
    HELPER_K = 11
    _close(f(x), ref())
    CONFIG.scale, CONFIG.shift, HELPER_K = 2.0, 1, 3
    _close(f(x), ref())


def test_a_class_attribute_and_an_instance_shadowing_it(guard_kind):
    class Cfg:
        k = 2.0

    cfg = Cfg()
    x = torch.randn(9)

    @kf.jit(target="cpu")
    def f(x):
        return x * cfg.k

    _close(f(x), x * 2.0)
    Cfg.k = 3.0  # the class's attribute changes
    _close(f(x), x * 3.0)
    cfg.k = -1.0  # the instance gains one of its own
    _close(f(x), x * -1.0)


def test_values_computed_anew_keep_their_program(guard_kind):
    """Scalars are compared by value: a step that assigns an equal float again keeps the
    entry (no walk, no compile)."""
    cfg = types.SimpleNamespace(lr=0.5)
    x = torch.randn(8)

    @kf.jit(target="cpu")
    def f(x):
        return x * cfg.lr

    _close(f(x), x * 0.5)
    entry = next(iter(f._fast.values()))
    for _ in range(3):
        cfg.lr = float("0.5")  # equal, maybe another object
        _close(f(x), x * 0.5)
    assert next(iter(f._fast.values())) is entry and len(f._table) == 1
    cfg.lr = -0.0
    _close(f(x), x * -0.0)
    assert torch.equal(torch.signbit(f(torch.ones(8))), torch.ones(8, dtype=torch.bool))


# ----------------------------------------------------------------------------- item 3: reached tensors


G = torch.randn(33)


@pytest.mark.parametrize("capture", ["trace", "export"])
def test_a_global_tensor_is_read_at_every_call(guard_kind, monkeypatch, capture):
    global G
    if capture == "export":
        monkeypatch.setenv("KF_CAPTURE", "export")
    G = torch.randn(33)
    x = torch.randn(33)

    @kf.jit(target="cpu")
    def f(x):
        return x * 2 + G

    _close(f(x), x * 2 + G)
    G.add_(10)  # in place
    _close(f(x), x * 2 + G)
    G = torch.randn(33)  # rebound
    _close(f(x), x * 2 + G)
    assert len(f._table) == 1  # the same program: G is its input
    G = torch.randn(3, 33)  # another shape: another program
    _close(f(x), x * 2 + G)
    G = torch.randn(33).double()  # another dtype
    _close(f(x), x * 2 + G)
    G = torch.randn(66)[::2]  # not contiguous
    _close(f(x), x * 2 + G)


@pytest.mark.parametrize("capture", ["trace", "export"])
def test_closure_tensors_and_module_parameters_are_inputs(guard_kind, monkeypatch, capture):
    if capture == "export":
        monkeypatch.setenv("KF_CAPTURE", "export")
    torch.manual_seed(0)
    lin = torch.nn.Linear(17, 5)
    norm = torch.nn.LayerNorm(5)
    bias = torch.randn(5)

    @kf.jit(target="cpu")
    def f(x):
        return norm(lin(x)) + bias

    x = torch.randn(3, 17)
    with torch.no_grad():
        _close(f(x), norm(lin(x)) + bias)
        lin.weight.mul_(-2)  # an optimizer step's in-place update
        norm.bias.add_(1)
        bias.add_(3)
        _close(f(x), norm(lin(x)) + bias)
        lin.weight = torch.nn.Parameter(torch.randn(5, 17))  # a new parameter
        _close(f(x), norm(lin(x)) + bias)
        norm.eps = 0.5  # a setting torch's forward reads
        _close(f(x), norm(lin(x)) + bias)
    assert len(f._table) == 2


class _Twice(torch.nn.Module):
    def forward(self, x):
        return x * 2 if self.training else x - 1


def test_buffers_and_tensors_in_containers(guard_kind):
    bn = torch.nn.BatchNorm1d(6).eval()
    mode = _Twice()
    table = {"w": torch.randn(6), "ws": [torch.randn(6), torch.randn(6)]}
    x = torch.randn(4, 6)

    @kf.jit(target="cpu")
    def f(x):
        return mode(bn(x)) * table["w"] + table["ws"][1]

    def ref():
        return mode(bn(x)) * table["w"] + table["ws"][1]

    _close(f(x), ref())
    bn.running_mean.add_(0.5)
    bn.running_var.mul_(2)
    table["ws"][1] = torch.randn(6)
    table["w"].neg_()
    _close(f(x), ref())
    mode.eval()  # a module's mode is read too
    _close(f(x), ref())


def test_a_tensor_the_function_makes_from_data_stays_a_constant(guard_kind):
    x = torch.randn(2)

    @kf.jit(target="cpu")
    def f(x):
        return x * torch.tensor([1.5, -2.0])

    _close(f(x), x * torch.tensor([1.5, -2.0]))
    (program,) = f._table.values()
    assert program.reached == [] and program.directory.exists()
    from kf.runtime.abi import ProgramABI

    assert [a.name for a in ProgramABI.from_json(program.meta["abi"]).inputs] == ["x"]


def test_two_paths_to_one_tensor(guard_kind):
    """A tensor reached by two names: the program reads the one the function uses, and
    rebinding the other is seen too."""
    global A, B
    A = torch.randn(4)
    B = A
    x = torch.randn(4)

    @kf.jit(target="cpu")
    def f(x):
        return x + A * B

    _close(f(x), x + A * B)
    B = torch.randn(4)
    _close(f(x), x + A * B)
    A = torch.randn(4)
    _close(f(x), x + A * B)


# ----------------------------------------------------------------------------- the guard programs


@pytest.mark.parametrize("kind", ["c", "python"])
def test_guard_operations(kind):
    """Each operation passing and failing the same way in C and in Python."""
    Guarded = _launcher.Guarded if kind == "c" else guards.PyGuarded
    t = torch.randn(3)
    box = {"a": 1.5, "b": [1, t], "c": "s"}
    ns = types.SimpleNamespace(v=2)
    k = 7

    def holder():
        return k

    consts = (box, ns, holder.__closure__[0])
    ops = (
        # registers 0-2: the constants; each operation writes the next one
        (guards.GET_ITEM, 0, "a", guards.CHECK_EQ, 1.5, -1),  # 3
        (guards.GET_ITEM, 0, "b", guards.CHECK_LEN, 2, -1),  # 4
        (guards.GET_INDEX, 4, 1, guards.CHECK_TENSOR, guards.tensor_key(t), 0),  # 5
        (guards.GET_SAME, 0, None, guards.CHECK_KEYS, ("a", "b", "c"), -1),  # 6
        (guards.GET_ATTR, 1, "v", guards.CHECK_EQ, 2, -1),  # 7
        (guards.GET_SAME, 1, None, guards.CHECK_IS, ns, -1),  # 8
        (guards.GET_ATTR, 1, "__dict__", guards.CHECK_NOKEY, "w", -1),  # 9
        (guards.GET_CELL, 2, None, guards.CHECK_EQ, 7, -1),  # 10
    )
    seen = []
    g = Guarded(consts, ops, 1, lambda ts: seen.append(ts) or "ran")
    assert g.check()[0] is t
    assert g([]) == "ran" and seen[-1][0] is t
    for change, undo in [(lambda: box.update(a=1.5000001), lambda: box.update(a=1.5)),
                         (lambda: box.update(a=-0.0), lambda: box.update(a=1.5)),
                         (lambda: box["b"].append(0), lambda: box["b"].pop()),
                         (lambda: box["b"].__setitem__(1, torch.randn(4)), lambda: box["b"].__setitem__(1, t)),
                         (lambda: box["b"].__setitem__(1, t.double()), lambda: box["b"].__setitem__(1, t)),
                         (lambda: box["b"].__setitem__(1, "x"), lambda: box["b"].__setitem__(1, t)),
                         (lambda: box.update(d=1), lambda: box.pop("d")),
                         (lambda: setattr(ns, "v", 2.0), lambda: setattr(ns, "v", 2)),
                         (lambda: setattr(ns, "w", 0), lambda: delattr(ns, "w")),
                         (lambda: delattr(ns, "v"), lambda: setattr(ns, "v", 2))]:
        change()
        assert g.check() is None and g([]) is guards.MISS
        undo()
        assert g.check() is not None
    nonlocal_cell = holder.__closure__[0]
    nonlocal_cell.cell_contents = 8
    assert g.check() is None
    nonlocal_cell.cell_contents = 7
    u = torch.randn(3)  # another tensor of the same key: read, not refused
    box["b"][1] = u
    assert g.check()[0] is u
    nan = float("nan")
    g2 = Guarded(({"n": nan},), ((guards.GET_ITEM, 0, "n", guards.CHECK_EQ, float("nan"), -1),), 0, lambda ts: 1)
    assert g2.check() == []  # a NaN equals a NaN of its bits


def test_guards_hold_no_tensor_they_read():
    """A rebound tensor is freed: the guards keep where to read it, not it."""
    import weakref

    global H
    H = torch.randn(1000)
    ref = weakref.ref(H)
    x = torch.randn(1000)

    @kf.jit(target="cpu")
    def f(x):
        return x + H

    _close(f(x), x + H)
    H = torch.randn(1000)
    import gc

    gc.collect()
    assert ref() is None
    _close(f(x), x + H)


# ----------------------------------------------------------------------------- fresh processes

_SCRIPT = textwrap.dedent("""
    import functools, json, sys, torch, kf
    import helper_mod

    value = json.loads(sys.argv[1])
    TABLE = {"k": value["dict"]}
    helper_mod.K = value["module"]
    helper_mod.SCALE = value["helper_global"]
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    with torch.no_grad():
        lin.weight.mul_(value["weights"])
    act = getattr(torch, value["act"])

    @kf.jit(target="cpu")
    def f(x):
        return act(lin(x)) * TABLE["k"] + helper_mod.K + helper_mod.scaled(x)

    torch.manual_seed(int(sys.argv[2]))
    x = torch.randn(3, 8)
    ref = act(lin(x)) * TABLE["k"] + helper_mod.K + helper_mod.scaled(x)
    out = f(x)
    torch.testing.assert_close(out, ref)
    print("compiled:", "mlir" in sys.modules)
""")

_HELPER = textwrap.dedent("""
    K = 0
    SCALE = 1.0

    def scaled(x):
        return x * SCALE
""")


def _fresh(tmp_path: Path, value: dict, seed: int) -> str:
    import json

    (tmp_path / "script.py").write_text(_SCRIPT)
    (tmp_path / "helper_mod.py").write_text(_HELPER)
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=_pythonpath(tmp_path))
    r = subprocess.run([sys.executable, str(tmp_path / "script.py"), json.dumps(value), str(seed)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_a_new_process_compiles_anew_for_what_changed(tmp_path):
    """Item 2 across processes: a dict value, a module attribute, a helper's global, a
    closed-over module's weights and a closed-over callable, each changed in a new
    process, are each a new program (or, for the weights, an input: no new program), and
    each result is right."""
    base = {"dict": 2.0, "module": 1, "helper_global": 0.5, "weights": 1.0, "act": "relu"}
    assert "compiled: True" in _fresh(tmp_path, base, 1)
    assert "compiled: False" in _fresh(tmp_path, base, 2)  # the same: a cache hit
    for change in [{"dict": -3.0}, {"module": 4}, {"helper_global": 2.5}, {"act": "sigmoid"}]:
        assert "compiled: True" in _fresh(tmp_path, dict(base, **change), 3)
    assert "compiled: False" in _fresh(tmp_path, dict(base, weights=-2.0), 4)  # read, not baked


SENTINEL = object()
MODE = SENTINEL


def test_what_cannot_be_named_in_another_process_stays_in_this_one(guard_kind, tmp_path, monkeypatch):
    """An object with no attributes and no stable repr: the program is keyed by its
    identity for this process and never written to the disk cache."""
    global MODE
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.randn(5)

    @kf.jit(target="cpu")
    def f(x):
        return x + 1 if MODE is SENTINEL else x - 1

    MODE = SENTINEL
    _close(f(x), x + 1)
    MODE = object()
    _close(f(x), x - 1)
    MODE = SENTINEL
    _close(f(x), x + 1)
    assert not list(tmp_path.glob("*/*/program.json"))


W = torch.randn(6, 6)


def test_explain_and_a_call_share_one_entry(tmp_path, monkeypatch):
    """kf.explain compiles (or reads) the entry a call uses: the same key, the same
    reached inputs."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))

    def mm(x):
        return x @ W

    x = torch.randn(3, 6)
    kf.explain(kf.jit(mm, target="cpu"), x, file=None)
    assert len(list(tmp_path.glob("*/*/program.json"))) == 1
    f = kf.jit(mm, target="cpu")
    _close(f(x), x @ W)
    W.mul_(-1)
    _close(f(x), x @ W)
    assert len(list(tmp_path.glob("*/*/program.json"))) == 1


class _Stash:
    pass


STASH = _Stash()
STASH.kept = [torch.randn(6)]
PART = "ke"


def test_a_tensor_reached_where_the_walk_does_not_look(guard_kind, tmp_path, monkeypatch):
    """Read through a name computed at run time: the walk cannot name it, so it is a
    constant of the program, with a warning; an in-place change compiles it again, and
    the program is kept out of the disk cache (another process could not check it)."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.randn(6)

    @kf.jit(target="cpu")
    def f(x):
        return x + getattr(STASH, PART + "pt")[0]

    with pytest.warns(RuntimeWarning, match="cannot follow"):
        _close(f(x), x + STASH.kept[0])
    _close(f(x), x + STASH.kept[0])
    STASH.kept[0].mul_(-3)
    with pytest.warns(RuntimeWarning, match="cannot follow"):
        _close(f(x), x + STASH.kept[0])
    assert not list(tmp_path.glob("*/*/program.json"))


GAIN = torch.rand(64) + 0.5


def test_random_numbers_and_reached_tensors(guard_kind):
    """A function that draws random numbers and reads a global tensor: the reached tensor
    and the random state are both inputs (in that order after the call's own), on the
    plain path and on the torch op's (which takes back the state it drew)."""
    import torch.nn.functional as F

    @kf.jit(target="cpu")
    def f(x):
        return F.dropout(x * GAIN, 0.5, training=True)

    for step in range(2):
        x = torch.randn(64)
        drawn = []
        for y in (f(x), f._kernel_call((x,), {}, drawn)):
            kept = y != 0
            assert 0 < kept.sum() < 64
            torch.testing.assert_close(y[kept], (x * GAIN * 2)[kept])
        assert len(drawn) == 1
        GAIN.add_(1.0)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_cuda
def test_reached_cuda_tensors_through_the_c_lane(guard_kind):
    """On the GPU the fast entry is the program's C lane behind the guards: the reached
    tensors are appended to the call's before the lane launches, every call."""
    global G
    G = torch.randn(1000, device="cuda")
    lin = torch.nn.Linear(64, 64).cuda()
    x, h = torch.randn(1000, device="cuda"), torch.randn(8, 64, device="cuda")

    @kf.jit
    def f(x):
        return x * 2 + G

    @kf.jit
    def g(h):
        return torch.relu(lin(h))

    for _ in range(2):
        _close(f(x), x * 2 + G)
        with torch.no_grad():
            _close(g(h), torch.relu(lin(h)))
            lin.weight.mul_(-1)
        G.add_(3)
        G = G.clone()
    entry = next(iter(f._fast.values()))
    assert guards.is_guarded(entry)
    from kf import api
    from kf.runtime import cuda as kcuda

    if guard_kind is _launcher.Guarded and kcuda._c_launch is not None and api._c_dispatch is not None:
        assert type(entry.call) is _launcher.Lane


def test_a_reached_tensor_on_another_device_is_named(guard_kind):
    """The capture of a function whose reached tensor is on another device than its
    arguments fails where the two meet in an op; the error names the tensor (a
    TargetError), not the op's device mismatch (on a CPU-only machine: a meta tensor)."""
    from kf.errors import TargetError

    table = torch.empty(10, device="meta")

    @kf.jit
    def g(x):
        return x + table

    with pytest.raises(TargetError, match="reads the tensor 'table' on meta, but runs on cpu"):
        g(torch.randn(10))


@needs_cuda
def test_reached_tensors_on_the_cpu_of_a_cuda_function(guard_kind):
    """A 0-d CPU tensor meets CUDA tensors in eager: it is copied to the device at each
    call (its value of the call). Any other CPU tensor is an error naming it, as in eager."""
    from kf.errors import TargetError

    scale = torch.tensor(2.0)
    table = torch.randn(10)
    x = torch.randn(10, device="cuda")

    @kf.jit
    def f(x):
        return x * scale

    @kf.jit
    def g(x):
        return x + table

    for _ in range(2):
        _close(f(x), x * scale.cuda())
        scale.add_(1.5)
    with pytest.raises(TargetError, match="table"):
        g(x)
