"""The paper's protocol, checked against strings built by hand from Search-R1's rules (scripts/data_process/
nq_search.py `make_prefix`, search_r1/llm_agent/generation.py `_passages2string` / `execute_predictions`)."""

from __future__ import annotations

import pytest

from searchr1_lld.data import prompts as P
from searchr1_lld.rewards import answer_char_span, extract_answer
from searchr1_lld.rollout.agent_loop import answer_token_span

# Search-R1's make_prefix(template_type="base"), written out by hand from the source (its backslash-continued
# f-string joins the lines with nothing between them; the typo "your want" is the source's).
SEARCH_R1_PREFIX = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: "
)


def test_search_r1_prompt_is_verbatim():
    assert P.template_text("search-r1") == SEARCH_R1_PREFIX + "{question}\n"
    # question formatting as the script does it: strip, then "?" appended when missing
    assert P.render_prompt("  who wrote Hamlet ", "search-r1") == SEARCH_R1_PREFIX + "who wrote Hamlet?\n"
    assert P.render_prompt("who wrote Hamlet?", "search-r1") == SEARCH_R1_PREFIX + "who wrote Hamlet?\n"
    # a question containing braces or the slot text itself is inserted literally
    assert P.render_prompt("what is {x}", "search-r1").endswith("Question: what is {x}?\n")


