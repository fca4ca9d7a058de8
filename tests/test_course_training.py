"""course.training's run comparison (notebook 07): the sentence says what differs, never "part at None"."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gpt2enc_edu.course import training  # noqa: E402 (after the skip: it imports torch)


def _run(losses, weights):
    losses = torch.tensor(losses, dtype=torch.float32)
    return training.Run(losses, training.digest(losses), training.digest(*weights), 1.0, tuple(weights))


def test_identical_runs():
    w = (torch.randn(5, 3), torch.randn(4).to(torch.bfloat16))
    a, b = _run([3.0, 2.0, 1.0], w), _run([3.0, 2.0, 1.0], tuple(t.clone() for t in w))
    assert a.parts_from(b) is None
    assert a.agreement(b) == "identical: the losses of all 3 steps and every bit of the final weights"
    assert a.loss_gaps(b).tolist() == [0.0, 0.0, 0.0]


def test_same_losses_different_weights_says_how_the_weights_differ():
    w = torch.randn(10)
    moved = w.clone()
    moved[[2, 7]] += torch.tensor([0.5, -0.25])
    a, b = _run([3.0, 2.0], (w,)), _run([3.0, 2.0], (moved,))
    assert a.parts_from(b) is None
    sentence = a.agreement(b)
    assert sentence.startswith("the losses agree for all 2 steps, the final weights differ in 2 of 10 values")
    assert sentence.endswith(f"by at most {float((moved - w).abs().max()):.1e}")


def test_losses_that_part_name_the_step():
    w = (torch.randn(3),)
    a, b = _run([3.0, 2.0, 1.0], w), _run([3.0, 2.0, 1.5], w)
    assert a.parts_from(b) == 2
    assert a.agreement(b) == "the losses part at step 2 (of 3)"
    assert a.loss_gaps(b).tolist() == [0.0, 0.0, 0.5]


def test_weights_of_another_model_are_refused():
    a, b = _run([1.0], (torch.randn(3),)), _run([1.0], (torch.randn(3), torch.randn(2)))
    with pytest.raises(ValueError, match="same model"):
        a.weights_differ(b)


def test_a_compiled_step_is_reproducible_and_close_to_the_eager_one():
    """``train(compile=True)``: the whole step through ``torch.compile(fullgraph=True)`` (a graph break would raise),
    two compiled runs with the same bits, their losses within rounding of the eager run's."""
    from dataclasses import replace

    cfg = replace(training.CPU_CONFIG, block_size=16, n_embd=32, n_head=2, n_layer=1, steps=4)
    compiled = [training.train(cfg, encoder="ours", compile=True) for _ in range(2)]
    eager = training.train(cfg, encoder="ours")
    assert compiled[0].parts_from(compiled[1]) is None and compiled[0].weights_hash == compiled[1].weights_hash
    torch.testing.assert_close(compiled[0].losses, eager.losses, rtol=1e-4, atol=1e-4)


def test_the_encoders_are_timed_in_turn_each_variant_once_per_repeat(monkeypatch):
    """Every variant whose method takes the dtype gets a median of its own calls, and each call is a whole step:
    the variant's module gets gradients."""
    steps = []
    real_step = training._encoder_step

    def counted(module, ids, dout, deterministic):
        real_step(module, ids, dout, deterministic)
        assert all(p.grad is not None for p in module.parameters())
        steps.append(module)

    monkeypatch.setattr(training, "_encoder_step", counted)
    times = training.time_encoders(2, 8, 16, 64, dtype=torch.float32, device="cpu", repeats=4)
    takes = [label for label, _, method, *_ in training.ENCODER_VARIANTS
             if method is None or training.METHODS[method].takes(np.float32)]
    assert list(times) == takes and len(takes) < len(training.ENCODER_VARIANTS)  # atomic_bf16 needs bf16
    assert all(ms > 0 for ms in times.values())
    assert len(steps) == (3 + 4) * len(times) and len(set(map(id, steps))) == len(times)
