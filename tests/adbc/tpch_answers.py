"""Reads the 22 TPC-H queries and their reference answers (DuckDB, same data) from the
sqllogictest files in sql-tests/suites/tpch_sf001, and compares results like the Rust
runner does: token by token, numbers within 1.5e-6 absolute or 1e-9 relative."""

import datetime
import decimal
import re
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / "sql-tests" / "suites" / "tpch_sf001"


def load():
    queries = []
    for path in sorted(SUITE.glob("q*.slt")):
        lines = [l for l in path.read_text().splitlines() if not l.startswith("#")]
        text = "\n".join(lines).strip()
        header, rest = text.split("\n", 1)
        sql, expected = rest.split("\n----\n", 1) if "\n----\n" in rest else (rest, "")
        rowsort = "rowsort" in header
        rows = [l for l in expected.splitlines() if l.strip()]
        queries.append((path.stem, sql.strip(), rows, rowsort))
    return queries


def format_value(v):
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return v if v else "(empty)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (decimal.Decimal, float)):
        s = format(decimal.Decimal(str(v)), "f")
        if "." in s:
            s = s.rstrip("0").rstrip(".")
        return "0" if s == "-0" else s
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    return str(v)


def _num(s):
    if not re.fullmatch(r"[-+0-9.eE]+", s):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def tokens_match(a, e):
    if a == e:
        return True
    fa, fe = _num(a), _num(e)
    if fa is None or fe is None:
        return False
    diff = abs(fa - fe)
    return diff <= 1.5e-6 or diff <= 1e-9 * max(abs(fa), abs(fe))


def matches(actual_rows, expected_rows, rowsort):
    actual = [" ".join(format_value(v) for v in row) for row in actual_rows]
    expected = list(expected_rows)
    if rowsort:
        actual, expected = sorted(actual), sorted(expected)
    if len(actual) != len(expected):
        return False
    for a, e in zip(actual, expected):
        ta, te = a.split(), e.split()
        if len(ta) != len(te) or not all(tokens_match(x, y) for x, y in zip(ta, te)):
            return False
    return True
