"""The decorators on the CPU target: the seed's functions compiled and run, strided
inputs, new specializations, and the errors a user meets."""

import pytest
import torch

import kf
import moe
import seed_examples as se


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _close(a, b, tol=1e-4):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("shape", [(1, 256, 1024), (1, 3, 1000), (2, 257)])
def test_seed_layer_norm_on_cpu(shape):
    x, w, b = torch.randn(*shape), torch.randn(shape[-1]), torch.randn(shape[-1])
    _close(se.metal_layer_norm.with_options(target="cpu")(x, w, b), se.metal_layer_norm.fn(x, w, b))


@pytest.mark.parametrize("seq,masked", [(257, False), (257, True), (64, True)])
def test_seed_attention_on_cpu(seq, masked):
    q, k, v = (torch.randn(1, 2, seq, 64) for _ in range(3))
    mask = (torch.rand(seq, seq) > 0.25).float() if masked else None
    _close(se.fused_attention.with_options(target="cpu")(q, k, v, mask), se.fused_attention.fn(q, k, v, mask))


def test_complete_moe_on_cpu():
    x, gate = torch.randn(1, 9, 64), torch.randn(4, 64)
    w_in, w_out = torch.randn(4, 64, 96) / 8, torch.randn(4, 96, 64) / 10
    _close(moe.moe_layer_fused.with_options(target="cpu")(x, gate, [w_in, w_out]),
           moe.moe_layer_fused.fn(x, gate, [w_in, w_out]))


def test_non_contiguous_inputs_give_correct_results():
    f = kf.jit(lambda a, b: torch.softmax(a * 2 + b, dim=-1), target="cpu")
    a = torch.randn(40, 30).t()  # a transposed view
    b = torch.randn(30, 80)[:, ::2]  # a strided slice
    _close(f(a, b), torch.softmax(a * 2 + b, dim=-1))


def test_auto_target_follows_the_device():
    f = kf.jit(lambda x: x.exp() + 1)
    x = torch.randn(100)
    _close(f(x), x.exp() + 1)
    (program,) = f._table.values()
    assert program.meta["name"] == "<lambda>"


def test_metal_shader_on_cpu_tensors_says_what_to_do():
    x, w, b = torch.randn(2, 16), torch.randn(16), torch.randn(16)
    with pytest.raises(kf.TargetError) as e:
        se.metal_layer_norm(x, w, b)
    assert "compiled for metal" in str(e.value) and "with_options(target='vulkan')" in str(e.value)


def test_cuda_kernel_on_cpu_tensors_says_what_to_do():
    q = torch.randn(1, 1, 8, 8)
    with pytest.raises(kf.TargetError, match="compiled for cuda, but its tensors are on 'cpu'"):
        se.fused_attention(q, q, q)


def test_a_function_of_no_tensors_runs_on_its_target():
    """torch.zeros(n) or arange inside a function that takes no tensors: nothing says a
    device, so the function's target runs it; target='auto' then runs on the CPU. Its
    results are where eager makes them (test below)."""
    from kf.signature import bind

    for target in ("cuda", "vulkan", "cpu", "auto"):
        f = kf.jit(lambda n: torch.arange(n) * 2, target=target)
        sig, _ = bind(f.fn, (5,), {})
        assert f.resolve_target(sig) == ("cpu" if target == "auto" else target)
    f = kf.jit(lambda n: torch.arange(n) * 2, target="vulkan")
    if kf.runtime.vulkan.is_available():
        _close(f(5), torch.arange(5) * 2)


def test_results_of_no_tensors_go_where_eager_makes_them(tmp_path, monkeypatch):
    """A cuda function of no tensors computes on the GPU, and each result that eager makes
    on the default device (``torch.arange(n)``, ``torch.linspace``: the CPU) is returned
    there, as OpInfo's arange/linspace/logspace samples check; the program records which
    (``result_devices``; built here for sm_90a, no GPU needed)."""
    from kf import driver
    from kf.signature import bind

    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    for fn, want in ((lambda n: torch.arange(n) * 2, [[0, "cpu"]]),
                     (lambda n: (torch.linspace(0, 1, n), torch.ones(n, 2).tril()), [[0, "cpu"], [1, "cpu"]])):
        f = kf.jit(fn, target="cuda")
        sig, tensors = bind(f.fn, (5,), {})
        meta, _ = driver.build(f.fn, sig, tensors, f.options.with_(target="cuda"), "sm_90a")
        assert meta["result_devices"] == want
    f = kf.jit(lambda n: torch.arange(n) * 2, target="vulkan")
    sig, tensors = bind(f.fn, (5,), {})
    assert driver.build(f.fn, sig, tensors, f.options.with_(target="vulkan"), "")[0]["result_devices"] == []
    if torch.cuda.is_available():
        g = kf.jit(lambda n: (torch.arange(n) * 2, torch.ones(n, device="cuda")), target="cuda")
        a, b = g(5)
        assert a.device.type == "cpu" and b.device.type == "cuda"
        _close(a, torch.arange(5) * 2)


