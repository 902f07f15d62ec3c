"""examples/demo.py: the target it picks, and that it runs there and matches torch."""

import os
import subprocess
import sys

import pytest
import torch

import demo

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "demo.py")


def test_best_target_is_never_a_cpu_vulkan_device():
    target, why = demo.best_target()
    assert why
    if torch.cuda.is_available():
        assert target == "cuda"
    elif target == "vulkan":
        from kf.runtime import vulkan

        assert vulkan.device().device_type != "CPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a CUDA GPU the demo runs on cuda")
def test_demo_runs_on_the_cpu_target_without_a_gpu(tmp_path):
    from kf.runtime import vulkan

    if vulkan.is_available() and vulkan.device().device_type != "CPU":
        pytest.skip("this machine has a Vulkan GPU: the demo picks it")
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, DEMO], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("kf demo on target 'cpu': no GPU"), lines[0]
    errors = [float(line.split()[-4]) for line in lines[2:5]]
    assert len(errors) == 3 and max(errors) < 1e-3, run.stdout
