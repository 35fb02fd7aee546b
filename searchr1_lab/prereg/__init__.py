"""The pre-registered death-spiral study (docs/lab/preregistration.md, .json): ``registration.py`` reads the
registration, checks every run against it and runs the registered analysis; ``detection.py`` the held-out collapse
label and the alarms it scores; ``report.py`` the report, its figures and the README block. The registration names
the analysis code by the paths it had at the registered commit (``searchr1_lab/prereg.py`` and
``detection.py``); that commit pins the code, these modules are the same code moved here.

Public entry: :func:`main`, the ``python -m searchr1_lab prereg-report`` command.
"""

from searchr1_lab.prereg.report import main

__all__ = ["main"]
