"""Judging a candidate: paired held-out evaluation, statistics, the release gate, chain replay, the cross-batch summary, calibration."""
