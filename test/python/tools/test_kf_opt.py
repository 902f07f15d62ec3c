"""kf-opt as a program: it never imports torch, and --verify-diagnostics fails when an
expected diagnostic is missing or an unexpected one appears."""

import subprocess
import sys
import textwrap

GOOD = """
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "kf.exp"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def _kf_opt(args, stdin):
    return subprocess.run([sys.executable, "-m", "kf.tools.kf_opt", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_kf_opt_does_not_import_torch():
    code = textwrap.dedent("""
        import io, sys
        sys.stdin = io.StringIO(sys.argv[1])
        from kf.tools import kf_opt
        rc = kf_opt.main(["--pass-pipeline=builtin.module(kf-verify, kf-canonicalize, cse)"])
        assert rc == 0
        assert "torch" not in sys.modules, "kf-opt imported torch"
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code, GOOD], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_verify_diagnostics_fails_on_a_missing_expectation():
    r = _kf_opt(["--verify-diagnostics"], GOOD.replace('%0 = "kf.exp"',
                                                       '// expected-error @+1 {{no such error}}\n  %0 = "kf.exp"'))
    assert r.returncode == 1
    assert 'expected error "no such error" was not produced' in r.stderr


def test_verify_diagnostics_fails_on_an_unexpected_error():
    bad = GOOD.replace('"kf.exp"(%a) : (tensor<4xf32>) -> tensor<4xf32>', '"kf.exp"(%a) : (tensor<4xf32>) -> tensor<5xf32>')
    r = _kf_opt(["--verify-diagnostics"], bad.replace("return %0 : tensor<4xf32>", "return %a : tensor<4xf32>"))
    assert r.returncode == 1
    assert "unexpected error" in r.stderr


def test_split_input_file_keeps_line_numbers():
    text = GOOD + "// -----\n" + GOOD.replace('"kf.exp"(%a) : (tensor<4xf32>) -> tensor<4xf32>',
                                               '"kf.matmul"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>')
    r = _kf_opt(["--split-input-file"], text)
    assert r.returncode == 1
    line = text.splitlines().index('  %0 = "kf.matmul"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>') + 1
    assert f"<stdin>:{line}:8: error: 'kf.matmul' op matmul needs operands of rank 2 or more" in r.stderr
    assert r.stdout.count("func.func @f") == 1
