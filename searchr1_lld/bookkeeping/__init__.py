"""Run bookkeeping: the run directory and resume safety, checkpoints, the best checkpoint, metrics tracking."""
