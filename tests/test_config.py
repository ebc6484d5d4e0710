"""TrainConfig: every bad value and impossible combination fails with a message that says how to fix it."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.config import ConfigError, TrainConfig, field_choices, field_doc, field_names, parse_overrides


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"amp": "fp8"}, "amp='fp8' is not valid; choose one of: fp32, bf16, fp16"),
        ({"compile": "fast"}, "choose one of: off, default, reduce-overhead"),
        ({"activation_checkpointing": "some"}, "choose one of: off, full, selective"),
        ({"optimizer": "lamb"}, "choose one of: adamw, sgd"),
        ({"optimizer_impl": "cuda"}, "default, for-loop, foreach, fused"),
        ({"cudnn_tf32": "off"}, "cudnn_tf32 must be true or false"),
        ({"attention_backend": "xformers"}, "auto, math, efficient, flash, cudnn"),
        ({"matmul_precision": "tf32"}, "highest, high, medium"),
        ({"channels_last": "yes"}, "channels_last must be true or false"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"grad_accumulation": 0}, "grad_accumulation must be >= 1"),
        ({"num_workers": -1}, "num_workers must be >= 0"),
        ({"seed": -3}, "seed must be >= 0"),
        ({"lr": 0}, "lr must be a positive number"),
        ({"lr": "fast"}, "lr must be a positive number"),
        ({"lr": float("inf")}, "lr must be a positive number, and finite, got inf"),
        ({"extra": [1]}, "extra must be a dict"),
        ({"compile_backend": ""}, "compile_backend must be a backend name"),
    ],
)
def test_bad_values_name_the_valid_choices(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**changes)


@pytest.mark.parametrize(
    ("changes", "fix"),
    [
        ({"compile_fullgraph": True}, "set compile=default"),
        ({"compile_dynamic": False}, "set compile=default"),
        ({"compile_backend": "eager"}, "set compile=default"),
        ({"checkpoint_target": "ResBlock"}, "set activation_checkpointing=full or selective"),
        ({"cuda_graphs": True, "compile": "reduce-overhead"}, "already captures CUDA graphs"),
        ({"cuda_graphs": True, "compile": "max-autotune"}, "already captures CUDA graphs"),
        ({"cuda_graphs": True, "amp": "fp16"}, "use amp=bf16"),
        ({"cuda_graphs": True, "activation_checkpointing": "full"}, "turn one of them off"),
        ({"prefetch_factor": 4}, "prefetch_factor needs num_workers > 0"),
        ({"persistent_workers": True}, "persistent_workers needs num_workers > 0"),
    ],
)
def test_impossible_combinations_say_how_to_fix(changes: dict, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        TrainConfig(**changes)


def test_valid_combinations_pass() -> None:
    TrainConfig(cuda_graphs=True, compile="max-autotune-no-cudagraphs", amp="bf16")
    TrainConfig(num_workers=2, prefetch_factor=4, persistent_workers=True, pin_memory=True)
    TrainConfig(activation_checkpointing="selective", checkpoint_target="encoder.*")


def test_json_round_trip_keeps_every_field() -> None:
    config = TrainConfig(
        amp="bf16", compile="default", compile_dynamic=False, channels_last=True, batch_size=4,
        num_workers=2, prefetch_factor=3, extra={"sample_cost_ms": 5.0},
    )  # fmt: skip
    again = TrainConfig.from_json(config.to_json())
    assert again == config
    assert again.to_dict() == config.to_dict()


def test_from_dict_rejects_unknown_fields_and_non_dicts() -> None:
    with pytest.raises(ConfigError, match=r"unknown config field.*ampp.*valid fields: amp"):
        TrainConfig.from_dict({"ampp": "bf16"})
    with pytest.raises(ConfigError, match="must be a dict"):
        TrainConfig.from_dict(["amp"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="does not parse"):
        TrainConfig.from_json("{amp: bf16")


def test_diff_lists_changed_fields_only() -> None:
    a = TrainConfig()
    b = TrainConfig(amp="bf16", channels_last=True)
    assert a.diff(b) == {"amp": ("fp32", "bf16"), "channels_last": (False, True)}
    assert a.diff(a) == {}
    assert b.describe() == "amp=bf16, channels_last=True"


def test_overrides_are_typed_by_field() -> None:
    parsed = parse_overrides(
        "amp=bf16, channels_last=true,batch_size=8,lr=3e-4,compile_dynamic=none,extra.sample_cost_ms=2.5"
    )
    assert parsed == {
        "amp": "bf16", "channels_last": True, "batch_size": 8, "lr": 3e-4,
        "compile_dynamic": None, "extra": {"sample_cost_ms": 2.5},
    }  # fmt: skip
    with pytest.raises(ConfigError, match="unknown config field 'colour'"):
        parse_overrides("colour=red")
    with pytest.raises(ConfigError, match="is not key=value"):
        parse_overrides("amp")
    with pytest.raises(ConfigError, match="batch_size must be an integer, got 'big'"):
        parse_overrides("batch_size=big")
    with pytest.raises(ConfigError, match="channels_last must be true or false"):
        parse_overrides("channels_last=maybe")


def test_extra_overrides_merge_across_calls() -> None:
    config = TrainConfig().with_overrides("extra.sample_cost_ms=5").with_overrides("extra.slow_step_ms=2")
    assert config.extra == {"sample_cost_ms": 5, "slow_step_ms": 2}


def test_config_is_frozen_and_replace_validates() -> None:
    config = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.amp = "bf16"  # type: ignore[misc]
    with pytest.raises(ConfigError):
        config.replace(amp="fp64")
    with pytest.raises(ConfigError, match="unknown config field"):
        config.replace(colour="red")


def test_every_field_has_a_docstring_and_enumerations_are_listed() -> None:
    for name in field_names():
        assert len(field_doc(name)) > 15, f"{name} has no docstring under its field"
    assert field_choices("amp") == ("fp32", "bf16", "fp16")
    assert field_choices("cuda_graphs") == (False, True)
    assert field_choices("compile_dynamic") == (None, False, True)
    assert field_choices("batch_size") is None


def test_configs_stored_under_the_old_defaults_still_load() -> None:
    """Before PyTorch's defaults: every field written out, a for-loop optimizer, no cudnn_tf32 field."""
    old = {**TrainConfig().to_dict(), "optimizer_impl": "for-loop", "matmul_precision": "highest"}
    del old["cudnn_tf32"]
    loaded = TrainConfig.from_dict(old)
    assert loaded.optimizer_impl == "for-loop" and loaded.matmul_precision == "highest" and loaded.cudnn_tf32
    assert loaded.describe() == "optimizer_impl=for-loop"  # not the defaults any more: it says what it ran
    assert TrainConfig.from_dict({**old, "matmul_precision": "high"}).matmul_precision == "high"


