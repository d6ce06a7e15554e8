"""Acceptance: real models train on `neuron` exactly as they do on the CPU.

Each test trains one copy of a model on the CPU and one on `neuron` from the same initial weights and the same
batches (generated on the CPU and moved), then compares the loss curve and every parameter and buffer. The device
runs the CPU's own kernels, so the runs agree to float32 rounding; 1e-5 leaves room for computations that take a
different but equivalent path on the device, as they would on CUDA: AdamW's multi-tensor (foreach) update, which
PyTorch picks for accelerators but not for the CPU, and attention's unfused math path.
"""

from __future__ import annotations

import copy
import gc
import io
import subprocess
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

TOL = {"atol": 1e-5, "rtol": 1e-5}
STEPS = 20


class ConvNet(nn.Module):
    """Conv / BatchNorm / Linear classifier (pooling and flatten are views and reductions on the device)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).flatten(1))


class TinyLM(nn.Module):
    """A one-block causal language model built from torch's own transformer layer.

    No biases: the key projection's bias has a mathematically zero gradient (softmax ignores it), so AdamW turns
    its rounding noise into full-size steps whose sign differs between any two kernels, on CUDA as here.
    """

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, max_len: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        self.block = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True, bias=False
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.embed(tokens) + self.pos[:length]
        return self.head(self.norm(self.block(hidden, src_mask=mask, is_causal=True)))


Batch = tuple[torch.Tensor, torch.Tensor]


def _image_batches() -> list[Batch]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 12, 12, generator=gen), torch.randint(0, 10, (8,), generator=gen)) for _ in range(4)]


def _token_batches() -> list[Batch]:
    gen = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, 64, (4, 16), generator=gen)
        batches.append((tokens[:, :-1], tokens[:, 1:]))
    return batches


def _classification_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _fit(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list[Batch], device: str,
         steps: range) -> list[float]:
    """Run the training loop over `steps` (indices into the batch cycle); return the loss of each step."""
    model.train()
    losses = []
    for step in steps:
        inputs, targets = (t.to(device) for t in batches[step % len(batches)])
        optimizer.zero_grad(set_to_none=True)
        loss = _classification_loss(model, inputs, targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


def _train(
    model: nn.Module,
    batches: list[Batch],
    device: str,
    *,
    optimizer_before_move: bool = False,
    **adamw: object,
) -> list[float]:
    """Train `model` in place for STEPS AdamW steps on `device`; return the loss of each step."""
    if optimizer_before_move:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **adamw)
        model.to(device)
    else:
        model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **adamw)
    return _fit(model, optimizer, batches, device, range(STEPS))


def _assert_same_run(
    factory: Callable[[], nn.Module],
    batches: list[Batch],
    device: str = "neuron",
    dtype: torch.dtype = torch.float32,
    tol: dict[str, float] = TOL,
    **options: object,
) -> tuple[nn.Module, nn.Module]:
    """Train the same model on the CPU and on `device`; assert equal losses and states; return (cpu, device)."""
    torch.manual_seed(0)
    cpu_model = factory().to(dtype)
    batches = [(x.to(dtype) if x.is_floating_point() else x, y) for x, y in batches]
    neuron_model = copy.deepcopy(cpu_model)
    cpu_losses = _train(cpu_model, batches, "cpu", **options)
    neuron_losses = _train(neuron_model, batches, device, **options)

    assert cpu_losses[-1] < cpu_losses[0]  # the run actually learns, so the comparison means something
    torch.testing.assert_close(neuron_losses, cpu_losses, **tol)
    cpu_state, neuron_state = cpu_model.state_dict(), neuron_model.state_dict()
    assert cpu_state.keys() == neuron_state.keys()
    expected_device = torch.empty(0, device=device).device  # "neuron" -> the current neuron:<index>
    for name, value in neuron_state.items():
        assert value.device == expected_device, name
        torch.testing.assert_close(value.cpu(), cpu_state[name], **tol, msg=lambda m, n=name: f"{n}: {m}")
    return cpu_model, neuron_model


@pytest.mark.parametrize(
    "adamw",
    [{}, {"foreach": False}, {"fused": True}],
    ids=["foreach", "for-loop", "fused"],
)
def test_convnet_trains_like_cpu(adamw: dict[str, bool]) -> None:
    batches = _image_batches()
    cpu_model, neuron_model = _assert_same_run(ConvNet, batches, **adamw)
    # Running statistics were updated in training; eval mode uses them, and must agree too.
    cpu_model.eval()
    neuron_model.eval()
    images = batches[0][0]
    with torch.no_grad():
        torch.testing.assert_close(neuron_model(images.to("neuron")).cpu(), cpu_model(images), **TOL)


def _tied_lm() -> TinyLM:
    """TinyLM whose output head shares the embedding matrix, as most language models do."""
    model = TinyLM()
    model.head.weight = model.embed.weight
    return model


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
@pytest.mark.parametrize("factory", [TinyLM, _tied_lm], ids=["untied", "tied"])
def test_transformer_block_trains_like_cpu(factory: Callable[[], TinyLM]) -> None:
    _, neuron_model = _assert_same_run(factory, _token_batches())
    assert (neuron_model.head.weight is neuron_model.embed.weight) == (factory is _tied_lm)  # moving keeps ties


@pytest.mark.parametrize("factory, batches", [(ConvNet, _image_batches), (TinyLM, _token_batches)],
                         ids=["convnet", "transformer"])
@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_bfloat16_training_matches_cpu_exactly(
    factory: Callable[[], nn.Module], batches: Callable[[], list[Batch]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In bfloat16 every rounding shows: the device must run the very kernels the CPU runs, scalars included.

    Except the matmuls, which follow the numerics policy (docs/numerics.md): computed in float32 and rounded once,
    as the Tensor engine accumulates. The CPU's bfloat16 GEMM rounds about one element in 60,000 differently (the
    policy's result is the float32 product rounded; the CPU's is not always), enough to move the transformer's run
    by an ulp after a few steps. Here the matmuls take the CPU's own kernels; the policy has its own tests."""
    from neuron_device.ops import matmul

    monkeypatch.setattr(matmul, "_LOW", ())
    _assert_same_run(factory, batches(), dtype=torch.bfloat16, tol={"atol": 0.0, "rtol": 0.0})


