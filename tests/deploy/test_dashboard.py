"""deploy/grafana/sluice.json: well formed, and every metric it queries is one the code exports
(a renamed or removed metric leaves a panel empty without any error in Grafana)."""

import json
import re

from conftest import ROOT

DASHBOARD = json.loads((ROOT / "deploy/grafana/sluice.json").read_text())
METRIC = re.compile(r"\bsluice_(?:server|coordinator)_[a-z0-9_]+")


def exported() -> set[str]:
    """Metric names in the string literals of the crates' sources (not their tests/ folders):
    where the exporters write them, wherever those move. A name in a comment does not count."""
    names = set()
    for path in (ROOT / "crates").glob("*/src/**/*.rs"):
        for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', path.read_text()):
            names.update(METRIC.findall(literal))
    return names


def panels() -> list[dict]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def queried() -> dict[str, set[str]]:
    by_panel = {}
    for panel in panels():
        for target in panel["targets"]:
            by_panel.setdefault(panel["title"], set()).update(METRIC.findall(target["expr"]))
    return by_panel


def test_exporters_found():
    names = exported()
    # Guards the extraction itself: if the files move, this fails rather than passing empty.
    assert {"sluice_server_pushed_bytes_total", "sluice_coordinator_live_servers"} <= names


def test_every_queried_metric_is_exported():
    names = exported()
    missing = {title: m - names for title, m in queried().items() if m - names}
    assert not missing, missing


def test_every_panel_queries_a_sluice_metric():
    for title, metrics in queried().items():
        assert metrics, title
    assert len(queried()) == len(panels())


def test_panels_use_the_datasource_variable():
    variables = [v["name"] for v in DASHBOARD["templating"]["list"]]
    assert variables[0] == "datasource"
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_ids_unique_and_layout_without_overlap():
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps at {(x, y)}"
                cells.add((x, y))


def test_covers_the_asked_for_areas():
    metrics = set().union(*queried().values())
    for needed in [
        "sluice_server_pushed_bytes_total",
        "sluice_server_fetched_bytes_total",
        "sluice_server_memory_used_bytes",
        "sluice_server_pushes_held_total",
        "sluice_server_busy_replies_total",
        "sluice_server_data_dirs_full",
        "sluice_server_data_dirs_failed",
        "sluice_server_flushed_bytes_total",
        "sluice_server_commits_total",
        "sluice_server_commit_wait_microseconds_total",
        "sluice_server_request_errors_total",
        "sluice_coordinator_live_servers",
    ]:
        assert needed in metrics, needed
