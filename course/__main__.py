"""Command line: python -m course {doctor, grade, grade-notebooks, gradebook, mutants, sweep, bench, stubs, release}.
See README.md."""
import argparse
import sys
import time

from . import registry


def _table(rows: list[tuple], header: tuple) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*map(str, r)) for r in rows])


def cmd_grade(args) -> int:
    from .isolated import exercise_file, grade_exercise
    rows, failed = [], []
    selected = registry.select(args.selector)
    width = max(len(e) for e in selected)
    print(f"{'exercise':<{width}}  {'status':<15}  {'error / tolerance':<17}  time", flush=True)
    for exercise_id in selected:
        start = time.perf_counter()
        # the submission runs in a fresh child per exercise (a hang or a dead CUDA context fails one exercise
        # only); inputs, references and the verdict stay in this process
        source = exercise_file(registry.week_of(exercise_id), args.solutions, args.exercises)
        verdict = grade_exercise(exercise_id, source, args.seed, hidden=args.seed is None)
        seconds = time.perf_counter() - start
        error = f"{verdict['max_error']:.0%}" if "max_error" in verdict else "-"
        rows.append((exercise_id, verdict["status"], error, f"{seconds:.1f} s"))
        print(f"{exercise_id:<{width}}  {verdict['status']:<15}  {error:<17}  {seconds:.1f} s", flush=True)
        if verdict["status"] not in ("pass", "not run"):
            failed.append((exercise_id, verdict["detail"]))
    for exercise_id, detail in failed:
        print(f"\n--- {exercise_id}\n{detail}")
    not_run = sum(row[1] == "not run" for row in rows)
    passed = len(rows) - len(failed) - not_run
    print(f"\n{passed} passed, {len(failed)} failed" + (f", {not_run} not run (need a GPU)" if not_run else ""))
    return 0 if not failed else 1


def cmd_mutants(args) -> int:
    """Every solution and variant accepted and every mutant rejected with its hint, else exit 1. `--shard K/N` runs
    every N-th of them from the K-th on, so that N processes share the work."""
    from . import mutants
    from .grading import GradingError, check
    selected = set(registry.select(args.selector))
    shard, shards = (int(x) for x in args.shard.split("/"))
    rows, bad, count = [], 0, -1

    def mine() -> bool:
        nonlocal count
        count += 1
        return count % shards == shard
    for week in registry.WEEKS:
        solutions = registry.kernels(week)
        for exercise_id in [e for e in registry.week_tasks(week) if e in selected and mine()]:
            try:
                report = check(exercise_id, getattr(solutions, registry.task(exercise_id).entry))
                status = "accepted" if report.ran else "not run: needs a GPU"
            except GradingError as err:
                status, bad = f"REJECTED: {str(err).splitlines()[0]}", bad + 1
            rows.append((exercise_id, "reference solution", status))
        for i, mutant in enumerate(mutants.declared(week)):
            if mutant.exercise in selected and mine():
                status, detail = mutants.verdict(mutant, i)
                bad += status in ("ACCEPTED", "rejected without its hint")
                rows.append((mutant.exercise, mutant.bug, status if status != "skipped" else "skipped: needs a GPU"))
        for i, variant in enumerate(mutants.variants(week)):
            if variant.exercise in selected and mine():
                status, detail = mutants.accepts(variant, i)
                bad += status == "REJECTED"
                rows.append((variant.exercise, f"correct, another way: {variant.change}",
                             f"REJECTED: {detail}" if status == "REJECTED" else status))
    print(_table(rows, ("exercise", "solution or mutant", "verdict")))
    print(f"\n{len(rows) - bad} passed, {bad} failed")
    return 1 if bad else 0


def cmd_sweep(args) -> int:
    """The reference solutions over many seeds: every false rejection listed, exit 1 if there is one."""
    import os
    from . import mutants
    start = time.perf_counter()
    found = mutants.sweep(registry.select(args.selector), args.seeds, args.jobs or os.cpu_count() or 1)
    rows = [(e, args.seeds, len(bad), bad[0][1][:90] if bad else "") for e, bad in found.items()]
    print(_table(rows, ("exercise", "seeds", "false rejections", "first")))
    total = sum(len(bad) for bad in found.values())
    print(f"\n{total} false rejections in {sum(r[1] for r in rows)} runs ({time.perf_counter() - start:.0f} s)")
    return 1 if total else 0


