"""runtime/abi.py: DeviceLimits, the device facts the SPIR-V strategies tile for, as the
runtime reads them from a Vulkan device and as the compiler takes them (text); the index
error flag that kernels write and launchers read."""

from __future__ import annotations

import pytest

from kf.runtime.abi import (FLOAT_CONTROLS, INDEX_FLAG_WORDS, MAX_DYNAMIC_SIZE, CoopMatShape, DeviceLimits,
                            IndexOutOfRange, IndexSite, KernelABI, ProgramABI, TensorArg)


@pytest.mark.parametrize("name", ["lavapipe", "nvidia-h200"])
def test_limits_of_recorded_devices_survive_their_text(name, recorded_device):
    limits = DeviceLimits.from_vulkan(recorded_device(name))
    assert DeviceLimits.parse(limits.spec()) == limits
    assert " " not in limits.spec() and "{" not in limits.spec()  # a pass option's value


def test_recorded_devices_read_as_vulkan_reports_them(recorded_device):
    lvp = DeviceLimits.from_vulkan(recorded_device("lavapipe"))
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200"))
    assert (lvp.shared_bytes, lvp.invocations, lvp.subgroup_size) == (32768, 1024, 8)
    assert (nv.shared_bytes, nv.invocations, nv.workgroup_size, nv.subgroup_size) == (49152, 1024, (1024, 1024, 64), 32)
    # lavapipe: supportedOperations 0xbf (no clustered), NVIDIA: every one kf names
    assert "shuffle" in lvp.subgroup_ops and "clustered" not in lvp.subgroup_ops
    assert {"arithmetic", "shuffle", "clustered", "quad"} <= set(nv.subgroup_ops)


def test_lavapipe_has_a_loop_limit_in_its_text(recorded_device):
    """lavapipe ends an invocation's loops after 65535 iterations: its limits say so (and
    so key its programs apart); a device without such a limit has no ``loops`` item."""
    lvp = DeviceLimits.from_vulkan(recorded_device("lavapipe"))
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200"))
    assert lvp.loops == 65535 and lvp.spec().endswith(",loops=65535")
    assert nv.loops == 0 and "loops" not in nv.spec()


def test_subgroup_operations_count_only_in_compute_shaders(recorded_device):
    props = recorded_device("lavapipe")
    props["subgroup"]["supportedStages"] = 0x10  # fragment only
    assert DeviceLimits.from_vulkan(props).subgroup_ops == ()
    props["subgroup"] = {}  # Vulkan 1.0: no subgroup properties
    assert DeviceLimits.from_vulkan(props).subgroup_size == 0


def test_defaults_are_the_portable_device():
    d = DeviceLimits()
    assert (d.shared_bytes, d.invocations, d.subgroup_size, d.subgroup_ops) == (16384, 256, 32, ())
    assert DeviceLimits.parse(d.spec()) == d and d.spec().endswith("ops=none,float=preserve16+preserve32")
    # a text without float (as kf wrote it before) has the defaults
    assert DeviceLimits.parse(d.spec().replace(",float=preserve16+preserve32", "")) == d


def test_float_controls_of_recorded_devices(recorded_device):
    """lavapipe keeps inf/NaN/-0.0 and rounds to nearest even but flushes subnormals (no
    DenormPreserve); NVIDIA has every float control. They are in the limits' text, so the
    two never share a program."""
    lvp = DeviceLimits.from_vulkan(recorded_device("lavapipe"))
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200"))
    assert lvp.float_controls == ("preserve16", "preserve32", "preserve64", "rte16", "rte32", "rte64")
    assert set(nv.float_controls) == set(FLOAT_CONTROLS)
    assert "denorm32" in nv.spec() and "denorm32" not in lvp.spec()
    props = recorded_device("nvidia-h200")
    del props["floatControls"]  # a device recorded without them: what kf assumes of any device
    assert DeviceLimits.from_vulkan(props).float_controls == ("preserve16", "preserve32")


def test_dependent_float_modes_count_only_for_every_width(recorded_device):
    """A device whose denormal modes are not independent per width (Vulkan's
    denormBehaviorIndependence NONE) must set them alike for every width: without f64
    DenormPreserve none of its widths gets it. Independent widths count one by one."""
    props = recorded_device("nvidia-h200")
    props["floatControls"]["shaderDenormPreserveFloat64"] = False
    assert {"denorm16", "denorm32"} <= set(DeviceLimits.from_vulkan(props).float_controls)
    props["floatControls"]["denormBehaviorIndependence"] = 2  # NONE
    floats = DeviceLimits.from_vulkan(props).float_controls
    assert not any(f.startswith("denorm") for f in floats) and "rte16" in floats


