"""The demo's study: its settings chosen on validation, the warm start a candidate (``selection.py``), and its
report, claim, figure and README line (``report.py``). Its runs come from the lab's resumable driver
(``lab/grid.py``, ``--demo``).

Public entry: the ``python -m searchr1_lab.demo`` command (:mod:`searchr1_lab.demo`), which composes the two.
"""
