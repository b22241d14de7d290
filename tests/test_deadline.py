"""--eval_minutes (evaluation/deadline.py) and the submission file that is complete at every moment
(evaluation/submission.py)."""

import json

import training
from evaluation.deadline import Deadline, Work
from evaluation.submission import SubmissionFile
from tests.conftest import CPU
from training import validation


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Ticks(Clock):
    """A clock that moves `seconds` at each read: a deadline on it counts the reads (a few a step), so a
    whole run under it plans and cuts the same on an idle machine and a loaded one."""
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def __call__(self) -> float:
        self.now += self.seconds
        return self.now


def tasks(n: int, steps: int = 60, kind: str = "", pairs: int = 1) -> list[Work]:
    """`n` groups of one task each, alike."""
    return [Work(kind, 1, pairs, steps)] * n


def test_the_plan_fits_each_task_alone_to_its_share_of_the_time_left():
    clock = Clock()
    deadline = Deadline(10.0, clock)  # 600 s
    assert deadline.plan(tasks(100), 8) == {"ttt_steps": 60, "eval_augments": 8}  # nothing measured
    # the first group: a 2 s search, 60 steps of 1 s, 8 views of 0.1 s, 0.6 s of the rest
    deadline.measured(search=2.0, steps=(60.0, 60), views=(0.8, 8), rest=0.6)
    clock.now = 63.4
    # 536.6 s for 99 groups: 5.42 s a group, 2.6 of it the search and the rest, 0.8 the views: 2 steps
    assert deadline.plan(tasks(99), 8) == {"ttt_steps": 2, "eval_augments": 8}
    assert deadline.plan(tasks(1), 8) == {"ttt_steps": 60, "eval_augments": 8}  # time to spare
    # 2.82 s a group: after the search and the rest, room for 0.22 s: two views, no steps
    assert deadline.plan(tasks(190), 8) == {"ttt_steps": 0, "eval_augments": 2}
    # 1.34 s a group: not even one view beside the search: it is left out, and 7 views fit
    assert deadline.plan(tasks(400), 8) == {"ttt_steps": 0, "eval_augments": 7,
                                                              "view_starts": False}
    deadline.measured(search=0.0, steps=(0.0, 0), views=(0.7, 7), rest=0.6)  # a group without its search
    assert deadline.cost("search") == 2.0 and deadline.cost("rest") == 0.6 and deadline.cost("view") == 0.1
    clock.now = 601.0
    late = deadline.plan(tasks(5), 8)
    assert late == {"ttt_steps": 0, "eval_augments": 1, "view_starts": False}
    assert deadline.tasks == {"full": 2, "cut": 3, "late": 1}



def test_without_the_search_no_plan_cuts_it_and_the_time_before_the_first_step_is_the_rests():
    """--view_starts off: nothing to leave out, so a share short of one view plans one view, not a cut
    search; the set-up before a group's first step is priced with the rest (it is spent either way)."""
    clock = Clock()
    deadline = Deadline(10.0, clock, searches=False)
    deadline.measured(search=2.0, steps=(60.0, 60), views=(0.8, 8), rest=0.6)
    assert deadline.cost("search") == 0.0 and deadline.cost("rest") == 2.6
    clock.now = 63.4
    assert deadline.plan(tasks(400), 8) == {"ttt_steps": 0, "eval_augments": 1}  # 1.34 s a group: one view

def test_tasks_that_cost_the_same_get_the_same_settings_alone_and_in_a_group_of_8():
    """A CPU's pace: a step of 8 tasks together takes 8 times one task's (8 s against 1 s), so do the
    search and the rest; a view takes 1 s a test input either way. With 180 s left for a task alone
    and then a group of 8 (9 tasks, 20 s each), the task alone gets 20 s: 1 s search + 1 s rest, 8
    views (8 s), 10 steps (10 s); the group 160 s: 8 + 8, 8 views of its 8 pairs (64 s), 10 steps
    of 8 s (80 s). The same settings; by group (90 s each) the group would get 1 step, the task 60."""
    clock = Clock()
    deadline = Deadline(10.0, clock)
    deadline.measured(search=1.0, steps=(10.0, 10), views=(2.0, 2), rest=1.0, tasks=1)
    deadline.measured(search=8.0, steps=(80.0, 10), views=(16.0, 16), rest=8.0, tasks=8)
    clock.now = 600.0 - 180.0
    alone = deadline.plan([Work("", 1, 1, 60), Work("", 8, 8, 60)], 8)
    clock.now += 20.0
    group = deadline.plan([Work("", 8, 8, 60)], 8)
    assert alone == group == {"ttt_steps": 10, "eval_augments": 8}


