"""CI's table of legs (``.ci/legs.toml``) is whole and names what exists (no database):
every leg says why it runs and what, on a pair CI builds a venv for; every selection a
command names is declared; every test path it names exists (a module moved without
the table following would otherwise select nothing, quietly); and `scripts/dev test
--all` runs the selections CI's test legs run."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

TABLE = tomllib.loads((ROOT / ".ci" / "legs.toml").read_text())


def commands() -> list[tuple[str, list[str]]]:
    """(where, words) of every command of the table, "@name" not expanded."""
    found = [("demo", TABLE["demo"]["dev"])]
    for leg in TABLE["leg"]:
        for number, run in enumerate(leg["run"], 1):
            found.append((f"leg {leg['name']} run {number}", run.get("dev", run.get("cmd"))))
    found += [(f"all {entry['name']}", entry["args"]) for entry in TABLE["all"]]
    return found


def test_every_leg_says_why_and_runs_one_command_a_run_on_a_built_pair() -> None:
    pairs = {(pair["python"], pair["django"]) for pair in TABLE["pair"]}
    names = [leg["name"] for leg in TABLE["leg"]]
    assert len(names) == len(set(names)), names
    assert "demo" not in names  # the demo runs before the legs, under its own name
    for leg in TABLE["leg"]:
        assert leg.get("why", "").strip(), f"leg {leg['name']} says why it runs"
        assert leg["run"], leg["name"]
        for run in leg["run"]:
            assert ("dev" in run) != ("cmd" in run), (leg["name"], run)
            pair = (run.get("python", leg.get("python")), run.get("django", leg.get("django")))
            assert pair in pairs or ("cmd" in run and pair == (None, None)), (leg["name"], pair)
    assert TABLE["coverage"]["after"] in names


def test_every_selection_a_command_names_is_declared() -> None:
    for where, words in commands():
        for word in words:
            if word.startswith("@"):
                assert word[1:] in TABLE["selections"], f"{where}: {word}"


def named_paths() -> set[str]:
    words: list[str] = [w for _, ws in commands() for w in ws]
    words += [w for selection in TABLE["selections"].values() for w in selection]
    paths = set()
    for word in words:
        path = word.removeprefix("--ignore=")
        if path.startswith(("tests/", "bench/")):
            paths.add(path)
    return paths


def test_every_test_path_the_table_names_exists() -> None:
    paths = named_paths()
    assert "tests/faults/test_statement_matrix.py" in paths
    missing = []
    for path in sorted(paths):
        file, _, test = path.partition("::")
        where = ROOT / file
        if not where.exists() or (where.is_dir() and not any(where.rglob("test_*.py"))):
            missing.append(path)  # a folder must hold tests
        elif test:
            tree = ast.parse((ROOT / file).read_text())
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            if test.split("[")[0] not in defined:
                missing.append(path)
    assert missing == [], "moved or renamed? update .ci/legs.toml: " + ", ".join(missing)


def test_dev_all_runs_the_selections_of_ci_s_test_legs() -> None:
    leg_words = {w for leg in TABLE["leg"] for run in leg["run"] for w in run.get("dev", [])}
    for entry in TABLE["all"]:
        for word in entry["args"]:
            if word.startswith("@"):
                assert word in leg_words, f"{entry['name']}: {word} is no leg's selection"
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "legs.py"), "--all"],
        env={k: v for k, v in os.environ.items() if k != "TEST_WORKERS"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    names = [line.split("|")[0] for line in out.splitlines()]
    assert names == [entry["name"] for entry in TABLE["all"]]
    assert "|-n 2 -m 'not faults and not failover and not partition'" in out


def test_the_driver_stays_short() -> None:
    driver = Path(ROOT / ".ci" / "legs.py").read_text().splitlines()
    assert len(driver) <= 300
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    assert len(run) <= 40 and run[-1] == 'exec python3 .ci/legs.py "$@"'
