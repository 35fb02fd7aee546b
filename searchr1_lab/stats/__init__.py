"""The statistics every study uses, named for what they compute (pure: numbers in, numbers out).

- ``survival.py``: runs as time to a collapse: the Kaplan-Meier curve, the log-rank test, the restricted mean survival
  time (RMST) and a bootstrap interval of a difference of RMSTs.
- ``smallsample.py``: what holds with a handful of runs per arm: Student's t, Welch's difference of means, the exact
  permutation test, Holm's adjustment, equivalence by an interval, and each run's restricted survival time.
- ``bootstrap.py``: seeded bootstrap intervals of a mean or a difference of means, and of held-out EM resampling the
  questions' subjects (the unit of independence), not the questions.
- ``proportions.py``: Wilson's interval of a share and Newcombe's of a difference of two shares.
"""