def paced_by_size_class(clock: Clock) -> Deadline:
    """A deadline that measured a small task's step and view at a tenth of a large one's: a small task
    costs 14.8 s in full (1 s search + 120 steps of 0.1 + 8 views of 0.1 + 1 s rest) and 2.8 s without
    its steps; a large one 72 s (2 + 60 x 1 + 8 x 1 + 2) and 12 s without."""
    deadline = Deadline(10.0, clock)
    deadline.measured(search=1.0, steps=(12.0, 120), views=(0.8, 8), rest=1.0, kind="small")
    assert deadline.cost("step", 1, "large") == 0.1 and deadline.cost("view", 1, "large") == 0.1  # borrowed
    deadline.measured(search=2.0, steps=(60.0, 60), views=(8.0, 8), rest=2.0, kind="large")
    assert deadline.cost("step", 1, "small") == 0.1 and deadline.cost("step", 1, "large") == 1.0
    return deadline


def test_each_size_class_is_planned_at_its_own_pace():
    """With 40 s for a small and a large task, the small one takes its full 14.8 s and the large one
    the 25.2 s left: 8 views and 13 steps (2 + 13 + 8 + 2 s); one pace over both (0.4 s a step) would
    plan it 33 and overrun."""
    clock = Clock()
    deadline = paced_by_size_class(clock)
    clock.now = 600.0 - 40.0
    assert deadline.plan(tasks(1, 120, "small") + tasks(1, 60, "large"), 8) == {"ttt_steps": 120, "eval_augments": 8}
    # its share holds the large task's 13.2 s of steps too: room to overrun an estimate (a mean over sides)
    assert abs(deadline.group_end - clock.now - 28.0) < 1e-9
    clock.now += 14.8
    assert deadline.plan(tasks(1, 60, "large"), 8) == {"ttt_steps": 13, "eval_augments": 8}


def test_a_deadline_cuts_large_tasks_steps_before_small_tasks():
    """Four small tasks, then four large ones: 59.2 s in full for the small ones, 48 s for the large ones
    without their steps. With 110 s (an even share, 13.75 s a task, would cut a small task to 109 steps)
    the small ones keep their full settings and the large ones lose their steps (12.7 s each: 8 views);
    with 80 s the small ones share the 32 s the large ones leave (8 s each: 8 views and 52 steps); with 50
    s and 40 s, less than every task's cost without steps (59.2 s), every task gets a share of that cost
    (at 50 s 2.4 s for a small one, its search and 3 views, and 10.1 s for a large one, 6 views; at 40 s
    1.9 s, its views without the search): more time never buys a small task less."""
    clock = Clock()
    work = tasks(4, 120, "small") + tasks(4, 60, "large")
    for left, small, large in ((110.0, {"ttt_steps": 120, "eval_augments": 8}, {"ttt_steps": 0, "eval_augments": 8}),
                               (80.0, {"ttt_steps": 52, "eval_augments": 8}, {"ttt_steps": 0, "eval_augments": 8}),
                               (50.0, {"ttt_steps": 0, "eval_augments": 3}, {"ttt_steps": 0, "eval_augments": 6}),
                               (40.0, {"ttt_steps": 0, "eval_augments": 8, "view_starts": False}, None)):
        clock.now = 0.0
        deadline = paced_by_size_class(clock)
        clock.now = 600.0 - left
        for i in range(4):  # each small task spends its share
            assert deadline.plan(work[i:], 8) == small, (left, i)
            clock.now = deadline.group_end
        if large is not None:
            assert deadline.plan(work[4:], 8) == large, left


