"""When the warm start's copy circuit forms: the drill phase of a world's warm start from a fresh model, without and
with the repeat phase (``warmstart_repeat_steps``: random-token sequences repeated once) in front, on the same drills
and held-out probes, in one run (``--repeat-steps``: one variant per length).

    .venv/bin/python benchmarks/bench_copy_formation.py [--world .cache/world] [--repeat-steps 0,600]
        [--drill-steps 1500] [--check-every 100] [--threshold 0.8] [key=value world overrides ...]

The world (built by ``python -m searchr1_lld.world build``) gives the corpus, the index, the training questions, the
tokenizer and the recipe (its ``world.json``; overrides change it). The drills are the short-context stage only
(``warmstart_drill_prompt_share=0``), all ``--drill-steps`` of them (the stage targets are set to 1 so that no stage
ends early); every ``--check-every`` steps the teacher-forced copy accuracy on the held-out probes is measured
(``warm_start.copy_accuracy``). Per variant (``repeat0``, ``repeat<N>``):

    RESULT copy_step_<kind>_<variant> S       (first drill step with accuracy >= --threshold; nan: never)
    RESULT copy_final_<kind>_<variant> A      (accuracy at the last check)
    RESULT copy_seconds_<variant> T           (wall time of the repeat and drill phases; a shared machine slows both)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default=str(ROOT / ".cache" / "world"))
    parser.add_argument("--repeat-steps", default="0,600",
                        help="comma-separated repeat-phase lengths, one variant each")
    parser.add_argument("--drill-steps", type=int, default=1500)
    parser.add_argument("--check-every", type=int, default=100)
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("overrides", nargs="*", help="world config key=value")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from retriever.inprocess import InProcessRetriever
    from searchr1_lld.data.jsonl import read_jsonl
    from searchr1_lld.world import warm_start as WS
    from searchr1_lld.world import load_world_config, read_card
    from searchr1_lld.world.drills import COPY_DRILL_KINDS, build_copy_drills, build_drill_probes

    world = Path(args.world)
    card = read_card(world)
    if card is None:
        raise SystemExit(f"{world} holds no built world (python -m searchr1_lld.world build --out {world})")
    base = load_world_config(overrides=args.overrides, values=card["config"])
    cfg = dataclasses.replace(base, warmstart_drills=args.drill_steps * base.warmstart_drill_batch_size,
                              warmstart_drill_prompt_share=0.0, warmstart_drill_answer_first=0.0,
                              warmstart_drill_check_every=args.check_every, warmstart_drill_subject_target=1.0,
                              warmstart_drill_answer_target=1.0, warmstart_drill_bridge_target=0.0,
                              warmstart_traj_drill_weight=0.0)
    rows, passages = read_jsonl(world / "qa" / "train.jsonl"), read_jsonl(world / "corpus.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(str(world / "tokenizer"))
    search = InProcessRetriever(world / "index").search
    drills = build_copy_drills(rows, search, tokenizer, cfg, passages=passages)
    probes = build_drill_probes(rows, search, tokenizer, cfg, cfg.warmstart_drill_probes, passages=passages)
    one_step = drills["short"][:cfg.warmstart_batch_size]  # the trajectory phase: one unmeasured step, no practice
    for repeat in (int(n) for n in args.repeat_steps.split(",")):
        variant = f"repeat{repeat}"
        c = dataclasses.replace(cfg, warmstart_repeat_steps=repeat)
        start = time.perf_counter()
        stats = WS.warm_start(WS.make_model(c, tokenizer), one_step, c, pad_id=tokenizer.pad_token_id,
                              batch_size=c.warmstart_batch_size, progress=True, drills=drills, probes=probes,
                              repeat_tokens=WS.repeat_vocabulary(tokenizer))
        seconds = time.perf_counter() - start
        for check in stats["drill_checks"]:
            print(f"{variant} step {check['step']}: " + ", ".join(f"{k} {check[k]:.2f}" for k in COPY_DRILL_KINDS),
                  flush=True)
        for kind in COPY_DRILL_KINDS:
            first = next((ch["step"] for ch in stats["drill_checks"] if ch[kind] >= args.threshold), math.nan)
            print(f"RESULT copy_step_{kind}_{variant} {first}")
            print(f"RESULT copy_final_{kind}_{variant} {stats['drill_checks'][-1][kind]:.3f}")
        print(f"RESULT copy_seconds_{variant} {seconds:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