def test_tensors_on_several_devices():
    f = kf.jit(lambda a, b: a + b)
    with pytest.raises(kf.TargetError, match="several devices"):
        f(torch.randn(2), torch.randn(2, device="meta"))


def test_wrong_arguments_are_signature_errors():
    f = kf.jit(lambda a, b: a + b, target="cpu")
    with pytest.raises(kf.SignatureError, match="missing a required argument"):
        f(torch.randn(2))


def test_interpret_mode_agrees_with_compiled():
    x, w, b = torch.randn(3, 200), torch.randn(200), torch.randn(200)
    compiled = se.metal_layer_norm.with_options(target="cpu")(x, w, b)
    interpreted = se.metal_layer_norm.with_options(target="cpu", interpret=True)(x, w, b)
    _close(compiled, interpreted, tol=1e-5)


def test_dump_ir_writes_numbered_files(tmp_path):
    f = kf.jit(lambda x: torch.tanh(x) * 3, target="cpu", dump_ir=str(tmp_path / "ir"))
    f(torch.randn(10))
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert names[0].endswith(".01.kf.mlir")
    assert any("kf-lower-to-linalg" in n for n in names) and any("kf-to-cpu" in n for n in names)


def test_inspect_gives_every_cpu_stage():
    info = kf.inspect(kf.jit(lambda x: x.sigmoid(), target="cpu"), torch.randn(8))
    assert "kf.sigmoid" in info.kf_ir
    assert list(info.stages) == ["kf", "linalg", "llvm"]
    assert "linalg.generic" in info.linalg and "llvm.func" in info.llvm


def test_two_reductions_of_one_shape_get_their_own_outputs():
    # Regression: cse merged the two reductions' init tensors before
    # eliminate-empty-tensors, and both results were written into one buffer.
    f = kf.jit(lambda g, a: ((g * a).sum(0), g.sum(0)), target="cpu")
    g, a = torch.randn(5, 7), torch.randn(5, 7)
    x, y = f(g, a)
    _close(x, (g * a).sum(0))
    _close(y, g.sum(0))


