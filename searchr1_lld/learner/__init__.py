"""The learner: the GRPO + LLDS training loop, its step, and their set-up (policy, reference, optimiser, batching,
log-probs, the weight stream to the rollout engine, memory plan and preflight)."""
