"""Whether a run can start and what it will take, before the first GPU-hour: the checks and the report of
``train.py --preflight`` (run.py) and the memory arithmetic they plan with (memory_plan.py)."""
