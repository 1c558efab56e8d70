"""``dlrover report``: an HTML page from a run directory; bad run directories are one-line errors."""

import base64
import json
import re

from dlrover.cli.main import main
from dlrover.runlogs.report import render

from summaries import a_summary

CONFIG = {"workers": 2, "ps": 1, "worker_cpu": 1.0, "ps_cpu": 1.0, "worker_memory_mb": 1536, "ps_memory_mb": 2048}


def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    grown = dict(CONFIG, worker_memory_mb=2304)
    events = [
        {"at_s": 0.0, "kind": "initial_config", "config": CONFIG},
        {"at_s": 0.5, "kind": "chaos", "job_s": 9.5, "action": "leak", "actor": "j/worker-0"},
        *[{"at_s": 9.0 + i, "kind": "metrics", "actor": f"j/worker-{i % 2}", "samples_per_s": 1000.0 + i, "rss_mb": 600.0 + 20 * i} for i in range(30)],
        *[{"at_s": 9.0 + i, "kind": "ps_metrics", "actor": "j/ps-0", "rss_mb": 400.0} for i in range(30)],
        {"at_s": 20.0, "kind": "failure", "failure_kind": "memory_pressure", "actor": "j/worker-0"},
        {"at_s": 20.0, "kind": "scale", "to": grown, "from": CONFIG},
    ]
    (d / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    (d / "summary.json").write_text(json.dumps(a_summary(final_config=grown).to_json()))
    return d


def test_report_has_every_plot_and_the_event_tables(tmp_path, capsys):
    d = run_dir(tmp_path)
    page = render(d)
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page  # self-contained, nothing to run
    images = re.findall(r'<figure id="(\w+)"><img alt="\w+" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert [k for k, _ in images] == ["throughput", "allocation", "memory", "model"]
    assert all(base64.b64decode(b)[:8] == b"\x89PNG\r\n\x1a\n" for _, b in images)
    assert "memory_pressure" in page and "(worker 1536 MB, PS 2048 MB) -&gt; 2w x 1cpu + 1ps x 1cpu (worker 2304 MB" in page and "worker-0" in page
    assert main(["report", str(d)]) == 0
    assert (d / "report.html").read_text() == page and "report.html" in capsys.readouterr().out


def test_bad_run_directories_are_one_line_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "summary.json: missing" in capsys.readouterr().err
    d = run_dir(tmp_path)
    with (d / "events.jsonl").open("a") as f:
        f.write("{not json\n")
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert "events.jsonl:" in err and "not a JSON object" in err and err.count("\n") == 1


def chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


def render_in_chromium(page, shot) -> str:
    """Screenshot ``page`` with headless Chromium; returns its log (console messages included)."""
    import subprocess

    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
            "--window-size=1000,2600", f"--screenshot={shot}", page.resolve().as_uri()]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


def assert_markers_drawn(shot) -> None:
    """The screenshot shows the scale (blue), failure (red) and fault (purple) markers."""
    import matplotlib.image as mpimg
    import numpy as np

    from dlrover.runlogs.report import MARKS

    img = (mpimg.imread(str(shot))[..., :3] * 255).astype(int)
    for kind, (color, _, _) in MARKS.items():
        rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
        hits = int((np.abs(img - rgb).sum(axis=2) < 30).sum())
        assert hits > 200, (kind, hits)


def test_report_renders_in_headless_chromium_without_console_errors(tmp_path):
    import pytest

    if chromium() is None:
        pytest.skip("chromium not installed (scripts/install.sh installs the Debian package when it can)")
    from dlrover.runlogs.report import write_report

    page = write_report(run_dir(tmp_path))
    shot = tmp_path / "report.png"
    log = render_in_chromium(page, shot)
    assert "CONSOLE" not in log, [ln for ln in log.splitlines() if "CONSOLE" in ln]
    assert shot.stat().st_size > 20_000
    assert_markers_drawn(shot)
