#!/usr/bin/env bash
# docs/deploy.md, followed top to bottom: every ```sh block of the page, its own text, run in order
# on this machine (scripts/doc_blocks.py extracts them), so that the page cannot drift from what
# works. Called by scripts/container-tests.sh, as root, after its own checks:
#
#   scripts/walkthrough.sh WORKDIR ROOTFS LIB CLI
#
# WORKDIR: an empty folder of the suite's; ROOTFS: the suite's image root (the fixtures in /fx, the
# host's /bin/sh and libraries); LIB, CLI: target/release/libpinguard.so and pinguard.
#
# The host is never changed: the script re-runs itself in a mount and a network namespace of its
# own (unshare -m -n), where /opt/pinguard, /etc/cdi, /var/lib/node_exporter/textfile and
# /etc/prometheus are empty tmpfs folders (a folder that is missing on the host is made in an
# overlay of its parent), localhost:9100 and :9090 are free, and podman keeps its storage in
# WORKDIR. The blocks run with `bash -e -o pipefail` in WORKDIR/run, which holds a copy of deploy/
# and the release tarball. The only changes to the page's text:
#
# - IMAGE is a local image imported from ROOTFS (nothing can be pulled here); COMMAND is /fx/command
#   in it, which pins 4 MiB through the emulated CUDA runtime and prints whether pinguard counted
#   them, in its own environment and under `env -i`; in a container of the "pod" (PINGUARD_POD
#   set) it holds them until the container is removed.
# - The release tarball is target/release/{pinguard,libpinguard.so} laid out, and named, as
#   scripts/release.sh lays out its tarball (release.sh itself needs zig).
# - deploy/Containerfile's base, debian:bookworm-slim, is that local image under that name.
# - A block that starts a server (prometheus-node-exporter) runs in the background, as `nobody`
#   (as Debian's service does), until the end.
# - A block that writes /etc/ld.so.preload runs in a container of IMAGE (with /opt/pinguard mounted
#   read-only), never on this machine.
# - Prometheus, which the page expects running, is started by this script on localhost:9090 with
#   /etc/prometheus/prometheus.yml, scraping localhost:9100 every second until the page's own
#   prometheus.yml replaces the file (then it is reloaded with `kill -HUP`, as the page says).
#
# podman runs with `--runtime runc` and `default_ulimits = []` through CONTAINERS_CONF (as in
# container-tests.sh) and no network (`netns = "none"`: this namespace has only a loopback).
#
# Every ```sh block prints one line: PASS or FAIL (with its output's end), or NOT RUN with the
# reason its first line gives ("# needs a Kubernetes cluster"), which is not a failure. A ```yaml
# block whose first line names an absolute path is written there. Exit status 1 when a block
# failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$PWD
page=docs/deploy.md

