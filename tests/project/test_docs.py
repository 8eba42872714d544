"""The Python examples of the README and docs/, executed in order in one namespace per page
against a fresh database, so the documentation cannot drift from the code; the command lines of
the README's quick start and CLI section run as written, every command line of the pages parses,
and every relative link and file of the repository a page names exists."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from lonnymq.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
# Pages whose every ```python block runs as written (Spark's page needs a JVM: tests/spark/).
PAGES = ["README.md", "docs/worker.md", "docs/channels.md", "docs/payloads.md", "docs/messages.md"]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES)
def test_doc_examples_run(
    page: str, dsn: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ROOT / page
    blocks = python_blocks(path.read_text())
    assert blocks, f"{page} has no python examples"
    name = f"docs_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    monkeypatch.setenv("LONNYMQ_DSN", make_conninfo(dsn, dbname=name))
    monkeypatch.chdir(ROOT)
    namespace: dict[str, Any] = {"__name__": f"docs_{path.stem}"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{page}[python block {i + 1}]", "exec"), namespace)
    finally:
        for value in list(namespace.values()):
            close = getattr(value, "close", None)
            if type(value).__name__ == "Client" and callable(close):
                close()
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    missing = []
    for href in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", href) or href.startswith("#"):
            continue
        if not (page.parent / href.split("#")[0]).exists():
            missing.append(href)
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


# Journals of past runs, which name files that have since been renamed or removed, as they were.
_JOURNALS = {"benchmarks.md", "testing.md"}
_REPO_PATH = re.compile(
    r"(?<![\w./-])((?:tests|benchmarks|examples|tools|src)/[\w./-]+\.(?:py|sql|txt|toml))"
)


@pytest.mark.parametrize("page", [p for p in _pages() if p.name not in _JOURNALS], ids=lambda p: p.name)
def test_named_files_exist(page: Path) -> None:
    """A path such as `tests/client/test_take.py` that a page names is where it says."""
    missing = sorted({m for m in _REPO_PATH.findall(page.read_text()) if not (ROOT / m).exists()})
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


def _command_lines(block: str, prompt: str = "") -> list[str]:
    """The ``lonnymq`` command lines of a block, comments and redirections cut; the commands of
    a pipeline joined by `` | ``."""
    lines = []
    for line in block.replace("\\\n", " ").splitlines():  # continuation lines joined
        line = line.strip()
        if not line.startswith(prompt + "lonnymq "):
            continue
        words = shlex.split(line[len(prompt) :], comments=True)
        cut = next((i for i, w in enumerate(words) if w in (">", ">>", "<")), len(words))  # redirections
        commands, command = [], []
        for word in [*words[:cut], "|"]:
            if word == "|":
                commands.append(shlex.join(command))
                command = []
            else:
                command.append(word)
        lines.append(" | ".join(commands))
    return lines


def _readme_block(heading: str) -> str:
    """The first bash block of a section of the README."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return _code_blocks(section, "bash")[0]


def _readme_cli_block() -> str:
    return _readme_block("CLI")


def _is_template(command: str) -> bool:
    # `queue list|stats`, `[--json]`, `ID:TOKEN ...`: a summary of several commands, not one.
    return any(re.search(r"\w\|\w", w) or w.startswith("[") or w == "..." for w in shlex.split(command))


def _documented_commands() -> list[str]:
    """Every ``lonnymq`` command line of the shell blocks of the README and docs/ (with or
    without a ``$`` prompt)."""
    lines = []
    for page in _pages():
        text = page.read_text()
        for lang in ("bash", "sh", "console", "shell"):
            for block in _code_blocks(text, lang):
                lines += _command_lines(block) + _command_lines(block, prompt="$ ")
    return list(dict.fromkeys(lines))


@pytest.mark.parametrize("line", [c for c in _documented_commands() if not _is_template(c)])
def test_documented_command_lines_parse(line: str) -> None:
    """Each command of the README's and docs/' shell examples is one the parser takes (each
    side of a pipe), e.g. `ack` with its queue."""
    for command in line.split(" | "):
        words = shlex.split(command)
        assert words[0] == "lonnymq"
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as e:  # argparse's usage error
            raise AssertionError(f"{command!r} is not a valid command line") from e


# Commands that need what a fresh database does not have: a worker's module, a shard router, a
# browser, placeholders (NAME, Q), or that run long (demo).
_NOT_RUN = {"server", "worker", "cron", "web", "shard", "demo", "completion"}


def test_readme_cli_section_runs_as_written(dsn: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """The README's quick start for users, then its CLI lines that are one concrete command, run
    in order on a fresh database, each exiting 0 (a dead-letter queue must exist before a queue
    names it)."""
    name = f"docs_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PG")},
            "LONNYMQ_DSN": make_conninfo(dsn, dbname=name),
        }
        lonnymq = f"{shlex.quote(sys.executable)} -m lonnymq"
        ran = []
        quick_start = _command_lines(_readme_block("Quick start"))
        assert quick_start[0] == "lonnymq migrate"
        for line in [*quick_start, *_command_lines(_readme_cli_block())]:
            words = shlex.split(line.split(" | ")[0])
            if _is_template(line) or words[1] in _NOT_RUN or "--partitions" in words:
                continue
            shell = " | ".join(lonnymq + c[len("lonnymq") :] for c in line.split(" | "))
            proc = subprocess.run(
                ["bash", "-o", "pipefail", "-c", shell],
                env=env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, (line, proc.stdout, proc.stderr)
            ran.append(words[1])
        assert {"queue", "send", "peek", "take"} <= set(ran), ran
    finally:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
