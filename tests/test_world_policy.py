"""The tiny tokenizer and warm-started Qwen2 policy: save/load round trips, exact rollout rendering, warm-start loss."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from searchr1_lld.world import drills as DR
from searchr1_lld.world import measure as ME
from searchr1_lld.world import tokenizer as TOK
from searchr1_lld.world import trajectories as TR
from searchr1_lld.world import warm_start as WS
from searchr1_lld.world.generate import passage_title
from searchr1_lld.data.jsonl import read_jsonl
from searchr1_lld.data import prompts as P

# ---------------------------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------------------------


def _sample_texts(world: Path) -> list[str]:
    corpus = read_jsonl(world / "corpus.jsonl")
    rows = read_jsonl(world / "qa" / "test.jsonl")
    return ([d["contents"] for d in corpus] + [P.render_prompt(r["question"]) for r in rows]
            + [P.format_observation(corpus[:3]), P.INVALID_ACTION_MESSAGE,
               "<think> ok </think>\n<search> Café Ørsted 1873 </search><answer> naïve — ünïcode </answer>"])


def test_every_corpus_year_is_one_token_with_its_space(tiny_world: Path, tiny_tokenizer) -> None:
    """A year of the corpus is one token, like a name word (' 1874' after a space); other numbers stay digits."""
    corpus = read_jsonl(tiny_world / "corpus.jsonl")
    years = TOK.corpus_years([p["contents"] for p in corpus])
    assert years and all(len(y) == 4 for y in years)
    for y in years:
        assert len(tiny_tokenizer.encode(f" {y}", add_special_tokens=False)) == 1, y
        ids = tiny_tokenizer.encode(f"<answer> {y} </answer>", add_special_tokens=False)
        assert tiny_tokenizer.decode(ids) == f"<answer> {y} </answer>" and len(ids) == 4
    assert len(tiny_tokenizer.encode(" 45", add_special_tokens=False)) == 3  # other numbers: space + digits
    assert TOK.corpus_years(["born in 1874, 450 km, in 2000 or 19999 and 0999"]) == ["1874", "2000"]


def test_tags_are_single_non_special_tokens(tiny_tokenizer) -> None:
    for tag in P.TAG_TOKENS:
        ids = tiny_tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, tag
        assert tag not in tiny_tokenizer.all_special_tokens
    text = "<think> a </think><search> b </search><answer> c </answer>"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == text  # tags survive, eos does not
    assert tiny_tokenizer.eos_token == TOK.EOS_TOKEN and tiny_tokenizer.pad_token == TOK.PAD_TOKEN
    assert tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id


def test_tokenizer_round_trip_ids_identical(tiny_world: Path, tiny_tokenizer, tmp_path: Path) -> None:
    """Ids after AutoTokenizer reload (from tokenizer/, from model/ whose config says qwen2, and after a re-save)
    equal the ids of the freshly trained tokenizer; decode(encode(x)) == x."""
    from transformers import AutoTokenizer

    texts = _sample_texts(tiny_world)
    corpus = read_jsonl(tiny_world / "corpus.jsonl")
    rows = read_jsonl(tiny_world / "qa" / "train.jsonl")
    years = TOK.corpus_years([p["contents"] for p in corpus])
    fresh = TOK.train_tokenizer(TOK.tokenizer_training_texts(corpus, rows), len(tiny_tokenizer) - len(years),
                               year_tokens=years)
    from_model_dir = AutoTokenizer.from_pretrained(str(tiny_world / "model"))
    tiny_tokenizer.save_pretrained(str(tmp_path / "again"))
    again = AutoTokenizer.from_pretrained(str(tmp_path / "again"))
    assert type(tiny_tokenizer).__name__ == "Qwen2Tokenizer"  # the class the trap is about
    for text in texts:
        ids = fresh.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.encode(text, add_special_tokens=False) == ids
        assert from_model_dir.encode(text, add_special_tokens=False) == ids
        assert again.encode(text, add_special_tokens=False) == ids
        assert tiny_tokenizer.decode(ids) == text


def test_entity_names_are_single_tokens(tiny_world: Path, tiny_tokenizer) -> None:
    """Every word of every entity name (passage titles) is ONE token after a space (as in questions, queries and
    answers; at most 3 without, e.g. after a title's opening quote), so the policy copies a name one token per word; non-numeric gold answers are at
    most 2 tokens."""
    corpus = read_jsonl(tiny_world / "corpus.jsonl")
    words = {w for d in corpus for w in passage_title(d["contents"]).split()}
    assert len(words) > 20
    for w in sorted(words):
        assert len(tiny_tokenizer.encode(" " + w, add_special_tokens=False)) == 1, w
        assert len(tiny_tokenizer.encode(w, add_special_tokens=False)) <= 3, w  # no leading space: rarer
    rows = read_jsonl(tiny_world / "qa" / "test.jsonl") + read_jsonl(tiny_world / "qa" / "train.jsonl")
    for g in {g for r in rows for g in r["golden_answers"] if not g.isdigit()}:
        assert len(tiny_tokenizer.encode(" " + g, add_special_tokens=False)) <= 2, g


def test_a_foreign_pre_tokenizer_would_break_the_round_trip(tiny_world: Path, tmp_path: Path) -> None:
    """The trap this tokenizer avoids: a whitespace pre-tokenizer saved with a qwen2 config loads with different ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    corpus = [d["contents"] for d in read_jsonl(tiny_world / "corpus.jsonl")]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=[TOK.EOS_TOKEN],
                                                        show_progress=False))
    hf = Qwen2Tokenizer(tokenizer_object=tok, eos_token=TOK.EOS_TOKEN, pad_token=TOK.EOS_TOKEN, unk_token=None)
    hf.save_pretrained(str(tmp_path / "bad"))
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "bad"))
    assert any(hf.encode(t, add_special_tokens=False) != reloaded.encode(t, add_special_tokens=False)
               for t in corpus[:20])


# ---------------------------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------------------------