if [[ ${PINGUARD_WALKTHROUGH_INSIDE:-} != 1 ]]; then
    [[ $# == 4 ]] || { echo "usage: scripts/walkthrough.sh WORKDIR ROOTFS LIB CLI" >&2; exit 2; }
    PINGUARD_WALKTHROUGH_INSIDE=1 exec unshare --mount --net --propagation private -- "$0" "$@"
    echo "FAIL: walkthrough: unshare --mount --net failed" && exit 1
fi

work=$1 rootfs=$2 lib=$3 cli=$4
run=$work/run
image=localhost/pinguard-walkthrough:latest
passed=0 failed=0 skipped=0 pod_started=$(($(date +%s%N) / 1000000))
umask 022

say() { printf '%s\n' "$*"; }
pass() { passed=$((passed + 1)); say "PASS: $*"; }
fail() { failed=$((failed + 1)); say "FAIL: $*"; }
now() { echo $(($(date +%s%N) / 1000000)); }
since() { local d=$(($(now) - $1)); printf '%d.%02d' $((d / 1000)) $((d % 1000 / 10)); }
nobody=(setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups --)

# ---------------------------------------------------------------------------------------------
# The namespace: folders, network, podman.
# ---------------------------------------------------------------------------------------------

# An empty tmpfs at $1, seen only in this namespace. A folder the host lacks is made in an overlay
# of its nearest existing parent, whose changes go to a tmpfs.
private_dir() {
    local p=$1 a=$1 n
    while [[ ! -d $a ]]; do a=$(dirname "$a"); done
    if [[ $a != "$p" ]]; then
        n=$work/overlay/${a//\//_}
        mkdir -p "$n/upper" "$n/work" &&
            mount -t overlay overlay -o "lowerdir=$a,upperdir=$n/upper,workdir=$n/work" "$a" &&
            mkdir -p "$p" || return 1
    fi
    mount -t tmpfs -o mode=755 tmpfs "$p"
}

setup_namespace() {
    ip link set lo up || return 1
    mkdir -p "$work/overlay" && mount -t tmpfs tmpfs "$work/overlay" || return 1
    local d
    for d in /opt/pinguard /etc/cdi /var/lib/node_exporter/textfile /etc/prometheus; do
        private_dir "$d" || { say "FAIL: walkthrough: cannot give $d a private folder"; return 1; }
    done
}

setup_podman() {
    cat >"$work/containers.conf" <<EOF
[containers]
# as in scripts/container-tests.sh: runc cannot raise the ulimits here
default_ulimits = []
log_driver = "k8s-file"
# this namespace has a loopback only
netns = "none"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$work/libpod"
EOF
    cat >"$work/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/runroot"
EOF
    export CONTAINERS_CONF=$work/containers.conf CONTAINERS_STORAGE_CONF=$work/storage.conf
}

# COMMAND of the page, and `env` for it, into the image.
make_image() {
    local f
    cp -L /usr/bin/env "$rootfs/bin/env" || return 1
    for f in $(ldd /usr/bin/env | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
        mkdir -p "$rootfs$(dirname "$f")" && cp -L "$f" "$rootfs$f"
    done
    cat >"$rootfs/fx/command" <<'EOF'
#!/bin/sh
# COMMAND of docs/deploy.md in scripts/walkthrough.sh.
if [ -n "${PINGUARD_POD:-}" ]; then exec /fx/pin_hold /never 4 hold; fi
count() {
    case "$("$@" /fx/scenario cuda_alloc:4194304 2>&1)" in
    *'"pinguard_live_bytes":4194304'*) echo "pinguard counted 4194304 bytes" ;;
    *'"pinguard_live_bytes":-1'*) echo "pinguard not loaded" ;;
    *) echo "pinguard loaded, but did not count 4 MiB" ;;
    esac
}
printf 'own environment: '; count
printf 'env -i: '; count /bin/env -i
EOF
    chmod 755 "$rootfs/fx/command"
    tar -C "$rootfs" -c . | podman import -q - "$image" >/dev/null &&
        podman tag "$image" docker.io/library/debian:bookworm-slim
}

# target/release laid out, and named, as scripts/release.sh lays out the release tarball.
make_tarball() {
    local version name stage=$work/stage
    version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
    name=pinguard-$version-$(uname -m)-linux-gnu
    mkdir -p "$stage/$name/bin" "$stage/$name/lib" "$stage/$name/include" "$run" &&
        cp "$cli" "$stage/$name/bin/" && cp "$lib" "$(dirname "$lib")/libpinguard-lazy.so" "$stage/$name/lib/" && cp include/pinguard.h "$stage/$name/include/" &&
        cp README.md LICENSE-MIT LICENSE-APACHE "$stage/$name/" &&
        tar -C "$stage" -czf "$run/$name.tar.gz" "$name" && cp -r deploy "$run/deploy"
}

# Prometheus as the page expects it (running, reading /etc/prometheus/prometheus.yml), scraping
# node_exporter every second until the page's own file replaces this one.
start_prometheus() {
    cat >/etc/prometheus/prometheus.yml <<'EOF'
global: { scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s }
scrape_configs:
  - job_name: node
    static_configs: [{ targets: ["localhost:9100"] }]
EOF
    mkdir -p "$work/prometheus-data" && chown nobody "$work/prometheus-data"
    "${nobody[@]}" prometheus --config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path="$work/prometheus-data" \
        --web.listen-address=localhost:9090 >"$work/prometheus.log" 2>&1 &
    prom_pid=$!
}

cleanup() {
    podman rm -a -f -t 0 >/dev/null 2>&1
    podman rmi -a -f >/dev/null 2>&1
    local p
    [[ -n ${ne_pid:-} ]] && kill -- "-$ne_pid" 2>/dev/null
    [[ -n ${prom_pid:-} ]] && kill "$prom_pid" 2>/dev/null
    for p in ${ne_pid:-} ${prom_pid:-}; do wait "$p" 2>/dev/null; done
}

# ---------------------------------------------------------------------------------------------
# What the suite does around some blocks: waits for what the block needs, and checks that the
# block did what the page says it does.
# ---------------------------------------------------------------------------------------------

# Waits up to $1 seconds for the command $2... to succeed.
wait_for() {
    local t=$(($1 * 10))
    shift
    until "$@" >/dev/null 2>&1; do
        ((t-- > 0)) || return 1
        sleep 0.1
    done
}

promql() { curl -s http://localhost:9090/api/v1/query --data-urlencode "query=$1"; }
# (No `| grep -q` under pipefail: grep's early exit can fail the writer with SIGPIPE.)
pod_series() { grep -q '"pod":"inference"},"value":\[[0-9.]*,"8388608"\]' <<<"$(promql 'sum by (namespace, pod) (pinguard_process_pinned_bytes)')"; }
# Whether the metrics files show the pod's server and loader with 4 MiB pinned each.
pod_files() {
    local c
    for c in server loader; do
        grep -qsE "^pinguard_process_pinned_bytes\{[^}]*container=\"$c\"[^}]*\} 4194304\$" /var/lib/node_exporter/textfile/*.prom || return 1
    done
}

before() { # TEXT
    case $1 in
    *'localhost:9100/metrics'*)
        # The page does not say how soon a file shows a pin; the suite says how soon it did.
        if wait_for 30 pod_files; then
            say "walkthrough: the pod's metrics files showed each container's 4 MiB $(since "$pod_started") s after the pod's block started"
        else
            say "walkthrough: the pod's metrics files did not show each container's 4 MiB within $(since "$pod_started") s"
        fi ;;
    *'localhost:9090/api/v1/query'*) wait_for 30 pod_series ;;
    esac
}

# Whether the output $2 of block text $1 shows what the page says; the reason when not in $why.
expect() { # TEXT OUTPUT
    local text=$1 out=$2 tag
    why=""
    case $text in
    *'podman build -f deploy/Containerfile'*)
        tag=$(grep -o -- '-t [^ ]*' <<<"$text" | head -1 | cut -c4-)
        podman run --rm "$tag" --version >"$work/version.out" 2>&1 ||
            why="the image $tag does not run pinguard: $(tail -1 "$work/version.out")" ;;
    *'ld.so.preload'*'IMAGE COMMAND'* | *'/etc/ld.so.preload'*)
        grep -qx 'env -i: pinguard counted 4194304 bytes' <<<"$out" ||
            why="/etc/ld.so.preload did not bring pinguard into a process started with env -i, or pinguard counted no 4 MiB" ;;
    *'podman run --rm --device pinguard.dev/preload=default IMAGE COMMAND'*)
        grep -qx 'own environment: pinguard counted 4194304 bytes' <<<"$out" ||
            why="the device did not preload pinguard into the container, or pinguard counted no 4 MiB" ;;
    *'--name inference-server'*)
        wait_for 20 sh -c 'podman logs inference-server | grep -x holding && podman logs inference-loader | grep -x holding' ||
            why="the pod's containers did not start pinning: $(podman logs inference-loader 2>&1 | tail -2 | tr '\n' ' ')"
        [[ -n $why ]] || { grep -qx 'alloc 4 MiB rc=0' <<<"$(podman logs inference-server 2>&1)" &&
            grep -qx 'alloc 4 MiB rc=0' <<<"$(podman logs inference-loader 2>&1)"; } ||
            why="a container of the pod was refused its 4 MiB: $(podman logs inference-server 2>&1 | grep alloc), $(podman logs inference-loader 2>&1 | grep alloc)" ;;
    *'localhost:9100/metrics'*)
        grep -q '^pinguard_process_pinned_bytes{.*container="server".*pod="inference".*} 4.194304e+06' <<<"$out" &&
            grep -q '^pinguard_process_pinned_bytes{.*container="loader".*pod="inference".*} 4.194304e+06' <<<"$out" ||
            why="node_exporter does not export the server's and the loader's 4 MiB with their pod labels" ;;
    *'localhost:9090/api/v1/query'*)
        grep -q '"pod":"inference"},"value":\[[0-9.]*,"8388608"\]' <<<"$out" ||
            why="Prometheus does not give the pod inference's 8 MiB" ;;
    *'pinguard top --metrics'*)
        [[ $(grep -cE '^ *1 +pin_hold +4\.00 MiB ' <<<"$out") == 2 ]] ||
            why="pinguard top does not show the pod's two processes (pid 1 each) with 4 MiB each" ;;
    esac
    # After part 1 every container asking for the device has PINGUARD_HOST_RESERVE=10% (of MemTotal).
    [[ $why == *pinguard*counted* || $why == *refused* ]] &&
        why+=" (the spec's host reserve is 10% of MemTotal; available now: $(awk '/^MemAvailable/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo))"
    [[ -z $why ]]
}

# After the page's prometheus.yml: reloaded as the page says, Prometheus has its alerting rules.
check_alert_rules() {
    local want got
    want=$(grep -o 'alert: [A-Za-z]*' deploy/pinguard-alerts.yaml | cut -c8- | sort | tr '\n' ' ')
    kill -HUP "$prom_pid"
    rules_loaded() {
        got=$(curl -s http://localhost:9090/api/v1/rules | grep -o '"name":"Pinguard[A-Za-z]*"' | cut -d'"' -f4 | sort | tr '\n' ' ')
        [[ -n $got && $got == "$want" ]]
    }
    if wait_for 20 rules_loaded; then
        pass "walkthrough: Prometheus, reloaded with kill -HUP after part 5, has the page's alerting rules: $want"
    else
        fail "walkthrough: Prometheus, reloaded with kill -HUP after part 5, has not the rules $want (it has: ${got:-none}; $(grep -i error "$work/prometheus.log" | tail -1))"
    fi
}

# ---------------------------------------------------------------------------------------------
# The blocks.
# ---------------------------------------------------------------------------------------------

# The page's text with the substitutions above.
substitute() { sed -e "s|\\bIMAGE\\b|$image|g" -e 's|\bCOMMAND\b|/fx/command|g' "$1"; }

run_block() { # FILE -> output in $work/out, status
    local file=$1 script=$work/block.sh
    substitute "$file" >"$script"
    case $(cat "$file") in
    'prometheus-node-exporter '*)
        # A session of its own, so that the server and the shell around it end together.
        (cd "$run" && exec setsid "${nobody[@]}" bash "$script") >"$work/node_exporter.log" 2>&1 &
        ne_pid=$!
        : >"$work/out"
        wait_for 20 curl -sf http://localhost:9100/metrics && kill -0 "$ne_pid" ;;
    *'/etc/ld.so.preload')
        podman run --rm -v /opt/pinguard:/opt/pinguard:ro "$image" /bin/sh -ec "$(cat "$script")
exec /fx/command" >"$work/out" 2>&1 ;;
    *)
        [[ $(cat "$file") == *'--name inference-server'* ]] && pod_started=$(now)
        (cd "$run" && timeout 300 bash -e -o pipefail "$script") >"$work/out" 2>&1 ;;
    esac
}

# "N commands" of a block: its lines but comments and continuations.
commands() {
    local n
    n=$(grep -c -v -e '^#' -e '^ ' -e '^$' <<<"$1")
    ((n == 1)) && echo "1 command" || echo "$n commands"
}

# A block's output, indented, its first 12 lines.
show() {
    [[ -s $1 ]] || return 0
    head -12 "$1" | cut -c1-200 | sed 's/^/    /'
    (($(wc -l <"$1") > 12)) && say "    ($(wc -l <"$1") lines)"
    return 0
}

walk() {
    local n line lang what heading why_not t0 text first where
    while IFS=$'\t' read -r n line lang what heading why_not; do
        text=$(cat "$work/blocks/$n.$lang")
        first=$(grep -v '^#' <<<"$text" | head -1 | cut -c1-100)
        where="block $n ($page:$line, \"$heading\")"
        case $what in
        skip) skipped=$((skipped + 1)); say "NOT RUN: walkthrough $where: $why_not: $first" ;;
        other) say "walkthrough $where: $why_not" ;;
        file) cp "$work/blocks/$n.$lang" "$why_not" && say "walkthrough $where: written to $why_not" ||
            fail "walkthrough $where: cannot write $why_not" ;;
        run)
            before "$text"
            t0=$(now)
            if ! run_block "$work/blocks/$n.$lang"; then
                fail "walkthrough $where: $first: failed ($(since "$t0") s): $(tail -3 "$work/out" | tr '\n' ' ' | cut -c1-400)"
            elif ! expect "$text" "$(cat "$work/out")"; then
                fail "walkthrough $where: $first: ran, but $why ($(since "$t0") s): $(tail -3 "$work/out" | tr '\n' ' ' | cut -c1-300)"
            else
                pass "walkthrough $where: $first ($(commands "$text"), $(since "$t0") s)"
            fi
            show "$work/out"
            [[ $text == *'promtool check config /etc/prometheus/prometheus.yml'* ]] && check_alert_rules ;;
        esac
    done <"$work/blocks/blocks.tsv"
}

# Every ```sh block of the page, counted on its own, was run or marked.
check_all_walked() {
    local total ran
    total=$(grep -c '^```sh$' "$page")
    ran=$(grep -c $'\t''sh'$'\t''run'$'\t' "$work/blocks/blocks.tsv")
    if ((total > 0 && ran + skipped == total)); then
        pass "walkthrough: all $total sh blocks of $page walked: $ran run, $skipped marked as needing what is not here"
    else
        fail "walkthrough: $page has $total sh blocks; $ran run and $skipped marked"
    fi
}

main() {
    mkdir -p "$work" && trap cleanup EXIT
    python3 scripts/doc_blocks.py "$page" "$work/blocks" || { fail "walkthrough: cannot extract the blocks of $page"; return; }
    setup_namespace || { fail "walkthrough: cannot set up the namespace"; return; }
    setup_podman
    make_image || { fail "walkthrough: cannot import the image"; return; }
    make_tarball || { fail "walkthrough: cannot lay out the release tarball"; return; }
    start_prometheus
    walk
    check_all_walked
}

main
say "walkthrough: $passed passed, $failed failed, $skipped not run"
((failed)) && exit 1
exit 0
