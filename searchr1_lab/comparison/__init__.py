"""The comparison at matched tuning (docs/lab.md): GRPO and LLDS share every setting, the learning rate is chosen per
method on validation, test EM is computed once per run. ``claims.py`` computes the selection, the intervals over
subjects and seeds and the detector's scores from the compact results alone; ``report.py`` writes the report, its
figures and the README block. Its runs come from the lab's resumable driver (``lab/grid.py``).

Public entry: :func:`main`, the ``python -m searchr1_lab report`` command.
"""

from searchr1_lab.comparison.report import main

__all__ = ["main"]