def test_nested_results_keep_their_structure():
    f = kf.jit(lambda a: (a + 1, (a * 2, [a - 1])), target="cpu")
    a = torch.randn(6)
    out = f(a)
    assert isinstance(out, tuple) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    _close(out[1][1][0], a - 1)


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
def test_out_of_range_index_is_an_error_not_a_bad_access(target):
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    f = kf.jit(lambda table, idx: torch.nn.functional.embedding(idx, table) * 2, target=target)
    table = torch.randn(10, 4)
    good = torch.tensor([[0, 9], [3, 3]])
    _close(f(table, good), torch.nn.functional.embedding(good, table) * 2)
    line = f"{__file__}:{f.fn.__code__.co_firstlineno}"
    with pytest.raises(kf.IndexOutOfRange, match=f"index 10 is out of range for a dimension of size 10 "
                                                 f"\\(kf.index_select at {line}\\)"):
        f(table, torch.tensor([[0, 10], [1, 2]]))
    with pytest.raises(IndexError, match="index -1"):
        f(table, torch.tensor([[0, -1], [1, 2]]))


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
def test_a_negative_index_past_the_size_is_reported_as_written(target):
    """Advanced indexing wraps -size <= i < 0 as Python does; an index below -size is out
    of range, and the error says the value the user passed (-11), not a wrapped one."""
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    f = kf.jit(lambda x, i: x[i] + 1, target=target)
    x = torch.randn(10, 4)
    _close(f(x, torch.tensor([0, -10, -1])), x[torch.tensor([0, -10, -1])] + 1)
    with pytest.raises(kf.IndexOutOfRange, match="^index -11 is out of range for a dimension of size 10 "):
        f(x, torch.tensor([0, -11]))
    with pytest.raises(kf.IndexOutOfRange, match="^index 12 is out of range"):
        f(x, torch.tensor([12, -3]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_index_checks_under_cuda_graph_capture():
    """A bad index in a replay of a captured CUDA graph: the replay cannot wait for its
    kernels, so its error flag is read, and raised, at the function's next call; the
    replay's kernels clamped the index (no fault)."""
    f = kf.jit(lambda table, idx: torch.nn.functional.embedding(idx, table) * 2, target="cuda")
    table = torch.randn(10, 4, device="cuda")
    idx = torch.tensor([[0, 9], [3, 3]], device="cuda")
    f(table, idx)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(table, idx)
    idx.copy_(torch.tensor([[1, 2], [8, 0]], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    _close(out.cpu(), torch.nn.functional.embedding(idx.cpu(), table.cpu()) * 2)
    idx.copy_(torch.tensor([[1, 12], [8, 0]], device="cuda"))
    graph.replay()
    with pytest.raises(IndexError, match="index 12 .* replay of a CUDA graph"):
        f(table, torch.tensor([[0, 1], [1, 2]], device="cuda"))
    with pytest.raises(IndexError, match="index 10"):  # outside a capture: at the call itself
        f(table, torch.tensor([[0, 10], [1, 2]], device="cuda"))


@pytest.mark.parametrize("target", ["vulkan"])
def test_reshapes_between_kernels_are_views(target):
    """kf-fuse leaves a reshape between two kernels in the schedule, where the launcher
    gives its result the operand's buffer: no copy kernel, the same numbers."""
    from kf.runtime import vulkan

    if not vulkan.is_available():
        pytest.skip("no Vulkan device")

    def f(x, w):
        h = torch.relu(x * 2).reshape(4, 8, 16)
        return ((h @ w) + 1).reshape(32, 8) * 3

    kfn = kf.jit(f, target=target)
    x, w = torch.randn(32, 16), torch.randn(16, 8)
    _close(kfn(x, w), f(x, w))
    fused = kf.inspect(kfn, x, w).fused
    kinds = [line.split('kf.kernel = "')[1].split('"')[0] for line in fused.splitlines() if 'kf.kernel = "' in line]
    assert kinds.count("generic") == 0, kinds  # neither reshape is a copy kernel
    assert '"kf.reshape"' in fused.split("func.func @f(")[1]


# ----------------------------------------------------------------------------- runtime floats


def _vulkan() -> bool:
    from kf.runtime import vulkan

    return vulkan.is_available()


CPU_VULKAN = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not _vulkan(), reason="no Vulkan device"))]


def sgd_step(p, g, lr, wd=0.01):
    return p - lr * (g + wd * p)


@pytest.mark.parametrize("target", CPU_VULKAN)
def test_a_float_that_changes_every_step_compiles_once(target):
    f = kf.jit(sgd_step, target=target)
    p, g = torch.randn(257), torch.randn(257)
    for step in range(8):
        lr = 0.1 / (step + 1)
        torch.testing.assert_close(f(p, g, lr), sgd_step(p, g, lr))
    assert len(f.compiles) == 1
    record = f.compiles[0]
    assert record.target == target and record.reason == "first call"
    assert "lr: float" in record.signature and "wd: float" in record.signature
    f(p, g, 0.5, wd=0.2)  # keywords: the same program
    torch.testing.assert_close(f(p, g, 0.5, wd=0.2), sgd_step(p, g, 0.5, wd=0.2))
    assert len(f.compiles) == 1


def threshold(x, t):
    if t > 0.5:
        return x * 2
    return x - t


def dropout_plus(x, p):
    return torch.nn.functional.dropout(x, p, training=False) + p


@pytest.mark.parametrize("fn", [threshold, dropout_plus])
def test_a_float_the_function_branches_on_stays_a_constant(fn):
    f = kf.jit(fn, target="cpu")
    x = torch.randn(7)
    for t in (0.7, 0.2, 0.7):
        torch.testing.assert_close(f(x, t), fn(x, t))
    assert len(f.compiles) == 2 and f.compiles[0].signature.endswith("=0.7)"), f.compiles


@pytest.mark.parametrize("dtype,want", [(torch.int64, torch.float32), (torch.float64, torch.float64),
                                        (torch.bfloat16, torch.bfloat16)])
def test_runtime_floats_keep_eagers_result_types_and_precision(dtype, want):
    """A float meets int tensors as torch's default dtype, f64 tensors at f64 (0.1 is not
    rounded to f32), and 16-bit tensors as a constant (eager computes with it in f32)."""
    f = kf.jit(sgd_step, target="cpu")
    p = (torch.randn(33) * 10).to(dtype)
    for lr in (0.1, 0.3):
        out = f(p, p, lr)
        assert out.dtype == want == sgd_step(p, p, lr).dtype
        if dtype == torch.bfloat16:
            torch.testing.assert_close(out.double(), sgd_step(p.double(), p.double(), lr), atol=0.2, rtol=2e-2)
        else:
            torch.testing.assert_close(out, sgd_step(p, p, lr), rtol=1e-12 if dtype == torch.float64 else 1.3e-6,
                                       atol=1e-12 if dtype == torch.float64 else 1e-5)
    assert len(f.compiles) == (2 if dtype == torch.bfloat16 else 1)


def test_compiles_is_the_records_and_their_number():
    """``f.compiles`` compares and converts as the number of programs (``== 1``, ``<= 2``,
    ``int``, ``:d``) and is still the sequence of records; tuples compare as tuples."""
    f = kf.jit(sgd_step, target="cpu")
    assert f.compiles == 0 and not f.compiles
    p, g = torch.randn(7), torch.randn(7)
    for step in range(3):
        f(p, g, 0.1 * step)
    assert f.compiles == 1 and f.compiles <= 2 and f.compiles > 0 and f.compiles != 2
    assert int(f.compiles) == 1 and f"{f.compiles:d}" == "1" and len(f.compiles) == 1
    assert f.compiles == tuple(f.compiles) and f.compiles.from_disk in (0, 1)
    assert f.compiles[0].reason == "first call"
    f(torch.randn(3, 2), torch.randn(3, 2), 0.1)  # another rank: another program
    assert f.compiles == 2 and f.compiles[1].reason != "first call"
