"""Distil a student in one command: teacher, distillation, student, int8 exports.

    python scripts/student.py data.dir=../shared/data/multi30k out=runs/student
    python scripts/student.py data.dir=../shared/data/multi30k out=runs/student teacher=t.ckpt

Writes {out}/teacher, {out}/distilled, {out}/student and {out}/exports; a rerun skips the
done stages and resumes an interrupted one. See conf/student.yaml for every option.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("student", "litmt.cli.distillation.student:student")
