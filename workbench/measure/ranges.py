"""The names of the `record_function` ranges each profiled step carries (one per phase).

Written once here because the profiler's tables, the memory timeline and the NVTX ranges all
find a step's phases by these names.
"""

RANGE_PREFIX = "workbench::"
"""Every range the workbench opens starts with this, so a user's own ranges never count as ours."""
COMPUTE_PHASES = ("forward", "backward", "optimizer", "step")
