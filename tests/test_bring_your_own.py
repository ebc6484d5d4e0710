"""Models nobody here wrote, on small stand-ins shaped like the real cases: a frozen backbone
(fine-tuning, LoRA), a Hugging Face-style model fed `model(**batch)` that returns its own loss,
a one-argument `batch_fn`, a mistyped checkpoint target, and a DETR-style loss that reads values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.estimate import estimate_memory, max_batch_size
from workbench.trials import run_trial
from workbench.workloads import Workload, WorkloadError

WINDOW = {"warmup": 1, "steps": 3, "isolation": "inline"}


def frozen_backbone() -> nn.Module:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for param in model[0].parameters():  # the backbone: 16*32 + 32 floats, no gradient
        param.requires_grad_(False)
    return model


def frozen_workload() -> Workload:
    return Workload.from_callables(
        model_fn=frozen_backbone,
        loss_fn=lambda output, batch: nn.functional.cross_entropy(output, batch[1]),
        batch_fn=lambda batch_size, gen: (
            torch.randn(batch_size, 16, generator=gen),
            torch.randint(0, 4, (batch_size,), generator=gen),
        ),
        batch_size=4,
    )


FROZEN_BYTES = (16 * 32 + 32) * 4
TRAINABLE_BYTES = (32 * 4 + 4) * 4


def test_a_frozen_backbone_is_measured_with_its_memory() -> None:
    result = run_trial(frozen_workload(), TrainConfig(), **WINDOW)
    assert result.status == "ok", result.message
    assert len(result.step_ms) == 3
    assert result.memory_breakdown is not None
    assert result.memory_breakdown["parameters"] == FROZEN_BYTES + TRAINABLE_BYTES  # frozen ones count
    assert result.memory_breakdown["gradients"] == TRAINABLE_BYTES  # and have no gradient


def test_estimate_memory_handles_a_frozen_backbone() -> None:
    estimate = estimate_memory(frozen_workload(), TrainConfig())
    assert estimate.breakdown["parameters"] == FROZEN_BYTES + TRAINABLE_BYTES
    assert estimate.breakdown["gradients"] == TRAINABLE_BYTES


def test_a_failing_memory_reading_never_discards_the_measured_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracker broke")

    monkeypatch.setattr("workbench.measure.trial.track_step_memory", broken)
    result = run_trial(frozen_workload(), TrainConfig(), **WINDOW)
    assert result.status == "ok"
    assert len(result.step_ms) == 3 and result.median_step_ms
    assert result.peak_memory_bytes is None
    assert result.memory_method is not None and "tracker broke" in result.memory_method


# --- Hugging Face conventions -------------------------------------------------------------------


@dataclass
class CausalLMOutput:
    """Shaped like transformers' output: the loss as an attribute, logits beside it."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class TinyLM(nn.Module):
    """forward(input_ids, attention_mask, labels) like a Hugging Face model; computes its own loss."""

    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        self.embed, self.head, self.as_dict = nn.Embedding(50, 16), nn.Linear(16, 50), as_dict

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        logits = self.head(self.embed(input_ids) * attention_mask.unsqueeze(-1))
        loss = None if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits} if self.as_dict else CausalLMOutput(loss, logits)


def token_batch(batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 50, (batch_size, 12), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


@pytest.mark.parametrize("as_dict", [False, True], ids=["attribute", "key"])
def test_a_dict_batch_feeds_model_kwargs_and_the_output_loss_is_the_loss(as_dict: bool) -> None:
    workload = Workload.from_callables(model_fn=lambda: TinyLM(as_dict), batch_fn=token_batch, batch_size=2)
    result = run_trial(workload, TrainConfig(), **WINDOW)
    assert result.status == "ok", result.message
    # The loss the trial recorded is the model's own cross-entropy: near ln(50) at initialisation.
    assert abs(result.losses[0] - torch.log(torch.tensor(50.0)).item()) < 0.5


def test_explicit_callables_still_win_over_the_conventions() -> None:
    seen: list[str] = []

    def forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
        seen.append("forward")
        return model(batch["input_ids"], batch["attention_mask"])  # no labels: the model returns no loss

    def loss_fn(output: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append("loss")
        return output.logits.float().pow(2).mean() * 0.0 + 7.0

    workload = Workload.from_callables(
        model_fn=TinyLM, batch_fn=token_batch, forward_fn=forward, loss_fn=loss_fn, batch_size=2
    )
    result = run_trial(workload, TrainConfig(), **WINDOW)
    assert result.status == "ok", result.message
    assert result.losses[0] == pytest.approx(7.0)
    assert "forward" in seen and "loss" in seen


def test_an_output_without_loss_and_no_loss_fn_says_what_to_pass() -> None:
    workload = Workload.from_callables(
        model_fn=lambda: nn.Linear(4, 2), batch_fn=lambda n, gen: (torch.randn(n, 4, generator=gen),)
    )
    with pytest.raises(WorkloadError, match=r"output \(Tensor\) has no 'loss' attribute or key.*pass loss_fn="):
        run_trial(workload, TrainConfig(), **WINDOW)


# --- batch_fn arity -------------------------------------------------------------------------------


def test_a_one_argument_batch_fn_works_and_is_reproducible() -> None:
    workload = Workload.from_callables(
        model_fn=lambda: nn.Linear(8, 2),
        loss_fn=lambda output, batch: nn.functional.cross_entropy(output, batch[1]),
        batch_fn=lambda batch_size: (torch.randn(batch_size, 8), torch.randint(0, 2, (batch_size,))),
        batch_size=4,
    )
    first = run_trial(workload, TrainConfig(), **WINDOW)
    second = run_trial(workload, TrainConfig(), **WINDOW)
    assert first.status == "ok", first.message
    assert first.losses == second.losses  # same seed, same batches, even from the global generator
    a, b = (next(workload.batches(TrainConfig(seed=s))) for s in (0, 1))
    assert not torch.equal(a[0], b[0])  # and the seed still matters


@pytest.mark.parametrize(
    "batch_fn",
    [lambda: None, lambda batch_size, generator, extra: None, lambda *, batch_size: None],
    ids=["none", "three", "keyword-only"],
)
def test_a_batch_fn_of_another_signature_is_refused_with_the_expected_one(batch_fn: Any) -> None:
    with pytest.raises(WorkloadError, match=r"expected batch_fn\(batch_size\) or batch_fn\(batch_size, generator\)"):
        Workload.from_callables(model_fn=lambda: nn.Linear(2, 2), loss_fn=lambda o, b: o.sum(), batch_fn=batch_fn)


# --- checkpoint_target typos ------------------------------------------------------------------------


class ViTLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attention(self.norm(x))


class AttentionPooler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense, self.activation = nn.Linear(8, 8), nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x))