def test_model_round_trip(tiny_model, tiny_tokenizer, tiny_world_config, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    cfg = tiny_model.config
    assert cfg.model_type == "qwen2"
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (tiny_world_config.model_hidden_size,
                                                        tiny_world_config.model_layers)
    assert cfg.vocab_size == len(tiny_tokenizer) and cfg.eos_token_id == tiny_tokenizer.eos_token_id
    tiny_model.save_pretrained(str(tmp_path / "m"))
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    ids = torch.tensor([tiny_tokenizer.encode(P.render_prompt("Who founded Velmora Works?"))])
    with torch.no_grad():
        assert torch.equal(tiny_model(ids).logits, again(ids).logits)


def test_make_model_rejects_bad_shapes(tiny_tokenizer, tiny_world_config) -> None:
    import dataclasses

    with pytest.raises(ValueError, match="divisible by model_heads"):
        WS.make_model(dataclasses.replace(tiny_world_config, model_hidden_size=66), tiny_tokenizer)


# ---------------------------------------------------------------------------------------------------------------
# warm-start data: rendered exactly as the rollout builds a trajectory
# ---------------------------------------------------------------------------------------------------------------


def test_masked_lm_loss_by_hand() -> None:
    # V=2, T=3; uniform logits -> every target costs log 2; only t=2 is masked in -> loss = log 2
    logits = torch.zeros(1, 3, 2)
    ids = torch.tensor([[0, 1, 0]])
    mask = torch.tensor([[1, 0, 1]])  # mask[0, 0] is ignored (no prediction for the first token)
    assert WS.masked_lm_loss(logits, ids, mask).item() == pytest.approx(math.log(2))
    # a confident correct prediction at t=2: logits[0, 1] favour token 0 by 10 nats
    logits[0, 1] = torch.tensor([10.0, 0.0])
    assert WS.masked_lm_loss(logits, ids, mask).item() == pytest.approx(math.log1p(math.exp(-10)), abs=1e-6)


def test_name_shuffler_renames_consistently() -> None:
    """One bijection per trajectory over name words (suffixes like 'Works' kept) and years, applied to the prompt,
    the generated text and the retrieved documents alike: the trajectory stays self-consistent."""
    segs = [TR.Segment("Question: Who founded Velmora Works in 1850?", False),
            TR.Segment("<search> Velmora Works </search>", True),
            TR.Segment("obs", False, hits=[{"id": "0", "contents": '"Velmora Works"\nfounded in 1850 by Ash Bren.'}]),
            TR.Segment("<answer> Ash Bren </answer>", True)]
    shuffler = TR.NameShuffler(["Velmora", "Works", "Ash", "Bren", "Kol", "Tiv"])
    assert "Works" not in shuffler.words
    out = shuffler(segs, random.Random(3))
    query = out[1].text.split()[1]
    founder = out[3].text.split()[1:3]
    year = out[0].text.split()[-1].rstrip("?")
    assert query in {"Velmora", "Ash", "Bren", "Kol", "Tiv"} and out[1].text.split()[2] == "Works"
    assert out[0].text == f"Question: Who founded {query} Works in {year}?"
    assert out[2].hits[0]["contents"] == f'"{query} Works"\nfounded in {year} by {founder[0]} {founder[1]}.'
    assert len({query, *founder}) == 3 and 1000 <= int(year) <= 1999
    assert out[2].text == "obs" and [x.generated for x in out] == [False, True, False, True]
    seen = {tuple(shuffler(segs, random.Random(k))[1].text.split()[1:2]) for k in range(20)}
    assert len(seen) > 2  # different trajectories get different names


def test_name_shuffler_maps_years_onto_the_year_pool() -> None:
    """With a year pool (the corpus' years, one token each) every year becomes a pool year, one bijection per
    trajectory: two different years never collide, the same year is renamed alike everywhere."""
    pool = ["1021", "1340", "1788", "1874", "1902", "2000"]
    shuffler = TR.NameShuffler(["Ash", "Bren"], years=pool)
    segs = [TR.Segment("Ash was born in 1874; Bren founded it in 2000.", False),
            TR.Segment("<answer> 1874 </answer>", True)]
    seen = set()
    for k in range(30):
        out = shuffler(segs, random.Random(k))
        words = out[0].text.replace(";", "").rstrip(".").split()
        born, founded = words[4], words[-1]
        assert born in pool and founded in pool and born != founded
        assert out[1].text == f"<answer> {born} </answer>"
        seen.add(born)
    assert len(seen) >= 4
    assert TR.NameShuffler(["Ash"], years=pool)([TR.Segment("in 1555", False)], random.Random(0))[0].text[3:] in pool


def test_name_shuffler_keeps_each_word_in_its_role() -> None:
    """Renaming by role: a city is renamed to a city, a first name to a first name, in every trajectory."""
    groups = {"city": ["Mora", "Kudan", "Velb"], "person_first": ["Ash", "Kol", "Tiv"], "person_last": ["Bren", "Dax"]}
    shuffler = TR.NameShuffler(groups)
    segs = [TR.Segment("Where was Ash Bren born? Ash Bren was born in Mora.", False)]
    for k in range(30):
        words = shuffler(segs, random.Random(k))[0].text.rstrip(".").replace("?", "").split()
        assert words[2] in groups["person_first"] and words[3] in groups["person_last"]
        assert words[-1] in groups["city"] and words[5:7] == words[2:4]
    firsts = {shuffler(segs, random.Random(k))[0].text.split()[2] for k in range(30)}
    assert firsts == set(groups["person_first"])  # every word of the role is used


def test_plans_cover_every_kind() -> None:
    rows = [{"question": "In which year was A B born?", "golden_answers": ["1900"],
             "metadata": {"hops": 1, "family": "person_birth_year", "subject": "A B", "bridge": ""}},
            {"question": "In which year was the founder of C Works born?", "golden_answers": ["1850"],
             "metadata": {"hops": 2, "family": "founder_birth_year", "subject": "C Works", "bridge": "D E"}}]
    plans = TR.plan_trajectories(rows, 400, quality=0.5, seed=0)
    kinds = {p.kind for p in plans}
    assert kinds == {"correct", "guess_after_search", "no_search", "one_hop_only", "malformed"}
    share_correct = sum(p.kind == "correct" for p in plans) / len(plans)
    assert 0.4 < share_correct < 0.6
    for p in plans:
        if p.kind == "correct":
            assert p.answer == p.row["golden_answers"][0]
            assert p.queries == [p.row["metadata"]["subject"]] + ([p.row["metadata"]["bridge"]]
                                                                  if p.row["metadata"]["hops"] == 2 else [])
        if p.kind in ("guess_after_search", "no_search"):
            assert p.answer not in p.row["golden_answers"]
        if p.queries:  # every trajectory that searches searches for the subject first: the policy learns to copy it
            assert p.queries[0] == p.row["metadata"]["subject"]


def test_one_hop_share_makes_multi_hop_plans_stop_after_the_first_hop() -> None:
    rows = [{"question": "In which year was A B born?", "golden_answers": ["1900"],
             "metadata": {"hops": 1, "family": "person_birth_year", "subject": "A B", "bridge": ""}},
            {"question": "In which year was the founder of C Works born?", "golden_answers": ["1850"],
             "metadata": {"hops": 2, "family": "founder_birth_year", "subject": "C Works", "bridge": "D E"}}]

    def one_hop_rate(plans, hops):
        sel = [p for p in plans if p.row["metadata"]["hops"] == hops]
        return sum(p.kind == "one_hop_only" for p in sel) / len(sel)

    base = TR.plan_trajectories(rows, 2000, quality=0.6, seed=0)
    skewed = TR.plan_trajectories(rows, 2000, quality=0.6, seed=0, one_hop_share=0.6)
    # drawn before the quality draw: 0.6 + 0.4 x (0.4 x the flaw weight of one_hop_only) of the multi-hop plans
    expected = 0.6 + 0.4 * 0.4 * TR.FLAWED_KINDS["one_hop_only"] / sum(TR.FLAWED_KINDS.values())
    assert abs(one_hop_rate(skewed, 2) - expected) < 0.04
    assert one_hop_rate(base, 2) < 0.25
    assert abs(one_hop_rate(skewed, 1) - one_hop_rate(base, 1)) < 0.04  # single-hop plans are left alone
    for p in skewed:
        if p.kind == "one_hop_only":
            assert p.queries == [p.row["metadata"]["subject"]]  # it still searches for the subject first
    with pytest.raises(ValueError, match="one_hop_share"):
        TR.plan_trajectories(rows, 10, quality=0.6, seed=0, one_hop_share=1.5)


def test_rows_drawn_by_family_give_a_rare_family_an_equal_share() -> None:
    """``row_sampler``: uniform over rows draws as ``rng.choice`` did (the same rows, so worlds built before it keep
    their plans); by family, a family of 1 row in 10 is drawn half the time against 9 rows of the other family, and
    the plans of ``plan_trajectories(by_family=True)`` follow it."""
    rows = [{"question": f"q{i}", "golden_answers": [f"a{i}"],
             "metadata": {"hops": 1, "family": "city_river" if i == 0 else "company_hq", "subject": f"S{i}",
                          "bridge": ""}} for i in range(10)]
    a, b = random.Random(5), random.Random(5)
    uniform = TR.row_sampler(rows, by_family=False)
    assert [uniform(a)["question"] for _ in range(50)] == [b.choice(rows)["question"] for _ in range(50)]
    balanced = TR.row_sampler(rows, by_family=True)
    rng = random.Random(0)
    rare = sum(balanced(rng)["metadata"]["family"] == "city_river" for _ in range(4000)) / 4000
    assert abs(rare - 0.5) < 0.03
    plans = TR.plan_trajectories(rows, 2000, quality=0.6, seed=0, by_family=True)
    assert abs(sum(p.row["metadata"]["family"] == "city_river" for p in plans) / 2000 - 0.5) < 0.04
    plain = TR.plan_trajectories(rows, 2000, quality=0.6, seed=0)
    assert sum(p.row["metadata"]["family"] == "city_river" for p in plain) / 2000 < 0.14


def test_segments_match_the_rollout_token_layout(tiny_world: Path, tiny_tokenizer, world_rows) -> None:
    """Prompt ids = agent_loop.encode_prompt; observation ids = ObservationTokenizer; loss only on generated text."""
    from retriever.inprocess import InProcessRetriever
    from searchr1_lld.rollout.agent_loop import ObservationTokenizer, encode_prompt

    row = next(r for r in world_rows if r["metadata"]["hops"] == 2)
    plan = TR.TrajectoryPlan(row, "malformed", [row["metadata"]["subject"], row["metadata"]["bridge"]],
                             row["golden_answers"][0], malformed_turn="<answer> guess")
    retriever = InProcessRetriever(tiny_world / "index")
    hits = retriever.search(plan.queries, 3)
    hits_of = dict(zip(plan.queries, hits))
    segs = TR.render_segments(plan, hits_of, tiny_tokenizer.eos_token, random.Random(0))
    ids, mask = TR.tokenize_segments(segs, tiny_tokenizer)

    observe = ObservationTokenizer(tiny_tokenizer, 500)
    prompt = encode_prompt(tiny_tokenizer, row["question"], "tiny")
    assert ids[: len(prompt)] == prompt and mask[: len(prompt)] == [0] * len(prompt)
    expected_env = [prompt, tiny_tokenizer.encode(P.INVALID_ACTION_MESSAGE, add_special_tokens=False),
                    observe(hits[0]), observe(hits[1])]
    # the environment's pieces appear, in order, exactly as the rollout tokenises them, and carry mask 0
    pos = 0
    for piece in expected_env:
        while ids[pos : pos + len(piece)] != piece:
            pos += 1
            assert pos < len(ids), "environment piece not found"
        assert mask[pos : pos + len(piece)] == [0] * len(piece)
        pos += len(piece)
    generated = tiny_tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert P.INFO_OPEN not in generated and P.INSTRUCTION[:30] not in generated
    assert generated.count(P.SEARCH_OPEN) == 2 and generated.removesuffix(TOK.EOS_TOKEN).endswith(
        f"<answer> {row['golden_answers'][0]} </answer>")
    assert sum(mask) == len(tiny_tokenizer.encode(generated, add_special_tokens=False))


def test_batched_tokenisation_equals_one_call_per_piece(tiny_world: Path, tiny_tokenizer, world_rows) -> None:
    """tokenize_many over many trajectories (every plan kind, names shuffled) gives, trajectory by trajectory, the
    ids of encoding each piece on its own: the prompt with special tokens, an observation through
    ObservationTokenizer (cut when it is longer than max_obs_length: here 40 tokens, so some are), the rest without."""
    from retriever.inprocess import InProcessRetriever
    from searchr1_lld.rollout.agent_loop import ObservationTokenizer

    plans = TR.plan_trajectories(world_rows, 24, quality=0.5, seed=3, one_hop_share=0.5)
    queries = sorted({q for p in plans for q in p.queries})
    hits_of = dict(zip(queries, InProcessRetriever(tiny_world / "index").search(queries, 3)))
    rng = random.Random(0)
    renamer = TR.NameShuffler(TR.name_pool(world_rows, list(hits_of.values()), None))
    trajectories = [renamer(TR.render_segments(p, hits_of, tiny_tokenizer.eos_token, rng), rng) for p in plans]
    observe = ObservationTokenizer(tiny_tokenizer, 40)

    def one_by_one(segments):
        ids, mask = [], []
        for k, seg in enumerate(segments):
            if k == 0 and not seg.generated:
                piece = tiny_tokenizer.encode(seg.text, add_special_tokens=True)
            elif seg.hits is not None:
                piece = observe(seg.hits)
            else:
                piece = tiny_tokenizer.encode(seg.text, add_special_tokens=False)
            ids += piece
            mask += [int(seg.generated)] * len(piece)
        return ids, mask

    expected = [one_by_one(segs) for segs in trajectories]
    assert TR.tokenize_many(trajectories, tiny_tokenizer, max_obs_length=40) == expected
    assert any(len(tiny_tokenizer.encode(P.format_observation(s.hits), add_special_tokens=False)) > 40
               for segs in trajectories for s in segs if s.hits is not None)  # the cut path ran
    assert TR.tokenize_many([], tiny_tokenizer) == []


def test_quote_think_quotes_the_passage_up_to_the_answer() -> None:
    """The quote starts at the last mention of the passage's title before the answer (the title line is not quoted),
    ends with the first whole-word occurrence of the answer in the first passage that names it; a guess after a
    search keeps the fixed think."""
    hits = [{"contents": '"Koste"\nKoste is a city in the Greiru region, founded in 1127. Koste lies on the Drel River.'},
            {"contents": '"Mera Ost"\nMera Ost was a baker born in 1874 in the city of Koste. Mera worked as a baker.'}]
    assert TR.quote_think("1874", hits) == "<think> Mera Ost was a baker born in 1874 </think>\n"
    assert TR.quote_think("Koste", hits) == "<think> Koste </think>\n"  # the first passage that names it
    assert TR.quote_think("1127", hits) == "<think> Koste is a city in the Greiru region, founded in 1127 </think>\n"
    assert TR.quote_think("Drel River", hits) == "<think> Koste lies on the Drel River </think>\n"  # last title mention
    assert TR.quote_think("baker", hits[1:]) == "<think> Mera Ost was a baker </think>\n"
    assert TR.quote_think("Dre", hits) is None  # whole words only
    assert TR.quote_think("Ost", hits[:1]) is None
    rng = random.Random(0)
    assert TR.answer_think("quote", "Ost", hits[:1], rng) == "<think> found it </think>\n"
    assert TR.answer_think("fixed", "1874", hits, rng) == "<think> found it </think>\n"
    assert TR.answer_think("quote", "1874", None, rng) == "<think> I know it </think>\n"
    with pytest.raises(ValueError, match="answer think"):
        TR.answer_think("summary", "1874", hits, rng)

    row = {"question": "In which year was Mera Ost born?", "golden_answers": ["1874"],
           "metadata": {"hops": 1, "subject": "Mera Ost", "bridge": ""}}
    quoted, guessed = (TR.render_segments(TR.TrajectoryPlan(row, kind, ["Mera Ost"], answer), {"Mera Ost": hits},
                                          "<eos>", random.Random(0), think="quote")[-1].text
                       for kind, answer in (("correct", "1874"), ("guess_after_search", "1874")))
    assert quoted == "<think> Mera Ost was a baker born in 1874 </think>\n<answer> 1874 </answer><eos>"
    assert guessed == "<think> found it </think>\n<answer> 1874 </answer><eos>"


def test_bridge_think_quotes_the_first_hop_up_to_the_bridge() -> None:
    """``bridge_think("quote")`` quotes the first hop's passage up to the bridge entity (the second search then
    repeats the think's last words); the fixed think, or a bridge the passages do not name, gives ``one more hop``;
    a trajectory's second search carries it, its first search keeps ``look it up``."""
    company = {"contents": '"Sadraes Works"\nSadraes Works is a railway company founded in 1794 by Mera Ost. '
                           'Its headquarters are in Koste.'}
    city = {"contents": '"Koste"\nKoste is a city in the Greiru region, founded in 1127. Koste lies on the Drel River.'}
    quote = "<think> Sadraes Works is a railway company founded in 1794 by Mera Ost. Its headquarters are in Koste </think>\n"
    assert TR.bridge_think("quote", "Koste", [company]) == quote
    assert TR.bridge_think("quote", "Mera Ost", [company]) == (
        "<think> Sadraes Works is a railway company founded in 1794 by Mera Ost </think>\n")
    assert TR.bridge_think("fixed", "Koste", [company]) == "<think> one more hop </think>\n"
    assert TR.bridge_think("quote", "Bunae", [company]) == "<think> one more hop </think>\n"  # not in the passages
    with pytest.raises(ValueError, match="bridge think"):
        TR.bridge_think("summary", "Koste", [company])

    row = {"question": "Which river flows through the city where Sadraes Works is headquartered?",
           "golden_answers": ["Drel River"], "metadata": {"hops": 2, "subject": "Sadraes Works", "bridge": "Koste"}}
    plan = TR.TrajectoryPlan(row, "correct", ["Sadraes Works", "Koste"], "Drel River")
    hits_of = {"Sadraes Works": [company], "Koste": [city]}
    generated = [seg.text for seg in TR.render_segments(plan, hits_of, "<eos>", random.Random(0), think="quote",
                                                        bridge="quote") if seg.generated]
    assert generated == ["<think> look it up </think>\n<search> Sadraes Works </search>",
                         quote + "<search> Koste </search>",
                         "<think> Koste lies on the Drel River </think>\n<answer> Drel River </answer><eos>"]


def test_copy_drills_only_ask_for_what_the_context_holds(tiny_world: Path, tiny_tokenizer, tiny_world_config) -> None:
    """Each drill's generated segment is one copy: the search query's words all occur in the question (subject) or
    in the observation (bridge), the answer occurs in the observation, after a think that quotes the observation up
    to it; names are shuffled, so the copy is the only way to predict it. Every kind occurs."""
    import dataclasses

    from retriever.inprocess import InProcessRetriever

    rows = read_jsonl(tiny_world / "qa" / "train.jsonl")
    cfg = dataclasses.replace(tiny_world_config, warmstart_drills=90, warmstart_bridge_think="quote")
    cfg = dataclasses.replace(cfg, warmstart_drill_prompt_share=1 / 3)
    real_search = InProcessRetriever(tiny_world / "index").search

    def search(queries, k):  # every other query retrieves the next query's passages: its target is not in them
        hits = real_search(queries, k)
        return [hits[(i + 1) % len(hits)] if i % 2 else h for i, h in enumerate(hits)]

    stages = DR.build_copy_drills(rows, search, tiny_tokenizer, cfg, passages=read_jsonl(tiny_world / "corpus.jsonl"))
    assert list(stages) == ["short", "full"]
    short, full = stages["short"], stages["full"]
    assert (len(short), len(full)) == (60, 30)
    for ids, _ in short:  # the curriculum's first stage: no instruction in front of the question
        assert tiny_tokenizer.decode(ids).startswith("Question: ")
    drills = full
    kinds = set()
    names = {r["metadata"][k] for r in rows for k in ("subject", "bridge")}
    renamed = queries = 0
    for ids, mask in drills:
        context = tiny_tokenizer.decode([i for i, m in zip(ids, mask) if not m])
        generated = tiny_tokenizer.decode([i for i, m in zip(ids, mask) if m])
        question = context.split("Question: ")[-1].split("\n")[0]
        prompt = P.render_prompt(question, "tiny")
        assert context.startswith(prompt)
        assert sum(mask) > 0 and mask == sorted(mask)  # the prompt, maybe an observation, one generated segment
        observation = context[len(prompt):]
        if P.SEARCH_OPEN in generated:
            target = generated.split(P.SEARCH_OPEN)[1].split(P.SEARCH_CLOSE)[0].strip()
            where = observation or question
            kinds.add("bridge_query" if observation else "subject_query")
            if observation:  # warmstart_bridge_think: quote
                quote = generated.split("<think>")[1].split("</think>")[0].strip()
                assert quote in observation and quote.endswith(target), (quote, observation)
            queries += 1
            renamed += target not in names
        else:
            target = generated.split(P.ANSWER_OPEN)[1].split(P.ANSWER_CLOSE)[0].strip()
            where = observation
            kinds.add("answer")
            quote = generated.split("<think>")[1].split("</think>")[0].strip()  # warmstart_answer_think: quote
            assert quote in observation and quote.endswith(target), (quote, observation)
        assert all(w in where for w in target.split()), (target, where)
    assert kinds == set(DR.COPY_DRILL_KINDS)
    assert renamed > queries // 2  # shuffled names: most queries are no real subject's or bridge's name


def _drill_setup(tiny_world: Path, tiny_tokenizer, cfg):
    from retriever.inprocess import InProcessRetriever

    rows = read_jsonl(tiny_world / "qa" / "train.jsonl")
    search = InProcessRetriever(tiny_world / "index").search
    passages = read_jsonl(tiny_world / "corpus.jsonl")
    drills = DR.build_copy_drills(rows, search, tiny_tokenizer, cfg, passages=passages)
    probes = DR.build_drill_probes(rows, search, tiny_tokenizer, cfg, cfg.warmstart_drill_probes, passages=passages)
    examples = TR.build_warmstart_examples(rows[:8], search, tiny_tokenizer, cfg, passages=passages)
    return drills, probes, examples


def test_drill_stages_end_on_evidence(tiny_world: Path, tiny_tokenizer, tiny_world_config) -> None:
    """A drill stage ends at the first check whose copy accuracies meet the targets, and runs its whole budget when
    they are out of reach; every check is recorded with the step it was made at."""
    import dataclasses

    cfg = dataclasses.replace(tiny_world_config, warmstart_drills=96, warmstart_drill_batch_size=8,
                              warmstart_drill_prompt_share=0.5, warmstart_drill_check_every=2,
                              warmstart_drill_probes=4, warmstart_trajectories=8)
    drills, probes, examples = _drill_setup(tiny_world, tiny_tokenizer, cfg)
    assert set(probes) == {"short", "full"} and all(len(v) == 4 for p in probes.values() for v in p.values())
    budget = 12  # 96 drills / 8 per step

    def run(**targets):
        c = dataclasses.replace(cfg, **targets)
        model = WS.make_model(c, tiny_tokenizer)
        return WS.warm_start(model, examples, c, pad_id=tiny_tokenizer.pad_token_id, batch_size=4, progress=False,
                             drills=drills, probes=probes)

    met = run(warmstart_drill_subject_target=0.0, warmstart_drill_answer_target=0.0)
    assert met["drill_stop"] == {"short": "targets met", "full": "targets met"} and met["drill_steps"] == 4
    assert [(c["step"], c["context"]) for c in met["drill_checks"]] == [(2, "short"), (4, "full")]
    unreachable = run(warmstart_drill_subject_target=1.0, warmstart_drill_answer_target=1.0)
    assert unreachable["drill_stop"] == {"short": "budget used", "full": "budget used"}
    assert unreachable["drill_steps"] == budget
    checks = unreachable["drill_checks"]
    assert [c["step"] for c in checks] == list(range(2, budget + 1, 2))
    assert [c["context"] for c in checks] == ["short"] * 3 + ["full"] * 3
    assert all(0 <= c[k] <= 1 for c in checks for k in DR.COPY_DRILL_KINDS)
    # every stage waits for the answer copy too: a stage whose subject query is copied goes on until the answer is
    subject_only = run(warmstart_drill_subject_target=0.0, warmstart_drill_answer_target=1.0)
    assert subject_only["drill_stop"] == {"short": "budget used", "full": "budget used"}
    assert subject_only["drill_steps"] == budget
    assert [c["context"] for c in subject_only["drill_checks"]] == ["short"] * 3 + ["full"] * 3
    # a bridge target holds the last stage (only it) until the bridge query is copied too
    bridge_unreachable = run(warmstart_drill_subject_target=0.0, warmstart_drill_answer_target=0.0,
                             warmstart_drill_bridge_target=1.0)
    assert bridge_unreachable["drill_stop"] == {"short": "targets met", "full": "budget used"}
    assert bridge_unreachable["drill_steps"] == budget


def test_copy_accuracy_is_one_for_a_model_that_copies(tiny_tokenizer) -> None:
    """The teacher-forced copy accuracy counts a drill only when every generated token is the argmax."""

    class Oracle(torch.nn.Module):  # predicts the next token of its input, or token 0 on the rows in wrong_rows

        def __init__(self, wrong_rows=()):
            super().__init__()
            self.wrong_rows = set(wrong_rows)

        def forward(self, input_ids, attention_mask):
            logits = torch.full((*input_ids.shape, 50), -1.0)
            nxt = torch.roll(input_ids, -1, dims=1)
            logits.scatter_(2, nxt[..., None], 1.0)
            for r in self.wrong_rows:
                logits[r, :, :] = 0.0
                logits[r, :, 0] = 1.0
            return type("Out", (), {"logits": logits})()

    probes = {"answer": [([5, 6, 7, 8], [0, 0, 1, 1]), ([9, 9, 7, 8, 3], [0, 0, 0, 1, 1])]}
    assert WS.copy_accuracy(Oracle(), probes, pad_id=0) == {"answer": 1.0}
    assert WS.copy_accuracy(Oracle(wrong_rows=[0]), probes, pad_id=0) == {"answer": 0.5}


def test_same_search_call_is_retrieved_once() -> None:
    calls = []

    def search(queries, k):
        calls.append((list(queries), k))
        return [[{"q": q, "k": k}] for q in queries]

    cached = WS._same_call_once(search)
    first = cached(["a", "b"], 3)
    assert cached(["a", "b"], 3) == first and len(calls) == 1
    assert cached(["a", "b"], 2) == [[{"q": "a", "k": 2}], [{"q": "b", "k": 2}]] and len(calls) == 2
    assert cached(["b"], 3) == [[{"q": "b", "k": 3}]] and len(calls) == 3  # another call: retrieved


def test_no_drills_when_zero(tiny_world_config) -> None:
    import dataclasses

    cfg = dataclasses.replace(tiny_world_config, warmstart_drills=0)
    assert DR.build_copy_drills([], lambda q, k: [], None, cfg) == {}
    with pytest.raises(ValueError, match="warmstart_drill_prompt_share"):
        DR.build_copy_drills([], lambda q, k: [], None, dataclasses.replace(cfg, warmstart_drills=4,
                                                                           warmstart_drill_prompt_share=1.5))
    with pytest.raises(ValueError, match="shares of one drill budget"):
        DR.build_copy_drills([], lambda q, k: [], None, dataclasses.replace(
            cfg, warmstart_drills=4, warmstart_drill_prompt_share=0.5, warmstart_drill_answer_first=0.6))


def test_answer_stage_comes_first_and_ends_on_the_answer_target(tiny_world: Path, tiny_tokenizer,
                                                                tiny_world_config) -> None:
    """With ``warmstart_drill_answer_first`` the curriculum opens with answer drills alone (short context); that
    stage ends on the answer target only, whatever the subject accuracy (the later stages wait for both)."""
    import dataclasses

    cfg = dataclasses.replace(tiny_world_config, warmstart_drills=96, warmstart_drill_batch_size=8,
                              warmstart_drill_prompt_share=0.25, warmstart_drill_answer_first=0.25,
                              warmstart_drill_check_every=2, warmstart_drill_probes=4, warmstart_trajectories=8)
    drills, probes, examples = _drill_setup(tiny_world, tiny_tokenizer, cfg)
    assert list(drills) == ["answer", "short", "full"] and [len(d) for d in drills.values()] == [24, 48, 24]
    for ids, mask in drills["answer"]:
        generated = tiny_tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assert P.ANSWER_OPEN in generated and P.SEARCH_OPEN not in generated
        assert tiny_tokenizer.decode(ids).startswith("Question: ")

    def run(**targets):
        c = dataclasses.replace(cfg, **targets)
        return WS.warm_start(WS.make_model(c, tiny_tokenizer), examples, c, pad_id=tiny_tokenizer.pad_token_id,
                             batch_size=4, progress=False, drills=drills, probes=probes)

    answer_met = run(warmstart_drill_subject_target=1.0, warmstart_drill_answer_target=0.0)
    assert answer_met["drill_stop"] == {"answer": "targets met", "short": "budget used", "full": "budget used"}
    assert [(c["step"], c["stage"]) for c in answer_met["drill_checks"]][:2] == [(2, "answer"), (4, "short")]
    never = run(warmstart_drill_subject_target=0.0, warmstart_drill_answer_target=1.0)
    assert never["drill_stop"] == {"answer": "budget used", "short": "budget used", "full": "budget used"}
    assert [(c["step"], c["stage"]) for c in never["drill_checks"]][:3] == [(2, "answer"), (3, "answer"), (5, "short")]


def test_repeat_batches_repeat_their_first_half_and_weigh_only_the_predictable_repeat() -> None:
    """Each batch is L random tokens twice (L in [max // 2, max]); the weight is 1 from the repeat's second token on:
    the first token of the repeat follows nothing that predicts it."""
    vocab = [11, 12, 13, 14, 15]
    batches = WS.repeat_batches(vocab, 3, 6, torch.Generator().manual_seed(0))
    lengths = set()
    for _ in range(20):
        ids, attn, weight = next(batches)
        length = ids.shape[1] // 2
        lengths.add(length)
        assert ids.shape == attn.shape == weight.shape == (3, 2 * length) and 3 <= length <= 6
        assert torch.equal(ids[:, :length], ids[:, length:]) and set(ids.flatten().tolist()) <= set(vocab)
        assert attn.all()
        assert weight[:, :length + 1].sum() == 0 and weight[:, length + 1:].eq(1).all()
    assert len(lengths) > 1


def test_repeat_vocabulary_leaves_out_the_tags_and_special_tokens(tiny_tokenizer) -> None:
    vocab = set(WS.repeat_vocabulary(tiny_tokenizer))
    left_out = set(range(len(tiny_tokenizer))) - vocab
    assert left_out == {tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id,
                        *tiny_tokenizer.convert_tokens_to_ids(list(P.TAG_TOKENS))}


def test_the_repeat_phase_runs_its_steps_and_is_counted(tiny_world: Path, tiny_tokenizer, tiny_world_config) -> None:
    """``warmstart_repeat_steps`` steps of repeats run and are reported in the stats (NaN loss without them); the
    phase needs the tokens it draws from."""
    import dataclasses

    cfg = dataclasses.replace(tiny_world_config, warmstart_repeat_steps=3, warmstart_repeat_length=4,
                              warmstart_drills=0, warmstart_trajectories=8)
    examples = [([1, 2, 3, 4], [0, 0, 1, 1])] * 8
    model = WS.make_model(cfg, tiny_tokenizer)
    stats = WS.warm_start(model, examples, cfg, pad_id=tiny_tokenizer.pad_token_id, batch_size=4, progress=False,
                          repeat_tokens=WS.repeat_vocabulary(tiny_tokenizer))
    assert stats["repeat_steps"] == 3 and math.isfinite(stats["repeat_final_loss"]) and stats["steps"] == 2
    off = WS.warm_start(model, examples, dataclasses.replace(cfg, warmstart_repeat_steps=0),
                        pad_id=tiny_tokenizer.pad_token_id, batch_size=4, progress=False)
    assert off["repeat_steps"] == 0 and math.isnan(off["repeat_final_loss"])
    with pytest.raises(ValueError, match="repeat_tokens"):
        WS.warm_start(model, examples, cfg, pad_id=tiny_tokenizer.pad_token_id, batch_size=4, progress=False)


def test_practice_drills_copy_the_answer_from_the_whole_prompt(tiny_world: Path, tiny_tokenizer,
                                                               tiny_world_config) -> None:
    """The trajectory phase's practice drills start from the rollout's prompt and copy the answer out of the last
    observation; none copies a query (the bridge query's second hop is left to RL)."""
    from retriever.inprocess import InProcessRetriever

    rows = read_jsonl(tiny_world / "qa" / "train.jsonl")
    drills = DR.build_practice_drills(rows, InProcessRetriever(tiny_world / "index").search, tiny_tokenizer,
                                      tiny_world_config, 6, passages=read_jsonl(tiny_world / "corpus.jsonl"))
    assert len(drills) == 6
    prompt = P.render_prompt(rows[0]["question"], "tiny")
    for ids, mask in drills:
        start = mask.index(1)
        context, generated = tiny_tokenizer.decode(ids[:start]), tiny_tokenizer.decode(ids[start:])
        observations = context.count("<information>") - prompt.count("<information>")  # the prompt names the tag
        assert context.startswith(prompt[:40]) and observations >= 1
        assert "<answer>" in generated and "<search>" not in generated


def test_practice_drills_add_their_weighted_loss_to_each_trajectory_step(tiny_tokenizer, tiny_world_config) -> None:
    """With ``warmstart_traj_drill_weight`` w > 0 the trajectory phase's first loss is the trajectories' loss plus w
    x the practice drills' loss, both on the model as it was; with w = 0 the drills are not used; w > 0 without
    drills is refused."""
    import copy
    import dataclasses

    cfg = dataclasses.replace(tiny_world_config, warmstart_drills=0, warmstart_trajectories=8,
                              warmstart_drill_batch_size=4, warmstart_traj_drill_weight=0.5)
    examples = [([1, 2, 3, 4, 5], [0, 0, 1, 1, 1])] * 8
    practice = [([6, 7, 8, 9, 10, 11], [0, 0, 0, 1, 1, 1])] * 4
    model = WS.make_model(cfg, tiny_tokenizer)
    before = copy.deepcopy(model)

    def loss_of(rows, env_weight):  # generated tokens weigh 1, the others env_weight (as in the phase's batches)
        ids, generated = torch.tensor([x for x, _ in rows]), torch.tensor([m for _, m in rows], dtype=torch.float)
        weights = generated + env_weight * (1 - generated)
        with torch.no_grad():
            return float(WS.generated_token_loss(before, ids, torch.ones_like(ids), weights))
    trajectories = loss_of(examples[:4], cfg.warmstart_env_loss_weight)
    expected = trajectories + 0.5 * loss_of(practice, 0.0)
    stats = WS.warm_start(model, examples, cfg, pad_id=tiny_tokenizer.pad_token_id, batch_size=4, progress=False,
                          practice=practice)
    assert stats["steps"] == 2 and stats["first_loss"] == pytest.approx(expected, rel=1e-5)
    off = WS.warm_start(copy.deepcopy(before), examples, dataclasses.replace(cfg, warmstart_traj_drill_weight=0.0),
                        pad_id=tiny_tokenizer.pad_token_id, batch_size=4, progress=False, practice=practice)
    assert off["first_loss"] == pytest.approx(trajectories, rel=1e-5)
    with pytest.raises(ValueError, match="practice"):
        WS.warm_start(copy.deepcopy(before), examples, cfg, pad_id=tiny_tokenizer.pad_token_id, batch_size=4,
                      progress=False)


# ---------------------------------------------------------------------------------------------------------------
# the warm-started policy generates the protocol at a measured rate
# ---------------------------------------------------------------------------------------------------------------


def test_em_by_groups_rewards_by_a_metadata_field() -> None:
    from types import SimpleNamespace

    def traj(hops, family, reward):
        return SimpleNamespace(row={"metadata": {"hops": hops, "family": family}}, reward=reward)
    trajs = [traj(1, "city_river", 0.0), traj(1, "company_hq", 1.0), traj(2, "hq_founded_year", 1.0),
             traj(1, "company_hq", 0.0), traj(2, "hq_founded_year", 0.0), traj(2, "hq_founded_year", 1.0)]
    assert ME.em_by(trajs, "hops") == {"1": pytest.approx(1 / 3), "2": pytest.approx(2 / 3)}
    assert ME.em_by(trajs, "family") == {"city_river": 0.0, "company_hq": 0.5, "hq_founded_year": pytest.approx(2 / 3)}
    assert list(ME.em_by(trajs, "family")) == ["city_river", "company_hq", "hq_founded_year"]
    assert ME.em_by([], "hops") == {}


@pytest.mark.slow
def test_warm_start_follows_the_format_sometimes(tiny_world: Path) -> None:
    """Sampled rollouts of the warm-started model through the real agent loop and retriever: a measured share of
    turns are well-formed searches and answers (an untrained model emits neither)."""
    from searchr1_lld.config import RolloutConfig

    cfg = RolloutConfig(max_turns=4, topk=3, max_tokens_per_turn=48, temperature=1.0)
    m = ME.measure_warm_start(tiny_world, limit=16, seed=0, rollout_cfg=cfg)
    print("tiny world warm start:", m)
    assert m["sampled"]["answer_rate"] >= 0.1
    assert m["sampled"]["mean_valid_searches"] >= 0.2
    assert m["greedy"]["num"] == m["sampled"]["num"] == 16


def test_generated_token_loss_equals_masked_lm_loss(tiny_model) -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, tiny_model.config.vocab_size, (3, 12))
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0  # right padding
    mask = (torch.rand(3, 12) < 0.4).long() * attn
    mask[0, 5] = 1
    with torch.no_grad():
        full = WS.masked_lm_loss(tiny_model(input_ids=ids, attention_mask=attn).logits, ids, mask)
        fast = WS.generated_token_loss(tiny_model, ids, attn, mask)
    assert fast.item() == pytest.approx(full.item(), rel=1e-5)


