"""The step-size study: is LLDS's delay of the death spiral its mechanism or only smaller steps? GRPO, LLDS and
step-size-matched controls over long runs, registered before its grid (:mod:`.registration`)."""