def test_a_large_task_planned_before_small_ones_leaves_them_their_full_settings():
    """A final validation's first tasks are planned with the rest's after them, small ones among them:
    with 51.6 s for a large task and then two small ones (29.6 s in full), the large one gets the 22 s
    they leave (8 views and 10 steps), where a share by cost alone would give it 36.6 s (24 steps)."""
    clock = Clock()
    deadline = paced_by_size_class(clock)
    clock.now = 600.0 - 51.6
    assert deadline.plan(tasks(1, 60, "large") + tasks(2, 120, "small"), 8) == {"ttt_steps": 10, "eval_augments": 8}


def test_a_group_size_not_yet_measured_is_priced_from_the_nearest_in_proportion():
    clock = Clock()
    deadline = Deadline(10.0, clock)
    deadline.measured(search=1.0, steps=(10.0, 10), views=(2.0, 2), rest=1.0, tasks=1)
    assert deadline.cost("step", 8) == 8.0 and deadline.cost("search", 8) == 8.0 and deadline.cost("view") == 1.0
    deadline.measured(search=2.0, steps=(20.0, 10), views=(8.0, 8), rest=2.0, tasks=4)  # 4 tasks: 2 s a step
    assert deadline.cost("step", 4) == 2.0 and deadline.cost("step", 8) == 4.0 and deadline.cost("step", 2) == 2.0
    assert deadline.cost("step", 1) == 1.0  # measured at its own size
    deadline.measured(search=1.0, steps=(0.0, 0), views=(1.0, 1), rest=1.0, tasks=8)  # 8 tasks cut to no step
    assert deadline.cost("step", 8) == 4.0, "a group that took no step measured no step's cost"


def test_the_submission_holds_every_test_input_from_the_start(small_cfg, tmp_path):
    data = training.build_data(small_cfg(), CPU)
    path = tmp_path / "submission.json"
    file = SubmissionFile(path, data.eval_set)
    start = json.loads(path.read_text())
    episodes = data.eval_set.episodes
    assert list(start) == list(dict.fromkeys(ep.task.task_id for ep in episodes))
    assert [a for task in start.values() for a in task] == \
        [{"attempt_1": ep.query.input.tolist(), "attempt_2": ep.query.input.tolist()} for ep in episodes]
    first = episodes[0]
    guess = (first.query.input * 0, first.query.input * 0 + 1)
    file.update({0: guess})
    now = json.loads(path.read_text())
    assert now[first.task.task_id][0] == {"attempt_1": guess[0].tolist(), "attempt_2": guess[1].tolist()}
    assert sum(map(len, now.values())) == len(episodes) and not list(tmp_path.glob("*.tmp"))


def test_an_evaluation_under_a_deadline_ends_in_time_with_a_complete_submission(small_cfg, tmp_path, monkeypatch):
    """A budget far below what the settings need (1000 steps a task): the run ends within it plus a
    task, says how the tasks were scored, and its submission holds every test input."""
    made = []
    synchronized = Deadline.synchronized
    monkeypatch.setattr(Deadline, "synchronized", lambda *a, **k: made.append(synchronized(*a, **k)) or made[-1])
    cfg = small_cfg(eval_only=True, eval_tasks=0, ttt_steps=1000, eval_minutes=0.05,
                    run_dir=str(tmp_path / "eval"), submission=str(tmp_path / "submission.json"))
    summary = training.train(cfg, CPU)
    tasks = summary["eval/tasks"]
    assert summary["eval/deadline_full"] + summary["eval/deadline_cut"] + summary["eval/deadline_late"] == tasks
    assert summary["eval/deadline_full"] < tasks and summary["eval/ttt_steps_per_task"] < 1000, summary
    # past the 3 s budget by the group scored at its end and the report, not by the start-up (counted
    # outside the deadline); unbudgeted, the first task alone takes about 50 s (1000 steps)
    overrun = [round(-d.left(), 1) for d in made]  # named when it fails (it failed once in a loaded not-slow run)
    assert len(made) == 1 and -made[0].left() < 10.0, f"deadlines made {len(made)}, overrun {overrun} s, {summary}"
    submission = json.loads((tmp_path / "submission.json").read_text())
    assert sum(map(len, submission.values())) == sum(len(t.test) for t in
                                                      training.build_data(cfg, CPU).splits.evaluation)


