"""The synthetic world's policy: a ``Qwen2ForCausalLM`` of a few million parameters sized by ``WorldConfig``, warm-started
by a short supervised phase (copy drills, then trajectories, :mod:`.trajectories` / :mod:`.drills`). The loss weights
generated tokens 1 and prompt/observation tokens ``warmstart_env_loss_weight`` (a little "pretraining" on copy-rich
text). Like a real base model the result follows the protocol often but not always, and answers correctly only
sometimes.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Callable

import torch

from searchr1_lld.rollout.inference import evaluating
from searchr1_lld.data.prompts import TAG_TOKENS
from searchr1_lld.world.config import WorldConfig
from searchr1_lld.world.drills import build_copy_drills, build_drill_probes, build_practice_drills
from searchr1_lld.world.generate import name_word_groups
from searchr1_lld.world.tokenizer import corpus_years, one_token_share, tokenizer_training_texts, train_tokenizer
from searchr1_lld.world.trajectories import SearchFn, build_warmstart_examples



def make_model(cfg: WorldConfig, tokenizer, max_positions: int = 4096, seed: int | None = None):
    """A fresh ``Qwen2ForCausalLM`` sized by ``cfg`` for ``tokenizer`` (tied embeddings, fp32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if cfg.model_hidden_size % cfg.model_heads:
        raise ValueError("model_hidden_size must be divisible by model_heads")
    if cfg.model_heads % cfg.model_kv_heads:
        raise ValueError("model_heads must be divisible by model_kv_heads")
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.model_hidden_size, intermediate_size=cfg.model_intermediate_size,
        num_hidden_layers=cfg.model_layers, num_attention_heads=cfg.model_heads,
        num_key_value_heads=cfg.model_kv_heads, max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0, use_cache=True,
    )
    torch.manual_seed(cfg.seed if seed is None else seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())




def masked_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy averaged over target tokens with ``loss_mask == 1``.

    logits [B, T, V], input_ids [B, T], loss_mask [B, T] (1 where token t is a generated token to learn).
    loss = sum_{b, t>=1} mask[b,t] * -log softmax(logits[b,t-1])[ids[b,t]] / sum mask[b, 1:]
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].float()
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (nll * mask).sum() / mask.sum().clamp_min(1.0)


def generated_token_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         loss_mask: torch.Tensor) -> torch.Tensor:
    """Weighted next-token cross-entropy; the LM head runs only on the positions whose target has a weight > 0.

    ``loss_mask`` [B, T] holds per-token *weights* (``_batches``: 1 on generated tokens, ``warmstart_env_loss_weight``
    on prompt/observation tokens, 0 on padding): loss = sum_t w[t+1] * nll[t] / sum_t w[t+1]. With a 0/1 mask this is
    ``masked_lm_loss(model(input_ids).logits, input_ids, loss_mask)``; the LM head then skips the unmasked positions
    (with env weight > 0 nearly every position has a weight, and the saving is only the padding).
    """
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
    weights = loss_mask[:, 1:].float()  # [B, T-1]: position t predicts token t+1 with this weight
    select = weights > 0
    logits = model.lm_head(hidden[:, :-1][select])  # [N, V]
    nll = torch.nn.functional.cross_entropy(logits.float(), input_ids[:, 1:][select], reduction="none")  # [N]
    return (nll * weights[select]).sum() / weights[select].sum().clamp_min(1e-8)


def _batches(examples: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, rng: random.Random,
             env_weight: float = 0.0):
    """Length-bucketed padded batches (input_ids, attention_mask, loss_weight) in a random order.

    loss_weight [B, T] float: 1 on generated tokens, ``env_weight`` on prompt/observation tokens, 0 on padding."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(chunks)
    for chunk in chunks:
        width = max(len(examples[i][0]) for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        lmask = torch.zeros((len(chunk), width), dtype=torch.float)
        for row, i in enumerate(chunk):
            x, m = examples[i]
            ids[row, : len(x)] = torch.tensor(x)
            attn[row, : len(x)] = 1
            gen = torch.tensor(m, dtype=torch.float)
            lmask[row, : len(x)] = gen + env_weight * (1.0 - gen)
        yield ids, attn, lmask


REPEAT_BATCH_SIZE = 32  # sequences per step of the repeat phase


def repeat_vocabulary(tokenizer) -> list[int]:
    """The token ids the repeat phase draws from: every id of ``tokenizer`` but its special tokens (eos, pad) and
    the protocol's tags (``prompts.TAG_TOKENS``), which only the trajectories may teach."""
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.convert_tokens_to_ids(list(TAG_TOKENS)))
    return [i for i in range(len(tokenizer)) if i not in excluded]


