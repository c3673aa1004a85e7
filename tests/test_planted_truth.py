"""Audit validity on planted truth: the dye model must fail more often than the lesion model."""

import pytest

from endoexplain_core.analysis import planted_truth


def test_training_frames_alternate_labels_and_reject_unknown_signals():
    images, labels = planted_truth.training_frames("dye", 4, 32, seed=0)
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="unknown planted signal"):
        planted_truth.training_frames("colour", 4, 32, seed=0)


def test_audit_recovers_the_planted_cue(tmp_path):
    summary = planted_truth.run_planted_truth(tmp_path, size=64, n_train=160, n_pool=32, epochs=6)
    rate = summary.set_index(["signal", "method"])["peak_outside_rate"]
    for method in planted_truth.GRADIENT_METHODS:
        assert rate["dye", method] >= rate["lesion", method] + 0.5, method
    checks = planted_truth.validity_checks(summary)
    assert checks["passed"].all(), checks.to_string()
    assert (tmp_path / "dye.parquet").is_file() and (tmp_path / "lesion.parquet").is_file()
