"""Every command in the README and the guide names scripts, modules, config groups and keys
that exist (checks/doc_commands.py), and the check catches each kind of stale name."""

from __future__ import annotations

from pathlib import Path

from checks.doc_commands import check_all, check_page

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_in_the_docs_composes() -> None:
    problems = check_all(ROOT)
    assert not problems, "\n".join(map(str, problems))


def test_stale_names_are_caught(tmp_path: Path) -> None:
    for name in ("conf", "scripts", "benchmarks", "checks", "reports"):
        (tmp_path / name).symlink_to(ROOT / name)
    page = tmp_path / "README.md"
    page.write_text(
        "```bash\n"
        "python scripts/translate.py ckpt_path=CKPT beam_size=5 input=x.en   # fine (short key)\n"
        "python scripts/train.py -m attention=math,sdpa   # fine (a sweep)\n"
        "python scripts/translate.py ckpt_path=CKPT beam_sise=5\n"
        "python scripts/train.py attention=flesh\n"
        "python scripts/evaluate.py data=multi30k data.nope=1\n"
        "python -m benchmarks.no_such_bench --x 1\n"
        "python scripts/no_such.py a=1 && echo done\n"
        "```\n"
    )
    problems = check_page(page, tmp_path)
    got = [(p.where, p.message.split(":")[0]) for p in problems]
    assert got == [
        ("README.md:4", "scripts/translate.py ConfigCompositionException"),
        ("README.md:5", "scripts/train.py MissingConfigException"),
        ("README.md:6", "scripts/evaluate.py ConfigCompositionException"),
        ("README.md:7", "python -m benchmarks.no_such_bench"),
        ("README.md:8", "scripts/no_such.py does not exist"),
    ], problems
