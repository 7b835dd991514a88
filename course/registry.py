"""Where the weeks and their graded tasks are listed. Owns: selector parsing ("w33", "w33.x", "all")."""
import importlib

WEEKS = ("w33_softmax", "w34_layernorm", "w35_attention_blocks", "w36_mha_analysis", "w37_flash_attention_core",
         "w38_flash_attention_impl")


def week_tasks(week: str) -> dict:
    return importlib.import_module(f"course.{week}.tasks").TASKS


def all_tasks() -> dict:
    return {tid: t for week in WEEKS for tid, t in week_tasks(week).items()}


def task(exercise_id: str):
    tasks = all_tasks()
    if exercise_id not in tasks:
        raise KeyError(f"no exercise {exercise_id!r}; known: {', '.join(tasks)}")
    return tasks[exercise_id]


def week_of(exercise_id: str) -> str:
    prefix = exercise_id.split(".")[0]
    return next(w for w in WEEKS if w.startswith(prefix + "_"))


def select(selector: str) -> list[str]:
    """Exercise ids matching "all", a week ("w33") or one exercise ("w33.stable_softmax")."""
    ids = list(all_tasks())
    if selector == "all":
        return ids
    chosen = [i for i in ids if i == selector or i.split(".")[0] == selector]
    if not chosen:
        raise SystemExit(f"no exercise matches {selector!r}; try 'all', a week like 'w33', or one of: {', '.join(ids)}")
    return chosen
