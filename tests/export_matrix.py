"""The configurations the export tests enumerate, shared by the snippet checks and the contract test.

One table: `test_export` checks that every snippet of it compiles and passes ruff, and
`test_export_contract` runs the ones this machine can run against their trials.
"""

from __future__ import annotations

import itertools

from workbench.config import ConfigError, TrainConfig, field_choices
from workbench.levers import check_config

AXES = ("amp", "compile", "activation_checkpointing", "cuda_graphs", "optimizer_impl", "attention_backend")


def valid_configs() -> list[TrainConfig]:
    """Every valid combination of the main enumerated toggles; the other fields cycle along."""
    axes = [field_choices(name) or () for name in AXES]
    cycled = [
        ("channels_last", (False, True)),
        ("optimizer", ("adamw", "sgd", "adamw")),
        ("matmul_precision", ("highest", "high", "medium", "high")),
        ("cudnn_tf32", (True, False, True)),
        ("grad_accumulation", (1, 2, 3, 1, 4)),
        ("checkpoint_target", ("auto", "Block", "encoder.*")),
        ("compile_backend", ("inductor", "eager", "inductor", "aot_eager", "inductor", "inductor")),
        ("compile_fullgraph", (False, True, False)),
        ("compile_dynamic", (None, True, False, None)),
        ("num_workers", (0, 2, 0, 4, 1)),
        ("pin_memory", (False, True, False)),
        ("batch_size", (None, 16, None, 7)),
    ]
    configs = []
    for i, values in enumerate(itertools.product(*axes)):
        fields = dict(zip(AXES, values))
        fields.update({name: choices[i % len(choices)] for name, choices in cycled})
        if fields["activation_checkpointing"] == "off":
            fields["checkpoint_target"] = "auto"
        if fields["compile"] == "off":
            fields.update(compile_backend="inductor", compile_fullgraph=False, compile_dynamic=None)
        if fields["num_workers"]:
            fields.update(prefetch_factor=(None, 3)[i % 2], persistent_workers=i % 3 == 0)
        try:
            configs.append(TrainConfig(**fields))
        except ConfigError:
            continue  # a combination TrainConfig rejects (e.g. cuda_graphs with fp16)
    return configs


def runnable_configs(device: str) -> list[TrainConfig]:
    """The valid configurations `device` can run, by the workbench's own `check_config`."""
    runnable = []
    for config in valid_configs():
        try:
            check_config(config, device)
        except ConfigError:
            continue  # e.g. CUDA graphs, or TF32 precision, on a CPU
        runnable.append(config)
    return runnable
