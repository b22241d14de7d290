"""The report page in a real browser: headless Chromium (Debian's package; `make browser` installs
it) loads a report of an evaluation and the test reads the rendered page: every task card is there
with its drawn grids, the filters and the sort change what is shown, and a screenshot shows ARC's
colours and a right attempt's green frame."""

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import training
from data.arc import ArcPair, ArcTask
from data.episodes import EpisodeDataset, evaluation_episodes
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.render import ARC_RGB
from evaluation.report import header, write_report
from tests.conftest import CPU
from tests.test_evaluation import CopyAgent

GREEN = (46, 125, 50)  # a right attempt's frame on the page (#2e7d32)


def chromium(*args: str) -> str:
    """Run headless Chromium -> its stdout. Missing, it fails the test under CI and skips it elsewhere."""
    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make browser` installs Debian's package")
        pytest.skip("no chromium here (`make browser` installs Debian's package)")
    done = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Cards(HTMLParser):
    """The rendered DOM's task cards: {task id: {"hidden", "canvases", "captions", "order"}} and the body's
    data attributes."""

    def __init__(self, html: str):
        super().__init__()
        self.cards: dict[str, dict] = {}
        self.body: dict[str, str] = {}
        self._card: dict | None = None
        self._depth = 0
        self._caption = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        if tag == "section" and "card" in (attrs.get("class") or "").split():
            self._card = {"hidden": "hidden" in attrs, "canvases": [], "captions": [], "order": len(self.cards)}
            self.cards[attrs["data-task"]] = self._card
            self._depth = 0
        if self._card is not None:
            self._depth += tag not in ("canvas",)  # canvas has an end tag too; count it like the others
            if tag == "canvas":
                self._card["canvases"].append(attrs.get("data-cells"))
            self._caption = tag == "figcaption"

    def handle_endtag(self, tag):
        if self._card is not None and tag != "canvas":
            self._depth -= 1
            if self._depth == 0:
                self._card = None
        self._caption = False

    def handle_data(self, data):
        if self._card is not None and self._caption:
            self._card["captions"].append(data)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory, arc_folder):
    """A report of a real evaluation: the 3 small ARC evaluation tasks and one whose test output is its
    input, predicted by an agent that copies its input: that task is solved, the others are not."""
    from engine.config import Config
    tmp = tmp_path_factory.mktemp("report")
    cfg = Config.from_flags(data=str(arc_folder), batch_size=4, eval_batch_size=8, agent_channels=16, prompt_dim=32,
                            run_dir=str(tmp / "run"), ttt_steps=0, eval_augments=2)
    training.seed_everything(0)
    state = training.build_train_state(cfg, CPU)
    state.model.agent = CopyAgent()
    eval_set = training.build_data(cfg, CPU).eval_set
    rng = np.random.default_rng(0)
    grids = [rng.integers(0, 10, (3, 5)) for _ in range(3)]
    copy = ArcTask("copy", tuple(ArcPair(g, g.copy()) for g in grids[:2]), (ArcPair(grids[2], grids[2].copy()),))
    tasks = tuple({ep.task.task_id: ep.task for ep in eval_set.episodes}.values()) + (copy,)
    dataset = EpisodeDataset(evaluation_episodes(tasks), eval_set.scale)
    scores = score_tasks(state.model, state.prompts, dataset, first_tasks(dataset, 0), cfg=cfg, device=CPU)
    head = header(run="run", what="evaluation", weights="fresh weights", step=0, data=str(arc_folder),
                  settings="none", metrics=scores.metrics("eval", cfg), prefix="eval")
    cards = scores.cards(dataset)
    return write_report(tmp, head, cards), cards


def rendered(page: Path, fragment: str = "") -> Cards:
    return Cards(chromium("--dump-dom", page.as_uri() + fragment))


def test_every_task_card_is_there_with_its_grids(report_page):
    page, cards = report_page
    dom = rendered(page)
    assert list(dom.cards) == [c["id"] for c in cards]
    for card in cards:
        shown = dom.cards[card["id"]]
        # demos (input, output), then per test input: input, target and two attempts
        assert len(shown["canvases"]) == 2 * len(card["demos"]) + 4 * len(card["tests"]), card["id"]
        demo_in = card["demos"][0][0]
        assert shown["canvases"][0] == f"{len(demo_in)}x{len(demo_in[0])}"
        assert not shown["hidden"]
        verdicts = [c for c in shown["captions"] if c.startswith("attempt")]
        assert len(verdicts) == 2 * len(card["tests"])
        assert ("attempt 1: right" in verdicts) == card["runs"][0]["pairs"][0]["right"][0]
    assert int(dom.body["data-render-ms"]) >= 0


@pytest.mark.parametrize("fragment, expect", [
    ("#filter=solved", lambda run: run["solved"]),
    ("#filter=shape", lambda run: run["wrong_shape"]),
    ("#filter=near&cells=0", lambda run: False),  # an unsolved task has a cell wrong or a wrong shape
    ("#filter=near&cells=100000", lambda run: not run["solved"] and run["cells_wrong"] is not None),
    ("#filter=oracle", lambda run: run["oracle_only"]),
])
def test_the_filters_change_what_is_shown(report_page, fragment, expect):
    page, cards = report_page
    dom = rendered(page, fragment)
    visible = {task for task, card in dom.cards.items() if not card["hidden"]}
    assert visible == {c["id"] for c in cards if expect(c["runs"][0])}
    assert len(dom.cards) == len(cards)  # hidden, not removed


def test_the_page_shows_the_solved_task_and_filters_to_it(report_page):
    page, cards = report_page
    assert [c["id"] for c in cards if c["runs"][0]["solved"]] == ["copy"]
    assert {t for t, c in rendered(page, "#filter=solved").cards.items() if not c["hidden"]} == {"copy"}
    sorted_by_cells = rendered(page, "#sort=cells").cards
    assert min(sorted_by_cells.items(), key=lambda kv: kv[1]["order"])[0] == "copy"  # 0 cells wrong first


def test_a_screenshot_shows_arc_colours_and_the_right_attempts_frame(report_page, tmp_path):
    page, _ = report_page
    shot = tmp_path / "page.png"
    chromium(f"--screenshot={shot}", "--window-size=1200,900", page.as_uri() + "#filter=solved")
    colours = {tuple(c) for c in np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)}
    arc = {tuple(c) for c in ARC_RGB.tolist()}
    assert len(arc & colours) >= 5  # the copy task's grids, drawn
    assert GREEN in colours
