"""CPU tests of `workbench.levers`: each toggle checked against an independent observation
(dispatched ops, live tensor storages, saved tensors, optimizer flags), not against its own record."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.config import ConfigError, TrainConfig
from workbench.levers import Applied, TrainStep, build, checkpointed_modules, find_targets, selective_policy
from workbench.levers.attention import apply_attention_backend
from workbench.levers.checkpointing import apply_activation_checkpointing
from workbench.levers.cuda_graphs import apply_cuda_graphs, snapshot_training_state
from workbench.levers.precision import fp32_precision
from workbench.workloads.base import Workload

CPU = torch.device("cpu")

# --- a small conv + attention workload (GroupNorm: per-sample, so gradient accumulation is exact) ---


class ConvBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.GroupNorm(4, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.gelu(self.norm(self.conv1(x))))


class AttnBlock(nn.Module):
    def __init__(self, d: int, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ToyNet(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.backbone = nn.Sequential(ConvBlock(c), ConvBlock(c))
        self.encoder = nn.Sequential(AttnBlock(c), AttnBlock(c))
        self.head = nn.Linear(c, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.backbone(self.stem(x))
        return self.head(self.encoder(features.flatten(2).transpose(1, 2)).mean(1))


def toy_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 16, 16, generator=generator), torch.randn(n, 4, generator=generator)


def toy_loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return F.mse_loss(output, batch[1])


def toy_workload(checkpoint_target: str | None = "ConvBlock") -> Workload:
    return Workload.from_callables(
        ToyNet, toy_loss, batch_fn=toy_batch, batch_size=4, checkpoint_target=checkpoint_target, name="toy"
    )


def make(**changes: Any) -> tuple[TrainStep, Iterator[Any]]:
    config = TrainConfig(**changes)
    step = build(toy_workload(), config, "cpu")
    return step, iter(step.workload.batches(config))


def one_step(step: TrainStep, batches: Iterator[Any], mark: Callable[[str], None] | None = None) -> torch.Tensor:
    micro = [step.prepare_batch(next(batches)) for _ in range(step.config.grad_accumulation)]
    return step(micro, mark)


class OpRecorder(TorchDispatchMode):
    """Records every dispatched aten op with the dtypes of its tensor inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[torch.dtype]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        dtypes = [a.dtype for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
        self.calls.append((str(func.overloadpacket.__name__), dtypes))
        return func(*args, **(kwargs or {}))

    def ops(self) -> set[str]:
        return {name for name, _ in self.calls}


class LiveStorages(TorchDispatchMode):
    """Bytes of the storages that ops allocated inside the block and that are still alive.

    After a forward pass that is exactly the activation memory autograd (and selective
    checkpointing's cache) holds for backward: an allocation-level truth independent of
    the checkpointing code.
    """

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[weakref.ref[Any], int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                self.storages[id(storage)] = (weakref.ref(storage), storage.nbytes())
        return out

    def live_bytes(self) -> int:
        return sum(nbytes for ref, nbytes in self.storages.values() if ref() is not None)


def forward_loss(step: TrainStep, batch: Any) -> torch.Tensor:
    return step.workload.loss_fn(step.workload.forward_fn(step.model, batch), batch)


# --- build and record -------------------------------------------------------------------------


def test_default_build_records_the_optimizer_and_precision_and_seeds_the_model() -> None:
    step, _ = make()
    assert [a.toggle for a in step.applied] == ["optimizer", "matmul_precision", "cudnn_tf32", "intra_op_threads"]
    assert isinstance(step.applied[0], Applied) and "AdamW" in step.applied[0].detail
    assert "no effect on cpu" in step.applied[2].detail
    again, _ = make()
    for p, q in zip(step.model.parameters(), again.model.parameters()):
        assert torch.equal(p, q)
    other, _ = make(seed=1)
    assert not torch.equal(next(step.model.parameters()), next(other.model.parameters()))


def test_mark_order_and_detached_device_loss() -> None:
    step, batches = make(grad_accumulation=2)
    marks: list[str] = []
    loss = one_step(step, batches, marks.append)
    assert marks == ["forward", "backward", "forward", "backward", "optimizer"]
    assert [a.toggle for a in step.applied] == [
        "optimizer",
        "grad_accumulation",
        "matmul_precision",
        "cudnn_tf32",
        "intra_op_threads",
    ]
    assert loss.dim() == 0 and not loss.requires_grad and loss.device == CPU and loss.dtype == torch.float32
    with pytest.raises(ValueError, match="expected 2 micro-batches"):
        step([step.prepare_batch(next(batches))])


def test_grad_accumulation_equals_one_big_batch() -> None:
    big, _ = make(optimizer="sgd", lr=0.1, batch_size=8)
    accumulated, _ = make(optimizer="sgd", lr=0.1, batch_size=4, grad_accumulation=2)
    initial = [p.detach().clone() for p in big.model.parameters()]
    x, y = toy_batch(8, torch.Generator().manual_seed(7))
    loss_big = big([(x, y)])
    loss_acc = accumulated([(x[:4], y[:4]), (x[4:], y[4:])])
    torch.testing.assert_close(loss_acc, loss_big)
    for p, q in zip(big.model.parameters(), accumulated.model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(p, q) for p, q in zip(big.model.parameters(), initial))


# --- channels_last ------------------------------------------------------------------------------


def test_channels_last_converts_conv_weights_and_inputs() -> None:
    step, batches = make(channels_last=True)
    convs = [m for m in step.model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 5
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert not all(c.weight.is_contiguous() for c in convs)
    x, y = step.prepare_batch(next(batches))
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert y.dim() == 2  # non-4-D tensors are left alone
    assert torch.isfinite(step([(x, y)]))
    assert "5/5 4-D parameters" in step.applied[0].detail


# --- activation checkpointing ---------------------------------------------------------------------


def test_class_name_and_glob_targets_wrap_the_expected_modules() -> None:
    model = ToyNet()
    assert find_targets(model, "ConvBlock") == ["backbone.0", "backbone.1"]
    assert find_targets(model, "encoder.*") == ["encoder.0", "encoder.1"]
    # A glob matching a module and everything inside it wraps the outermost module once.
    assert find_targets(model, "backbone*") == ["backbone"]
    keys = list(model.state_dict())
    record = apply_activation_checkpointing(model, "full", "encoder.*")
    assert checkpointed_modules(model) == {"encoder.0": "full", "encoder.1": "full"}
    assert "encoder.0, encoder.1" in record.detail and "AttnBlock" in record.detail
    assert list(model.state_dict()) == keys  # no wrapper segment in parameter names
    # Applying again (or a nested target) never double-wraps.
    apply_activation_checkpointing(model, "selective", "AttnBlock")
    assert checkpointed_modules(model) == {"encoder.0": "full", "encoder.1": "full"}


def test_checkpoint_target_auto_uses_the_workload_and_bad_targets_fail() -> None:
    step, _ = make(activation_checkpointing="full")
    assert set(checkpointed_modules(step.model)) == {"backbone.0", "backbone.1"}
    with pytest.raises(ConfigError, match=r"'Missing' matches no module.*ConvBlock"):
        make(activation_checkpointing="full", checkpoint_target="Missing")
    with pytest.raises(ConfigError, match="names no checkpoint target"):
        build(toy_workload(checkpoint_target=None), TrainConfig(activation_checkpointing="full"), "cpu")


def test_checkpointing_frees_activations_full_below_selective_below_off() -> None:
    live: dict[str, int] = {}
    saved: dict[str, int] = {}
    for policy in ("off", "selective", "full"):
        target = "auto" if policy == "off" else "*"
        step, batches = make(activation_checkpointing=policy, checkpoint_target=target, batch_size=8)
        batch = step.prepare_batch(next(batches))
        sizes: list[int] = []

        def pack(t: torch.Tensor, sizes: list[int] = sizes) -> torch.Tensor:
            sizes.append(t.numel() * t.element_size())
            return t

        tracker = LiveStorages()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), tracker:
            loss = forward_loss(step, batch)
        live[policy], saved[policy] = tracker.live_bytes(), sum(sizes)
        loss.backward()  # the graph is usable: recomputation runs
    # Autograd's saved tensors: checkpointed regions save nothing through the hooks.
    assert saved["full"] < saved["off"] / 4
    # Live activation memory: selective keeps matmul/conv outputs, full keeps block inputs only.
    assert live["full"] < live["selective"] < live["off"]
    assert live["full"] < live["off"] / 4


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_checkpointing_keeps_losses_and_gradients(policy: str) -> None:
    reference, batches_ref = make()
    checkpointed, batches = make(activation_checkpointing=policy, checkpoint_target="*")
    for _ in range(2):
        torch.testing.assert_close(one_step(checkpointed, batches), one_step(reference, batches_ref))
        for p, q in zip(reference.model.parameters(), checkpointed.model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5)


def test_selective_policy_saves_compute_heavy_ops_only() -> None:
    aten = torch.ops.aten
    assert selective_policy(None, aten.mm.default).name == "MUST_SAVE"
    assert selective_policy(None, aten.convolution.default).name == "MUST_SAVE"
    assert selective_policy(None, aten.gelu.default).name == "PREFER_RECOMPUTE"


def test_checkpointed_model_deepcopies_and_pickles() -> None:
    step, batches = make(activation_checkpointing="full")
    clone = copy.deepcopy(step.model)
    assert clone.backbone[0].forward.args[0].__self__ is clone.backbone[0]  # rebound to the copy
    restored = pickle.loads(pickle.dumps(step.model))
    x, _ = next(batches)
    torch.testing.assert_close(restored(x), step.model(x))


# --- AMP ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("amp", "dtype"), [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_amp_sets_the_dtype_matmuls_and_convolutions_see(amp: str, dtype: torch.dtype) -> None:
    step, batches = make(amp=amp)
    batch = step.prepare_batch(next(batches))
    recorder = OpRecorder()
    with recorder:
        loss = step([batch])
    heavy = [dtypes for name, dtypes in recorder.calls if name in ("addmm", "mm", "convolution")]
    assert heavy and all(d == dtype for dtypes in heavy for d in dtypes)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert step.scaler is None


def test_fp16_creates_a_grad_scaler_that_scales_the_loss() -> None:
    step, batches = make(amp="fp16")
    assert isinstance(step.scaler, torch.amp.GradScaler)
    assert torch.isfinite(one_step(step, batches))
    amp_record = next(a for a in step.applied if a.toggle == "amp")
    assert step.scaler.get_scale() > 0 and "GradScaler" in amp_record.detail


# --- optimizer ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer", "impl", "flag", "value"),
    [
        ("adamw", "fused", "fused", True),
        ("adamw", "foreach", "foreach", True),
        ("adamw", "for-loop", "foreach", False),
        ("sgd", "foreach", "foreach", True),
        ("adamw", "default", "foreach", None),  # no flag at all: PyTorch decides, as in a user's script
        ("sgd", "default", "fused", None),
    ],
)
def test_optimizer_implementation_flags(optimizer: str, impl: str, flag: str, value: bool | None) -> None:
    step, batches = make(optimizer=optimizer, optimizer_impl=impl, lr=0.01)
    group = step.optimizer.param_groups[0]
    assert group[flag] is value and group["lr"] == 0.01
    if impl == "default":
        assert group["foreach"] is None and group["fused"] is None
    expected = torch.optim.AdamW if optimizer == "adamw" else torch.optim.SGD
    assert type(step.optimizer) is expected
    if optimizer == "sgd":
        assert group["momentum"] == 0.9
    before = [p.detach().clone() for p in step.model.parameters()]
    one_step(step, batches)
    assert any(not torch.equal(b, p) for b, p in zip(before, step.model.parameters()))
    assert len(step.optimizer.param_groups[0]["params"]) == len(list(step.model.parameters()))


# --- matmul precision and attention backend --------------------------------------------------------


# --- PyTorch's defaults and the float32 precision flags -------------------------------------------

#: Run in a fresh interpreter: what PyTorch does when nobody touched anything.
PYTORCH_UNTOUCHED = """
import json, sys, torch
from torch.utils._python_dispatch import TorchDispatchMode

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

param = torch.nn.Parameter(torch.randn(8, device=sys.argv[1]))
param.grad = torch.ones_like(param)
optimizer = torch.optim.AdamW([param])
with Ops() as ops:
    optimizer.step()
print(json.dumps({
    "matmul_precision": torch.get_float32_matmul_precision(),
    "cudnn_tf32": torch.backends.cudnn.allow_tf32,
    "foreach": any(name.startswith("_foreach_") for name in ops.names),
}))
"""


def pytorch_untouched(device: str) -> dict[str, Any]:
    """A fresh process's float32 flags, and whether a plain AdamW's step ran foreach kernels."""
    proc = subprocess.run([sys.executable, "-c", PYTORCH_UNTOUCHED, device], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return dict(json.loads(proc.stdout))


def flags_now() -> tuple[str, bool]:
    return torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32


def test_defaults_run_what_pytorch_runs_untouched_on_this_device() -> None:
    expected = pytorch_untouched("cpu")
    step, batches = make()
    seen: list[tuple[str, bool]] = []
    step.model.register_forward_pre_hook(lambda module, args: seen.append(flags_now()))
    ops = OpRecorder()
    with fp32_precision("medium", False):  # the caller's own global settings must not reach the trial
        with ops:
            one_step(step, batches)
        assert flags_now() == ("medium", False)
    assert seen == [(expected["matmul_precision"], expected["cudnn_tf32"])]
    ran_foreach = any(name.startswith("_foreach_") for name in ops.ops())
    assert ran_foreach == expected["foreach"]
    records = {a.toggle: a.value for a in step.applied}
    assert records["optimizer"] == "adamw/" + ("foreach" if ran_foreach else "for-loop")
    assert (records["matmul_precision"], records["cudnn_tf32"]) == seen[0]


@pytest.mark.parametrize(
    "changes",
    [{"matmul_precision": "high"}, {"matmul_precision": "medium"}, {"cudnn_tf32": False}],
    ids=["matmul-high", "matmul-medium", "cudnn-tf32-off"],
)
def test_each_precision_toggle_sets_only_its_own_flag_for_the_step(
    changes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # On CPU check_config refuses these (they would change nothing); the flags are what is tested.
    with pytest.raises(ConfigError, match=next(iter(changes))):
        make(**changes)
    monkeypatch.setattr("workbench.levers.registry.check_config", lambda config, device: None)
    default, _ = make()
    step, batches = make(**changes)
    seen: list[tuple[str, bool]] = []
    for built in (default, step):
        built.model.register_forward_pre_hook(lambda module, args: seen.append(flags_now()))
    before = flags_now()
    one_step(default, iter(default.workload.batches(default.config)))
    one_step(step, batches)
    assert flags_now() == before  # restored after each step
    names = ("matmul_precision", "cudnn_tf32")
    expected = {**dict(zip(names, seen[0])), **changes}
    assert seen[1] == tuple(expected[name] for name in names)
    assert [name for name, a, b in zip(names, seen[0], seen[1]) if a != b] == list(changes)
    assert {a.toggle: a.value for a in step.applied if a.toggle in names} == expected


def test_the_precision_context_restores_both_flags_after_a_failing_step() -> None:
    before = flags_now()
    with pytest.raises(RuntimeError), fp32_precision("high", not before[1]):
        assert flags_now() == ("high", not before[1])
        raise RuntimeError("a failing step must restore the precision too")
    assert flags_now() == before


def test_attention_backend_forces_the_kernel() -> None:
    q = torch.randn(1, 2, 8, 8)
    efficient, _ = apply_attention_backend("efficient")
    assert efficient is not None
    with pytest.raises(RuntimeError, match="No viable backend"), efficient():
        F.scaled_dot_product_attention(q, q, q)  # this CPU build has no memory-efficient kernel
    with pytest.raises(ConfigError, match="attention_backend=efficient"):
        make(attention_backend="efficient")

    ops: dict[str, set[str]] = {}
    for backend in ("math", "auto"):  # auto after math: the forced backend did not leak
        step, batches = make(attention_backend=backend)
        recorder = OpRecorder()
        with recorder:
            one_step(step, batches)
        ops[backend] = recorder.ops()
    assert "_scaled_dot_product_flash_attention_for_cpu" in ops["auto"]
    assert "_scaled_dot_product_flash_attention_for_cpu" not in ops["math"] and "bmm" in ops["math"]
    assert apply_attention_backend("auto") == (None, None)


# --- compile ------------------------------------------------------------------------------------


def test_compile_plumbing_with_a_cheap_backend() -> None:
    eager, batches_eager = make()
    compiled, batches = make(
        compile="max-autotune", compile_backend="aot_eager", activation_checkpointing="selective", channels_last=True
    )
    assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled.model._orig_mod is compiled.base_model
    record = compiled.applied[-1]
    assert record.toggle == "compile" and "backend='aot_eager'" in record.detail
    assert "mode 'max-autotune' not passed" in record.detail
    losses = [one_step(compiled, batches) for _ in range(3)]
    reference = [one_step(eager, batches_eager) for _ in range(3)]
    torch.testing.assert_close(torch.stack(losses), torch.stack(reference), rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


# --- CUDA graphs ----------------------------------------------------------------------------------


def test_cuda_graphs_are_refused_without_cuda() -> None:
    with pytest.raises(ConfigError, match="CUDA"):
        make(cuda_graphs=True)
    model = ToyNet()
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        apply_cuda_graphs(lambda batches: torch.zeros(()), model, optimizer, CPU)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_cuda_graph_warmup_is_undone_by_the_snapshot(optimizer: str) -> None:
    """The capture's warm-up steps (run on CPU here: the restore logic is device-independent)
    leave no trace: afterwards the step follows a fresh run's trajectory exactly."""
    fresh, batches = make(optimizer=optimizer, lr=1e-2)
    warmed, _ = make(optimizer=optimizer, lr=1e-2)
    steps = [[next(batches)] for _ in range(3)]
    restore = snapshot_training_state(warmed.model, warmed.optimizer, CPU)
    for _ in range(3):
        warmed.eager_step(steps[0])
    assert not torch.equal(next(warmed.model.parameters()), next(fresh.model.parameters()))
    restore()
    assert [float(warmed(s)) for s in steps] == [float(fresh(s)) for s in steps]


# --- host→device batch copies ------------------------------------------------------------


class _ToCalls(torch.overrides.TorchFunctionMode):
    """Records `Tensor.to` calls and returns the tensor unmoved: the arguments are the subject."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.to:
            self.calls.append({"device": args[1] if len(args) > 1 else None, **(kwargs or {})})
            return args[0]
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("pin_memory", [False, True])
def test_batches_go_to_a_cuda_device_without_blocking(pin_memory: bool) -> None:
    """A blocking host→device copy synchronizes the stream every step, pinned memory or not."""
    step, batches = make()
    step.device = torch.device("cuda")  # only the copy's arguments are built: no CUDA call runs
    step.config = TrainConfig(pin_memory=pin_memory)
    recorder = _ToCalls()
    with recorder:
        step.prepare_batch(next(batches))
    assert len(recorder.calls) == 2  # inputs and targets
    assert all(call["device"] == torch.device("cuda") and call["non_blocking"] is True for call in recorder.calls)


def test_batches_stay_blocking_copies_on_cpu() -> None:
    step, batches = make()
    recorder = _ToCalls()
    with recorder:
        step.prepare_batch(next(batches))
    assert all(call["non_blocking"] is False for call in recorder.calls)