def test_precision_toggles_parse_as_the_cli_types_them() -> None:
    config = TrainConfig().with_overrides("cudnn_tf32=off,matmul_precision=high,optimizer_impl=default")
    assert (config.cudnn_tf32, config.matmul_precision, config.optimizer_impl) == (False, "high", "default")
    assert TrainConfig().diff(config) == {"cudnn_tf32": (True, False), "matmul_precision": ("highest", "high")}


# --- distributed fields -------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "fix"),
    [
        ({"nproc_per_node": 2}, "set strategy=ddp"),
        ({"nnodes": 2, "rdzv_endpoint": "node0:29500"}, "set strategy=ddp"),
        ({"ddp_bucket_cap_mb": 5}, "applies to strategy=ddp only.*set strategy=ddp or drop ddp_bucket_cap_mb"),
        ({"strategy": "fsdp2", "comm_hook": "fp16"}, "comm_hook=fp16 applies to strategy=ddp only"),
        ({"strategy": "ddp", "ddp_static_graph": True, "fsdp_reshard_after_forward": False}, "strategy=fsdp2 only"),
        ({"strategy": "ddp", "fsdp_param_dtype": "bf16"}, "set strategy=fsdp2 or drop fsdp_param_dtype"),
        ({"strategy": "ddp", "nnodes": 2}, "nnodes=2 needs rdzv_endpoint=HOST:PORT"),
        ({"strategy": "ddp", "rdzv_endpoint": "node0"}, "is not HOST:PORT"),
        ({"strategy": "ddp", "rdzv_endpoint": "node0:99999"}, "is not HOST:PORT"),
        ({"strategy": "ddp", "cuda_graphs": True}, "turn one of them off"),
        ({"strategy": "fsdp2", "grad_accumulation": 2}, "raise batch_size instead"),
        ({"strategy": "fsdp2", "fsdp_param_dtype": "bf16", "amp": "fp16"}, "use amp=bf16"),
    ],
)
def test_distributed_fields_belong_to_their_strategy(changes: dict, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        TrainConfig(**changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"strategy": "horovod"}, "choose one of: none, ddp, fsdp2"),
        ({"strategy": "ddp", "comm_hook": "int8"}, "choose one of: none, fp16, bf16"),
        ({"strategy": "ddp", "nproc_per_node": 0}, "nproc_per_node must be >= 1"),
        ({"strategy": "ddp", "nnodes": 1.5}, "nnodes must be an integer"),
        ({"strategy": "ddp", "ddp_bucket_cap_mb": 0}, "ddp_bucket_cap_mb must be a positive number"),
        ({"strategy": "ddp", "ddp_bucket_cap_mb": True}, "ddp_bucket_cap_mb must be a positive number"),
        ({"strategy": "ddp", "rdzv_endpoint": 29500}, "rdzv_endpoint must be a 'HOST:PORT' string"),
    ],
)
def test_bad_distributed_values_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)


def test_distributed_configs_parse_from_the_command_line_and_round_trip() -> None:
    text = "strategy=ddp,nproc_per_node=4,rdzv_endpoint=node0:29500,nnodes=2,ddp_bucket_cap_mb=2.5,comm_hook=fp16"
    config = TrainConfig().with_overrides(text)
    assert (config.nproc_per_node, config.nnodes, config.ddp_bucket_cap_mb) == (4, 2, 2.5)
    assert isinstance(config.ddp_bucket_cap_mb, float)
    assert TrainConfig.from_json(config.to_json()) == config
    fsdp = TrainConfig(strategy="fsdp2", nproc_per_node=2, fsdp_reshard_after_forward=False, fsdp_param_dtype="bf16")
    assert TrainConfig.from_json(fsdp.to_json()) == fsdp
    assert field_choices("strategy") == ("none", "ddp", "fsdp2")
    assert "GLOBAL batch" in field_doc("strategy")
