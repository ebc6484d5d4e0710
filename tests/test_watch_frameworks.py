"""The Lightning and Hugging Face Trainer callbacks on tiny real models trained a few steps (the real
libraries, no mocks): every step marked, the data wait of a dataset slowed on purpose seen, the
loss kept, the run ended (failed, with the error and its line, when training fails)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench.store import Store
from workbench.store.watched import watch_steps, watched_runs

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_SLEEP_S = 0.01
BATCH = 4


class SlowDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Each sample waits, as a JPEG decode would: BATCH x 10 ms of data wait per step."""

    def __init__(self, size: int = 64, as_dict: bool = False) -> None:
        self.size, self.as_dict = size, as_dict

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        time.sleep(SAMPLE_SLEEP_S)
        x = torch.randn(8, generator=torch.Generator().manual_seed(index))
        if self.as_dict:
            return {"input_ids": torch.randint(0, 50, (6,), generator=torch.Generator().manual_seed(index)),
                    "labels": torch.tensor(index % 2)}  # fmt: skip
        return x, torch.tensor(float(index % 2))


def the_run(store: Path, name: str):  # type: ignore[no-untyped-def]
    with Store(store) as db:
        (run,) = watched_runs(db, name=name)
        return run, watch_steps(db, run.run_id, recent=True)


def lightning_fit(store: Path, name: str, fail_at: int = -1, size: int = 64, **options: Any) -> Any:
    """A tiny real Lightning fit over `SlowDataset`, watched; `options` go to the Trainer. Returns it."""
    import lightning

    from workbench.watch.lightning import WatchCallback

    class Tiny(lightning.LightningModule):
        def __init__(self, fail_at: int = -1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            if batch_idx == self.hparams.fail_at:
                raise RuntimeError("loss went NaN at step 5")
            x, y = batch
            return torch.nn.functional.mse_loss(self(x).squeeze(-1), y)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.layer(x)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = WatchCallback(name, store=store, warmup=2, flush_s=0.2)
    trainer = lightning.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        **options,
    )
    trainer.fit(Tiny(fail_at), torch.utils.data.DataLoader(SlowDataset(size), batch_size=BATCH))
    return trainer


# Lightning 2.6 itself calls a torch pytree API that torch 2.13 deprecates; not ours to fix.
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_lightning_callback_watches_a_fit(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    lightning_fit(tmp_path / "h.sqlite", "lit", max_steps=12)
    run, rows = the_run(tmp_path / "h.sqlite", "lit")
    assert run.status == "ended" and not run.message and run.last_step == 12
    assert run.config["fail_at"] == -1, "the module's hparams are the job's configuration"
    expected = BATCH * SAMPLE_SLEEP_S * 1000
    assert expected * 0.8 <= run.summary["steady_data_ms"] <= expected * 4, run.summary
    assert all(r.loss is not None for r in rows), rows
    assert rows[-1].forward_ms is not None, rows

    with pytest.raises(RuntimeError, match="NaN"):
        lightning_fit(tmp_path / "h.sqlite", "lit-fails", fail_at=5, max_steps=12)
    failed, _ = the_run(tmp_path / "h.sqlite", "lit-fails")
    assert failed.status == "failed" and "RuntimeError: loss went NaN at step 5" in failed.message
    assert "test_watch_frameworks.py" in failed.message and failed.last_step == 5, failed.message


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_lightning_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    """accumulate_grad_batches=2: two batches make one optimizer step, so one stored step whose data
    wait is both batches' fetches (not two steps of one fetch each)."""
    pytest.importorskip("lightning")
    trainer = lightning_fit(tmp_path / "h.sqlite", "lit-acc", size=96, max_steps=10, accumulate_grad_batches=2)
    run, rows = the_run(tmp_path / "h.sqlite", "lit-acc")
    assert run.status == "ended" and run.last_step == 10 == trainer.global_step
    assert [r.first_step for r in rows] == list(range(1, 11))
    two_fetches = 2 * BATCH * SAMPLE_SLEEP_S * 1000
    assert two_fetches * 0.8 <= run.summary["steady_data_ms"] <= two_fetches * 3, run.summary
    assert all(r.loss is not None for r in rows), rows


def test_hugging_face_trainer_callback_watches_training(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from workbench.watch.hf import WatchCallback

    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=12, per_device_train_batch_size=BATCH,
                                          logging_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                                          disable_tqdm=True, dataloader_num_workers=0)  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=SlowDataset(as_dict=True),
                                   callbacks=[WatchCallback("hf", store=tmp_path / "h.sqlite", warmup=2, flush_s=0.2)])  # fmt: skip
    trainer.train()
    run, rows = the_run(tmp_path / "h.sqlite", "hf")
    assert run.status == "ended" and run.last_step == 12 and run.config["max_steps"] == 12
    expected = BATCH * SAMPLE_SLEEP_S * 1000
    assert expected * 0.8 <= run.summary["steady_data_ms"] <= expected * 4, run.summary
    assert sum(r.loss is not None for r in rows) >= 5, "the logged losses (every 2 steps) are kept"
    assert rows[-1].forward_ms is not None and rows[-1].optimizer_ms is not None


