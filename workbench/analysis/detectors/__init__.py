"""The diagnosis's detectors: one module per finding, listed in `registry.DETECTORS`.

Each module says what it reads from a `TrialResult`, when its finding fires (with the evidence
numbers) and what it recommends; `analysis.diagnose` iterates the registry, as `levers.build`
iterates the levers. Adding a finding = one module + one registry line.
"""
