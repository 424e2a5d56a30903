"""gantt.png: rows per pipeline stage, whole-pass blocks with micro-batch labels, the hatched
bubble with its hand-computed extent, the legend outside the axes, and the caption."""
import dataclasses
import json

import pytest
from helpers import custom_scenario, star
from matplotlib.backends.backend_agg import FigureCanvasAgg

from emulator.outputs.gantt import AXES_PX, Block, chart, density, draw, evenly, gantt_figure, survey, write_gantt
from emulator.run.simulation import simulate
from emulator.scenario.spec import WorkloadSpec
from emulator.spans import Span

MS = 1e-3
F, B = 1 * MS, 2 * MS  # forward and backward time of one micro-batch on one stage


def span(op, rank, kind, start, end, mb=-1, stage=-1, category="", stream="compute", xfer=None):
    return Span(op, rank, stream, kind, f"op{op}", start, end, 0.0, 0.0, mb, stage, category,
                start if xfer is None else xfer)


def gpipe_spans():
    """GPipe, p = 2 stages, m = 2 micro-batches, free communication. Each forward pass is two
    layer kernels with a 1 µs tensor-parallel wait between them (the 'stripes' of the old chart).

    stage 0: F0 [0,1] F1 [1,2]          B0 [5,7] B1 [7,9]    (ms)
    stage 1:        F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7]
    """
    out, op = [], 0

    def add(*a, **k):
        nonlocal op
        out.append(span(op, *a, **k))
        op += 1

    for rank, fwd_at, bwd_at in ((0, (0, 1), (5, 7)), (1, (1, 2), (3, 5))):
        for mb in (0, 1):
            t = fwd_at[mb] * MS
            add(rank, "compute", t, t + F / 2 - 1e-6, mb=mb, stage=rank, category="fwd")  # layer 1
            add(rank, "compute", t + F / 2, t + F, mb=mb, stage=rank, category="fwd")  # layer 2
            add(rank, "compute", bwd_at[mb] * MS, bwd_at[mb] * MS + B, mb=mb, stage=rank, category="bwd")
    add(0, "send", 1 * MS, 1 * MS + 1e-6, mb=0, stage=0, stream="pp_send_fwd")  # 1 µs transfers
    add(1, "recv", 1 * MS, 1 * MS + 1e-6, mb=0, stage=1, stream="pp_recv_fwd")
    return out


def test_forward_passes_are_one_block_per_micro_batch_and_the_bubble_is_p_minus_1_times_f_plus_b():
    spans = gpipe_spans()
    c = chart(spans, survey(spans), total=2)
    assert [r.label for r in c.rows] == ["s0 · r0 compute", "r0 pp", "s1 · r1 compute", "r1 pp"]
    r0, r1 = c.rows[0], c.rows[2]
    # the two layer kernels of a forward pass (1 µs apart, under one pixel: 9 ms / 1221 px = 7.4 µs) are one block
    assert AXES_PX == 1221  # (14 − 1.25 − 1.65) in × 110 dpi
    assert [(b.key, b.microbatch) for b in r0.blocks] == [("fwd", 0), ("fwd", 1), ("bwd", 0), ("bwd", 1)]
    assert [(round(b.start / MS, 9), round(b.width / MS, 9)) for b in r0.blocks] == [(0, 1), (1, 1), (5, 2), (7, 2)]
    # the flush ends at 9 ms (stage 0's last backward); stage 0 idles from 2 to 5 ms, stage 1 from 0 to 1 and 7 to 9
    assert [(round(a / MS, 9), round(w / MS, 9)) for a, w in r0.idle] == [(2, 3)]
    assert [(round(a / MS, 9), round(w / MS, 9)) for a, w in r1.idle] == [(0, 1), (7, 2)]
    # each stage idles (p − 1)(f + b) = 1 · (1 + 2) = 3 ms
    for row in (r0, r1):
        assert sum(w for _, w in row.idle) == pytest.approx((2 - 1) * (F + B), abs=1e-12)
    assert c.caption == "2 of 2 ranks shown: one per pipeline stage, the rank whose compute ends last (lowest id on ties)"


def _rendered(fig):
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig, fig.axes[0], fig.canvas.get_renderer()