def test_trains_on_second_device() -> None:
    """accelerate and DDP put each process on neuron:<local_rank>: everything must stay on that device."""
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    _assert_same_run(ConvNet, _image_batches(), device="neuron:1")


@pytest.mark.parametrize("factory, batches", [(ConvNet, _image_batches), (TinyLM, _token_batches)],
                         ids=["convnet", "transformer"])
@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_optimizer_built_before_move_trains_moved_parameters(
    factory: Callable[[], nn.Module], batches: Callable[[], list[Batch]]
) -> None:
    """The accelerate pattern: the optimizer holds the Parameter objects, and `.to("neuron")` must keep them."""
    torch.manual_seed(0)
    model = factory()
    optimizer = torch.optim.AdamW(model.parameters())
    model.to("neuron")
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in held] == [id(p) for p in model.parameters()]
    assert all(p.device.type == "neuron" for p in held)

    _assert_same_run(factory, batches(), optimizer_before_move=True)


def test_resume_from_checkpoint_continues_identically() -> None:
    """Save model and optimizer half-way, load them into fresh objects, finish: same result as one run."""
    batches = _image_batches()
    torch.manual_seed(0)
    initial = ConvNet()
    straight = copy.deepcopy(initial)
    straight_losses = _train(straight, batches, "neuron")

    model = copy.deepcopy(initial).to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = _fit(model, optimizer, batches, "neuron", range(STEPS // 2))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    del model, optimizer
    buffer.seek(0)
    checkpoint = torch.load(buffer, map_location="cpu")  # the usual pattern: load to host, then into the model

    resumed = ConvNet().to("neuron")
    resumed.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    optimizer.load_state_dict(checkpoint["optimizer"])
    assert all(s["exp_avg"].device.type == "neuron" for s in optimizer.state.values())
    losses += _fit(resumed, optimizer, batches, "neuron", range(STEPS // 2, STEPS))

    exact = {"atol": 0.0, "rtol": 0.0}  # same kernels on the same inputs: bitwise equal
    torch.testing.assert_close(losses, straight_losses, **exact)
    torch.testing.assert_close(resumed.state_dict(), straight.state_dict(), **exact)


_CHECKPOINT_RESTORE = """
import copy, io, torch
model = torch.nn.Linear(4, 3).to("neuron")
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 4, device="neuron")).sum().backward()
optimizer.step()
buffer = io.BytesIO()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
saved = buffer.getvalue()
weight, exp_avg = model.weight.detach(), optimizer.state[model.weight]["exp_avg"]
for restored, original in (
    (torch.load(io.BytesIO(saved))["model"]["weight"], weight),
    (torch.load(io.BytesIO(saved), map_location="neuron")["model"]["weight"], weight),
    (copy.deepcopy(optimizer.state_dict())["state"][0]["exp_avg"], exp_avg),
):
    same = torch.equal(restored.cpu(), original.cpu())
    print(restored.device, same, restored.data_ptr() != original.data_ptr(), flush=True)
"""


def test_checkpoint_restore_paths(python: Callable[..., subprocess.CompletedProcess]) -> None:
    """`torch.load` onto the device (saved location or `map_location`) and `deepcopy` of device tensors restore
    `neuron` tensors: all need storage allocation that torch 2.13's C++ side cannot do for a Python backend.
    Runs in a fresh interpreter, so a crash fails this test instead of the whole session."""
    run = python(_CHECKPOINT_RESTORE)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.splitlines() == ["neuron:0 True True"] * 3  # device, values, own memory


def test_training_holds_steady_device_memory() -> None:
    """Activations, gradients and temporaries of each step are freed: memory stays flat, and all of it returns."""
    gc.collect()  # garbage of earlier tests must not be freed in the middle of the measurement
    baseline = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = ConvNet().to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = _image_batches()
    after_step = []
    for step in range(5):
        _fit(model, optimizer, batches, "neuron", range(step, step + 1))
        gc.collect()
        after_step.append(torch.neuron.memory_allocated())
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    # After the first step: parameters, their gradients and AdamW's two moments, at least.
    assert after_step[0] >= baseline + 4 * parameters
    assert after_step == [after_step[0]] * len(after_step)
    assert torch.neuron.max_memory_allocated() > after_step[0]  # activations existed, and were freed
    del model, optimizer
    gc.collect()
    assert torch.neuron.memory_allocated() == baseline