def test_a_training_runs_final_validation_shares_one_deadline_over_all_its_tasks(small_cfg, tmp_path, monkeypatch):
    """The final validation scores its first --val_tasks, then the rest, in two calls: the first
    call's groups are planned knowing the rest's (on an H200 the first 16 of 50 tasks took the
    whole budget and the other 34 were predicted unadapted), and the budget holds for both."""
    plans = []
    plan = Deadline.plan

    def spy(self, *args):
        plans.append(sum(w.tasks for w in args[0]))  # the tasks still to score
        return plan(self, *args)

    monkeypatch.setattr(Deadline, "plan", spy)
    # on the wall clock this failed once under load (three xdist workers on two cores): 12 s of reads
    monkeypatch.setattr(Deadline, "synchronized", classmethod(
        lambda cls, minutes, device, spent=0.0, searches=True: cls(minutes, Ticks(0.01), spent, searches)))
    cfg = small_cfg(val_tasks=1, eval_tasks=0, val_every="end", ttt_steps=1000, eval_minutes=0.2,
                    run_dir=str(tmp_path / "run"))
    summary = training.train(cfg, CPU)
    tasks = int(summary["eval/tasks"])
    said = {k: v for k, v in summary.items() if k.startswith("eval/")}  # what a failure reports
    assert tasks == 3 and plans == [3, 2, 1], (plans, said)  # one task a group: the first planned as one of three
    assert summary["eval/deadline_full"] + summary["eval/deadline_cut"] + summary["eval/deadline_late"] == tasks, said
    assert summary["eval/ttt_steps_per_task"] < 1000, said


def test_under_a_deadline_eval_tasks_minus_one_scores_every_task(small_cfg, tmp_path, monkeypatch):
    """--eval_tasks -1 (all if that takes no longer than the training did) under --eval_minutes: the
    deadline bounds the validation, so every task is scored and the training-time rule is never asked
    (a run of three steps would drop the rest under it)."""
    asked = []
    monkeypatch.setattr(validation, "fits_in_training", lambda *a: asked.append(a) or False)
    cfg = small_cfg(val_tasks=1, eval_tasks=-1, val_every="end", eval_minutes=0.2, run_dir=str(tmp_path / "run"))
    summary = training.train(cfg, CPU)
    assert summary["eval/tasks"] == 3 and asked == []


def test_a_compile_during_the_predictions_is_not_priced_as_views(small_cfg, tmp_path, monkeypatch):
    """The first group's predictions pay a compiled agent's compile: its seconds (torch's account,
    agents.compile_seconds) are left out of the views' pace, so the next groups keep their views."""
    import evaluation.evaluate as evaluate_module
    from evaluation.evaluate import first_tasks, score_tasks

    cfg = small_cfg(run_dir=str(tmp_path / "run"), ttt_steps=0)
    state, eval_set = training.build_train_state(cfg, CPU), training.build_data(cfg, CPU).eval_set
    compiled = iter([0.0, 50.0] + [50.0] * 100)  # the first group's predictions "compile" for 50 s
    monkeypatch.setattr(evaluate_module, "compile_seconds", lambda: next(compiled))
    deadline = Deadline(10.0)
    score_tasks(state.model, state.prompts, eval_set, first_tasks(eval_set, 0), cfg=cfg, device=CPU,
                deadline=deadline)
    seconds, views = deadline.pace["view"][("", 1)]  # the size rule off: one class
    assert 0 <= seconds / views < 1.0  # a view's seconds, not the compile's 50 over its views