def _bars(ax, gid, y):
    """(start, end) in ms of the bars of the collections with ``gid`` on row ``y``."""
    out = []
    for coll in ax.collections:
        if coll.get_gid() != gid:
            continue
        for path in coll.get_paths():
            v = path.vertices
            if v[:, 1].min() < y < v[:, 1].max():
                out.append((round(float(v[:, 0].min()), 9), round(float(v[:, 0].max()), 9)))
    return sorted(out)


def test_figure_has_stage_rows_labels_bubble_patches_and_the_legend_outside_the_axes():
    spans = gpipe_spans()
    fig, ax, renderer = _rendered(draw(chart(spans, survey(spans), total=2), "gpipe", 9 * MS))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["s0 · r0 compute", "r0 pp", "s1 · r1 compute", "r1 pp"]
    # hatched bubble patches in ms: stage 0 (row 0) 2–5, stage 1 (row 2) 0–1 and 7–9
    assert _bars(ax, "bubble", 0) == [(2, 5)]
    assert _bars(ax, "bubble", 2) == [(0, 1), (7, 9)]
    assert all(c.get_hatch() == "///" for c in ax.collections if c.get_gid() == "bubble")
    assert _bars(ax, "fwd", 0) == [(0, 1), (1, 2)] and _bars(ax, "bwd", 2) == [(3, 5), (5, 7)]
    # micro-batch labels at each block's middle: row 0 F0 F1 B0 B1, row 2 F0 F1 B0 B1
    labels = sorted((round(t.get_position()[1]), t.get_position()[0], t.get_text()) for t in ax.texts
                    if t.get_gid() == "microbatch")
    assert labels == [(0, 0.5, "0"), (0, 1.5, "1"), (0, 6.0, "0"), (0, 8.0, "1"),
                      (2, 1.5, "0"), (2, 2.5, "1"), (2, 4.0, "0"), (2, 6.0, "1")]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["fwd", "bwd", "send", "recv", "idle compute (bubble)"]
    box, axes = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.x0 >= axes.x1  # right of the axes: it covers no bar
    assert box.x1 <= fig.bbox.x1  # and inside the picture
    assert "2 of 2 ranks shown" in ax.get_title(loc="left")


def test_the_slowest_rank_of_each_stage_is_shown_and_the_caption_says_why():
    # stage 0: ranks 0 and 2, rank 2's compute ends later; stage 1: ranks 1 and 3 tie, the lowest id wins
    spans = [span(0, 0, "compute", 0, 1, 0, 0, "fwd"), span(1, 2, "compute", 0, 2, 0, 0, "fwd"),
             span(2, 1, "compute", 1, 3, 0, 1, "fwd"), span(3, 3, "compute", 1, 3, 0, 1, "fwd")]
    c = chart(spans, survey(spans), total=8)  # 4 of 8 ranks simulated: the others are folded copies
    assert c.shown == [2, 1]
    assert c.caption == ("2 of 8 ranks shown: one per pipeline stage, the rank whose compute ends last (lowest id "
                         "on ties); the others are folded copies of the simulated ranks")


