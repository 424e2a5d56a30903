"""Units: parsing quantities with units to SI, refusing bare numbers, formatting back."""
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.errors import EmulatorError
from emulator.scenario.units import (
    UNIT_PATTERNS,
    UnitError,
    format_bandwidth,
    format_bytes,
    format_flops_rate,
    format_time,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_flops_rate,
    parse_ratio,
    parse_si,
    parse_time,
)


@pytest.mark.parametrize("text, expected", [
    ("80 GiB", 80 * 2**30),  # 85_899_345_920
    ("25 MB", 25e6),
    ("1.5KiB", 1536),  # 1.5 * 1024, no space
    ("2 TB", 2e12),
    ("512 B", 512),
    ("141 GB", 141e9),
    ("1 kB", 1e3),
    ("1e3 MB", 1e9),  # exponent notation: 1000 * 1e6
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [
    ("2 us", 2e-6), ("1.5 ms", 1.5e-3), ("3µs", 3e-6), ("3 μs", 3e-6), ("10 ns", 1e-8),
    ("2 s", 2.0), ("1 min", 60.0), ("0.15 us", 1.5e-7),
])
def test_parse_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [
    ("200 Gb/s", 25e9),  # 200e9 bits / 8
    ("200Gb/s", 25e9),
    ("400 Gbps", 50e9),
    ("25 GB/s", 25e9),
    ("1 GiB/s", 2**30),
    ("8 b/s", 1.0),
    ("100 Mb/s", 12.5e6),
    ("2 TB/s", 2e12),
])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [
    ("312 TFLOP/s", 312e12), ("989.4 TFLOPS", 989.4e12), ("2.25 PFLOP/s", 2.25e15),
    ("1 Tflops", 1e12), ("5 GFLOP/s", 5e9),
])
def test_parse_flops_rate(text, expected):
    assert parse_flops_rate(text) == pytest.approx(expected, rel=1e-15)


def test_parse_flops_count():
    assert parse_flops("4.2 TFLOP") == pytest.approx(4.2e12, rel=1e-15)


@pytest.mark.parametrize("parse, example", [
    (parse_bytes, '"80 GiB"'), (parse_time, '"2 us"'), (parse_bandwidth, '"200 Gb/s"'),
    (parse_flops_rate, '"312 TFLOP/s"'),
])
@pytest.mark.parametrize("bare", [200, 2.5, "200", " 7 "])
def test_a_bare_number_needs_a_unit(parse, example, bare):
    with pytest.raises(UnitError, match="with a unit such as") as info:
        parse(bare)
    assert example in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, EmulatorError)


def test_bare_number_message_names_the_number():
    with pytest.raises(UnitError) as info:
        parse_bandwidth(200)
    assert str(info.value) == ('expected a bandwidth with a unit such as "200 Gb/s" or "25 GB/s", '
                               "got the bare number 200")


@pytest.mark.parametrize("value", [True, False, None, [1], {"a": 1}])
def test_non_numbers_are_refused(value):
    with pytest.raises(UnitError):
        parse_bytes(value)
    with pytest.raises(UnitError):
        parse_si(value, "bytes")


@pytest.mark.parametrize("text, needle", [
    ("nan GB", "does not start with a number"),
    ("inf GB", "does not start with a number"),
    ("-1 GB", "negative"),
    ("1e400 GB", "not a finite number"),
    ("1e30 B", "not plausible"),  # more than 1e18 B
    ("8 Gb", "bits"),  # b is bits: a size is in B
    ("8 foo", 'unknown unit "foo"'),
    ("", "does not start with a number"),
])
def test_bad_sizes(text, needle):
    with pytest.raises(UnitError, match=re.escape(needle)):
        parse_bytes(text)


def test_case_matters_for_bits_and_bytes():
    # 8 Gb/s = 1 GB/s
    assert parse_bandwidth("8 Gb/s") == parse_bandwidth("1 GB/s") == 1e9
    with pytest.raises(UnitError, match=re.escape('"GB/s"')):
        parse_bandwidth("8 GB")  # a size, not a rate: the hint suggests GB/s


