"""The lever layout: old import paths still work (with a warning), and every lever is whole."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter: a module imported once by another test would not warn again here."""
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_old_optimizations_package_warns_and_forwards_to_levers() -> None:
    warned = _run("import workbench.optimizations")
    assert warned.returncode != 0 and "workbench.levers" in warned.stderr, warned.stderr[-2000:]
    same = _run(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import importlib, sys\n"
        "old = importlib.import_module('workbench.optimizations.offload')\n"
        "assert old is sys.modules['workbench.levers.offload'], old\n"
        "from workbench.optimizations import build\n"
        "from workbench.levers import build as new_build\n"
        "assert build is new_build, build  # the function, as before\n"
        "print('ok')"
    )
    assert same.stdout.strip() == "ok", same.stderr[-2000:]


def test_the_moved_device_functions_warn_and_forward_to_levers() -> None:
    from workbench import levers

    moved = {"capabilities": "workbench.levers", "check_config": "workbench.levers",
             "capabilities_report": "workbench.levers", "world_size_availability": "workbench.levers.distributed",
             "MEMORY_BUDGETS_SHOWN": "workbench.levers.memory_budget"}  # fmt: skip
    for name, home in moved.items():
        warned = _run(f"import workbench.device as d; d.{name}")
        assert warned.returncode != 0 and f"{home}.{name}" in warned.stderr, warned.stderr[-2000:]
        forwarded = _run(
            "import warnings; warnings.simplefilter('ignore')\n"
            f"import workbench.device as d, {home} as new\nassert d.{name} is new.{name}\nprint('ok')"
        )
        assert forwarded.stdout.strip() == "ok", forwarded.stderr[-2000:]
    assert all(callable(getattr(levers, name)) for name in ("capabilities", "check_config", "capabilities_report"))


def test_device_facts_never_reach_up_into_the_levers_but_for_the_shim() -> None:
    """Layers point one way: device.py names levers only in its deprecation shim (the table of
    moved names and `__getattr__`), never in an import or a string elsewhere."""
    import ast
    import inspect

    from workbench import device

    tree = ast.parse(inspect.getsource(device))
    shim = [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
        or (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_MOVED_TO_LEVERS")
    ]
    assert len(shim) == 2
    in_shim = {id(node) for part in shim for node in ast.walk(part)}
    reaching_up = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Constant))
        and any(up in ast.unparse(node) for up in ("workbench.levers", "workbench.optimizations"))
        and id(node) not in in_shim
        and not (isinstance(node, ast.Constant) and node is tree.body[0].value)  # the module docstring
    ]
    assert reaching_up == []


# --- every lever is whole --------------------------------------------------------------------


def test_every_lever_declares_every_part() -> None:
    import torch

    from workbench.levers import LEVERS

    for lever in LEVERS:
        assert lever.name and lever.fields and lever.summary.strip(), lever
        table = lever.availability(torch.device("cpu"))
        for name in lever.fields:
            listed = name in table and len(table[name]) > 0
            assert listed != (name in lever.open_fields), f"{lever.name}: {name} listed or open, not both"
        assert set(table) <= set(lever.fields), f"{lever.name} lists fields it does not own: {set(table)}"
        assert (lever.snippet is not None) != bool(lever.not_exported.strip()), lever.name
        assert (lever.space is not None) != bool(lever.not_searched.strip()), lever.name
        assert (lever.apply is not None) != bool(lever.not_in_step.strip()), lever.name
        assert set(lever.fixed) <= set(lever.fields) and all(why.strip() for why in lever.fixed.values()), lever


def test_a_space_file_may_name_every_lever_field_but_the_fixed_ones_which_it_refuses_with_their_reason() -> None:
    """The tuner's searchable fields are the levers' (not a list of its own): a field a lever keeps
    fixed is refused quoting that lever's reason, any other one is accepted."""
    from workbench.config import ConfigError, TrainConfig
    from workbench.levers import LEVERS
    from workbench.tune import user_space

    baseline = TrainConfig()
    for lever in LEVERS:
        for name in lever.fields:
            if name in lever.fixed:
                with pytest.raises(ConfigError, match=re.escape(lever.fixed[name])):
                    user_space({name: [getattr(baseline, name)]}, "cpu")
            elif getattr(baseline, name) is not None:
                space = user_space({name: [getattr(baseline, name)]}, "cpu")
                assert space.values == {name: (getattr(baseline, name),)}, name
    # a lever not in the default space says a space file may name it: it may
    assert user_space({"intra_op_threads": [1, 2]}, "cpu").searched == {"intra_op_threads": (1, 2)}


def test_build_applies_the_levers_in_the_registrys_order_and_nothing_else() -> None:
    """Every record in a step's `applied` comes from a lever's own `apply`, in registry order."""
    from workbench.config import TrainConfig
    from workbench.levers import LEVERS, build
    from workbench.levers.registry import lever_of
    from workbench.workloads import load_workload

    config = TrainConfig(
        channels_last=True, activation_checkpointing="full", grad_accumulation=2, amp="bf16",
        activation_memory_budget=0.5, compile="default", compile_backend="aot_eager", intra_op_threads=1,
        attention_backend="math",
    )  # fmt: skip
    step = build(load_workload("bev-perception", "tiny"), config, "cpu")
    order = [LEVERS.index(lever_of(record.toggle)) for record in step.applied]
    assert order == sorted(order), [record.toggle for record in step.applied]
    applied = {lever_of(record.toggle).name for record in step.applied}
    expected = {"channels_last", "activation_checkpointing", "batching", "amp", "fp32_precision",
                "intra_op_threads", "activation_memory_budget", "compile", "optimizer", "attention_backend"}  # fmt: skip
    assert applied == expected


