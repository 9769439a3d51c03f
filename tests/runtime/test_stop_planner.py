"""StopPlanner on a fake clock: the stop it plans keeps the last checkpoint before the deadline
when steps slow down, calls get slower than any before them, and checkpoints (their upload
included) take longer than assumed; and it does not stop needlessly early."""

import pytest

from runexp.runtime.stop_planner import StopPlanner, format_duration


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _planner(clock, budget=1000.0, margin=20.0, assumed_save=1.0, **kw) -> StopPlanner:
    return StopPlanner(clock() + budget, margin, assumed_save, clock=clock, **kw)


def simulate(planner, clock, step_time, save_time, checkpoint_every=1000,
             steps_per_loop=100):
    """Runs the trainer's loop against the fake clock: ``step_time(step, planned)`` is one
    step's real duration (``planned``: the planner's per-step figure when the call was
    planned), ``save_time(k)`` the k-th checkpoint's. Returns (the step stopped at, the
    seconds left when its checkpoint was complete, the calls' lengths)."""
    step, saved, saves, calls, first = 0, None, 0, [], True

    def save():
        nonlocal saved, saves
        seconds = save_time(saves)
        saves += 1
        clock.advance(seconds)
        planner.record_save(seconds)
        saved = step

    while True:
        wanted = min(steps_per_loop, checkpoint_every - step % checkpoint_every)
        n = planner.next_call_steps(wanted)
        if n == 0:
            break
        planned = planner.step_seconds
        seconds = sum(step_time(step + i, planned) for i in range(n))
        clock.advance(seconds)
        planner.record_call(n, seconds, tracing=first)
        first = False
        step += n
        calls.append(n)
        if step % checkpoint_every == 0:
            save()
    if saved != step:
        save()
    return step, planner.seconds_left_at_save(), calls


def test_steady_run_stops_with_the_margin_kept_and_little_time_wasted():
    clock = Clock()
    planner = _planner(clock, budget=1000.0, margin=20.0)
    step, left, calls = simulate(planner, clock, lambda s, p: 0.1, lambda k: 2.0)
    assert left >= 20.0
    # Stopped when fewer than two steps were spare: margin + a checkpoint + 2 steps at most.
    assert left <= 20.0 + 2.0 + 2 * 0.1 + 1e-9
    assert 8000 < step < 10000
    assert calls[0] == 1 and calls[1] == 1  # tracing, then the first timed step
    assert max(calls) == 100 and calls[-1] == 1  # calls shrink near the deadline


def test_each_call_twice_as_slow_as_any_before_still_keeps_the_margin():
    # A machine that keeps slowing down: every step takes twice the slowest per-step time
    # the planner knew when it planned the call.
    clock = Clock()
    planner = _planner(clock, budget=300.0, margin=10.0)
    step, left, _ = simulate(planner, clock,
                             lambda s, planned: 0.05 if planned is None else 2 * planned,
                             lambda k: 1.0)
    assert step > 3 and left >= 10.0


def test_checkpoints_slower_than_assumed_are_planned_for():
    # A slow gs:// upload: each checkpoint takes 30 s, the assumption was 1 s.
    clock = Clock()
    planner = _planner(clock, budget=600.0, margin=5.0, assumed_save=1.0)
    step, left, _ = simulate(planner, clock, lambda s, p: 0.1, lambda k: 30.0,
                             checkpoint_every=500)
    assert left >= 5.0 and planner.save_seconds == 30.0
    # A final save slower than every measured one eats into the margin, not past it.
    clock = Clock()
    planner = _planner(clock, budget=600.0, margin=20.0)
    _, left, _ = simulate(planner, clock, lambda s, p: 0.1,
                          lambda k: 10.0 + 2.0 * k, checkpoint_every=500)
    assert 0 <= left < 20.0


def test_the_slowest_recent_call_sets_the_step_time():
    clock = Clock()
    planner = _planner(clock, window=3)
    assert planner.step_seconds is None
    planner.record_call(1, 5.0, tracing=True)
    assert planner.step_seconds == 5.0  # the tracing call, until a steady one is timed
    for per_step in (0.1, 0.4, 0.1):
        planner.record_call(10, 10 * per_step)
    assert planner.step_seconds == pytest.approx(0.4)
    planner.record_call(10, 1.0)
    assert planner.step_seconds == pytest.approx(0.4)  # still one of the last 3
    planner.record_call(10, 1.0)  # now it is not
    assert planner.step_seconds == pytest.approx(0.1)


