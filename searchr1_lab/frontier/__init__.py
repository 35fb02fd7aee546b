"""The learning-stability frontier: every collapse fix at its doses in one registered grid, scored on two axes at
once, how much a run learns (held-out utility) and how long it lasts (survival to a collapse), with each method's best
dose chosen on validation and scored once on test (``python -m searchr1_lab frontier-report``; the registration:
docs/lab/frontier/registration.json).

``endpoints`` (per run and per cell: utility, survival, final validation EM), ``pareto`` (the frontier of a set of
points), ``selection`` (each method's dose chosen on validation, its test score with subject-clustered intervals),
``figures`` and ``report`` (the report, its figures and the README block).
"""
