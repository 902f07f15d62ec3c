"""Hugging Face decoders that kf's authors did not write, built from small configs with
random weights (no downloads), trained one step under ``torch.compile(backend="kf")`` on
cpu and vulkan: the loss and every parameter's gradient match eager at four sequence
lengths (from the second on through Dynamo's symbolic length, whose programs serve the
third and fourth without compiling), with the model's own attention
(SDPA, grouped-query heads), rotary embedding, norms, MLP and cross-entropy loss. A
left-padded batch (an attention mask of zeros for the padding, as a tokenizer gives it)
masks some query rows everywhere: torch gives those 0, not NaN.
``transformers`` is a test dependency (pyproject's ``test`` extra)."""

from __future__ import annotations

import copy

import pytest
import torch

from kf.backend import attention as backend_attention
from kf.backend import report
from kf.runtime import vulkan

transformers = pytest.importorskip("transformers")

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                    reason="no Vulkan device"))]
DECODER = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER))


def _qwen2():
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**DECODER))


def _gemma():
    return transformers.GemmaForCausalLM(transformers.GemmaConfig(**DECODER, head_dim=16))


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=96, n_embd=64, n_layer=1, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0,
        attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))  # (dropout draws apart)


MODELS = {"llama": _llama, "qwen2": _qwen2, "gemma": _gemma, "gpt2": _gpt2, "llama-padded": _llama}
#: models called with a left-padded batch's attention mask
PADDED = {"llama-padded"}
#: GPT-2's loss logs a warning once, where Dynamo breaks the graph
GRAPH_BREAKS = {"gpt2"}
#: models with a program that still compiles at each new length, and why (the others
#: compile nothing after their second length)
EACH_LENGTH = {
    "llama-padded": "the padding mask's backward carries [s, s] scores between kernels",
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_matches_eager(name, target, monkeypatch):
    # the attention functions as a fresh process has them: what other tests of the worker
    # called them with (other heads and head dims) would change which calls compile
    monkeypatch.setattr(backend_attention, "_FUNCTIONS", {})
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MODELS[name]()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kf", fullgraph=name not in GRAPH_BREAKS,
                             options={"target": target, "fallback": "eager"})
    compiles = []
    for seq in (13, 21, 30, 8):
        x = torch.randint(0, 96, (2, seq))
        kw = dict(input_ids=x, labels=x)
        if name in PADDED:  # the second sequence: padding first, and padding masked in the loss
            kw["attention_mask"] = torch.ones(2, seq, dtype=torch.long)
            kw["attention_mask"][1, : seq // 3] = 0
            kw["labels"] = x.masked_fill(kw["attention_mask"] == 0, -100)
        with report.collect() as ran:
            out, want = compiled(**kw), eager(**kw)
            out.loss.backward()
        torch.testing.assert_close(out.logits, want.logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=1e-6)
        want.loss.backward()
        for (p_name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{p_name} seq {seq}: {m}")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        compiles.append((sum(r.compiles for g in ran for r in g.regions), _attention_programs()))
    if name not in EACH_LENGTH:
        # the regions' programs of run-time sizes serve every length from the second on; the
        # attention functions' too, but where a process met attention of other heads before
        # (their disk profile has the heads changing too), which settles by the third
        assert compiles[2][0] == compiles[1][0] and compiles[3] == compiles[2], compiles


def _attention_programs() -> int:
    """The programs of the attention kf functions and of their split backwards."""
    backwards = {id(t.backward.fn): t.backward.fn for f in backend_attention._FUNCTIONS.values()
                 for t, _ in f._trainings.values()}
    return sum(len(f.compiles) for f in [*backend_attention._FUNCTIONS.values(), *backwards.values()])


@pytest.mark.parametrize("target", TARGETS)
def test_generate_matches_eager(target):
    """``generate`` with the model's forward under the backend: a prompt, then one token a
    step against the key/value cache (a query of one row), for a left-padded batch: the
    same greedy tokens as eager and each step's logits within float32 rounding."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _llama().eval()
    eager = copy.deepcopy(model)
    model.forward = torch.compile(model.forward, backend="kf", options={"target": target, "fallback": "eager"})
    x = torch.randint(1, 96, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    programs = lambda: sum(len(f.compiles) for f in backend_attention._FUNCTIONS.values())  # noqa: E731
    before = programs()
    with torch.no_grad():
        got, want = model.generate(x, **kw), eager.generate(x, **kw)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # the prompt, a first step at static sizes and one program for the run-time keys of
    # the others (the padding mask's too): not one a step
    assert programs() - before <= 3
    # prompts of new lengths: their [b, 1, n, n] mask takes run-time queries and keys, so
    # one program serves every prompt from the second length on
    for n in (13, 20, 31):
        x = torch.randint(1, 96, (2, n))
        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, :3] = 0
        with torch.no_grad():
            got = model.generate(x, **{**kw, "attention_mask": mask, "max_new_tokens": 2})
            want = eager.generate(x, **{**kw, "attention_mask": mask, "max_new_tokens": 2})
        assert torch.equal(got.sequences, want.sequences)
        for a, b in zip(got.logits, want.logits):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert programs() - before <= 4
