"""A small GPT-2-shaped model and its training loop, for notebook 07 (needs torch).

``TinyGPT``: the encoder (``gpt2enc_edu.torch.GPT2Embedding``, or PyTorch's ``nn.Embedding`` pair to compare
with), ``n_layer`` pre-norm transformer blocks (causal self-attention written out as matmuls and a softmax,
a GELU MLP) and a final LayerNorm, with the LM head tied to ``wte``. ``train`` runs it on fixed windows of
the real GPT-2 token sample and returns the losses and hashes of the losses and the final weights.

Everything but the encoder is deterministic by construction: fixed seeds (``torch.manual_seed`` for the
initial weights, a separate ``torch.Generator`` for the encoder's stochastic-rounding seeds), a fixed data
order, no dropout, attention without fused kernels, AdamW's elementwise update, and cuBLAS with a fixed
workspace (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, set before CUDA starts). ``deterministic=True`` also turns
on ``torch.use_deterministic_algorithms``, which makes PyTorch raise on any op it knows to be
nondeterministic (it does not know the package's kernels: their determinism is the package's promise).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..bench.timer import time_synchronised_in_turn
from ..methods import DEFAULT_METHOD, METHODS
from ..rounding import bfloat16
from ..tokens import GPT2_VOCAB_SIZE, gpt2_sample_ids
from ..torch import GPT2Embedding


@dataclass(frozen=True)
class Config:
    """Model and run sizes. ``compact_vocab`` renumbers the sample's ids densely (a small vocabulary)."""

    block_size: int = 256
    n_layer: int = 2
    n_head: int = 6
    n_embd: int = 384
    batch_size: int = 8
    steps: int = 50
    lr: float = 1e-3
    dtype: torch.dtype = torch.bfloat16
    compact_vocab: bool = False


#: GPT-2's vocabulary and real ids; two blocks of GPT-2-small's shape cut to 384 channels (H200).
GPU_CONFIG = Config()
#: Seconds for the notebook's runs on a 2-core CPU: the sample's 6404 distinct ids, 64 channels, fp32 (the
#: mirror's bf16 atomics are slow, and fp32 atomics show their nondeterminism within a few steps).
CPU_CONFIG = replace(GPU_CONFIG, block_size=64, n_head=4, n_embd=64, batch_size=4, steps=20, dtype=torch.float32,
                     compact_vocab=True)


def token_data(cfg: Config) -> tuple[np.ndarray, int]:
    """(the sample's ids as int64, the vocabulary size): GPT-2's ids, or renumbered densely."""
    ids = gpt2_sample_ids()
    if not cfg.compact_vocab:
        return ids.astype(np.int64), GPT2_VOCAB_SIZE
    _, dense = np.unique(ids, return_inverse=True)
    return dense.astype(np.int64), int(dense.max()) + 1


