"""compiler/wall_time.py: the automatic margin, the assumed checkpoint time and the expected
last step of a wall-time budget."""

import pytest

from runexp.compiler import wall_time


def test_default_margin_grows_with_the_budget_and_the_model():
    base, large = 110_000_000, 335_000_000
    assert wall_time.default_margin_s(12 * 3600, base) == pytest.approx(10 + 432 + 52.8)
    assert wall_time.default_margin_s(3600, large) == pytest.approx(10 + 36 + 160.8)
    assert (wall_time.default_margin_s(3600, base) < wall_time.default_margin_s(7200, base)
            < wall_time.default_margin_s(7200, large))
    # Unknown size: the size term is left out.
    assert wall_time.default_margin_s(3600, None) == pytest.approx(46.0)


def test_a_short_budget_keeps_three_quarters_for_training():
    assert wall_time.default_margin_s(20.0, 50_000) == pytest.approx(5.0)
    assert wall_time.default_margin_s(0.36, 110_000_000) == pytest.approx(0.09)
    assert wall_time.default_margin_s(-1.0, 10) == 0.0


def test_a_margin_set_in_gin_wins():
    assert wall_time.margin_s(3600, 110_000_000, margin_minutes=2.5) == 150.0
    assert wall_time.margin_s(3600, 110_000_000, margin_minutes=0) == 0.0
    assert wall_time.margin_s(3600, None) == wall_time.default_margin_s(3600, None)


def test_assumed_save_seconds():
    assert wall_time.assumed_save_seconds(None) == 1.0
    assert wall_time.assumed_save_seconds(110_000_000) == pytest.approx(1.0 + 1.32e9 / 50e6)


def test_expected_last_step():
    # 1000 s, 100 kept free, a final save of 10 s: 890 s for steps of 1 s and a save of
    # 10 s every 100 steps (110 s per 100): 8 whole intervals (880 s) and 10 steps.
    last = wall_time.expected_last_step(budget_s=1000, margin_s=100, step_seconds=1.0,
                                        checkpoint_every=100, save_seconds=10.0)
    assert last == 810
    assert wall_time.expected_last_step(1000, 100, 1.0, 100, 10.0, start_step=5000) == 5810
    assert wall_time.expected_last_step(1000, 100, 1.0, 100, 10.0, train_steps=700) == 700
    # Room for a whole interval's steps but not its save: the interval's last step, whose
    # checkpoint is the final one.
    assert wall_time.expected_last_step(1000, 0, 1.0, 100, 10.0) == 900
    assert wall_time.expected_last_step(100, 100, 1.0, 100, 10.0) == 0
    with pytest.raises(ValueError, match="step_seconds"):
        wall_time.expected_last_step(100, 10, 0.0, 100, 10.0)


def test_a_restart_costs_the_stop_save_start_up_compile_restore_and_data_position():
    base = 110_000_000
    cost = wall_time.restart_cost(base, "tpu")
    save = wall_time.assumed_save_seconds(base)
    assert cost.stop_save_s == save and cost.restore_s == pytest.approx(save)
    assert cost.compile_s == wall_time.COMPILE_S["tpu"] > wall_time.COMPILE_S["cpu"]
    assert cost.seconds == pytest.approx(2 * save + wall_time.STARTUP_S
                                         + wall_time.COMPILE_S["tpu"]
                                         + wall_time.DATA_POSITION_S)
    assert "start-up" in cost.describe() and "data position" in cost.describe()
    # The restore grows with the checkpoint, nothing else with the run.
    assert wall_time.restart_cost(4 * base, "tpu").restore_s > cost.restore_s


def test_expected_restarts_include_those_during_restarts():
    cost = wall_time.restart_cost(110_000_000, "tpu")
    r = wall_time.expected_restarts(48.0, 1.0, cost)
    c = cost.seconds / 3600
    assert r.hours == pytest.approx(48.0 + r.count * c)
    assert r.count == pytest.approx(r.hours / 24)
    assert wall_time.expected_restarts(48.0, 0.0, cost).count == 0
    never = wall_time.expected_restarts(1.0, 2 * 24 * 3600 / cost.seconds, cost)
    assert never.hours == float("inf")
    assert wall_time.preemptions_per_day({"type": "tpu", "usd_per_hour_preemptible": 2.4}) == 1
    assert wall_time.preemptions_per_day({"type": "tpu"}) == 0  # no preemptible offering
    assert wall_time.preemptions_per_day(None) == 0


def test_sessions_of_a_budget():
    assert wall_time.sessions(1000, 1000, 0) == 1
    assert wall_time.sessions(1000, 400, 300) == 3
    assert wall_time.sessions(1000, 400, 200) == 4
    assert wall_time.sessions(1000, 400, 0) == 0
