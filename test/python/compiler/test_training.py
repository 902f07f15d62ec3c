"""A small GPT (2 layers, width 256, seq 128) trains 50 steps through kf kernels on the CPU
target, its losses tracking the same model run eagerly (examples/train_gpt.py)."""

import torch

import train_gpt as tg


def test_gpt_trains_through_kf_like_eager():
    kf_model, eager = tg.twin_models(seed=0)
    assert len(kf_model.blocks) == 2 and kf_model.head.in_features == 256 and kf_model.mask.shape == (128, 128)
    kf_losses = tg.train(kf_model, steps=50, batch=2)
    eager_losses = tg.train(eager, steps=50, batch=2)

    # it learns: from ln(128) ~ 4.85 to well below
    assert kf_losses[0] > 4.5 and min(kf_losses[-5:]) < 2.5
    # and tracks eager step by step: both see the same data and start from the same weights
    for step, (a, b) in enumerate(zip(kf_losses, eager_losses)):
        assert abs(a - b) <= 1e-3 * abs(b), f"step {step}: kf {a} vs eager {b}"

    # the kernels were kf's, forward and backward
    for kfn in (tg.layer_norm, tg.causal_attention, tg.gelu):
        assert kfn._trainings, f"{kfn} never derived a backward"
        for training, _ in kfn._trainings.values():
            # a forward that saves nothing beyond its results runs the function's own program
            forward = training.forward if training.extras else kfn
            for f in (forward, training.backward.fn):
                assert f._table and all(type(p).__name__ == "CompiledProgram" for p in f._table.values())
    # the final parameters agree as well -- except the key bias: it adds q.b_k to every
    # score of a row, which the softmax cancels, so its gradient is zero in exact arithmetic
    # and rounding noise of either program, normalized by AdamW, is all that moves it (by
    # up to lr = 1e-3 a step); it is checked against that bound
    width = kf_model.head.in_features
    for (name, p), (_, q) in zip(kf_model.named_parameters(), eager.named_parameters()):
        if name.endswith("qkv.bias"):
            key = slice(width, 2 * width)
            torch.testing.assert_close(p[key], q[key], rtol=0, atol=1e-3, msg=name)
            p, q = torch.cat([p[:width], p[2 * width:]]), torch.cat([q[:width], q[2 * width:]])
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4, msg=name)