def test_cooperative_matrices_of_recorded_devices(recorded_device):
    """NVIDIA lists its VK_KHR_cooperative_matrix shapes; kf keeps those at subgroup scope
    with float components it knows (not the int8 ones), in the device's order, and they are
    in the limits' text. lavapipe has none, and its text is what it was without them."""
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200"))
    assert nv.cooperative_matrix[0] == "16x16x16:f16:f16:f32:f32"
    assert "16x16x16:bf16:bf16:f32:f32" in nv.cooperative_matrix
    assert not any(":i" in t or ":ui" in t for t in nv.cooperative_matrix)
    assert CoopMatShape(16, 16, 16, "f16", "f16", "f32", "f32") in nv.cooperative_shapes()
    assert "coopmat=16x16x16:f16:f16:f32:f32+" in nv.spec()
    lvp = DeviceLimits.from_vulkan(recorded_device("lavapipe"))
    assert lvp.cooperative_matrix == () and "coopmat" not in lvp.spec()
    props = recorded_device("nvidia-h200")
    for e in props["cooperativeMatrix"]:
        e["scope"] = 2  # workgroup scope: kf's kernels multiply per subgroup
    assert DeviceLimits.from_vulkan(props).cooperative_matrix == ()
    del props["cooperativeMatrix"]  # recorded before kf read them: none
    assert DeviceLimits.from_vulkan(props).cooperative_matrix == ()


@pytest.mark.parametrize("text,what", [
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=none,coopmat=16x16:f16:f16:f32:f32", "MxNxK:a:b:c:result"),
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=none,coopmat=16x16x16:f16:f16:i32:f32", "MxNxK:a:b:c:result"),
    ("shared=1,invocations=2", "must give exactly"),
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=none,extra=1", "must give exactly"),
    ("shared=lots,invocations=2,size=3x3x3,subgroup=4,ops=none", "integers"),
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=none,loops=many", "integers"),
    ("shared=1,invocations=2,size=3x3,subgroup=4,ops=none", "three numbers"),
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=teleport", "teleport"),
    ("shared", "not key=value"),
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=none,float=denorm8", "float controls are among"),
])
def test_malformed_limits_say_what_is_wrong(text, what):
    with pytest.raises(ValueError, match=what):
        DeviceLimits.parse(text)


def _abi(sites=()):
    return ProgramABI("cuda", (TensorArg("x", (7, 5), "f32"), TensorArg("i", (3,), "i64")),
                      (TensorArg("result0", (3, 5), "f32"),), (TensorArg("tmp0", (3,), "i64"),),
                      (KernelABI("k", (0, 1, 2)),), (-1,), tuple(sites))


SITES = (IndexSite("kf.gather", "model.py:3", 1, 5), IndexSite("kf.index_select", "model.py:8", 0, 7))


def test_the_flag_is_the_buffer_after_the_temporaries():
    assert _abi().flag_buffer == -1
    abi = _abi(SITES)
    assert abi.flag_buffer == 4
    assert abi.flag_arg.shape == (INDEX_FLAG_WORDS,) and abi.flag_arg.elem == "i32"


def test_sites_survive_json():
    abi = _abi(SITES)
    assert ProgramABI.from_json(abi.to_json()) == abi


def test_a_clear_flag_raises_nothing():
    _abi(SITES).raise_index_error([0, 0, 0, 0])


@pytest.mark.parametrize("value", [7, -1, 2 ** 40 + 3, -(2 ** 40), 2 ** 63 - 1, -(2 ** 63)])
def test_a_set_flag_names_the_value_the_bound_the_op_and_the_line(value):
    lo = value & 0xFFFFFFFF
    words = [1, 1, lo - (1 << 32) if lo >= 1 << 31 else lo, value >> 32]  # as int32 words read back
    with pytest.raises(IndexOutOfRange, match=rf"^index {value} is out of range for a dimension of size 7 "
                                              rf"\(kf.index_select at model.py:8\)$"):
        _abi(SITES).raise_index_error(words)


def test_index_out_of_range_is_an_index_error():
    import kf

    assert issubclass(kf.IndexOutOfRange, IndexError) and kf.IndexOutOfRange is IndexOutOfRange


