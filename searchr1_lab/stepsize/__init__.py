"""The step-size study's analysis: does LLDS delay the collapse of GRPO training by its mechanism, or only because the
policy takes smaller steps? Runs of GRPO, LLDS and step-size-matched controls (GRPO at a lower learning rate, GRPO with
a larger KL coefficient, an NLL anchor) are labelled by when their held-out EM collapses and compared as survival data.

``registration.py`` reads the registration (arms, learning rates, seeds, directories) that the grid driver runs and
refuses to run before it is registered; ``survival.py`` holds the survival statistics (Kaplan-Meier, log-rank,
restricted mean survival time and its bootstrap difference); ``analysis.py`` the collapse label, the measured step size,
the cells' survival, the registered hypotheses and their sensitivity to the label; ``alarms.py`` the early-warning
alarms at a matched false-alarm rate. All of it is pure: compact run records
(:func:`searchr1_lab.compact.read_runs`) and a registration dict in, numbers out.
"""

from searchr1_lab.stepsize.alarms import STUDY_ALARMS, ScoreWindow, alarm_study, matched_threshold
from searchr1_lab.stepsize.analysis import (cell_survival, collapse_time, compare_arms, hypotheses, run_points,
                                            sensitivity_table, step_size)
from searchr1_lab.stepsize.survival import kaplan_meier, logrank, rmst, rmst_difference

__all__ = ["STUDY_ALARMS", "ScoreWindow", "alarm_study", "matched_threshold", "cell_survival", "collapse_time",
           "compare_arms", "hypotheses", "run_points", "sensitivity_table", "step_size", "kaplan_meier", "logrank",
           "rmst", "rmst_difference"]
