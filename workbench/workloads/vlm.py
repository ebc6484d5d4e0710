"""`driving-vlm`: a small vision-language model that describes a driving scene (LLaVA-style, reduced).

A ViT encodes the image (patch-embedding conv, then bidirectional SDPA blocks); its tokens
are projected into a causal language decoder as a prefix, and the decoder is trained with
next-token cross-entropy on the caption. The decoder runs `is_causal=True` over
[image tokens; text tokens] so the flash kernel stays eligible (the image tokens were
already mixed both ways by the encoder). Synthetic captions name the objects painted into
the image and their grid cells, so the text really depends on the image.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.workloads.base import Workload
from workbench.workloads.catalog import register
from workbench.workloads.layers import TransformerBlock, init_transformer_weights, transformer_tp_plan
from workbench.workloads.synthetic import Sample, SyntheticDataset, check_sample_cost, choose_preset

NAME = "driving-vlm"
IGNORE_INDEX = -100
"""Label of padding positions; `F.cross_entropy` skips them."""
CELLS_PER_SIDE = 4
"""Objects sit in a 4×4 grid of image cells; captions name the cell."""
OBJECT_CLASSES = 8
# Caption vocabulary: a few fixed words, then one token per object class, then one per cell.
PAD, BOS, EOS, THERE, IS, A, AT, DOT = range(8)
CLASS_TOKEN0 = 8
CELL_TOKEN0 = CLASS_TOKEN0 + OBJECT_CLASSES
WORDS_PER_OBJECT = 7
"""'there is a <class> at <cell> .'"""


@dataclass(frozen=True)
class VlmSize:
    """One preset: image and patch size, encoder/decoder widths and depths, vocabulary and caption length."""

    image: int
    patch: int
    vision_dim: int
    vision_depth: int
    vision_heads: int
    text_dim: int
    text_depth: int
    text_heads: int
    vocab: int
    objects: int
    batch_size: int

    @property
    def text_len(self) -> int:
        """Caption tokens: BOS, seven words per object, EOS."""
        return 2 + WORDS_PER_OBJECT * self.objects


PRESETS = {
    "tiny": VlmSize(
        image=64,
        patch=8,
        vision_dim=96,
        vision_depth=2,
        vision_heads=3,
        text_dim=128,
        text_depth=3,
        text_heads=4,
        vocab=256,
        objects=2,  # decoder sequence 64 image + 16 text tokens: divides by 2, 4, 8 (sequence parallelism)
        batch_size=16,
    ),
    "base": VlmSize(
        image=224,
        patch=16,
        vision_dim=768,
        vision_depth=12,
        vision_heads=12,
        text_dim=768,
        text_depth=12,
        text_heads=12,
        vocab=32000,
        objects=6,
        batch_size=16,
    ),
    "large": VlmSize(
        image=336,
        patch=14,
        vision_dim=1024,
        vision_depth=24,
        vision_heads=16,
        text_dim=1280,
        text_depth=16,
        text_heads=20,
        vocab=32000,
        objects=8,
        batch_size=8,
    ),
}


def class_colours() -> torch.Tensor:
    """A fixed, distinct RGB colour per object class (corners of the colour cube, shifted off black)."""
    bits = torch.arange(OBJECT_CLASSES, device="cpu")[:, None] >> torch.arange(3, device="cpu")[None, :] & 1
    return 0.2 + 0.8 * bits.float()


@dataclass(frozen=True)
class CaptionSampler:
    """One image with a few coloured squares in distinct grid cells, and its caption.

    Caption: BOS, then 'there is a <class> at <cell> .' for each object in cell order, EOS.
    """

    size: VlmSize

    def __call__(self, generator: torch.Generator) -> Sample:
        size, k = self.size, self.size.objects
        cells = torch.randperm(CELLS_PER_SIDE**2, generator=generator)[:k].sort().values
        classes = torch.randint(OBJECT_CLASSES, (k,), generator=generator)
        cell_px = size.image // CELLS_PER_SIDE
        pixel = torch.arange(size.image, device="cpu")
        # Pixel (r, c) belongs to cell (r // cell_px) * 4 + c // cell_px; a margin leaves a square, not a tile.
        inner = (pixel % cell_px >= cell_px // 8) & (pixel % cell_px < cell_px - cell_px // 8)
        pixel_cell = (pixel // cell_px).clamp(max=CELLS_PER_SIDE - 1)
        cell_of = pixel_cell[:, None] * CELLS_PER_SIDE + pixel_cell[None, :]
        hit = (cell_of[None] == cells[:, None, None]) & inner[None, :, None] & inner[None, None, :]
        paint = torch.einsum("kc,khw->chw", class_colours()[classes], hit.float())
        image = 0.1 * torch.randn(3, size.image, size.image, generator=generator) + paint
        words = torch.stack(
            [
                torch.full((k,), THERE),
                torch.full((k,), IS),
                torch.full((k,), A),
                CLASS_TOKEN0 + classes,
                torch.full((k,), AT),
                CELL_TOKEN0 + cells,
                torch.full((k,), DOT),
            ],
            dim=1,
        ).flatten()
        tokens = torch.cat([torch.tensor([BOS]), words, torch.tensor([EOS])])
        labels = torch.cat([tokens[1:], torch.tensor([IGNORE_INDEX])])
        return {"image": image, "tokens": tokens, "labels": labels}


class VisionEncoder(nn.Module):
    """ViT: patch-embedding conv, learned positions, bidirectional TransformerBlocks, final LayerNorm."""

    def __init__(self, size: VlmSize) -> None:
        super().__init__()
        patches = (size.image // size.patch) ** 2
        self.patch_embed = nn.Conv2d(3, size.vision_dim, size.patch, stride=size.patch)
        self.pos = nn.Parameter(torch.zeros(1, patches, size.vision_dim))
        self.blocks = nn.Sequential(
            *[TransformerBlock(size.vision_dim, size.vision_heads) for _ in range(size.vision_depth)]
        )
        self.norm = nn.LayerNorm(size.vision_dim)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(image).flatten(2).transpose(1, 2) + self.pos
        return self.norm(self.blocks(tokens))


class DrivingVlm(nn.Module):
    """Image tokens → projector → prefix of a causal decoder over [image; text] → next-token logits for the text."""

    def __init__(self, size: VlmSize) -> None:
        super().__init__()
        self.vision = VisionEncoder(size)
        self.projector = nn.Sequential(
            nn.Linear(size.vision_dim, size.text_dim), nn.GELU(), nn.Linear(size.text_dim, size.text_dim)
        )
        self.embed = nn.Embedding(size.vocab, size.text_dim)
        self.pos = nn.Parameter(torch.zeros(1, (size.image // size.patch) ** 2 + size.text_len, size.text_dim))
        self.blocks = nn.Sequential(
            *[TransformerBlock(size.text_dim, size.text_heads, causal=True) for _ in range(size.text_depth)]
        )
        self.norm = nn.LayerNorm(size.text_dim)
        self.lm_head = nn.Linear(size.text_dim, size.vocab, bias=False)
        self.apply(init_transformer_weights)
        for param in (self.vision.pos, self.pos):
            nn.init.normal_(param, std=0.02)

    def forward(self, image: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        prefix = self.projector(self.vision(image))
        x = torch.cat([prefix, self.embed(tokens)], dim=1)
        x = self.blocks(x + self.pos[:, : x.shape[1]])
        return self.lm_head(self.norm(x[:, prefix.shape[1] :]))


def vlm_forward(model: nn.Module, batch: Sample) -> torch.Tensor:
    return model(batch["image"], batch["tokens"])


def vlm_loss(logits: torch.Tensor, batch: Sample) -> torch.Tensor:
    """Next-token cross-entropy over the caption (labels are the tokens shifted by one; padding ignored)."""
    return F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)


@register(NAME, "driving VLM: ViT image encoder + causal language decoder captioning the scene")
def build_driving_vlm(preset: str = "tiny", sample_cost_ms: float = 0.0) -> Workload:
    """The `driving-vlm` workload at a size preset; `sample_cost_ms` simulates per-sample decoding."""
    size = choose_preset(NAME, preset, PRESETS)
    cost = check_sample_cost(NAME, sample_cost_ms)
    return Workload(
        name=NAME,
        model_fn=functools.partial(DrivingVlm, size),
        loss_fn=vlm_loss,
        batch_size=size.batch_size,
        dataset_fn=functools.partial(_dataset, size, cost),
        forward_fn=vlm_forward,
        checkpoint_target="TransformerBlock",
        # The decoder is split; the ViT encoder (3 heads at tiny) stays whole on every rank.
        tp_plan={**transformer_tp_plan("blocks"), "lm_head": "colwise_rep"},
        preset=preset,
        description="driving VLM (ViT encoder, projector, causal decoder; next-token loss on scene captions)",
        options={"sample_cost_ms": cost},
    )


def _dataset(size: VlmSize, sample_cost_ms: float, seed: int) -> SyntheticDataset:
    return SyntheticDataset(CaptionSampler(size), seed, sample_cost_ms)