def batch(data: np.ndarray, cfg: Config, step: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of ``step``: consecutive windows of the sample, in a fixed order."""
    B, T = cfg.batch_size, cfg.block_size
    starts = (step * B + np.arange(B)) * T % (len(data) - T - 1)
    rows = np.stack([data[s : s + T + 1] for s in starts])
    rows = torch.from_numpy(rows).to(device)
    return rows[:, :-1], rows[:, 1:]


class TorchEmbedding(nn.Module):
    """PyTorch's own encoder for comparison: ``nn.Embedding`` for tokens and positions, summed."""

    def __init__(self, vocab_size: int, max_positions: int, channels: int, *, dtype, device):
        super().__init__()
        kw = {"dtype": dtype, "device": device}  # _weight: no default initialisation drawing from the RNG
        self.tokens = nn.Embedding(vocab_size, channels, _weight=torch.empty(vocab_size, channels, **kw))
        self.positions = nn.Embedding(max_positions, channels, _weight=torch.empty(max_positions, channels, **kw))
        nn.init.normal_(self.tokens.weight, std=0.02)  # the same draws, in the same order, as GPT2Embedding
        nn.init.normal_(self.positions.weight, std=0.01)

    @property
    def wte(self) -> nn.Parameter:
        return self.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: Config, *, device):
        super().__init__()
        C, kw = cfg.n_embd, {"dtype": cfg.dtype, "device": device}
        self.n_head = cfg.n_head
        self.ln1, self.ln2 = nn.LayerNorm(C, **kw), nn.LayerNorm(C, **kw)
        self.qkv, self.proj = nn.Linear(C, 3 * C, **kw), nn.Linear(C, C, **kw)
        self.fc, self.fc_proj = nn.Linear(C, 4 * C, **kw), nn.Linear(4 * C, C, **kw)
        mask = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool, device=device).tril()
        self.register_buffer("causal", mask, persistent=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (y.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for y in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (C // self.n_head) ** -0.5
        scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))
        y = scores.float().softmax(dim=-1).to(x.dtype) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGPT(nn.Module):
    """Encoder, ``n_layer`` blocks, final LayerNorm, LM head tied to ``wte``; ``forward`` returns the loss."""

    def __init__(self, cfg: Config, vocab_size: int, *, encoder: str, method: str = DEFAULT_METHOD, device,
                 generator: torch.Generator | None = None):
        super().__init__()
        kw = {"dtype": cfg.dtype, "device": device}
        if encoder == "ours":
            self.encoder = GPT2Embedding(vocab_size, cfg.block_size, cfg.n_embd, method=method,
                                         generator=generator, **kw)
        elif encoder == "torch":
            self.encoder = TorchEmbedding(vocab_size, cfg.block_size, cfg.n_embd, **kw)
        else:
            raise ValueError(f"encoder must be 'ours' or 'torch', not {encoder!r}")
        self.blocks = nn.ModuleList(Block(cfg, device=device) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, **kw)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.encoder(ids)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.encoder.wte)  # tied: the head reuses the token embedding
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def digest(*tensors: torch.Tensor) -> str:
    """The first 16 hex digits of the SHA-256 of the tensors' bytes (bf16 read as its 16-bit patterns)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class Run:
    """One training run: the loss of every step, hashes of the losses and of the final weights, the final
    weights themselves (detached copies on the CPU, in their dtype), and time."""

    losses: torch.Tensor  #: float32, one per step
    loss_hash: str
    weights_hash: str
    step_ms: float  #: median time of one training step, in milliseconds
    weights: tuple[torch.Tensor, ...] = ()  #: the final parameters, in the model's order

    def parts_from(self, other: Run) -> int | None:
        """The first step whose loss differs in its bits from ``other``'s, or ``None`` when all agree."""
        same = (self.losses.view(torch.int32) == other.losses.view(torch.int32)).tolist()
        return next((step for step, ok in enumerate(same) if not ok), None)

    def loss_gaps(self, other: Run) -> np.ndarray:
        """``|loss - other's loss|`` of every step, float64 (0 where the bits agree)."""
        return np.abs(self.losses.double().numpy() - other.losses.double().numpy())

    def weights_differ(self, other: Run) -> tuple[int, int, float]:
        """(values whose bits differ, values in all, the largest absolute difference) of the final weights."""
        if len(self.weights) != len(other.weights) or not self.weights:
            raise ValueError("both runs must hold their final weights, of the same model")
        differ, total, largest = 0, 0, 0.0
        for a, b in zip(self.weights, other.weights):
            bits = torch.int16 if a.dtype in (torch.bfloat16, torch.float16) else torch.int32
            differ += int((a.view(bits) != b.view(bits)).sum())
            total += a.numel()
            largest = max(largest, float((a.float() - b.float()).abs().max()))
        return differ, total, largest

    def agreement(self, other: Run) -> str:
        """One sentence on how two runs compare: identical, where their losses part, or how their weights differ
        when every loss agrees."""
        parts = self.parts_from(other)
        if parts is not None:
            return f"the losses part at step {parts} (of {len(self.losses)})"
        if self.weights_hash == other.weights_hash:
            return f"identical: the losses of all {len(self.losses)} steps and every bit of the final weights"
        differ, total, largest = self.weights_differ(other)
        return (f"the losses agree for all {len(self.losses)} steps, the final weights differ in {differ:,} of "
                f"{total:,} values, by at most {largest:.1e}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def deterministic_algorithms(flag: bool):
    """``torch.use_deterministic_algorithms(flag)`` inside the block, the previous setting after it."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(flag)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def train(cfg: Config, *, encoder: str = "ours", method: str = DEFAULT_METHOD, deterministic: bool = True,
          seed: int = 1337, device="cpu", compile: bool = False) -> Run:
    """Train a fresh ``TinyGPT`` for ``cfg.steps`` AdamW steps; ``deterministic`` sets PyTorch's switch;
    ``compile`` runs the model's forward and backward through ``torch.compile(fullgraph=True)`` (the first steps
    compile; the step time is the median of the others)."""
    device = torch.device(device)
    data, vocab_size = token_data(cfg)
    with deterministic_algorithms(deterministic):
        torch.manual_seed(seed)
        model = TinyGPT(cfg, vocab_size, encoder=encoder, method=method, device=device,
                        generator=torch.Generator().manual_seed(seed + 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        step_loss = torch.compile(model, fullgraph=True) if compile else model
        losses, times = [], []
        for step in range(cfg.steps):
            ids, targets = batch(data, cfg, step, device)
            _sync(device)
            start = time.perf_counter()
            loss = step_loss(ids, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            _sync(device)
            times.append(time.perf_counter() - start)
            losses.append(loss.detach())
    losses = torch.stack(losses).float().cpu()
    weights = tuple(w.detach().cpu().clone() for w in model.parameters())
    warm = 2 if compile else 1  # the steps that compile (the forward's graph, then the backward's) are not timed
    return Run(losses, digest(losses), digest(*weights), 1e3 * float(np.median(times[warm:] or times)), weights)


#: The encoders ``time_encoders`` times: (label, encoder, method, check_ids, deterministic algorithms): ours with
#: the default method, also without the id check, then with every other method; PyTorch's with and without its
#: deterministic algorithms.
ENCODER_VARIANTS = [
    (f"ours, {DEFAULT_METHOD}", "ours", DEFAULT_METHOD, True, True),
    (f"ours, {DEFAULT_METHOD}, check_ids=False", "ours", DEFAULT_METHOD, False, True),
    # a nondeterministic method raises under torch.use_deterministic_algorithms(True): timed with it off
    *((f"ours, {name}", "ours", name, True, METHODS[name].deterministic) for name in METHODS if name != DEFAULT_METHOD),
    ("nn.Embedding, deterministic", "torch", None, True, True),
    ("nn.Embedding, not deterministic", "torch", None, True, False),
]


def time_encoders(B: int, T: int, C: int, V: int, *, dtype, device, repeats: int = 30) -> dict[str, float]:
    """Median milliseconds of one encoder forward + backward (into ``.grad``) per variant, real GPT-2 ids.

    Host-side time around a synchronised call: what a training step pays, Python and launches included. The
    variants are timed in turn (``bench.timer.time_synchronised_in_turn``: each repeat runs each variant once), so
    that a drift of the host's speed meets them all and their medians compare.
    """
    device = torch.device(device)
    ids = torch.from_numpy(gpt2_sample_ids()[: B * T].reshape(B, T) % V).to(device)
    dout = torch.randn(B, T, C, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    calls = {}
    for label, encoder, method, check_ids, deterministic in ENCODER_VARIANTS:
        if method is not None and not METHODS[method].takes(bfloat16 if dtype == torch.bfloat16 else np.float32):
            continue
        if encoder == "ours":
            module = GPT2Embedding(V, T, C, dtype=dtype, device=device, method=method, check_ids=check_ids)
        else:
            module = TorchEmbedding(V, T, C, dtype=dtype, device=device)
        calls[label] = functools.partial(_encoder_step, module, ids, dout, deterministic)
    # the first calls compile kernels and warm caches
    samples = time_synchronised_in_turn(calls, lambda: _sync(device), warmup=3, repeats=repeats)
    return {label: 1e3 * float(np.median(s)) for label, s in samples.items()}


def _encoder_step(module: nn.Module, ids: torch.Tensor, dout: torch.Tensor, deterministic: bool) -> None:
    """One of ``time_encoders``'s timed calls: fresh gradients, the forward, the backward."""
    with deterministic_algorithms(deterministic):
        module.zero_grad(set_to_none=True)
        module(ids).backward(dout)