def test_copy_metrics_by_hand() -> None:
    """first_query_subject_rate, gold_retrieved_rate and answer_copied_rate on hand-made trajectories."""
    from types import SimpleNamespace

    contents = {"0": '"Ash Kolven"\nAsh Kolven was a poet born in 1834.', "1": '"Bren Tiv"\nBren Tiv was a painter.'}
    row = {"golden_answers": ["1834"], "metadata": {"subject": "Ash Kolven", "hops": 1}}

    def traj(queries, retrieved, prediction, reward):
        return SimpleNamespace(row=row, queries=queries, retrieved_ids=retrieved, prediction=prediction,
                               reward=reward, finish_reason="answer", invalid_actions=0, valid_searches=len(queries))

    trajs = [traj(["Ash Kolven"], [["0", "1"]], "1834", 1.0),  # copies the subject and the answer
             traj(["ash kolven poet"], [["0"]], "1790", 0.0),  # names the subject, guesses the answer
             traj(["Bren Tiv"], [["1"]], "1834", 1.0),  # wrong entity, no gold passage: right by chance
             traj([], [], "1834", 1.0)]  # no search
    m = ME.summarize_trajectories(trajs, contents)
    assert m["first_query_subject_rate"] == pytest.approx(2 / 4)
    assert m["gold_retrieved_rate"] == pytest.approx(2 / 4)
    assert m["answer_copied_rate"] == pytest.approx(1 / 2)
    assert m["answer_in_passages_rate"] == pytest.approx(1 / 4)  # only the first answer is in what it retrieved
    assert m["right_without_gold_rate"] == pytest.approx(2 / 4)  # the third (wrong entity) and the fourth (no search)
    assert m["em"] == pytest.approx(3 / 4)
    assert "answer_copied_rate" not in ME.summarize_trajectories(trajs)  # without the corpus: not measured


def test_one_token_share_counts_name_words_kept_whole(tiny_world: Path, tiny_tokenizer) -> None:
    """The build records which share of the corpus' name words are one token after a space; in the test world all
    are, an invented long word is not, and a share below 1 is a shortfall the build warns about."""
    from searchr1_lld.world.build import read_card, warm_start_shortfalls
    from searchr1_lld.world.generate import name_word_groups
    from searchr1_lld.world.tokenizer import one_token_share

    words = sorted({w for ws in name_word_groups(read_jsonl(tiny_world / "corpus.jsonl")).values() for w in ws})
    assert one_token_share(tiny_tokenizer, words) == 1.0 == read_card(tiny_world)["policy"]["name_words_one_token"]
    assert one_token_share(tiny_tokenizer, [words[0], "Qzxqzxqzxqzx"]) == 0.5
    assert any("raise tokenizer_vocab_size" in line
               for line in warm_start_shortfalls({"policy": {"name_words_one_token": 0.5}}))
