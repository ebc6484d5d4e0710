"""The auto-tuner: search the levers for the fastest configuration that fits, then verify it.

`tune()` builds its space from `TrainConfig` and `capabilities()`, screens with an Optuna
study, measures contenders with the one comparison protocol (successive halving over its
rounds) and picks the winner by the comparison's own rule. It keeps no statistics of its own.
"""

from workbench.callable_module import make_callable
from workbench.tune.objective import DEFAULT_PLANNED_STEPS, Objective, pareto_front
from workbench.tune.result import TuneResult
from workbench.tune.search import MIN_BUDGET_S, tune
from workbench.tune.space import SearchSpace, check_space, default_space, load_space_file, user_space

__all__ = [
    "DEFAULT_PLANNED_STEPS",
    "MIN_BUDGET_S",
    "Objective",
    "SearchSpace",
    "TuneResult",
    "check_space",
    "default_space",
    "load_space_file",
    "pareto_front",
    "tune",
    "user_space",
]

make_callable(__name__, tune)  # wb.tune(...) runs the tuner; wb.tune.tune is the same function