def test_before_anything_is_measured():
    clock = Clock()
    planner = _planner(clock, budget=100.0, margin=10.0, assumed_save=5.0)
    assert planner.save_seconds == 5.0 and planner.spare_s() == pytest.approx(85.0)
    assert planner.next_call_steps(100) == 1  # the first call traces: one step
    planner.record_call(1, 60.0, tracing=True)
    clock.advance(60.0)
    assert planner.step_seconds == 60.0  # a bound, until a steady step is timed
    assert planner.next_call_steps(100) == 1  # one step to time it: 25 s are spare
    planner.record_call(1, 0.5)
    clock.advance(0.5)
    assert planner.next_call_steps(100) == 24  # half of 24.5 s, at 0.5 s a step
    # Not even one step and a checkpoint fit: stop at once.
    clock = Clock()
    planner = _planner(clock, budget=14.0, margin=10.0, assumed_save=5.0)
    assert planner.next_call_steps(100) == 0
    assert planner.seconds_left_at_save() == pytest.approx(14.0)  # no save: now


def test_a_checkpoint_is_started_only_if_it_can_be_complete_before_the_deadline():
    clock = Clock()
    planner = _planner(clock, budget=100.0, margin=10.0, assumed_save=5.0)
    planner.record_call(1, 94.0, tracing=True)  # a tracing call that overran the plan
    clock.advance(94.0)
    # 6 s left: no call any more, but the 5 s checkpoint still ends before the deadline
    # (the margin is its cover, not a condition).
    assert planner.next_call_steps(10) == 0 and planner.checkpoint_fits()
    clock.advance(2.0)  # 4 s left: it would end after the deadline
    assert not planner.checkpoint_fits()
    # The rest of the upload in flight comes first: a save waits for it.
    clock = Clock()
    planner = _planner(clock, budget=100.0, margin=10.0, assumed_save=5.0)
    clock.advance(91.0)
    planner.record_upload_started()  # expected to end in 5 s
    assert not planner.checkpoint_fits()  # 9 s left < 5 + 5
    clock.advance(2.0)
    planner.record_save(4.0)  # it ended: written and uploaded in 4 s
    assert planner.checkpoint_fits()  # 7 s left >= 4 s, the slowest measured now


def test_evaluation_is_planned_from_the_slowest_one():
    clock = Clock()
    planner = _planner(clock, budget=100.0, margin=10.0, assumed_save=5.0)
    assert planner.eval_fits()  # the first one is not known
    planner.record_eval(30.0)
    assert planner.eval_fits()
    clock.advance(60.0)  # 40 s left: 25 s spare
    assert not planner.eval_fits()


def test_the_forecast_names_the_expected_last_step():
    clock = Clock()
    planner = _planner(clock, budget=3600.0, margin=60.0, assumed_save=10.0)
    planner.record_call(1, 3.0, tracing=True)
    planner.record_call(100, 50.0)
    planner.record_save(10.0)
    line = planner.describe(step=101, train_steps=1_000_000, checkpoint_every=1000)
    assert "1:00:00 left" in line and "margin 0:01:00" in line
    last = planner.expected_last_step(101, 1_000_000, 1000)
    assert 6000 < last < (3600 - 70) / 0.5 + 101
    assert f"step ~{last}" in line
    assert "the end" in planner.describe(step=101, train_steps=200, checkpoint_every=1000)


def test_format_duration():
    assert format_duration(3725.4) == "1:02:05"
    assert format_duration(-5) == "-0:00:05"


def test_the_executor_hands_the_plans_margin_to_training_stages(tmp_path):
    from runexp.compiler import wall_time
    from runexp.compiler.model_sizes import parameter_count
    from runexp.compiler.plan import Plan, Stage
    from runexp.runtime import executor
    from tests.support.runtime import TINY_MODEL

    stage = Stage(id="pretrain", kind="pretrain", params={"model": dict(TINY_MODEL)},
                  inputs={}, output_dir=str(tmp_path / "pretrain"))

    def margin(**launch):
        plan = Plan(experiment="t", output_root=str(tmp_path), stages=(stage,), launch=launch)
        return executor._deadline_margin_s(plan, stage)

    assert margin() is None  # no budget: the trainer's own default, if a deadline comes
    assert margin(wall_time_hours=12.0, wall_time_margin_minutes=None) == pytest.approx(
        wall_time.default_margin_s(12 * 3600, parameter_count(TINY_MODEL)))
    assert margin(wall_time_hours=12.0, wall_time_margin_minutes=2.5) == 150.0
