"""What every registered study shares: ``registration.py`` reads a registration (arms, learning rates, seeds,
directories; ``docs/lab/<study>/registration.json``), which the grid driver runs and refuses to run before it is
registered; ``report.py`` is the report command of any registered study (:class:`report.StudyReport`: the summary,
the report, the figures and the README block), whatever its analysis. A study's own analysis stays in its folder
(``stepsize/``, ``frontier/``)."""