def test_without_stages_every_rank_is_shown_up_to_the_row_limit_evenly_spaced():
    assert evenly(list(range(10)), 4) == [0, 3, 6, 9]  # round(i · 9/3) for i = 0..3
    # 60 ranks, each a compute row and one dp row: 48 rows // 2 = 24 ranks
    spans = [span(i, i // 2, "compute" if i % 2 == 0 else "collective", 0, 1, stream="compute" if i % 2 == 0 else "dp")
             for i in range(120)]
    c = chart(spans, survey(spans), total=60)
    assert len(c.shown) == 24 and c.shown[0] == 0 and c.shown[-1] == 59
    assert c.caption == "24 of 60 ranks shown: evenly spaced"


def test_transfers_are_shaded_by_their_busy_share_of_each_pixel_column():
    # busy [0, 0.5] and [1.5, 2.5] over 4 columns of 1: each of the first three is half busy, the last idle
    blocks = [Block(0.0, 0.5, "collective", -1), Block(1.5, 1.0, "collective", -1)]
    assert density(blocks, 4.0, 4) == [(0.0, 3.0, 0.5)]
    # busy [0, 1] over 2 columns: the first full, the second idle
    assert density([Block(0.0, 1.0, "send", -1)], 2.0, 2) == [(0.0, 1.0, 1.0)]
    # a 1e-15 s transfer still marks its column, at the lowest share shown (0.01)
    assert density([Block(1.2, 1e-15, "send", -1)], 2.0, 2) == [(1.0, 1.0, 0.01)]


def test_recompute_is_drawn_inside_its_backward_block_not_as_stripes():
    # backward of micro-batch 0 as recompute/backward per layer: 0–1 r, 1–2 b, 2–3 r, 3–4 b (ms)
    spans = [span(i, 0, "compute", i * MS, (i + 1) * MS, 0, 0, "recompute" if i % 2 == 0 else "bwd")
             for i in range(4)]
    row = chart(spans, survey(spans), total=1).rows[0]
    assert [(b.key, round(b.width / MS, 9)) for b in row.blocks] == [("bwd", 4)]
    assert [(round(b.start / MS, 9), round(b.width / MS, 9)) for b in row.recompute] == [(0, 1), (2, 1)]


def _trace(folder):
    """The GPipe case above as a native trace on a star with a 1 PB/s, zero-latency switch: 1-byte
    sends take 1e-15 s, so the times are the hand ones."""
    ops, deps = [], {}

    def op(rank, kind, **k):
        ops.append({"id": len(ops), "rank": rank, "kind": kind, "stage": rank, **k})
        return len(ops) - 1

    for mb in (0, 1):
        f0 = op(0, "compute", deps=[deps.get(("f0", mb - 1))] if mb else [], duration=F, category="fwd",
                microbatch=mb, stream="compute")
        deps[("f0", mb)] = f0
        op(0, "send", deps=[f0], peer=1, bytes=1, tag=mb, microbatch=mb, stream="pp_send")
        r = op(1, "recv", deps=[], peer=0, bytes=1, tag=mb, microbatch=mb, stream="pp_recv")
        deps[("f1", mb)] = op(1, "compute", deps=[r], duration=F, category="fwd", microbatch=mb, stream="compute")
    prev = deps[("f1", 1)]
    for mb in (0, 1):
        b1 = op(1, "compute", deps=[prev], duration=B, category="bwd", microbatch=mb, stream="compute")
        prev = b1
        op(1, "send", deps=[b1], peer=0, bytes=1, tag=10 + mb, microbatch=mb, stream="pp_send")
        r = op(0, "recv", deps=[deps[("f0", 1)]], peer=1, bytes=1, tag=10 + mb, microbatch=mb, stream="pp_recv")
        deps[("b0", mb)] = op(0, "compute", deps=[r] + ([deps[("b0", mb - 1)]] if mb else []), duration=B,
                              category="bwd", microbatch=mb, stream="compute")
    path = folder / "gpipe.json"
    path.write_text(json.dumps({"format": "emulator-trace", "version": 1, "ranks": 2, "ops": ops}))
    sc = custom_scenario(star(folder, 2, bw=1e15, lat=0.0), name="gpipe")
    return dataclasses.replace(sc, workload=WorkloadSpec(trace=str(path)))


def test_a_simulated_gpipe_run_draws_the_hand_computed_bubble(tmp_path):
    result = simulate(_trace(tmp_path))
    assert result.iteration_time_s == pytest.approx(9 * MS, abs=1e-9)  # (m + p − 1)(f + b) = 3 · 3 ms
    fig, ax, _ = _rendered(gantt_figure(result))
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == ["s0 · r0 compute", "r0 pp", "s1 · r1 compute", "r1 pp"]
    assert _bars(ax, "bubble", 0) == [(2, 5)]
    assert _bars(ax, "bubble", 2) == [(0, 1), (7, 9)]
    # the 1-byte sends (1e-15 s) still show: one pixel column (9 ms / 1221) on row 1, at 1 ms (column
    # 1221/9 = 135.7 → 135) and at 2 ms (271.3 → 271)
    px = 9 / AXES_PX
    assert [(a, round((b - a) / px, 6)) for a, b in _bars(ax, "send", 1)] == [(round(k * px, 9), 1) for k in (135, 271)]
    write_gantt(str(tmp_path / "g.png"), result)
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_control_characters_and_dollars_in_the_name_are_escaped_in_the_title(tmp_path):
    sc = _trace(tmp_path)
    result = simulate(dataclasses.replace(sc, name="evil\x1b[2J\nname $x$"))
    fig = gantt_figure(result)
    assert fig.get_suptitle().startswith(r"evil\x1b[2J\nname \$x\$: iteration 9.000 ms")