def test_every_config_field_but_seed_lr_extra_is_owned_by_exactly_one_lever() -> None:
    import dataclasses

    from workbench.config import TrainConfig
    from workbench.levers import LEVERS
    from workbench.levers.registry import NOT_LEVERS

    owned = [name for lever in LEVERS for name in lever.fields]
    assert len(owned) == len(set(owned)), sorted(n for n in owned if owned.count(n) > 1)
    config_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(owned) == config_fields - set(NOT_LEVERS)
    assert set(NOT_LEVERS) == {"seed", "lr", "extra"}


def test_pytorchs_defaults_run_here_so_a_default_config_is_checked_without_probing() -> None:
    """`check_config` probes only the levers a config changes; that is sound because every lever's
    default value is available (by the full table), and a changed value is still refused."""
    from workbench.config import ConfigError, TrainConfig
    from workbench.levers import capabilities, check_config

    default = TrainConfig()
    for name, table in capabilities("cpu").items():
        value = getattr(default, name)
        assert value not in table or table[value].available, (name, value, table[value].reason)
    code = (
        "import sys\nfrom workbench.config import TrainConfig\nfrom workbench.levers import check_config\n"
        "check_config(TrainConfig(), 'cpu')\nprint('torch._dynamo' in sys.modules)"
    )
    assert _run(code).stdout.strip() == "False"  # the compile and fused-optimizer probes import the compiler
    refused = [(name, v) for name, table in capabilities("cpu").items() for v, a in table.items() if not a.available]
    assert refused, "this CPU refuses nothing: the refusals below prove nothing"
    checked = 0
    for name, value in refused:
        try:
            config = TrainConfig(**{name: value})
        except ConfigError:
            continue  # refused on its own already (e.g. float8 without compile)
        with pytest.raises(ConfigError, match=f"{name}={value} is not available on cpu"):
            check_config(config, "cpu")
        checked += 1
    assert checked >= 5, refused


def test_the_levers_spaces_give_only_values_this_device_runs() -> None:
    """The default space against the device's own table: nothing it refuses is tried."""
    from workbench.levers import capabilities
    from workbench.tune.space import default_space

    caps = capabilities("cpu")
    space = default_space(16, "cpu", cpu_cores=2)
    for name, values in space.values.items():
        for value in values:
            availability = caps.get(name, {}).get(value)
            assert availability is None or availability.available, (name, value)


# --- the documented example lever --------------------------------------------------------------


def _documented_lever() -> Any:
    """Run the Python block of docs/levers/adding-a-lever.md as a module; return its LEVER."""
    import re
    import types
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "levers" / "adding-a-lever.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    module = types.ModuleType("freeze_embeddings")
    sys.modules[module.__name__] = module  # dataclasses and annotations look their module up
    try:
        exec(compile(code, "adding-a-lever.md", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module.LEVER


def test_the_documented_lever_registers_builds_and_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import torch
    from torch import nn

    from workbench.config import TrainConfig
    from workbench.export import to_snippet
    from workbench.levers import build, registry
    from workbench.workloads import Workload

    lever = _documented_lever()
    # The doc's "add the field to TrainConfig", done for this test only.
    toy_config = dataclasses.make_dataclass(
        "ToyConfig", [("freeze_embeddings", bool, False)], bases=(TrainConfig,), frozen=True
    )
    at = registry.LEVERS.index(registry.lever_of("strategy"))
    monkeypatch.setattr(registry, "LEVERS", (*registry.LEVERS[:at], lever, *registry.LEVERS[at:]))

    def model_fn() -> nn.Module:
        return nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(16 * 4, 3))

    def batch_fn(size: int, generator: torch.Generator) -> Any:
        return torch.randint(0, 50, (size, 4), generator=generator), torch.randint(0, 3, (size,), generator=generator)

    workload = Workload.from_callables(
        model_fn, lambda out, batch: nn.functional.cross_entropy(out, batch[1]), batch_fn=batch_fn, name="toy"
    )
    step = build(workload, toy_config(freeze_embeddings=True), "cpu")
    embedding, linear = step.base_model[0].weight, step.base_model[2].weight
    before = embedding.detach().clone(), linear.detach().clone()
    batch = step.prepare_batch(batch_fn(8, torch.Generator().manual_seed(0)))
    step([batch])
    assert torch.equal(embedding, before[0]) and not torch.equal(linear, before[1])
    assert any(a.toggle == "freeze_embeddings" for a in step.applied)
    untouched = build(workload, toy_config(freeze_embeddings=False), "cpu")
    untouched([untouched.prepare_batch(batch)])
    assert not torch.equal(untouched.base_model[0].weight, before[0])  # the lever, not the model, froze it
    snippet = to_snippet(toy_config(freeze_embeddings=True), device="cpu")
    assert "module.requires_grad_(False)" in snippet
    assert snippet.index("requires_grad_(False)") < snippet.index("def make_optimizer")
