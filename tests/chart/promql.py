"""The metric names a PromQL expression reads, and the series names a /metrics page exports.

A small lexer, not a parser: string literals, label matchers, range/subquery brackets, grouping
clauses, numbers and Grafana variables are removed; what is left that looks like an identifier
and is not a function call or keyword is a metric name. Enough for the chart's own dashboard and
rules (it is tested against a table of expressions), and strict in the right direction: an
identifier it cannot classify is reported as a metric name, so the name check fails loudly
rather than passing silently.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
            "bool", "inf", "nan", "Inf", "NaN"}
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:.])(0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+([eE][+-]?[0-9]+)?)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """Metric names read by one PromQL expression (Grafana variables allowed)."""
    m = _LABEL_VALUES.match(expr)  # Grafana's label_values(metric, label) variable query
    if m:
        expr = m.group(1)
    s = _STRING.sub('""', expr)
    s = _GRAFANA_VAR.sub("", s)
    s = _MATCHERS.sub(" ", s)
    s = _BRACKETS.sub(" ", s)
    s = _GROUPING.sub(" ", s)
    s = _OFFSET.sub(" ", s)
    s = _NUMBER.sub(" ", s)
    names = set()
    for tok in _IDENT.finditer(s):
        name = tok.group(0)
        if name in KEYWORDS or s[tok.end():].lstrip().startswith("("):
            continue  # keyword, or a function / aggregation call
        names.add(name)
    return names


def series_names(exposition: str) -> set[str]:
    """Series names a Prometheus scrape of this /metrics text would contain.

    Families with no samples yet (a labelled counter nobody incremented) still count: their
    names are declared and appear as soon as the label set does.
    """
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("", "_count", "_sum", "_created"), "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
                "info": ("_info",), "stateset": ("",), "gauge": ("",), "unknown": ("",)}
    out = set()
    for fam in text_string_to_metric_families(exposition):
        out.update(fam.name + suf for suf in suffixes[fam.type])
        out.update(s.name for s in fam.samples)
    return out


def dashboard_exprs(path: Path) -> list[str]:
    """Every PromQL expression of a Grafana dashboard (panel targets and variable queries)."""
    d = json.loads(path.read_text())
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(d["panels"])
    for var in d.get("templating", {}).get("list", []):
        q = var.get("query")
        if var.get("type") == "query":
            exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


def rule_exprs(path: Path) -> tuple[list[str], set[str]]:
    """(every rule expression, names recorded by recording rules) of a Prometheus rule file."""
    doc = yaml.safe_load(path.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    return [r["expr"] for r in rules], {r["record"] for r in rules if "record" in r}
