"""Building blocks shared by the built-in workloads: residual conv blocks and pre-norm transformer blocks.

Each repeated block is its own class so that activation checkpointing can target it by
name (`checkpoint_target`). Attention goes through `F.scaled_dot_product_attention`, so
the attention-backend toggle (flash / efficient / math) really changes the kernel; it is
called through each SelfAttention's `attention_fn`, which attention_backend=flex swaps for
FlexAttention. The
forward paths avoid `.item()`, data-dependent branches and in-place ops on tensors
autograd keeps, so every block compiles without graph breaks and checkpoints cleanly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class ConvBNAct(nn.Sequential):
    """Conv → BatchNorm → ReLU: the stem of a CNN backbone (no bias: BN supplies it)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )


class ResBlock(nn.Module):
    """Basic ResNet block (two 3×3 conv-BN, identity or 1×1 projection shortcut).

    The repeated unit of the conv backbones: checkpointing it trades one recomputed
    block per stage for its saved activations.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def res_stage(in_channels: int, out_channels: int, blocks: int, stride: int) -> nn.Sequential:
    """`blocks` ResBlocks; the first one changes width and stride."""
    layers = [ResBlock(in_channels, out_channels, stride)]
    layers += [ResBlock(out_channels, out_channels) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class MLP(nn.Module):
    """Linear → GELU → Linear, the transformer feed-forward."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttention(nn.Module):
    """Multi-head self-attention through SDPA; `causal` uses `is_causal=True` (flash-eligible, no mask tensor).

    `attention_fn(q, k, v, is_causal=...)` is the kernel call: SDPA by default, replaceable per
    instance by a function with SDPA's signature (attention_backend=flex does that).
    The fused projection's outputs are laid out head by head ([q k v] of head 0, then head 1, ...)
    and the forward counts heads from the width it receives: a column-wise split of `qkv` into
    contiguous blocks (tensor parallelism) then gives each rank whole heads, and it runs unchanged.
    """

    def __init__(self, dim: int, heads: int, causal: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention width {dim} is not divisible by {heads} heads")
        self.heads, self.causal, self.head_dim = heads, causal, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attention_fn: Callable[..., torch.Tensor] = F.scaled_dot_product_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        qkv = self.qkv(x).view(batch, tokens, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        out = self.attention_fn(qkv[0], qkv[1], qkv[2], is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, -1))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x)).

    The repeated unit of every token model here (ViT encoder, language decoder, planner).
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, causal: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def transformer_tp_plan(blocks: str) -> dict[str, str]:
    """The tensor-parallel plan of a stack of TransformerBlocks named `blocks` (Megatron's split).

    Attention: qkv column-wise (whole heads per rank), proj row-wise; MLP: fc1 column-wise, fc2
    row-wise; one all-reduce (or, with sequence parallelism, an all-gather before and a
    reduce-scatter after) per half-block. The norms run sequence-parallel, and the stack is one
    sequence region: its input is split along the sequence and its output gathered again.
    """
    return {
        blocks: "sequence_region",
        f"{blocks}.*.norm1": "sequence_parallel",
        f"{blocks}.*.attn.qkv": "colwise",
        f"{blocks}.*.attn.proj": "rowwise",
        f"{blocks}.*.norm2": "sequence_parallel",
        f"{blocks}.*.mlp.fc1": "colwise",
        f"{blocks}.*.mlp.fc2": "rowwise",
    }


class GridAttention(nn.Module):
    """TransformerBlocks over the cells of a (B, C, H, W) feature map, with a learned position embedding.

    Lets a conv model mix information across the whole grid (e.g. a BEV map) in one step;
    the position embedding is 3-D so `channels_last` conversion leaves it alone.
    """

    def __init__(self, channels: int, height: int, width: int, heads: int, depth: int = 1) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(1, height * width, channels))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.blocks = nn.Sequential(*[TransformerBlock(channels, heads) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        tokens = x.flatten(2).transpose(1, 2) + self.pos
        tokens = self.blocks(tokens)
        return tokens.transpose(1, 2).reshape(batch, channels, height, width)


def init_transformer_weights(module: nn.Module) -> None:
    """Small-normal Linear/Embedding init (GPT-2 style): keeps early logits near zero so losses start sane."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
