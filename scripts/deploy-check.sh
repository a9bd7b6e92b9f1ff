#!/usr/bin/env bash
# Checks what deploy/ ships, with the tools an operator's CI would use: the alerting rules
# (promtool check rules, promtool test rules), the Kubernetes manifests (kubernetes-validate,
# strict, against the oldest and the newest Kubernetes it knows), the Grafana dashboard (parses,
# every query and variable accepted by Prometheus' parser through promtool, only metrics pinguard
# writes, no pid), the rules' metric names, the CDI spec `pinguard cdi` writes (CDI's JSON schema,
# from the Debian package of the CDI library podman uses), and that docs/deploy.md names every
# file of deploy/. One PASS or FAIL line per check; exits 1 when any failed.
#
# Installs what is missing: Debian's prometheus (promtool) and CDI library source (its schema),
# and a virtual environment in target/deploy-venv with kubernetes-validate.
set -uo pipefail
cd "$(dirname "$0")/.."

apt_need=()
command -v promtool >/dev/null || apt_need+=(prometheus)
cdi_schema=/usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface/schema
[ -f "$cdi_schema/schema.json" ] || apt_need+=(golang-github-container-orchestrated-devices-container-device-interface-dev)
if ((${#apt_need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${apt_need[@]}" >/dev/null
fi
venv=target/deploy-venv
if ! "$venv/bin/python3" -c "import kubernetes_validate, jsonschema, referencing, yaml" 2>/dev/null; then
    python3 -m venv "$venv" && "$venv/bin/python3" -m pip install -q "kubernetes-validate==1.37.0"
fi
py="$venv/bin/python3"

passed=0
failed=0
check() { # name, command...: PASS or FAIL, with the command's output under a FAIL
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        echo "PASS $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name"
        printf '%s\n' "$out" | sed 's/^/    /'
        failed=$((failed + 1))
    fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check "promtool check rules deploy/pinguard-alerts.yaml" promtool check rules deploy/pinguard-alerts.yaml
check "promtool test rules deploy/pinguard-alerts.test.yaml" promtool test rules deploy/pinguard-alerts.test.yaml
check "the alerting rules read only metrics pinguard writes" "$py" scripts/deploy_check.py rules deploy/pinguard-alerts.yaml src/output/metrics.rs

for k in 1.25.0 1.37.0; do
    for f in deploy/daemonset.yaml deploy/example-pod.yaml; do
        check "$f is valid Kubernetes $k (strict)" "$venv/bin/kubernetes-validate" --strict --quiet -k "$k" "$f"
    done
done

check "deploy/grafana-dashboard.json: structure, variables, metric names, no pid" \
    "$py" scripts/deploy_check.py dashboard deploy/grafana-dashboard.json src/output/metrics.rs "$tmp/dashboard-rules.yaml"
check "deploy/grafana-dashboard.json: every query parses (promtool)" promtool check rules "$tmp/dashboard-rules.yaml"

# The spec as the DaemonSet writes it, from the command and library built here.
if cargo build -q -p pinguard -p pinguard-cli; then
    mkdir -p "$tmp/textfile"
    check "pinguard cdi writes a spec" target/debug/pinguard cdi --lib target/debug/libpinguard.so \
        --metrics-dir "$tmp/textfile" --env PINGUARD_GROUP=inference --env PINGUARD_GROUP_BUDGET=8GiB -o "$tmp/pinguard.json"
    check "the CDI spec matches CDI's JSON schema" "$py" scripts/deploy_check.py cdi "$tmp/pinguard.json" "$cdi_schema"
else
    check "cargo build of pinguard and pinguard-cli" false
fi

check "docs/deploy.md names every file of deploy/, and only files that exist" "$py" scripts/deploy_check.py docs docs/deploy.md deploy

echo "deploy-check: $passed passed, $failed failed"
[ "$failed" = 0 ]
