from __future__ import annotations

import json

import pytest

from bench.__main__ import main
from workers.sim.fleet import start_fleet

TINY = ["--param", "requests=6", "--param", "prompt_tokens=64", "--param", "output_tokens=4"]


def test_sim_cli_writes_one_json_per_policy(tmp_path, capsys) -> None:
    out = tmp_path / "sim.json"
    rc = main(
        [
            "sim",
            "--workload",
            "unique",
            *TINY,
            "--rate",
            "5",
            "--engines",
            "2",
            "--profile",
            "dev",
            "--policy",
            "round_robin",
            "--policy",
            "kv_score",
            "--out",
            str(out),
            "--html",
            str(tmp_path / "sim.html"),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "sim unique kv_score x2 dev" in printed and "s CPU" in printed
    for policy in ("round_robin", "kv_score"):
        doc = json.loads((tmp_path / f"sim-{policy}.json").read_text())
        assert doc["summary"]["completed"] == 6 and len(doc["requests"]) == 6
    assert (tmp_path / "sim.html").stat().st_size > 1_000_000


def test_sweep_cli_table_and_heatmap(tmp_path, capsys) -> None:
    rc = main(
        [
            "sweep",
            "--workload",
            "tenants",
            "--param",
            "tenants=2",
            "--param",
            "users=2",
            "--param",
            "prefix_tokens=64",
            "--param",
            "question_tokens=16",
            "--param",
            "output_tokens=4",
            "--rate",
            "20",
            "--engines",
            "2",
            "--profile",
            "dev",
            "--policy",
            "kv_score",
            "--grid",
            "cache_weight=0,1",
            "--grid",
            "load_weight=0.5,1",
            "--out",
            str(tmp_path / "sweep.json"),
            "--html",
            str(tmp_path / "sweep.html"),
        ]
    )
    assert rc == 0
    table = capsys.readouterr().out
    assert table.count("\n") >= 5 and "cache_weight" in table
    rows = json.loads((tmp_path / "sweep-kv_score.json").read_text())["rows"]
    assert len(rows) == 4
    assert '"type":"heatmap"' in (tmp_path / "sweep.html").read_text()


def test_cli_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--rate"):
        main(
            [
                "sim",
                "--workload",
                "unique",
                *TINY,
                "--engines",
                "1",
                "--profile",
                "dev",
                "--policy",
                "kv_score",
            ]
        )
    with pytest.raises(SystemExit, match="--grid"):
        main(
            [
                "sweep",
                "--workload",
                "unique",
                *TINY,
                "--rate",
                "1",
                "--profile",
                "dev",
                "--grid",
                "cache_weight",
            ]
        )
    with pytest.raises(SystemExit, match="bogus"):
        main(
            [
                "sim",
                "--workload",
                "unique",
                "--param",
                "bogus=1",
                "--rate",
                "1",
                "--policy",
                "kv_score",
            ]
        )


def test_run_cli_against_a_worker(tmp_path, capsys) -> None:
    with start_fleet(1, profile="dev", time_scale=0.05, kv_events=False) as fleet:
        rc = main(
            [
                "run",
                "--target",
                fleet.workers[0].url,
                "--workload",
                "unique",
                *TINY,
                "--concurrency",
                "2",
                "--out",
                str(tmp_path / "run.json"),
            ]
        )
    assert rc == 0
    assert "completed 6  failed 0" in capsys.readouterr().out
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["summary"]["hit_rate"] == 0.0 and doc["summary"]["oracle_hit_rate"] == 0.0
