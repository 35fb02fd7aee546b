"""Whether a run can start and what it will take, before the first GPU-hour: the checks and the report of
``train.py --preflight`` (run.py), the memory arithmetic they plan with (memory_plan.py) and what evaluation
during training costs (eval_plan.py)."""
