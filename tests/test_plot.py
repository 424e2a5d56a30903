"""Study plots and link utilisation: the numbers behind them, and the files."""
import numpy as np
import pytest
from test_sweep import degrade, write_tiny

from emulator.cli import main
from emulator.errors import EmulatorError
from emulator.outputs.linkplot import busiest, cumulative, plot_links, utilisation
from emulator.run.simulation import simulate
from emulator.scenario import load_scenario
from emulator.studies.plot import pareto_front, plot_study

PNG = b"\x89PNG\r\n\x1a\n"


def test_pareto_front_keeps_points_no_cheaper_point_beats():
    pts = [(8, 100.0), (16, 150.0), (16, 180.0), (32, 170.0), (64, 400.0), (8, 90.0)]
    # by cost: 8 → 100 (best so far), 16 → 180 (the better of the two), 32 → 170 < 180 (dominated), 64 → 400
    assert pareto_front(pts) == [0, 2, 4]


def test_utilisation_integrates_a_piecewise_constant_load():
    series = [(0.0, 50.0), (1.0, 100.0), (3.0, 0.0)]  # B/s from t on, on a 100 B/s link
    # ∫0^t: t=1 → 50, t=2 → 150, t=3 → 250, t=4 → 250
    assert list(cumulative(series, np.array([0.0, 1.0, 2.0, 3.0, 4.0]))) == [0.0, 50.0, 150.0, 250.0, 250.0]
    assert list(utilisation(series, 100.0, 4.0, 4)) == [0.5, 1.0, 1.0, 0.0]
    # two bins of 2 s: (50 + 100)/200 = 0.75, (100 + 0)/200 = 0.5
    assert list(utilisation(series, 100.0, 4.0, 2)) == [0.75, 0.5]
    # mean over 4 s: link 0 carries 250 of 400 possible, link 1 100 of 400, link 2 nothing
    assert busiest({0: series, 1: [(0.0, 25.0)], 2: []}, [100.0, 100.0, 100.0], 4.0, 5) == [0, 1]


def _study(tmp_path, varies):
    path = write_tiny(str(tmp_path))
    db = str(tmp_path / "r.sqlite")
    args = ["sweep", path, "--db", db]
    for v in varies:
        args += ["--vary", v]
    assert main(args) == 0
    return db


def _is_png_and_svg(paths):
    assert [p.rsplit(".", 1)[1] for p in paths] == ["png", "svg"]
    assert open(paths[0], "rb").read(8) == PNG
    assert b"<svg" in open(paths[1], "rb").read(2000)


def test_line_heatmap_and_pareto_files(tmp_path):
    one = _study(tmp_path, [f"cluster.overrides={degrade(1)},{degrade(0.5)},{degrade(0.25)}"])
    _is_png_and_svg(plot_study(one, str(tmp_path / "line.png")))
    _is_png_and_svg(plot_study(one, str(tmp_path / "pareto.png"), pareto=True, cost_per_gpu_hour=2.0))
    two = str(tmp_path / "two.sqlite")
    path = write_tiny(str(tmp_path))
    assert main(["sweep", path, "--db", two, "--vary", f"cluster.overrides={degrade(1)},{degrade(0.5)}",
                 "--vary", "simulation.iterations=1,2"]) == 0
    _is_png_and_svg(plot_study(two, str(tmp_path / "heat.png"), metric="iteration_time_s"))
    with pytest.raises(EmulatorError, match="no row has this metric"):
        plot_study(two, str(tmp_path / "x.png"), metric="nope")
    with pytest.raises(EmulatorError, match="no finished rows"):
        plot_study(two, str(tmp_path / "x.png"), where=["simulation.iterations=7"])


def test_plot_links_of_a_run(tmp_path, capsys):
    path = write_tiny(str(tmp_path))
    result = simulate(load_scenario(path), record_links=True)
    paths = plot_links(result, str(tmp_path / "links.png"), top=4)
    _is_png_and_svg(paths)
    assert main(["plot", "--links", str(tmp_path), "--out", str(tmp_path / "l.png")]) == 2
    assert "holds no link series" in capsys.readouterr().err
    assert main(["plot", "--links", path, "--out", str(tmp_path / "l.png")]) == 0
