"""A checkpoint resumed into a model whose table changed is said in the model's terms (which table, its rows and
width in each, what loads it), from the line torch.distributed.checkpoint gives (as a 2-rank job saw it)."""

from __future__ import annotations

from runner.train.checkpoint import table_mismatch

SEEN = ("Size mismatch between saved torch.Size([100000, 64]) and current: torch.Size([300000, 64]) for "
        "model.model.sparse_arch.embedding_bag_collection.embedding_bags.t0.weight")


def test_a_grown_table_is_named_with_its_rows_in_the_checkpoint_and_in_the_model() -> None:
    line = table_mismatch(f"rank 0: {SEEN}")
    assert line is not None and line.startswith("table t0 has 100,000 rows x 64 in the checkpoint but 300,000 x 64")
    assert "num_embeddings=100000" in line and "embedding_dim" not in line and "torch.Size" not in line


def test_a_wider_table_names_its_width_and_other_failures_are_left_alone() -> None:
    wider = SEEN.replace("[300000, 64]", "[100000, 128]").replace(".t0.", ".g017.")
    assert "table g017 has 100,000 rows x 64 in the checkpoint but 100,000 x 128" in table_mismatch(wider)
    assert "(embedding_dim=64)" in table_mismatch(wider)
    assert table_mismatch("Missing key in checkpoint state_dict: optim.weight.step") is None


def test_a_meta_json_a_resume_cannot_use_is_one_line(tmp_path) -> None:
    """make fuzz-files: a meta.json of no step (a newer format's record) resumed at step 0, a negative step was
    taken, and a loss scale missing a key or infinite failed in the trainer or was used; each is now one line."""
    import json

    import pytest

    from runner.config.errors import CheckpointError
    from runner.train.checkpoint import META, read_meta

    good = {"step": 10, "loss_scale": {"scale": 32768.0, "good_steps": 3, "skipped": 1}}
    (tmp_path / META).write_text(json.dumps(good))
    assert read_meta(tmp_path) == good
    (tmp_path / META).write_text(json.dumps({"step": 10}))  # a job without fp16's loss scaling
    assert read_meta(tmp_path) == {"step": 10}
    for damaged in ({"format": 3, "record": good}, {**good, "step": -10}, {**good, "step": 1e30},
                    {**good, "loss_scale": {"scale": 32768.0, "skipped": 1}},
                    {**good, "loss_scale": {**good["loss_scale"], "scale": float("inf")}},
                    {**good, "loss_scale": {**good["loss_scale"], "skipped": 2**63}}, {**good, "loss_scale": "x"}):
        (tmp_path / META).write_text(json.dumps(damaged))
        with pytest.raises(CheckpointError) as refused:
            read_meta(tmp_path)
        assert f"checkpoint {tmp_path}: its {META} cannot be read back" in str(refused.value), damaged
        assert "\n" not in str(refused.value)
