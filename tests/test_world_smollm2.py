"""searchr1_lld/world/smollm2.py: a world whose policy is SmolLM2 after a short SFT on the world's format."""

import copy
import json

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
    card = build_smollm2_world(tiny_world, out, trajectories=8, batch_size=8, lr=1e-4, measure_limit=1, pass_k=1,
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
