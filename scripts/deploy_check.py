"""The checks of scripts/deploy-check.sh that need Python: the Grafana dashboard, the CDI spec
against CDI's JSON schema, and the deploy page naming the files of deploy/.

Each subcommand prints nothing and exits 0 when the check holds, else prints why and exits 1.
    dashboard DASHBOARD.json METRICS_SOURCE OUT_RULES.yaml
    rules RULES.yaml METRICS_SOURCE
    cdi SPEC.json SCHEMA_DIR
    docs DOC.md DEPLOY_DIR
"""

import json
import re
import sys
from pathlib import Path

import yaml

# Grafana's own variables, and a value for each that Prometheus' parser accepts.
BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
# Series the dashboard reads that pinguard does not write: node_exporter's own.
OTHER_METRICS = {"node_memory_MemAvailable_bytes"}
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "by", "without", "on", "ignoring",
    "group_left", "group_right", "rate", "increase", "irate", "delta", "and", "or", "unless",
    "bool", "offset", "label_values", "min_over_time", "max_over_time", "avg_over_time",
}


def pinguard_metrics(source):
    """The metric names src/output/metrics.rs writes (every `family("pinguard_...")`)."""
    return set(re.findall(r'"(pinguard_[a-z_]+)"', Path(source).read_text()))


def metric_names(expr):
    """Names in an expression that stand for series: identifiers outside braces, strings and
    brackets that are neither PromQL words nor followed by `(`. Labels in `by (...)` are left out
    by dropping those clauses first."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word in PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]?", word):
            continue
        names.add(word)
    return names


def unknown_metrics(expr, known):
    return sorted(n for n in metric_names(expr) if n not in known and n not in OTHER_METRICS)


def panels_of(dash):
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])


def substitute(expr, variables, where, errors):
    def one(m):
        name = m.group(1) or m.group(2)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in variables:
            errors.append(f"{where}: ${name} is not a variable of the dashboard")
        return ".*"
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def check_panel(p, variables, known, errors, exprs):
    where = f"panel {p.get('id')} {p.get('title')!r}"
    if not p.get("title") or "gridPos" not in p:
        errors.append(f"{where}: no title or gridPos")
    if p.get("datasource", {}).get("uid") != "${datasource}":
        errors.append(f"{where}: its datasource is not the dashboard's $datasource")
    if not p.get("targets"):
        errors.append(f"{where}: no query")
    for t in p.get("targets", []):
        expr = t.get("expr", "")
        if re.search(r"\bpid\b", expr):
            errors.append(f"{where}: {expr!r} uses pid (a fleet view never needs a process's pid)")
        for n in unknown_metrics(expr, known):
            errors.append(f"{where}: {n} is not a metric pinguard writes")
        exprs.append((f"panel_{p.get('id')}_{t.get('refId')}", substitute(expr, variables, where, errors)))


def check_dashboard(path, source, out):
    dash = json.loads(Path(path).read_text())
    known = pinguard_metrics(source)
    errors, exprs, ids = [], [], set()
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in dash:
            errors.append(f"no {key!r}")
    variables = {v["name"] for v in dash["templating"]["list"]}
    for wanted in ("datasource", "node", "namespace", "pod"):
        if wanted not in variables:
            errors.append(f"no ${wanted} variable")
    for v in dash["templating"]["list"]:
        q = v.get("query", {})
        q = q.get("query", "") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
        if v["type"] == "query":
            if not m:
                errors.append(f"variable {v['name']}: {q!r} is not label_values(SELECTOR, LABEL)")
                continue
            exprs.append((f"variable_{v['name']}", substitute(m.group(1), variables, v["name"], errors)))
    for p in panels_of(dash):
        if p.get("id") in ids:
            errors.append(f"panel id {p.get('id')} twice")
        ids.add(p.get("id"))
        if p.get("type") != "row":
            check_panel(p, variables, known, errors, exprs)
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:{name}", "expr": e} for name, e in exprs]}]}
    Path(out).write_text(yaml.safe_dump(rules, sort_keys=False))
    return errors


def check_rules(path, source):
    known = pinguard_metrics(source)
    errors = []
    for g in yaml.safe_load(Path(path).read_text())["groups"]:
        for r in g["rules"]:
            for n in unknown_metrics(r["expr"], known):
                errors.append(f"{r.get('alert') or r.get('record')}: {n} is not a metric pinguard writes")
    return errors


def check_cdi(path, schema_dir):
    import jsonschema
    from referencing import Registry
    from referencing.jsonschema import DRAFT7

    schema_dir = Path(schema_dir)
    schema = json.loads((schema_dir / "schema.json").read_text())
    # schema.json refers to its definitions as "defs.json#/...".
    defs = DRAFT7.create_resource(json.loads((schema_dir / "defs.json").read_text()))
    registry = Registry().with_resource("defs.json", defs)
    validator = jsonschema.Draft7Validator(schema, registry=registry)
    spec = json.loads(Path(path).read_text())
    return [f"{'/'.join(map(str, e.absolute_path)) or 'spec'}: {e.message}" for e in validator.iter_errors(spec)]


def check_docs(doc, deploy_dir):
    text = Path(doc).read_text()
    errors = []
    for named in sorted(set(re.findall(r"\bdeploy/[\w./-]+\w", text))):
        if not Path(named).exists():
            errors.append(f"{doc} names {named}, which does not exist")
    for f in sorted(Path(deploy_dir).iterdir()):
        if f"deploy/{f.name}" not in text:
            errors.append(f"{doc} never names deploy/{f.name}")
    return errors


def main(argv):
    checks = {"dashboard": check_dashboard, "rules": check_rules, "cdi": check_cdi, "docs": check_docs}
    if len(argv) < 2 or argv[1] not in checks:
        print(__doc__, file=sys.stderr)
        return 2
    errors = checks[argv[1]](*argv[2:])
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
