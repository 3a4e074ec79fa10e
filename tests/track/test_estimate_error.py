"""A training job's measured step beside its plan's estimate: the whole step's where the plan was made with a
calibration, TorchRec's embeddings-only one otherwise, said in the table; the errors logged per rank."""

from __future__ import annotations

import pytest

from runner.track.estimate_error import against_estimates, estimate_errors

MEASURED = [{"step_ms": 10.0, "embedding_fwd_ms": 2.0}, {"step_ms": 12.0, "embedding_fwd_ms": 4.0}]


def test_errors_are_of_the_whole_step_with_a_calibration() -> None:
    plan = {"plan/est_step_ms": 0.5, "plan/est_whole_step_ms": 11.0,
            "plan/rank0/total_ms": 0.5, "plan/rank1/total_ms": 0.4,
            "plan/rank0/whole_step_ms": 11.0, "plan/rank1/whole_step_ms": 9.0,
            "plan/rank0/est_embedding_fwd_ms": 2.5, "plan/rank1/est_embedding_fwd_ms": 3.0}
    errors = estimate_errors(MEASURED, plan)
    assert errors["error/rank0/step"] == pytest.approx(0.1) and errors["error/rank1/step"] == pytest.approx(-0.25)
    assert errors["error/rank0/embedding_fwd"] == pytest.approx(0.25)
    assert errors["error/step"] == pytest.approx(11.0 / 12.0 - 1)
    text = against_estimates(MEASURED, plan)
    assert "the whole step, with this machine's calibration" in text and "+10%" in text and "-25%" in text


def test_without_a_calibration_the_table_says_the_estimate_is_the_embeddings_only() -> None:
    plan = {"plan/est_step_ms": 0.5, "plan/rank0/total_ms": 0.5, "plan/rank1/total_ms": 0.4,
            "plan/rank0/fwd_compute_ms": 0.1, "plan/rank0/fwd_comms_ms": 0.1,
            "plan/rank1/fwd_compute_ms": 0.1, "plan/rank1/fwd_comms_ms": 0.05}
    errors = estimate_errors(MEASURED, plan)
    assert errors["error/rank0/step"] == pytest.approx(-0.95) and errors["error/rank1/embedding_fwd"] == pytest.approx(
        0.15 / 4.0 - 1)
    assert "the embeddings only, with TorchRec's default constants" in against_estimates(MEASURED, plan)


def test_a_job_that_trained_no_step_has_no_error() -> None:
    idle = [{"step_ms": 0.0, "embedding_fwd_ms": None}, {"step_ms": 0.0, "embedding_fwd_ms": None}]
    assert estimate_errors(idle, {"plan/est_step_ms": 0.5, "plan/rank0/total_ms": 0.5}) == {}
    assert "  0" in against_estimates(idle, {"plan/est_step_ms": 0.5})
