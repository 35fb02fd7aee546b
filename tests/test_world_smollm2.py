"""searchr1_lld/world/smollm2.py: a world whose policy is SmolLM2 after a short SFT on the world's format."""

import copy
import json
from pathlib import Path

import pytest
import torch


def test_link_world_data_links_and_refuses_to_overwrite(tmp_path):
    from searchr1_lld.world.smollm2 import link_world_data

    base = tmp_path / "base"
    (base / "index").mkdir(parents=True)
    (base / "qa").mkdir()
    (base / "corpus.jsonl").write_text("{}\n")
    out = tmp_path / "out"
    link_world_data(base, out)
    link_world_data(base, out)  # again: links are replaced, nothing copied
    assert all((out / n).is_symlink() and (out / n).resolve() == (base / n).resolve()
               for n in ("corpus.jsonl", "index", "qa"))
    (out / "qa").unlink()
    (out / "qa").mkdir()
    with pytest.raises(FileExistsError, match="not a link"):
        link_world_data(base, out)
    with pytest.raises(FileNotFoundError, match="not a finished world"):
        link_world_data(tmp_path / "nothing", tmp_path / "out2")


@pytest.mark.slow
def test_build_smollm2_world_trains_saves_and_measures(smollm2, tiny_world, tmp_path):
    """One SFT step of SmolLM2 on the test world; the saved world's policy is the trained one and train.py's
    loader takes it; world.json holds the SFT statistics and the warm-start rollouts."""
    from searchr1_lld.config import load_config
    from searchr1_lld.learner.factories import load_policy_and_tokenizer
    from searchr1_lld.world import trainer_overrides
    from searchr1_lld.world.smollm2 import POLICY_NAME, build_smollm2_world

    tokenizer, model = smollm2[0], copy.deepcopy(smollm2[1])
    before = {k: v.clone() for k, v in model.state_dict().items() if k.endswith("q_proj.weight")}
    out = tmp_path / "w"
    card = build_smollm2_world(tiny_world, out, trajectories=2, batch_size=2, lr=1e-4, measure_limit=1, pass_k=1,
                               progress=False, policy=(tokenizer, model))
    assert card["policy"]["name"] == POLICY_NAME and card["policy"]["steps"] == 1
    assert torch.isfinite(torch.tensor(card["policy"]["first_loss"]))
    assert card["warm_start"]["questions"] == 1 and card["warm_start"]["split"] == "val"
    assert {"em", "format_valid_rate"} <= set(card["warm_start"]["greedy"]) & set(card["warm_start"]["sampled"])
    assert card["base_world"] == str(tiny_world.resolve())
    assert json.loads((out / "world.json").read_text())["policy"] == card["policy"]
    trained = model.state_dict()
    assert any(not torch.equal(trained[k], v) for k, v in before.items())  # the SFT step moved the weights

    cfg = load_config(None, trainer_overrides(out))
    loaded, loaded_tok = load_policy_and_tokenizer(cfg)
    assert loaded_tok.convert_tokens_to_ids("<|im_end|>") == tokenizer.convert_tokens_to_ids("<|im_end|>")
    for k in before:
        assert torch.equal(loaded.state_dict()[k], trained[k])


def test_the_fp32_cache_builds_once_checks_its_copy_and_rebuilds_on_a_new_source(tiny_world, tmp_path):
    """load_through_fp32_cache on the tiny world's policy: the first call loads and writes a copy that reads back
    equal; the second reads the copy without loading; a different source key rebuilds; a copy that does not read
    back as the loaded model is refused and never published."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchr1_lld.world.smollm2 import load_through_fp32_cache

    calls = []

    def load():
        calls.append(1)
        return (AutoTokenizer.from_pretrained(str(tiny_world / "tokenizer")),
                AutoModelForCausalLM.from_pretrained(str(tiny_world / "model"), dtype=torch.float32).eval())

    cache = tmp_path / "fp32"
    tok, model = load_through_fp32_cache(load, cache, {"v": 1})
    assert len(calls) == 1 and json.loads((cache / "source.json").read_text()) == {"v": 1}
    tok2, model2 = load_through_fp32_cache(load, cache, {"v": 1})
    assert len(calls) == 1  # read from the copy
    assert all(torch.equal(v, model2.state_dict()[k]) for k, v in model.state_dict().items())
    assert tok2("Paris 1874")["input_ids"] == tok("Paris 1874")["input_ids"]
    load_through_fp32_cache(load, cache, {"v": 2})
    assert len(calls) == 2 and json.loads((cache / "source.json").read_text()) == {"v": 2}

    def load_and_drift():  # a load whose saved copy differs from what it returns (a lossy save)
        tok, model = load()
        model.save_pretrained = lambda path, _save=model.save_pretrained: (_save(path), _perturb(path))
        return tok, model

    def _perturb(path):
        from safetensors.torch import load_file, save_file

        path = Path(path)
        weights = load_file(str(path / "model.safetensors"))
        key = sorted(weights)[0]
        weights[key] = weights[key] + 1.0
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})

    with pytest.raises(RuntimeError, match="does not read back"):
        load_through_fp32_cache(load_and_drift, cache, {"v": 3})
    assert json.loads((cache / "source.json").read_text()) == {"v": 2}  # the old copy stands