def repeat_batches(token_ids: list[int], batch_size: int, max_length: int, generator: torch.Generator):
    """Endless batches of random token sequences, each repeated once: (input_ids [B, 2L], attention_mask [B, 2L],
    loss_weight [B, 2L]), ``L`` drawn per batch in ``[max_length // 2, max_length]``, the tokens uniformly from
    ``token_ids``. The weight is 1 on the repeat's tokens after its first (which follows nothing predictable), 0
    elsewhere: once the repeat starts, the token that followed the current one the first time is the next one, so
    only a copy circuit lowers the loss."""
    vocab = torch.tensor(token_ids, dtype=torch.long)
    while True:
        length = int(torch.randint(max(1, max_length // 2), max_length + 1, (1,), generator=generator))
        first = vocab[torch.randint(len(vocab), (batch_size, length), generator=generator)]  # [B, L]
        ids = torch.cat([first, first], dim=1)  # [B, 2L]
        weight = torch.zeros(ids.shape, dtype=torch.float)
        weight[:, length + 1:] = 1.0
        yield ids, torch.ones_like(ids), weight


def copy_accuracy(model, probes: dict[str, list[tuple[list[int], list[int]]]], pad_id: int,
                  batch_size: int = 32) -> dict[str, float]:
    """Teacher-forced copy accuracy per drill kind: the share of probe drills whose generated segment (the think
    line and the copied query or answer) the model predicts token for token (argmax at every generated position)."""
    acc = {}
    with evaluating(model):
        for kind, examples in probes.items():
            if not examples:
                continue
            right = 0
            for ids, attn, lmask in _batches(examples, batch_size, pad_id, random.Random(0)):
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
                target, scored = ids[:, 1:], lmask[:, 1:] > 0
                wrong = (logits.argmax(-1) != target) & scored
                right += int((~wrong.any(dim=1)).sum())
            acc[kind] = right / len(examples)
    return acc


def _train_phase(model, opt, batches, steps: int, lr_at: Callable[[int], float], bar,
                 loss_of: Callable[[Any], torch.Tensor] | None = None) -> list[float]:
    """Run ``steps`` AdamW steps over ``batches`` (lr from ``lr_at(step)``), the loss ``loss_of(batch)``
    (default: ``generated_token_loss`` of a batch ``(input_ids, attention_mask, loss_weight)``); the losses."""
    losses: list[float] = []
    for step, batch in enumerate(batches):
        if step >= steps:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = loss_of(batch) if loss_of else generated_token_loss(model, *batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def _stage_targets(name: str, last: bool, cfg: WorldConfig) -> dict[str, float]:
    """The copy accuracies that end drill stage ``name`` (``last``: the curriculum's last stage; see
    :func:`warm_start`): the answer's in every stage (the answer copy forms after the query copy, and a stage that
    ended on the query alone left it unformed), the subject query's in every stage but ``answer``, the bridge
    query's in the last."""
    targets = {"subject_query": cfg.warmstart_drill_subject_target} if name != "answer" else {}
    targets["answer"] = cfg.warmstart_drill_answer_target
    if last and cfg.warmstart_drill_bridge_target > 0:
        targets["bridge_query"] = cfg.warmstart_drill_bridge_target
    return targets


class _DrillPhase:
    """The drill phase of :func:`warm_start`, stage after stage on one optimiser and one batch-order ``rng``: its
    losses (one per step), its copy-accuracy checks and how each stage stopped."""

    def __init__(self, model, opt, cfg: WorldConfig, pad_id: int, rng: random.Random, bar,
                 probes: dict[str, dict[str, list[tuple[list[int], list[int]]]]] | None):
        self.model, self.opt, self.cfg, self.pad_id, self.rng, self.bar = model, opt, cfg, pad_id, rng, bar
        self.probes = probes
        self.check_every = cfg.warmstart_drill_check_every if probes else 0
        self.losses: list[float] = []
        self.checks: list[dict[str, Any]] = []
        self.stops: dict[str, str] = {}

    def run(self, drills: dict[str, list[tuple[list[int], list[int]]]], budget: int) -> None:
        """Every stage in order: all but the last use their drills once at most, the last what is left of
        ``budget`` steps; linear warmup over the first 10% of ``budget``."""
        drill_bs = self.cfg.warmstart_drill_batch_size
        warmup = max(1, budget // 10)
        for si, (name, stage) in enumerate(drills.items()):
            last = si == len(drills) - 1
            stage_budget = (budget - len(self.losses)) if last else math.ceil(len(stage) / drill_bs)
            batches = _cycle(lambda: _batches(stage, drill_bs, self.pad_id, self.rng))
            self.stops[name] = self._stage(name, batches, stage_budget, warmup, _stage_targets(name, last, self.cfg))

    def _stage(self, name: str, batches, stage_budget: int, warmup: int, targets: dict[str, float]) -> str:
        """Train one stage until its targets are met (checked every ``check_every`` steps) or its budget is used;
        returns which."""
        context = "full" if name == "full" else "short"
        done = 0
        while done < stage_budget:
            n = min(self.check_every or stage_budget, stage_budget - done)
            start = len(self.losses)
            self.losses += _train_phase(self.model, self.opt, batches, n,
                                        lambda s: self.cfg.warmstart_drill_lr * min(1.0, (start + s + 1) / warmup),
                                        self.bar)
            done += n
            if self.check_every:
                acc = copy_accuracy(self.model, self.probes[context], self.pad_id)
                self.checks.append({"step": len(self.losses), "stage": name, "context": context, **acc})
                self.bar.set_postfix(**{k[:7]: f"{v:.2f}" for k, v in acc.items()})
                if all(acc.get(kind, 0.0) >= target for kind, target in targets.items()):
                    return "targets met"
        return "budget used"


def _repeat_phase(model, opt, cfg: WorldConfig, repeat_tokens: list[int], bar) -> list[float]:
    """``cfg.warmstart_repeat_steps`` steps of :func:`repeat_batches` over ``repeat_tokens``, lr
    ``cfg.warmstart_drill_lr`` after a linear warmup of 50 steps; the losses (none when the phase is off)."""
    if not cfg.warmstart_repeat_steps:
        return []
    if not repeat_tokens:
        raise ValueError("warmstart_repeat_steps > 0 needs the tokens to draw from (repeat_tokens)")
    batches = repeat_batches(list(repeat_tokens), REPEAT_BATCH_SIZE, cfg.warmstart_repeat_length,
                             torch.Generator().manual_seed(cfg.seed + 5))
    return _train_phase(model, opt, batches, cfg.warmstart_repeat_steps,
                        lambda s: cfg.warmstart_drill_lr * min(1.0, (s + 1) / 50), bar)


def trajectory_steps(num_examples: int, batch_size: int, cfg: WorldConfig) -> int:
    """Optimiser steps of the trajectory phase: ``cfg.warmstart_epochs`` passes over ``num_examples`` in batches of
    ``batch_size``."""
    return math.ceil(num_examples / batch_size) * cfg.warmstart_epochs


def _trajectory_phase(model, opt, examples: list[tuple[list[int], list[int]]], cfg: WorldConfig, *, steps: int,
                      batch_size: int, pad_id: int, rng: random.Random, warmup: int, bar,
                      practice: list[tuple[list[int], list[int]]] = ()) -> list[float]:
    """``cfg.warmstart_epochs`` epochs of the trajectories, peak lr ``cfg.warmstart_lr`` with ``warmup`` steps (0 =
    none) and cosine decay to 0 over ``steps``; the losses. With ``cfg.warmstart_traj_drill_weight`` > 0 every
    step's loss adds that weight x the loss of a batch of ``cfg.warmstart_drill_batch_size`` ``practice`` drills
    (cycled; the losses are then the sums; the weight without drills is refused)."""
    lr = cfg.warmstart_lr

    def traj_lr(s: int) -> float:
        return lr * min(1.0, (s + 1) / warmup if warmup else 1.0) * 0.5 * (1 + math.cos(math.pi * s / steps))

    def traj_batches():
        for _ in range(cfg.warmstart_epochs):
            yield from _batches(examples, batch_size, pad_id, rng, cfg.warmstart_env_loss_weight)

    weight = cfg.warmstart_traj_drill_weight
    if not weight:
        return _train_phase(model, opt, traj_batches(), steps, traj_lr, bar)
    if not practice:
        raise ValueError("warmstart_traj_drill_weight > 0 needs the drills to practise (practice)")
    drill_batches = _cycle(lambda: _batches(practice, cfg.warmstart_drill_batch_size, pad_id, rng))

    def loss_of(pair) -> torch.Tensor:
        trajectories, drills = pair
        return generated_token_loss(model, *trajectories) + weight * generated_token_loss(model, *drills)
    return _train_phase(model, opt, zip(traj_batches(), drill_batches), steps, traj_lr, bar, loss_of)


def warm_start(model, examples: list[tuple[list[int], list[int]]], cfg: WorldConfig, *, pad_id: int,
               batch_size: int = 16, progress: bool = True,
               drills: list[list[tuple[list[int], list[int]]]] = (), probes: dict[str, dict[str, list]] | None = None,
               repeat_tokens: list[int] = (), practice: list[tuple[list[int], list[int]]] = ()) -> dict[str, Any]:
    """Supervised phase: random-token repeats over ``repeat_tokens`` (:func:`_repeat_phase`: only copying lowers
    their loss), copy drills (``build_copy_drills``) at lr ``cfg.warmstart_drill_lr``, then whole trajectories at
    peak lr ``cfg.warmstart_lr`` (lower: a high lr there undoes the copying), one AdamW.

    Drill phase: the curriculum's stages in order (``build_copy_drills``), batches of
    ``cfg.warmstart_drill_batch_size``, linear warmup over the first 10% of the drill-step budget (all drills once),
    then constant. With ``probes`` (``build_drill_probes``) and ``cfg.warmstart_drill_check_every`` > 0 a stage
    ends on evidence: every that many steps the teacher-forced copy accuracy (``copy_accuracy``) on the stage's
    held-out probes (short / full context) is measured, and the stage ends once its targets are met: ``answer``
    the answer accuracy ``cfg.warmstart_drill_answer_target``, ``short`` and the last stage (``full``) that and the
    subject-query accuracy ``cfg.warmstart_drill_subject_target``, the last also ``cfg.warmstart_drill_bridge_target``
    when > 0. Every stage but the last may use its drills once; the last gets what is left of the budget, cycling.
    (The copy circuit forms in a phase change whose step varies from run to run: a fixed count stopped some builds
    before it, docs/lab.md.)
    Trajectory phase: ``cfg.warmstart_epochs`` epochs of batches of ``batch_size``, cosine decay to 0 (with its own
    warmup when there are no drills). The loss is the LM loss on generated tokens (weight 1) plus, at weight
    ``cfg.warmstart_env_loss_weight``, on the prompt and observation tokens of the trajectories (a little
    "pretraining" on copy-rich text; drills weight only their generated segment), plus, with ``practice`` drills
    (``build_practice_drills``) and ``cfg.warmstart_traj_drill_weight`` > 0, that weight x a batch of them.
    Returns ``{"first_loss", "final_loss", "steps", "tokens", "repeat_steps", "repeat_final_loss", "drill_steps",
    "drill_final_loss", "drill_stop", "drill_checks"}`` (final = mean of the last 10% of the trajectory phase;
    ``repeat_final_loss``: mean of the repeat phase's last 20 steps, NaN without one; ``drill_stop``: stage name ->
    ``targets met`` / ``budget used``; ``drill_checks``: every measurement,
    ``{step, stage, context, <kind>: accuracy}``).
    """
    from tqdm.auto import tqdm

    if not examples:
        raise ValueError("no warm-start examples")
    rng = random.Random(cfg.seed + 2)
    drills = {name: stage for name, stage in (drills or {}).items() if stage}
    budget = sum(math.ceil(len(stage) / cfg.warmstart_drill_batch_size) for stage in drills.values())
    traj_steps = trajectory_steps(len(examples), batch_size, cfg)
    repeat_steps = cfg.warmstart_repeat_steps
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warmstart_lr, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    bar = tqdm(total=repeat_steps + budget + traj_steps, desc="warm start", disable=not progress, leave=False)
    repeat_losses = _repeat_phase(model, opt, cfg, repeat_tokens, bar)
    drill = _DrillPhase(model, opt, cfg, pad_id, rng, bar, probes)
    drill.run(drills, budget)
    bar.total = repeat_steps + len(drill.losses) + traj_steps
    bar.refresh()
    losses = _trajectory_phase(model, opt, examples, cfg, steps=traj_steps, batch_size=batch_size, pad_id=pad_id,
                               rng=rng, warmup=0 if drills else max(1, traj_steps // 10), bar=bar,
                               practice=practice)
    bar.close()
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    drill_tail = drill.losses[-max(1, len(drill.losses) // 10):]
    return {"first_loss": losses[0], "final_loss": sum(tail) / len(tail), "steps": len(losses),
            "tokens": sum(len(x) for x, _ in examples) * cfg.warmstart_epochs,
            "repeat_steps": len(repeat_losses),
            "repeat_final_loss": sum(repeat_losses[-20:]) / len(repeat_losses[-20:]) if repeat_losses else math.nan,
            "drill_steps": len(drill.losses),
            "drill_final_loss": sum(drill_tail) / len(drill_tail) if drill.losses else float("nan"),
            "drill_stop": drill.stops, "drill_checks": drill.checks}


def _cycle(make_iter: Callable[[], Any]):
    """Endless iteration: ``make_iter()`` again each time it is exhausted (a new random batch order per pass)."""
    while True:
        yield from make_iter()


def _same_call_once(search: SearchFn) -> SearchFn:
    """``search`` that retrieves each distinct (queries, topk) call once and returns its earlier result again (the
    same call, so the same hits as retrieving anew)."""
    done: dict[tuple[tuple[str, ...], int], list[list[dict]]] = {}

    def cached(queries: list[str], topk: int) -> list[list[dict]]:
        key = (tuple(queries), topk)
        if key not in done:
            done[key] = search(queries, topk)
        return done[key]
    return cached


def build_tiny_policy(out_dir: str | Path, passages: list[dict], train_rows: list[dict], search: SearchFn,
                      cfg: WorldConfig, *, progress: bool = True) -> dict[str, Any]:
    """Train the tokenizer (``out_dir/tokenizer``) and the warm-started model (``out_dir/model``); return stats."""
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    tok_dir, model_dir = out_dir / "tokenizer", out_dir / "model"
    years = corpus_years([p["contents"] for p in passages]) if cfg.tokenizer_year_tokens else []
    tokenizer = train_tokenizer(tokenizer_training_texts(passages, train_rows), cfg.tokenizer_vocab_size, tok_dir,
                                year_tokens=years)
    model = make_model(cfg, tokenizer)
    search = _same_call_once(search)  # the drills and their probes retrieve the same queries
    with tqdm(total=1, desc="warm-start data", disable=not progress, leave=False) as bar:
        examples = build_warmstart_examples(train_rows, search, tokenizer, cfg, passages=passages)
        drills = build_copy_drills(train_rows, search, tokenizer, cfg, passages=passages)
        practice = (build_practice_drills(train_rows, search, tokenizer, cfg, cfg.warmstart_drill_batch_size
                                          * trajectory_steps(len(examples), cfg.warmstart_batch_size, cfg),
                                          passages=passages)
                    if cfg.warmstart_traj_drill_weight > 0 else [])
        probes = (build_drill_probes(train_rows, search, tokenizer, cfg, cfg.warmstart_drill_probes, passages=passages)
                  if drills and cfg.warmstart_drill_check_every > 0 else None)
        bar.update(1)
    stats = warm_start(model, examples, cfg, pad_id=tokenizer.pad_token_id, batch_size=cfg.warmstart_batch_size,
                       progress=progress, drills=drills, probes=probes, repeat_tokens=repeat_vocabulary(tokenizer),
                       practice=practice)
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))  # the model dir is self-contained too
    lengths = [len(x) for x, _ in examples]
    return {
        **stats,
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "name_words_one_token": one_token_share(
            tokenizer, sorted({w for words in name_word_groups(passages).values() for w in words})),
        "examples": len(examples),
        "drills": sum(len(stage) for stage in drills.values()),
        "mean_example_tokens": sum(lengths) / len(lengths),
        "max_example_tokens": max(lengths),
    }