def test_size_expressions_and_binding():
    from kf.runtime.abi import DYN, TensorArg, bind_sizes, eval_size

    assert eval_size("2*s0 + 1", {"s0": 5}) == 11
    assert eval_size("FloorDiv(s0, 2) - Mod(s1, 3)", {"s0": 9, "s1": 7}) == 3
    with pytest.raises(ValueError, match="not integer arithmetic"):
        eval_size("__import__('os')", {})
    with pytest.raises(ValueError):
        eval_size("s9", {"s0": 1})
    x = TensorArg("x", (DYN, 64), "f32", ("s0", "64"))
    y = TensorArg("y", (DYN,), "f32", ("s0",))
    assert bind_sizes([x, y], [(7, 64), (7,)]) == {"s0": 7}
    assert "dim 1 is 63" in bind_sizes([x, y], [(7, 63), (7,)])
    assert "s0 is 7" in bind_sizes([x, y], [(7, 64), (8,)])
    assert "from 2" in bind_sizes([x, y], [(1, 64), (1,)])
    out = TensorArg("result0", (DYN, 64), "f32", ("2*s0", "64"))
    assert out.sized({"s0": 7}) == (14, 64)
    assert ProgramABI("cpu", (x,), (out,)).to_json() and \
        ProgramABI.from_json(ProgramABI("cpu", (x,), (out,)).to_json()).outputs[0] == out
    assert bind_sizes([x, y], [(1, 64), (1,)], 1) == {"s0": 1}
    assert "up to 4096" in bind_sizes([x, y], [(4097, 64), (4097,)], 1, MAX_DYNAMIC_SIZE)
    # a dim that is an expression of symbols other dims bind (a region's flattened view)
    a = TensorArg("a", (DYN, DYN), "f32", ("s0", "s1"))
    flat = TensorArg("flat", (DYN, 8), "f32", ("s0*s1", "8"))
    assert bind_sizes([flat, a], [(12, 8), (3, 4)]) == {"s0": 3, "s1": 4}
    assert "s0*s1 is 12" in bind_sizes([flat, a], [(13, 8), (3, 4)])
    assert "no input dim gives" in bind_sizes([flat], [(12, 8)])


def test_kernel_grid_and_size_slots_at_run_time():
    """A GPU kernel with run-time sizes: its slots are expressions over the program's
    symbols, its grid an expression over the slots (k0, k1, ...), both kept in the JSON."""
    from kf.runtime.abi import DYN, TensorArg

    k = KernelABI("k", (0, 1), grid=(4096, 1, 1), block=(256, 1, 1), sizes=("s0", "2*s0"),
                  grid_sizes=("FloorDiv(k1*5 + 255, 256)", "1", "1"))
    assert k.sized_grid({"s0": 300}) == ((12, 1, 1), [300, 600])
    assert k.sized_grid({"s0": 1}) == ((1, 1, 1), [1, 2])
    x = TensorArg("x", (DYN, 5), "f32", ("s0", "5"))
    abi = ProgramABI("vulkan", (x,), (x,), kernels=(k,))
    assert ProgramABI.from_json(abi.to_json()).kernels[0] == k
    assert KernelABI("s", (0,)).sized_grid({}) == ((1, 1, 1), [])


def test_a_sized_call_is_kept_per_input_shapes():
    """ProgramABI.sized_call: the symbols, the outputs' and temporaries' shapes and each
    kernel's grid and slots for one set of input shapes, the same object at the next call
    with those shapes (a launch evaluates no size expression), the newest 64 kept; shapes
    that do not fit give the reason, as bind_sizes and beyond_planned_sizes do."""
    from kf.runtime.abi import DYN, SIZED_CALLS_KEPT, TensorArg

    k = KernelABI("k", (0, 1, 2), grid=(4096, 1, 1), sizes=("s0", "2*s0"),
                  grid_sizes=("FloorDiv(k1*5 + 255, 256)", "1", "1"))
    s = KernelABI("s", (1,))
    x = TensorArg("x", (DYN, 5), "f32", ("s0", "5"))
    t = TensorArg("t", (DYN,), "f32", ("2*s0",))
    abi = ProgramABI("cuda", (x,), (TensorArg("y", (DYN, 5), "f32", ("s0", "5")),), (t,), kernels=(k, s))
    call = abi.sized_call(((300, 5),))
    assert call.sizes == {"s0": 300} and call.outputs == ((300, 5),) and call.temporaries == ((600,),)
    assert call.launches == (((12, 1, 1), [300, 600]), None)
    assert abi.sized_call(((300, 5),)) is call
    assert "dim 1 is 4" in abi.sized_call(((300, 4),))
    assert "up to 4096" in abi.sized_call(((4097, 5),))
    assert "sizes from 1" in abi.sized_call(((0, 5),))
    for n in range(1, SIZED_CALLS_KEPT + 2):
        assert abi.sized_call(((n, 5),)).outputs == ((n, 5),)
    assert abi.sized_call(((300, 5),)) is not call and abi.sized_call(((300, 5),)) == call


def test_max_dynamic_size_is_the_signatures():
    from kf.signature import MAX_DYNAMIC_SIZE as signature_max

    assert MAX_DYNAMIC_SIZE == signature_max
