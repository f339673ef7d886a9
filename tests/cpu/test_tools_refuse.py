"""Issue 46 item 3: every reader and tool refuses a bad file in one line on stderr, exit 2, never a traceback.

``python -m harness.reference`` on a failed run's directory, ``python -m harness.bump``'s refusals,
``python -m harness history``, ``python -m harness.night.ci`` and ``python -m benchmarks`` on an empty,
foreign or binary file, a directory or a FIFO. Each tool's ``main`` runs in this process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import benchmarks.__main__ as benchmarks_main
from harness.base import run_dir
from harness.bump.__main__ import main as bump_main
from harness.night.ci import main as ci_main
from harness.reference.diagnosis import main as reference_main
from harness.report.history import main as history_main


def empty(p: Path) -> Path:
    p.write_text("")
    return p


def binary(p: Path) -> Path:
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    return p


def directory(p: Path) -> Path:
    p.mkdir()
    return p


def fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


def foreign_json(p: Path) -> Path:
    p.write_text(json.dumps({"name": "another tool's file", "items": [1, 2]}) + "\n")
    return p


def a_json_list(p: Path) -> Path:
    p.write_text("[1, 2, 3]\n")
    return p


def failed_run(p: Path) -> Path:
    """A run directory whose ranks recorded step 1's batch and died before provenance.json."""
    import torch
    from safetensors.torch import save_file

    (p / run_dir.RECORD_DIR).mkdir(parents=True)
    (p / run_dir.RUN_FILE).write_text("{}")
    save_file(
        {
            "input.0": torch.zeros(1, 4, dtype=torch.long),
            "labels.0": torch.zeros(1, 4, dtype=torch.long),
        },
        str(p / run_dir.RECORD_DIR / "rank00000.safetensors"),
        metadata={"world": "1", "attention": "sdpa", "batches": "1"},
    )
    return p


def a_file(p: Path) -> Path:
    p.write_text("a note\n")
    return p


BAD_FILES = {"empty": empty, "binary": binary, "directory": directory, "fifo": fifo}
CASES = [
    *(
        pytest.param(history_main, [], build, "history.jsonl", what, id=f"history-{name}")
        for name, build, what in [
            ("empty", empty, "is empty"),
            ("binary", binary, "binary data"),
            ("directory", directory, "is a directory"),
            ("fifo", fifo, "is a FIFO"),
        ]
    ),
    pytest.param(
        history_main, [], a_json_list, "history.jsonl", 'needs a "date" key', id="history-foreign"
    ),
    *(
        pytest.param(
            ci_main,
            ["require-claims"],
            build,
            "night.json",
            "not a pytest report",
            id=f"ci-{name}",
        )
        for name, build in [*BAD_FILES.items(), ("foreign", foreign_json), ("list", a_json_list)]
    ),
    pytest.param(
        ci_main,
        ["trend", "{tests}"],
        directory,
        "trend",
        "is a directory, not a trend file",
        id="ci-trend-a-directory",
    ),
    *(
        pytest.param(
            benchmarks_main.main,
            ["plan", "--out", "{out}", "--history"],
            build,
            "history.jsonl",
            what,
            id=f"benchmarks-{name}",
        )
        for name, build, what in [
            ("binary", binary, "binary data"),
            ("directory", directory, "is a directory"),
            ("foreign", a_json_list, "line 1 is not a JSON object"),
        ]
    ),
    pytest.param(
        reference_main,
        [],
        failed_run,
        "run",
        "ranks failed before provenance was written",
        id="reference-failed-run",
    ),
    pytest.param(
        reference_main,
        [],
        a_file,
        "notes.txt",
        "is a file, not a run directory",
        id="reference-a-file",
    ),
    pytest.param(
        bump_main,
        ["--dry-run", "no-such-package==1.0"],
        None,
        "",
        "no-such-package not in",
        id="bump-refused-pin",
    ),
]


@pytest.mark.parametrize("main, argv, build, name, message", CASES)
def test_a_tool_refuses_a_bad_file_in_one_line_on_stderr(
    main, argv, build, name, message, tmp_path, capsys
):
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps({"tests": []}))
    path = build(tmp_path / name) if build else None
    argv = [
        a.replace("{tests}", str(tests)).replace("{out}", str(tmp_path / "out.json")) for a in argv
    ] + ([str(path)] if path else [])
    code = main(argv)
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert code == 2, (code, out.out, out.err)
    assert len(lines) == 1 and message in lines[0], out.err
    assert (path is None or str(path) in lines[0]) and "Traceback" not in out.err
    assert "error" in lines[0] or lines[0].startswith("bump: ")