def test_search_r1_prompt_through_a_chat_template():
    class ChatTok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert (tokenize, add_generation_prompt) == (False, True)
            return "<|im_start|>user\n" + messages[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"

    expected = "<|im_start|>user\n" + SEARCH_R1_PREFIX + "q?\n<|im_end|>\n<|im_start|>assistant\n"
    assert P.render_prompt("q", "search-r1", ChatTok(), "auto") == expected
    assert P.render_prompt("q", "search-r1", ChatTok(), "never") == SEARCH_R1_PREFIX + "q?\n"


def test_observation_matches_search_r1():
    docs = [{"id": "7", "contents": '"Hamlet"\nHamlet is a tragedy.\nIt was written around 1600.'},
            {"id": "9", "contents": '"William Shakespeare"\nAn English playwright. '}]
    # _passages2string: f"Doc {i}(Title: {first line}) {other lines joined by \n}\n" per document; the block is
    # stripped and wrapped as f"\n\n<information>{block}</information>\n\n"; titles keep their quotes
    block = ('Doc 1(Title: "Hamlet") Hamlet is a tragedy.\nIt was written around 1600.\n'
             'Doc 2(Title: "William Shakespeare") An English playwright. \n')
    assert P.format_observation(docs) == "\n\n<information>" + block.strip() + "</information>\n\n"
    assert P.format_observation(docs) == (
        '\n\n<information>Doc 1(Title: "Hamlet") Hamlet is a tragedy.\nIt was written around 1600.\n'
        'Doc 2(Title: "William Shakespeare") An English playwright.</information>\n\n')
    # a document without a text line: Search-R1 writes the title and an empty text
    assert P.format_observation([{"contents": "Only a title"}]) == (
        "\n\n<information>Doc 1(Title: Only a title)</information>\n\n")


def test_invalid_action_message_is_search_r1s():
    assert P.INVALID_ACTION_MESSAGE == (
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
        "Let me try again.\n")


def test_unknown_template_and_missing_file(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown prompt template"):
        P.template_text("chat")
    monkeypatch.setattr(P, "PROMPT_DIR", tmp_path)
    monkeypatch.setattr(P, "_template_cache", {})
    with pytest.raises(FileNotFoundError, match="search-r1.txt"):
        P.template_text("search-r1")
    (tmp_path / "search-r1.txt").write_text("no slot here")
    with pytest.raises(ValueError, match="exactly once"):
        P.template_text("search-r1")


# ---------------------------------------------------------------------------------------------------------------
# the answer span from decoded character offsets
# ---------------------------------------------------------------------------------------------------------------


class CharTokenizer:
    """Each id is a fixed string piece (pieces may straddle tag boundaries, like BPE merges)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return "".join(self.pieces[i] for i in ids)


def _span(pieces):
    tok = CharTokenizer(pieces)
    ids = list(range(len(pieces)))
    return answer_token_span(tok, ids, tok.decode(ids))


def test_answer_token_span_on_merged_pieces():
    # tags split over several pieces; ' </' and '>.' merge neighbouring characters into the tags' pieces
    assert _span(["<think>", " ok", " <", "answer", ">", " Paris", " </", "answer", ">.", " more"]) == (2, 9)
    # the answer starts inside a piece ("ok<") and ends inside one (">x"): both pieces overlap the span
    assert _span(["ok<", "answer> Paris </answer", ">x", "y"]) == (0, 3)
    # the last closed answer counts; an unclosed one has none
    assert _span(["<answer>", "a", "</answer>", " ", "<answer>", "b", "</answer>"]) == (4, 7)
    assert _span(["<answer>", " a"]) is None
    # zero-width pieces at the edges are not part of the span
    assert _span(["x", "", "<answer>b</answer>", "", "y"]) == (2, 3)


def test_answer_token_span_reports_a_prefix_that_does_not_decode_consistently():
    class Inconsistent(CharTokenizer):
        def decode(self, ids, **kw):  # a prefix decodes differently from the same characters of the whole
            text = super().decode(ids)
            return text if len(ids) == len(self.pieces) else text.upper()

    tok = Inconsistent(["x", "<answer>a</answer>", "z"])
    assert answer_token_span(tok, [0, 1, 2], tok.decode([0, 1, 2])) is None
    assert answer_token_span(CharTokenizer(tok.pieces), [0, 1, 2], "x<answer>a</answer>z") == (1, 2)


def test_answer_char_span_agrees_with_extraction():
    text = "a <answer> x </answer> b <answer> y </answer>."
    a, b = answer_char_span(text)
    assert text[a:b] == "<answer> y </answer>" and extract_answer(text) == "y"
    assert answer_char_span("<answer> open") is None


# ---------------------------------------------------------------------------------------------------------------
# a released checkpoint, evaluated with the paper's protocol in one command (a local stand-in: no hub here)
# ---------------------------------------------------------------------------------------------------------------


def test_eval_released_checkpoint_with_the_paper_protocol(tiny_world, tmp_path, monkeypatch):
    """`eval.py --model <released> --config configs/paper/eval.yaml`: the stand-in is a model dir with its own
    tokenizer (as the hub repos SEGAgentRL/LLDS-* are); the rollout must get Search-R1's prompt through that
    tokenizer's chat template, greedy decoding, the paper's 4 turns and top-3 documents."""
    import json
    import shutil


    import eval as eval_cli
    from searchr1_lld.rollout import agent_loop

    release = tmp_path / "LLDS-A-GRPO-stand-in"
    shutil.copytree(tiny_world / "model", release)
    # the release's own tokenizer, with a chat template (Qwen2.5's tokenizers have one; the tiny one has none)
    from transformers import AutoTokenizer

    stand_in_tok = AutoTokenizer.from_pretrained(str(tiny_world / "tokenizer"))
    stand_in_tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                                  "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    stand_in_tok.save_pretrained(str(release))
    seen = []
    real = agent_loop.run_agent_loop

    def recording(rows, **kw):
        seen.append(kw)
        return real(rows, **kw)

    monkeypatch.setattr(agent_loop, "run_agent_loop", recording)
    out = tmp_path / "eval"
    rc = eval_cli.main(["--model", str(release), "--config", "configs/paper/eval.yaml", "--datasets",
                        f"synthetic={tiny_world / 'qa' / 'test.jsonl'}", "--index", str(tiny_world / "index"), "--backend", "hf",
                        "--limit", "2", "--out", str(out), "--no-progress",
                        "--set", "rollout.max_tokens_per_turn=12", "rollout.max_obs_length=100"])  # CPU-sized turns
    assert rc == 0 and seen
    kw = seen[0]
    assert (kw["template"], kw["chat_template"], kw["greedy"], kw["n"]) == ("search-r1", "auto", True, 1)
    assert (kw["cfg"].max_turns, kw["cfg"].topk, kw["cfg"].max_tokens_per_turn, kw["cfg"].max_obs_length) == (
        4, 3, 12, 100)
    tok = kw["tokenizer"]
    assert tok.name_or_path == str(release) and tok.chat_template  # the release's own tokenizer
    prompt = agent_loop.encode_prompt(tok, "who is it", kw["template"], kw["chat_template"])
    assert tok.decode(prompt) == "<|user|>" + SEARCH_R1_PREFIX + "who is it?\n<|assistant|>"
    rows = [json.loads(line) for line in open(out / "trajectories.jsonl")]
    assert len(rows) == 2 and json.loads((out / "results.json").read_text())["datasets"]