class TinyViT(nn.Module):
    """More classes alphabetically before 'ViTLayer' than an 8-name list shows."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Conv1d(1, 1, 1), nn.BatchNorm1d(1), nn.Dropout(0.0), nn.GELU(), nn.Identity())
        self.layers = nn.ModuleList(ViTLayer() for _ in range(4))
        self.pool, self.head = AttentionPooler(), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(self.pool(x))


def test_a_typo_in_checkpoint_target_suggests_the_close_match_and_the_repeated_blocks() -> None:
    from workbench.levers.checkpointing import apply_activation_checkpointing

    with pytest.raises(ConfigError) as caught:
        apply_activation_checkpointing(TinyViT(), "full", "VitLayer")
    message = str(caught.value)
    assert "Did you mean 'ViTLayer'?" in message
    assert "Repeated blocks here: Linear (x6), LayerNorm (x4)" in message
    assert "\n" not in message


# --- a loss that reads tensor values ----------------------------------------------------------------


def matcher_loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    """DETR's Hungarian matcher reads its cost matrix back as Python values to pick the pairs."""
    cost = torch.cdist(output.detach(), batch[1])
    pairs = cost.argmin(dim=1).tolist()
    return ((output - batch[1][pairs]) ** 2).mean()


def matcher_workload() -> Workload:
    return Workload.from_callables(
        model_fn=lambda: nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)),
        loss_fn=matcher_loss,
        batch_fn=lambda n, gen: (torch.randn(n, 8, generator=gen), torch.randn(n, 4, generator=gen)),
        batch_size=4,
    )


def test_estimate_memory_on_a_data_dependent_loss_measures_one_real_step() -> None:
    estimate = estimate_memory(matcher_workload(), TrainConfig(), batch_size=6)
    assert any("measured on one real CPU step" in note and "reads tensor values" in note for note in estimate.notes)
    # Truth: the same step measured by a real trial, whose memory reading is one tracked steady step.
    measured = run_trial(matcher_workload(), TrainConfig(batch_size=6), **WINDOW)
    assert measured.status == "ok", measured.message
    assert estimate.batch_size == 6
    assert estimate.peak_bytes == measured.peak_memory_bytes
    on_gpu = estimate_memory(matcher_workload(), TrainConfig(), device_name="H100", batch_size=6)
    assert on_gpu.peak_bytes > estimate.peak_bytes  # allocator rounding and workspaces on top


def test_max_batch_size_on_a_data_dependent_loss_says_why_it_cannot_search() -> None:
    with pytest.raises(ConfigError, match=r"cannot search the largest batch: the step reads tensor values"):
        max_batch_size(matcher_workload(), TrainConfig(), device_name="H100")


# --- intra-op threads ------------------------------------------------------------------------------


class ThreadProbe(nn.Module):
    """Records how many intra-op threads each forward ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.seen = nn.Linear(4, 2), []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return self.linear(x)


def test_intra_op_threads_hold_for_the_step_are_recorded_and_restored() -> None:
    probes: list[ThreadProbe] = []

    def model() -> ThreadProbe:
        probes.append(ThreadProbe())
        return probes[-1]

    workload = Workload.from_callables(
        model_fn=model,
        loss_fn=lambda output, batch: output.sum(),
        batch_fn=lambda n, gen: (torch.randn(n, 4, generator=gen),),
        batch_size=2,
    )
    before = torch.get_num_threads()
    result = run_trial(workload, TrainConfig(intra_op_threads=1), **WINDOW)
    assert result.status == "ok", result.message
    assert set(probes[-1].seen) == {1}
    assert torch.get_num_threads() == before
    assert [a["value"] for a in result.applied if a["toggle"] == "intra_op_threads"] == [1]
    default = run_trial(workload, TrainConfig(), **WINDOW)
    assert [a["value"] for a in default.applied if a["toggle"] == "intra_op_threads"] == [before]


def test_intra_op_threads_must_be_a_positive_integer() -> None:
    with pytest.raises(ConfigError, match="intra_op_threads must be >= 1"):
        TrainConfig(intra_op_threads=0)


def test_a_mapping_batch_like_a_tokenizers_batch_encoding_is_fed_and_moved_too() -> None:
    from collections import UserDict

    class BatchEncoding(UserDict):  # transformers' tokenizer output is a UserDict, not a dict
        pass

    workload = Workload.from_callables(
        model_fn=TinyLM, batch_fn=lambda n, gen: BatchEncoding(token_batch(n, gen)), batch_size=2
    )
    result = run_trial(workload, TrainConfig(), **WINDOW)
    assert result.status == "ok", result.message
    assert workload.samples_in(next(workload.batches(TrainConfig()))) == 2
