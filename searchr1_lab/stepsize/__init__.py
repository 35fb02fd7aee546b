"""The step-size study's analysis: does LLDS delay the collapse of GRPO training by its mechanism, or only because the
policy takes smaller steps? Runs of GRPO, LLDS and step-size-matched controls (GRPO at a lower learning rate, GRPO with
a larger KL coefficient, an NLL anchor) are labelled by when their held-out EM collapses and compared as survival data
(the statistics: :mod:`searchr1_lab.stats`; the registration the grid driver runs and the report command every
registered study shares: :mod:`searchr1_lab.registered`).

``analysis.py`` holds the collapse label, the measured step size, the cells' survival, the registered hypotheses and
their sensitivity to the label; ``alarms.py`` the early-warning alarms at a matched false-alarm rate. All of it is
pure: compact run records (:func:`searchr1_lab.compact.read_runs`) and a registration dict in, numbers out.
"""

from searchr1_lab.stepsize.alarms import STUDY_ALARMS, ScoreWindow, alarm_study, matched_threshold
from searchr1_lab.stepsize.analysis import (cell_survival, collapse_time, compare_arms, hypotheses, run_points,
                                            sensitivity_table, step_size)

__all__ = ["STUDY_ALARMS", "ScoreWindow", "alarm_study", "matched_threshold", "cell_survival", "collapse_time",
           "compare_arms", "hypotheses", "run_points", "sensitivity_table", "step_size"]
