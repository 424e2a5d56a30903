"""User-given names reach the terminal and figure titles with control characters escaped."""
import os

import pytest

from emulator.cli import main
from emulator.outputs.printable import figure_text, printable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.path.join(ROOT, "scenarios", "quickstart.yaml")


def test_controls_and_invisible_formatting_are_escaped_and_other_text_kept():
    assert printable("plain name-1.5B ünïcödé 名前") == "plain name-1.5B ünïcödé 名前"
    assert printable(r"C:\runs\a.yaml") == r"C:\runs\a.yaml"
    # ESC, newline, CR, tab, NUL, DEL, a C1 control, a bidi override (U+202E), a line separator (U+2028)
    assert printable("a\x1b[31mb\nc\rd\te\x00f\x7fg\x9bh\u202ei\u2028j") == \
        r"a\x1b[31mb\nc\rd\te\x00f\x7fg\x9bh\u202ei\u2028j"
    assert printable("two\nlines\x1b", keep="\n") == "two\nlines\\x1b"
    assert figure_text("cost $5\n") == r"cost \$5\n"  # $ would start matplotlib mathtext


def _scenario(tmp_path, name):
    text = open(QUICK).read().replace("name: quickstart", "name: " + name)
    (tmp_path / "s.yaml").write_text(text)
    return str(tmp_path / "s.yaml")


@pytest.mark.parametrize("yaml_name, shown", [(r'"evil\e[2J"', r"evil\x1b[2J"), (r'"two\nlines"', r"two\nlines")])
def test_run_collective_and_estimate_print_the_name_escaped(tmp_path, capsys, yaml_name, shown):
    path = _scenario(tmp_path, yaml_name)
    assert main(["run", path]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert next(ln for ln in out.splitlines() if ln.startswith("scenario")).split(None, 1)[1] == shown
    assert main(["run", path, "--estimate"]) == 0
    out = capsys.readouterr().out
    assert next(ln for ln in out.splitlines() if ln.startswith("scenario")).split(None, 1)[1] == shown
    assert main(["collective", path, "--sizes", "1MiB:1MiB"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"# all_reduce on {shown}"


def test_an_error_naming_a_file_with_a_newline_stays_one_line(tmp_path, capsys):
    bad = tmp_path / "a\nb\x1b.yaml"
    bad.write_text("name: x\ncluster: {nodes: 0}\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "a\\nb\\x1b.yaml" in err


def test_study_plot_labels_are_escaped():
    from emulator.studies.plot import _label

    # a varied value that is a name: the ESC is shown as \x1b, the $ as itself (not a mathtext formula)
    assert _label("a$b\x1b$") == r"a\$b\x1b\$"
    assert _label(0.5) == "0.5"
