"""Every example in README.md and docs/ is run or checked, so none can show a name or a flag that is gone.

- A ```python block runs as a script in a fresh interpreter (as a reader would paste it), with the
  run history off. A block that cannot run on a CPU says why in an HTML comment on the line above,
  `<!-- not-run: REASON -->`, and is reported as a skipped test with that reason, never dropped.
- A ```bash block's `workbench ...` command lines are parsed by the CLI's own parser, and every
  `--set`/`--baseline`/`--candidate` value by the same function the CLI builds configs with; the
  cheap ones (`workloads`, `capabilities`, `export`) also run for real.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from workbench.cli import build_parser
from workbench.cli.options import config_from

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->\s*$")
RUN_FOR_REAL = {"workloads", "capabilities", "export"}
CONFIG_FLAGS = {"--set", "--baseline", "--candidate"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(language: str) -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) != language:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = NOT_RUN.search(before)
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(page, line, language, match.group(2), marker.group(1) if marker else None))
    return found


PYTHON = blocks("python")
SHELL = blocks("bash")


def workbench_commands(code: str) -> list[list[str]]:
    """The `workbench ...` invocations of a shell block, as argv lists after `workbench`."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;|\|", line.split(" #", 1)[0]):
            words = shlex.split(part, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
                words = words[1:]
            if words and Path(words[0]).name == "workbench":
                commands.append(words[1:])
    return commands


def test_every_page_has_examples_and_markers_say_why() -> None:
    assert len(PYTHON) >= 10, "the docs lost their Python examples"
    skipped = [b for b in PYTHON if b.not_run]
    assert all(len(b.not_run or "") > 10 for b in skipped), "a not-run marker must say why"
    assert len(skipped) <= len(PYTHON) // 4, f"most examples must run; not run: {[b.id for b in skipped]}"


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example_runs(block: Block, tmp_path: Path) -> None:
    if block.not_run:
        pytest.skip(f"not run ({block.not_run})")
    script = tmp_path / "example.py"
    script.write_text(block.code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_STORE": "off"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


COMMANDS = [(b, argv) for b in SHELL for argv in workbench_commands(b.code)]


def test_shell_examples_name_the_cli() -> None:
    assert len(COMMANDS) >= 20, "the docs lost their command-line examples"


@pytest.mark.parametrize("block,argv", COMMANDS, ids=[f"{b.id}:{' '.join(a[:1])}" for b, a in COMMANDS])
def test_command_line_example_parses(block: Block, argv: list[str]) -> None:
    parser = build_parser()
    if "--help" in argv or "-h" in argv:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 0
        return
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{block.id}: `workbench {' '.join(argv)}` no longer parses (exit {exc.code})")
    for flag, value in itertools.pairwise(argv):
        if flag in CONFIG_FLAGS:
            config_from([value])  # raises ConfigError naming the unknown field or bad value


CHEAP = [(b, a) for b, a in COMMANDS if a and a[0] in RUN_FOR_REAL and "--help" not in a]


@pytest.mark.parametrize("block,argv", CHEAP, ids=[f"{b.id}:{' '.join(a)}" for b, a in CHEAP])
def test_cheap_command_line_example_runs(block: Block, argv: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_STORE": "off"}
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.id}: `workbench {' '.join(argv)}`:\n{done.stderr[-3000:]}"


def test_readme_links_resolve() -> None:
    """The README is read on GitHub, outside the docs site's strict build: check its links here."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links to its docs pages"
    missing = [t for t in targets if not t.startswith(("http://", "https://")) and not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"
    docs_pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} - {"docs/index.md"}
    assert docs_pages <= set(targets), f"pages the README's feature list does not link: {docs_pages - set(targets)}"


def test_readme_stays_a_front_door() -> None:
    """Reference material belongs on a docs page, the development log in git history."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move reference material to docs/"
    first_blocks = [b.code.strip() for b in SHELL if b.page.name == "README.md"][:2]
    assert first_blocks == ["./scripts/setup && ./scripts/lab", "./scripts/setup && .venv/bin/python -m pytest"]
    assert "./scripts/setup && .venv/bin/python -m pytest" in (ROOT / ".ci" / "run").read_text()