HF_CRASH = """
import sys, torch, transformers
from workbench.watch.hf import WatchCallback

FAIL_AT = int(sys.argv[3])


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.calls = 0

    def forward(self, x, labels):
        self.calls += 1
        if self.calls == FAIL_AT:
            raise RuntimeError(f"corrupt batch in forward {self.calls}")  # the line the run names
        return {"loss": torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), labels)}


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return {"x": torch.randn(8), "labels": torch.tensor(float(i % 2))}


args = transformers.TrainingArguments(output_dir=sys.argv[2], max_steps=40, per_device_train_batch_size=4,
                                      logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                                      disable_tqdm=True, dataloader_num_workers=0)
# flush_s=30: no flush of its own before the crash; what is stored is what the crash's flush wrote
watch = WatchCallback("hf-crash", store=sys.argv[1], flush_s=30)
transformers.Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=[watch]).train()
"""


def test_hugging_face_trainer_that_crashes_keeps_every_step_and_reads_failed(tmp_path: Path) -> None:
    """The Trainer has no callback for a crash: the exception ends the process unhandled, and the watch's
    exception hook writes the steps run so far and the failure before Python prints the traceback."""
    pytest.importorskip("transformers")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(HF_CRASH))
    fail_at = 9  # the 9th forward raises: steps 1-8 ran, step 9 never ends
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script), str(tmp_path / "h.sqlite"), str(tmp_path / "out"), str(fail_at)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and "RuntimeError: corrupt batch in forward 9" in done.stderr, done.stderr[-3000:]
    line = next(i for i, text in enumerate(textwrap.dedent(HF_CRASH).splitlines(), 1) if "corrupt batch" in text)

    run, rows = the_run(tmp_path / "h.sqlite", "hf-crash")
    assert run.status == "failed" and run.last_step == fail_at - 1, run
    assert [r.first_step for r in rows] == list(range(1, fail_at)), rows
    assert run.message == f"RuntimeError: corrupt batch in forward 9, at {script}:{line} in forward", run.message


def test_an_optimizer_step_that_runs_forward_and_backward_itself_gets_no_negative_phase(tmp_path: Path) -> None:
    """optimizer.step(closure) (LBFGS, Lightning's loop): the step hooks wrap the forward, so backward
    has no edge: it is left out rather than stored negative."""
    import workbench as wb

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        return loss

    with wb.watch(model, opt, name="closure", store=tmp_path / "h.sqlite", flush_s=0.2, warmup=0) as w:
        for _ in range(5):
            w.step(loss=opt.step(closure))
    _, rows = the_run(tmp_path / "h.sqlite", "closure")
    assert len(rows) == 5 and all(r.forward_ms is not None and r.forward_ms >= 0 for r in rows)
    assert all(r.backward_ms is None and r.optimizer_ms is None for r in rows), rows