def cmd_gradebook(args) -> int:
    """Grade a class: SUBMISSIONS/<learner>/wNN_topic.py, each learner's exercises in isolation."""
    import os
    from pathlib import Path
    from . import gradebook
    folder = Path(args.submissions)
    if not folder.is_dir():
        raise SystemExit(f"gradebook: {folder} is not a folder (expected one folder per learner inside it)")
    book = folder / "_gradebook"
    out = Path(args.out) if args.out else book / "gradebook.csv"
    if args.merge:
        rows = gradebook.merge(book / "parts", out)
        print(f"merged {len(rows)} rows from {book / 'parts'} into {out}")
        return 0
    names = [args.learner] if args.learner else gradebook.learners(folder)
    if not names:
        raise SystemExit(f"gradebook: no learner folders in {folder}")
    if args.slurm:
        book.mkdir(exist_ok=True)
        script = book / "gradebook.sbatch"
        script.write_text(gradebook.slurm_script(folder, args.selector, names))
        print(f"wrote {script}: submit it with `sbatch {script}`, then run "
              f"`python -m course gradebook {folder} --merge`")
        return 0
    start = time.perf_counter()
    rows = gradebook.grade_class(folder, args.selector, args.jobs or os.cpu_count() or 1, names,
                                 progress=lambda r: print(f"{r['learner']:<20} {r['exercise']:<32} {r['status']}",
                                                          flush=True))
    gradebook.write(rows, out)
    passed = sum(r["status"] == "pass" for r in rows)
    print(f"\n{len(names)} learners, {len(rows)} grades ({passed} passed) in {time.perf_counter() - start:.0f} s: "
          f"{out}, feedback in {out.parent / 'feedback'}")
    return 0


def cmd_bench(args) -> int:
    from . import bench
    return bench.main(args.selector, args.csv, args.resume)


def cmd_stubs(_args) -> int:
    from .stubs import write_stubs
    for path in write_stubs():
        print(f"wrote {path}")
    return 0


def cmd_grade_notebooks(args) -> int:
    from . import nbgrade
    return nbgrade.main(args.notebooks or nbgrade.ROOT / "notebooks", args.week, args.jobs)


def cmd_release(args) -> int:
    from . import release
    return release.main(args.dest, args.branch)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="what this machine can run")
    p = sub.add_parser("grade", help="grade exercises: all, w33 or w33.<exercise>")
    p.add_argument("selector", nargs="?", default="all")
    p.add_argument("--solutions", action="store_true", help="grade the reference solutions instead")
    p.add_argument("--seed", type=int, help="replay the cases of a failure's seed (no hidden cases)")
    p.add_argument("--exercises", metavar="DIR", help="grade the wNN_topic.py files in DIR instead of course/exercises")
    p = sub.add_parser("gradebook", help="grade a class: one folder of exercise files per learner")
    p.add_argument("submissions", metavar="SUBMISSIONS")
    p.add_argument("selector", nargs="?", default="all")
    p.add_argument("--jobs", "-j", type=int, help="exercises graded at once (default: every core)")
    p.add_argument("--out", help="the gradebook CSV (default: SUBMISSIONS/_gradebook/gradebook.csv)")
    p.add_argument("--learner", help="grade this learner only")
    p.add_argument("--slurm", action="store_true", help="write an sbatch job array instead (one learner per task)")
    p.add_argument("--merge", action="store_true", help="join the job array's CSVs into the gradebook")
    p = sub.add_parser("mutants", help="prove the graders reject wrong solutions")
    p.add_argument("selector", nargs="?", default="all")
    p.add_argument("--shard", default="0/1", metavar="K/N", help="every N-th solution or mutant, from the K-th")
    p = sub.add_parser("sweep", help="run the reference solutions over many seeds: no false rejections")
    p.add_argument("selector", nargs="?", default="all")
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--jobs", type=int, help="processes (default: every core)")
    p = sub.add_parser("bench", help="benchmark the solution kernels against their peers (GPU)")
    p.add_argument("selector", nargs="?", default="all")
    p.add_argument("--csv", help="where to write the results (default: course/results/<week>.csv on an H200, <week>.<gpu>.csv elsewhere)")
    p.add_argument("--resume", action="store_true",
                   help="finish a run that stopped: keep the parts its .partial.jsonl finished, run the rest")
    sub.add_parser("stubs", help="regenerate course/exercises/ from solutions/ (overwrites your work!)")
    p = sub.add_parser("grade-notebooks", help="run the notebooks with nbval against your exercise files: a table")
    p.add_argument("--week", help="one week: 33 or w33 (default: every week)")
    p.add_argument("--jobs", "-j", type=int, default=1, help="notebooks run at once (default: 1)")
    p.add_argument("--notebooks", metavar="DIR", help="run the notebooks in DIR instead of notebooks/")
    p = sub.add_parser("release", help="write the learner's edition (no solutions) to DEST and/or a git branch")
    p.add_argument("dest", nargs="?", metavar="DEST", help="a new or empty folder (or an earlier release)")
    p.add_argument("--branch", help="add the edition of HEAD as a commit on this branch (e.g. student)")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from .backend import doctor
        return doctor()
    commands = {"grade": cmd_grade, "gradebook": cmd_gradebook, "mutants": cmd_mutants, "sweep": cmd_sweep,
                "bench": cmd_bench, "stubs": cmd_stubs, "grade-notebooks": cmd_grade_notebooks,
                "release": cmd_release}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