def test_parse_si_reads_plain_numbers_as_si():
    assert parse_si(1e-6, "time") == 1e-6
    assert parse_si(100, "bytes") == 100.0
    assert parse_si("2 us", "time") == pytest.approx(2e-6, rel=1e-15)
    assert parse_si("1 KiB", "bytes") == 1024.0
    assert parse_si("25e9", "bandwidth") == 25e9  # a numeric string is SI too
    assert parse_si(3e12, "flops") == 3e12
    with pytest.raises(UnitError, match="negative"):
        parse_si(-1, "time")
    with pytest.raises(UnitError, match="finite"):
        parse_si(float("nan"), "time")
    with pytest.raises(UnitError, match="too large"):
        parse_si(10**400, "bytes")
    with pytest.raises(ValueError, match="unknown quantity kind"):
        parse_si(1, "volts")


def test_parse_ratio():
    assert parse_ratio(0.8) == 0.8
    assert parse_ratio("230/300") == 230 / 300
    assert parse_ratio("2:1") == 2.0
    assert parse_ratio(2) == 2.0
    for bad in ("1/0", "two", True, "nan", -1):
        with pytest.raises(UnitError):
            parse_ratio(bad)


def test_format():
    assert format_bytes(1.5 * 2**30) == "1.5 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(80 * 2**30) == "80.0 GiB"
    assert format_time(0.0123) == "12.3 ms"
    assert format_time(2.5e-6) == "2.5 us"
    assert format_time(3.0) == "3.0 s"
    assert format_time(0) == "0 s"
    assert format_bandwidth(230e9) == "230.0 GB/s"
    assert format_bandwidth(25e9) == "25.0 GB/s"
    assert format_flops_rate(312e12) == "312.0 TFLOP/s"


ACCEPTED = {
    "bytes": ["80 GiB", "25MB", "1.5 KiB", "1e3 B"],
    "time": ["2 us", "3µs", "1.5 ms", "10ns"],
    "bandwidth": ["200 Gb/s", "25 GB/s", "400Gbps", "1 GiB/s"],
    "flops_rate": ["312 TFLOP/s", "989.4 TFLOPS", "1 Tflops"],
}
REFUSED = {"bytes": ["80", "8 Gb", "GiB"], "time": ["2", "2 sec"], "bandwidth": ["200", "25 GB"],
           "flops_rate": ["312", "312 TFLOP"]}
PARSE = {"bytes": parse_bytes, "time": parse_time, "bandwidth": parse_bandwidth,
         "flops_rate": parse_flops_rate}


@pytest.mark.parametrize("kind", list(ACCEPTED))
def test_schema_patterns_agree_with_the_parsers(kind):
    pattern = re.compile(UNIT_PATTERNS[kind])
    for text in ACCEPTED[kind]:
        PARSE[kind](text)
        assert pattern.search(text), text
    for text in REFUSED[kind]:
        with pytest.raises(UnitError):
            PARSE[kind](text)
        assert not pattern.search(text), text


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=1e17, allow_nan=False),
       st.sampled_from([("B", 1), ("KiB", 1024), ("MB", 1e6), ("GiB", 2**30)]))
def test_bytes_scale_exactly(x, unit):
    # value * factor, computed the same way as the parser: float(text) * factor
    name, factor = unit
    text = f"{x!r} {name}"
    if x * factor > 1e18:
        with pytest.raises(UnitError):
            parse_bytes(text)
    else:
        assert parse_bytes(text) == float(repr(x)) * factor


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1024, max_value=2**55, allow_nan=False))
def test_format_bytes_round_trips_to_within_rounding(b):
    # one decimal in units of at least 1 KiB: the relative error is at most 0.05 / 1
    back = parse_bytes(format_bytes(b))
    assert math.isclose(back, b, rel_tol=0.05)
