#!/usr/bin/env bash
# pinguard the way a fleet runs it, in real containers on this machine: Debian's podman (with runc)
# runs an image imported from a root file system made of this host's own files; pinguard reaches
# the containers through a CDI spec (`--device pinguard.dev/preload=default`), not through the
# image; two containers of one "pod" share an IPC namespace and /dev/shm (and so one group
# budget) with PID namespaces of their own; a container has a memory limit; node_exporter (as
# `nobody`) exports the metrics files and Prometheus scrapes it every second, and PromQL over
# Prometheus' HTTP API must give each pinning container's bytes with its pod labels, and nothing
# for it two scrape intervals after it ends (normal exit, SIGKILL, OOM kill). Then docs/deploy.md
# itself: every ```sh block of the walk-through, run in order by scripts/walkthrough.sh.
#
#   scripts/container-tests.sh
#
# Every check prints one PASS or FAIL line. Where the suite cannot run (not root, no podman, podman
# cannot start a container here) it prints one `NOT RUN: <why>` line and exits 0, or 1 with
# PINGUARD_REQUIRE_CONTAINERS=1 (CI). Exit status: 1 when a check failed. Installs podman, runc,
# prometheus (and promtool), prometheus-node-exporter, curl and iproute2 with apt-get when they are
# missing.
#
# Needs root: rootful podman, a spec in /etc/cdi. This host's root may lack CAP_SYS_RESOURCE (runc
# cannot set podman's default ulimits above the hard limits, so containers.conf says
# `default_ulimits = []`), and crun refuses a hybrid cgroup layout (so `--runtime runc`). Containers, images, storage, the spec, the services
# and the temporary folder are removed on exit.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
now() { echo $(($(date +%s%N) / 1000000)); } # milliseconds
started=$(now)

scrape_s=5           # Prometheus' scrape interval: at least 3 x PINGUARD_INTERVAL + 5 s, so that a
                     # series whose writer's death only the file's age proves (an OOM kill racing
                     # the kernel's robust-list walk: docs/internals.md, "Metrics") still goes within
                     # two scrape intervals
interval=1s          # PINGUARD_INTERVAL in the containers: a live process rewrites its file this often
kns=pinguard-ci      # the Kubernetes namespace the containers claim (PINGUARD_NAMESPACE)
MiB=$((1 << 20))
passed=0 failed=0

say() { printf '%s\n' "$*"; }
pass() { passed=$((passed + 1)); say "PASS: $*"; }
fail() { failed=$((failed + 1)); say "FAIL: $*"; }
# Seconds since $1 (milliseconds), two decimals.
since() { local d=$(($(now) - $1)); printf '%d.%02d' $((d / 1000)) $((d % 1000 / 10)); }
# Whether $1 milliseconds have passed since $2.
past() { (($(now) - $2 >= $1)); }

# The suite could not run at all: one line, never a silent pass.
not_run() {
    say "NOT RUN: container suite: $*"
    say "container suite: took $(since "$started") s"
    [[ ${PINGUARD_REQUIRE_CONTAINERS:-0} == 1 ]] && exit 1
    exit 0
}

# ---------------------------------------------------------------------------------------------
# Set-up: packages, build, the image, the CDI spec, the services.
# ---------------------------------------------------------------------------------------------

install_missing() {
    local need=()
    command -v podman >/dev/null || need+=(podman)
    command -v runc >/dev/null || need+=(runc)
    command -v conmon >/dev/null || need+=(conmon)
    command -v prometheus >/dev/null || need+=(prometheus)
    command -v prometheus-node-exporter >/dev/null || need+=(prometheus-node-exporter)
    command -v curl >/dev/null || need+=(curl)
    command -v setpriv >/dev/null && command -v unshare >/dev/null || need+=(util-linux)
    command -v ip >/dev/null || need+=(iproute2) # the walk-through's network namespace
    command -v promtool >/dev/null || need+=(prometheus)
    command -v python3 >/dev/null || need+=(python3)
    command -v cc >/dev/null || need+=(gcc libc6-dev)
    ((${#need[@]})) || return 0
    command -v apt-get >/dev/null || not_run "missing ${need[*]}, and no apt-get to install them"
    say "container suite: installing ${need[*]}"
    # A service's package starts nothing here (no init system); the suite starts its own.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${need[@]}" >"$tmp/apt.log" 2>&1 ||
        { DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$tmp/apt.log" 2>&1 &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${need[@]}" >>"$tmp/apt.log" 2>&1; } ||
        not_run "apt-get could not install ${need[*]}: $(tail -1 "$tmp/apt.log")"
}

build() {
    cargo build --release --workspace --quiet || not_run "cargo build --release failed"
    lib=$PWD/target/release/libpinguard.so
    cli=$PWD/target/release/pinguard
    scripts/build-fixtures.sh "$tmp/fx" >/dev/null || not_run "scripts/build-fixtures.sh failed"
    cc -O1 -g -Wall -pthread -o "$tmp/fx/pin_hold" tests/progs/pin_hold.c -L"$tmp/fx" -Wl,-rpath,'$ORIGIN' -lcudart ||
        not_run "tests/progs/pin_hold.c does not build"
    # An image's own preload (as jemalloc or tcmalloc would be): it says when it is loaded.
    printf '%s\n' '#include <unistd.h>' \
        '__attribute__((constructor)) static void loaded(void) { static const char m[] = "image preload: loaded\n"; (void)!write(2, m, sizeof m - 1); }' >"$tmp/mark.c"
    cc -shared -fPIC -O1 -o "$tmp/fx/libmark.so" "$tmp/mark.c" || not_run "the image's preload library does not build"
}

# The image: the fixtures in /fx and, at their host paths, the libraries they and pinguard load
# (from this host, so the host-built binaries run as they do here), and /bin/sh.
make_image() {
    local root=$tmp/rootfs f
    mkdir -p "$root"/{fx,ctl,tmp,proc,sys,dev,etc,bin}
    cp "$tmp/fx"/{pin_hold,scenario,libcudart.so,libascendcl.so,libmark.so} "$root/fx/"
    cp "$cli" "$root/fx/pinguard"
    cp -L /bin/sh "$root/bin/sh"
    # ldd's lines: "name => /path (address)" or "/path (address)".
    for f in $(ldd /bin/sh "$root/fx/pin_hold" "$root/fx/scenario" "$root/fx/pinguard" "$lib" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u); do
        [[ $f == "$tmp"/* || $f == "$lib" ]] && continue
        mkdir -p "$root$(dirname "$f")" && cp -L "$f" "$root$f"
    done
    image=localhost/pinguard-container-tests:$$
    tar -C "$root" -c . | pm import -q - "$image" >/dev/null 2>"$tmp/import.err" ||
        not_run "podman import failed: $(tail -1 "$tmp/import.err")"
    # The same files in an image that sets LD_PRELOAD itself.
    image_preload=localhost/pinguard-container-tests-preload:$$
    tar -C "$root" -c . | pm import -q --change 'ENV LD_PRELOAD=/fx/libmark.so' - "$image_preload" >/dev/null 2>"$tmp/import.err" ||
        not_run "podman import --change failed: $(tail -1 "$tmp/import.err")"
}

# podman with this suite's own storage, run directory and configuration: nothing of the host's
# containers is touched, and removing the temporary folder removes everything. It runs from the
# temporary folder because conmon writes a file named `oom` into its working directory when the
# kernel's OOM killer ends a container.
pm() { (cd "$tmp" && exec podman --runtime runc --root "$tmp/storage" --runroot "$tmp/runroot" --tmpdir "$tmp/libpod" "$@"); }

write_containers_conf() {
    cat >"$tmp/containers.conf" <<'EOF'
[containers]
# root here may lack CAP_SYS_RESOURCE: runc could not set podman's default ulimits (nofile, nproc)
# above the hard limits, and every container would fail ("error setting rlimit type 7")
default_ulimits = []
log_driver = "k8s-file"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    export CONTAINERS_CONF=$tmp/containers.conf
}

# ============================== THE ONE PLACE TO SWITCH TO `pinguard cdi` ======================
# While `pinguard cdi` is not in this tree, the spec is written by hand in the shape it writes;
# once it is, the command writes it (and a failure of the command is a failure of the suite).
# When `pinguard cdi` is on main for good, keep only the first branch.
write_cdi_spec() {
    cdi_source="pinguard cdi"
    "$cli" cdi --lib "$lib" --metrics-dir "$metrics" -o "$spec" 2>"$tmp/cdi.err" ||
        { fail "cdi: pinguard cdi --lib $lib --metrics-dir $metrics -o $spec: $(head -1 "$tmp/cdi.err")"; return 1; }
}
# ===============================================================================================

# Another spec for the same device would conflict with this one (two in /etc/cdi: podman refuses
# the device) or override it (/var/run/cdi wins): the suite would not test its own.
install_cdi_spec() {
    local other f
    mkdir -p /etc/cdi
    # A spec left by a run of this suite that was killed before its clean-up.
    for f in /etc/cdi/pinguard-container-tests-*.json; do
        [[ -e $f ]] || continue
        f=${f##*-} && f=${f%.json}
        kill -0 "$f" 2>/dev/null || rm -f "/etc/cdi/pinguard-container-tests-$f.json"
    done
    other=$(grep -ls 'pinguard.dev/preload' /etc/cdi/* /var/run/cdi/* 2>/dev/null | head -1)
    [[ -n $other ]] && not_run "another CDI spec for pinguard.dev/preload is installed ($other)"
    spec=/etc/cdi/pinguard-container-tests-$$.json
    write_cdi_spec || return 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# node_exporter as `nobody` (as Debian's service runs it) reading only the textfile folder, and
# Prometheus scraping it every second; both on ports of their own, on the loopback only.
start_services() {
    local nobody=(setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups --)
    ne_port=$(free_port) prom_port=$(free_port)
    "${nobody[@]}" prometheus-node-exporter --collector.disable-defaults --collector.textfile \
        --collector.textfile.directory="$metrics" --web.listen-address="127.0.0.1:$ne_port" >"$tmp/node_exporter.log" 2>&1 &
    ne_pid=$!
    mkdir -p "$tmp/prometheus-data" && chown nobody "$tmp/prometheus-data"
    cat >"$tmp/prometheus.yml" <<EOF
global: { scrape_interval: ${scrape_s}s, scrape_timeout: ${scrape_s}s, evaluation_interval: ${scrape_s}s }
scrape_configs:
  - job_name: node
    static_configs: [{ targets: ["127.0.0.1:$ne_port"] }]
EOF
    chmod 644 "$tmp/prometheus.yml"
    "${nobody[@]}" prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/prometheus-data" \
        --web.listen-address="127.0.0.1:$prom_port" --storage.tsdb.retention.time=1h >"$tmp/prometheus.log" 2>&1 &
    prom_pid=$!
}

# SIGTERM, up to 10 s to end, then SIGKILL.
stop_pid() {
    [[ -n $1 ]] || return 0
    kill "$1" 2>/dev/null || return 0
    local i
    for ((i = 0; i < 100; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n ${tmp:-} && -d $tmp ]]; then
        pm rm -a -f -t 0 >/dev/null 2>&1
        pm rmi -a -f >/dev/null 2>&1
        stop_pid "${ne_pid:-}"
        stop_pid "${prom_pid:-}"
        # Overlay mounts the storage may still hold, deepest first, then the folder.
        grep -o " $tmp/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
        rm -rf "$tmp"
    fi
    [[ -n ${spec:-} ]] && rm -f "$spec"
    exit "$rc"
}

# ---------------------------------------------------------------------------------------------
# Helpers for the checks.
# ---------------------------------------------------------------------------------------------

# A PromQL query's result, one series a line: {label="value",...} VALUE (labels sorted, no
# spaces), sorted; `error: ...` when Prometheus did not answer.
promql() {
    curl -sS --max-time 5 "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" 2>&1 | python3 -c '
import json, sys
text = sys.stdin.read()
try:
    r = json.loads(text)
except ValueError:
    print("error: " + text.strip().replace("\n", " ")[:200]); sys.exit()
if r.get("status") != "success":
    print("error: " + str(r.get("error"))); sys.exit()
rows = []
for s in r["data"]["result"]:
    labels = ",".join(f"{k}=\"{v}\"" for k, v in sorted(s["metric"].items()) if k != "__name__")
    v = float(s["value"][1])
    rows.append("{%s} %s" % (labels, int(v) if v.is_integer() else v))
print("\n".join(sorted(rows)))'
}

# Waits (up to $3 milliseconds) until the lines of $2 are all in the answer to PromQL $1; the answer
# seen last is left in $answer.
wait_for_series() {
    local query=$1 want=$2 t0 line missing
    t0=$(now)
    while :; do
        answer=$(promql "$query")
        missing=0
        while read -r line; do
            [[ -z $line ]] && continue
            grep -qxF -- "$line" <<<"$answer" || missing=1
        done <<<"$want"
        ((missing == 0)) && return 0
        past "$3" "$t0" && return 1
        sleep 0.2
    done
}

# Waits (up to $3 milliseconds from $4) until no line of the answer to PromQL $1 matches the
# extended regular expression $2; $gone_after holds the seconds since $4 when it was so.
wait_for_absence() {
    local query=$1 pattern=$2 limit=$3 t0=$4
    while :; do
        answer=$(promql "$query")
        if [[ $answer != error:* ]] && ! grep -qE -- "$pattern" <<<"$answer"; then
            gone_after=$(since "$t0")
            return 0
        fi
        past "$limit" "$t0" && return 1
        sleep 0.2
    done
}

# Waits (up to $3 milliseconds) until container $1's output holds a line matching $2.
wait_log() {
    local t0
    t0=$(now)
    until pm logs "$1" 2>&1 | grep -qE -- "$2"; do
        past "$3" "$t0" && return 1
        sleep 0.1
    done
}

# Every workload container: pinguard through the CDI device, its metrics rewritten every
# $interval, the control folder (stop files) at /ctl. IPC_LOCK: the emulated runtime pins with
# mlock, which RLIMIT_MEMLOCK (8 MiB here, and root cannot raise it) would cap; a real driver's
# pinning is not counted against that limit.
common() {
    printf '%s\n' --network none --cap-add IPC_LOCK --device pinguard.dev/preload=default \
        -e "PINGUARD_INTERVAL=$interval" -e "PINGUARD_NAMESPACE=$kns" -v "$tmp/ctl:/ctl"
}
# A container of a pod: as in Kubernetes, its host name is the pod's name (a pod's containers
# share one UTS namespace), and most run their program as pid 1 of a PID namespace of their own.
run_d() { # NAME POD CONTAINER [podman options...] -- COMMAND...
    local name=$1 pod=$2 ctr=$3 opts=()
    shift 3
    while [[ $1 != -- ]]; do opts+=("$1"); shift; done
    shift
    mapfile -t c < <(common)
    pm run -d --name "$name" --hostname "$pod" "${c[@]}" -e "PINGUARD_POD=$pod" -e "PINGUARD_CONTAINER=$ctr" "${opts[@]}" "$image" "$@" >/dev/null
}
# The series PromQL `sum by (namespace, pod, container)` gives for one container.
row() { printf '{container="%s",namespace="%s",pod="%s"} %s' "$2" "$kns" "$1" "$3"; }

# ---------------------------------------------------------------------------------------------
# The checks.
# ---------------------------------------------------------------------------------------------

check_scrape() {
    local want="{instance=\"127.0.0.1:$ne_port\",job=\"node\"} 1"
    if wait_for_series "up{job=\"node\"}" "$want" 60000; then
        pass "services: Prometheus scrapes node_exporter (running as nobody) every ${scrape_s} s"
    else
        fail "services: Prometheus does not scrape node_exporter within 60 s: up = ${answer:-nothing}; $(tail -1 "$tmp/prometheus.log")"
    fi
}

# The device request alone puts the library into a container whose image has none of it.
check_cdi() {
    local out c
    mapfile -t c < <(common)
    out=$(pm run --rm "${c[@]}" "$image" /bin/sh -c 'echo "LD_PRELOAD=$LD_PRELOAD"
        read -r list </etc/ld.so.preload; echo "list=$list"
        echo "PINGUARD_METRICS=$PINGUARD_METRICS"
        if ( : >/opt/pinguard/libpinguard.so ) 2>/dev/null; then echo library=writable; else echo library=read-only; fi
        exec /fx/scenario cuda_alloc:1048576' 2>&1)
    # The file name's template is the spec's choice; the folder is the textfile collector's.
    local want=("^LD_PRELOAD=\$" "^list=/opt/pinguard/libpinguard.so\$" "^PINGUARD_METRICS=$metrics/[^/]*%p[^/]*\\.prom\$" "^library=read-only\$")
    local w
    for w in "${want[@]}"; do
        grep -qE -- "$w" <<<"$out" || { fail "cdi (spec $cdi_source): no line $w in the container: $(tr '\n' ' ' <<<"$out" | cut -c1-400)"; return; }
    done
    if grep -qF '"pinguard_live_bytes":1048576' <<<"$out"; then
        pass "cdi (spec $cdi_source): --device pinguard.dev/preload=default preloads the read-only library through the container's /etc/ld.so.preload and sets PINGUARD_METRICS; pinguard counted the container's 1 MiB"
    else
        fail "cdi (spec $cdi_source): the library is not counting in the container: $(grep STATS <<<"$out" | cut -c1-300)"
    fi
}

# An image that sets LD_PRELOAD itself keeps its preload beside pinguard's (issue 46 item 16).
check_cdi_image_preload() {
    local out c
    mapfile -t c < <(common)
    out=$(pm run --rm "${c[@]}" "$image_preload" /bin/sh -c 'echo "LD_PRELOAD=$LD_PRELOAD"
        exec /fx/scenario cuda_alloc:1048576' 2>&1)
    if ! grep -qx 'LD_PRELOAD=/fx/libmark.so' <<<"$out" || ! grep -qx 'image preload: loaded' <<<"$out"; then
        fail "cdi: the image's own LD_PRELOAD did not survive the device: $(tr '\n' ' ' <<<"$out" | cut -c1-400)"
    elif ! grep -qF '"pinguard_live_bytes":1048576' <<<"$out"; then
        fail "cdi: beside the image's LD_PRELOAD, pinguard did not count the 1 MiB: $(grep STATS <<<"$out" | cut -c1-300)"
    else
        pass "cdi: an image that sets LD_PRELOAD keeps its library loaded, and pinguard counted the container's 1 MiB beside it"
    fi
}

# A and B: the "pod" (one IPC namespace and /dev/shm, a PID namespace each, one group budget of
# 64 MiB, 24 MiB pinned each); M: 50% of a 64 MiB memory limit as its budget; O: pins 16 MiB
# under a 32 MiB limit, then 32 MiB more when told (and is OOM-killed).
start_workloads() {
    group=infer-$$
    local g=(-e "PINGUARD_GROUP=$group" -e "PINGUARD_GROUP_BUDGET=64MiB")
    run_d ct-a infer-0 worker-a --ipc shareable "${g[@]}" -- /fx/pin_hold /ctl/a.stop 24 hold &&
    run_d ct-b infer-0 worker-b --ipc container:ct-a "${g[@]}" -- /fx/pin_hold /ctl/b.stop 24 hold &&
    run_d ct-m small-0 worker --memory 64m -e PINGUARD_BUDGET=50% -- /fx/pin_hold /ctl/m.stop 24 16 hold &&
    run_d ct-o oom-0 worker --memory 32m -- /fx/pin_hold /ctl/o.stop 16 hold 32 ||
        { fail "workloads: podman run -d failed"; return 1; }
    local n
    for n in ct-a ct-b ct-m ct-o; do
        wait_log "$n" '^holding' 20000 || { fail "workloads: $n never held its memory: $(pm logs "$n" 2>&1 | tr '\n' ' ' | cut -c1-300)"; return 1; }
    done
}

check_pod_namespaces() {
    local la lb
    la=$(pm logs ct-a 2>&1 | grep -m1 '^pid=') lb=$(pm logs ct-b 2>&1 | grep -m1 '^pid=')
    pm exec ct-a /bin/sh -c 'echo shared >/dev/shm/pinguard-container-tests.marker' >/dev/null 2>&1
    local shm
    shm=$(pm exec ct-b /bin/sh -c 'read -r x </dev/shm/pinguard-container-tests.marker && echo "$x"' 2>/dev/null)
    local ipc_a=${la##*ipcns=} ipc_b=${lb##*ipcns=}
    pid_a=$(grep -o 'pidns=[^ ]*' <<<"$la") pid_b=$(grep -o 'pidns=[^ ]*' <<<"$lb")
    if [[ -n $ipc_a && $ipc_a == "$ipc_b" && -n $pid_a && $pid_a != "$pid_b" && $shm == shared ]]; then
        pass "pod: worker-a and worker-b share one IPC namespace and /dev/shm, each in a PID namespace of its own (a: $la; b: $lb)"
    else
        fail "pod: the two containers do not share IPC and /dev/shm with separate PID namespaces (a: $la; b: $lb; /dev/shm marker seen by b: '${shm}')"
    fi
}

check_memory_limit() {
    local out
    out=$(pm logs ct-m 2>&1)
    if grep -qx 'alloc 24 MiB rc=0' <<<"$out" && grep -qx 'alloc 16 MiB rc=2' <<<"$out"; then
        pass "memory limit: under --memory 64m, PINGUARD_BUDGET=50% is 32 MiB: 24 MiB pinned, 16 MiB more refused (cudaErrorMemoryAllocation)"
    else
        fail "memory limit: expected 24 MiB pinned and 16 MiB more refused under --memory 64m with PINGUARD_BUDGET=50%: $(grep '^alloc' <<<"$out" | tr '\n' ' ')"
    fi
}

by_pod='sum by (namespace, pod, container) (pinguard_process_pinned_bytes)'

# Each pinning container's bytes, with its pod's labels, through Prometheus.
check_metrics_present() {
    local want
    want=$(row infer-0 worker-a $((24 * MiB)); echo; row infer-0 worker-b $((24 * MiB)); echo
        row small-0 worker $((24 * MiB)); echo; row oom-0 worker $((16 * MiB)))
    local ok=0
    wait_for_series "$by_pod" "$want" 15000 && ok=1
    present=$answer
    say "PromQL: $by_pod"
    say "returned:"
    sed 's/^/    /' <<<"${answer:-(nothing)}"
    if ((ok)); then
        pass "metrics: PromQL gives each pinning container's bytes with its namespace, pod and container labels"
    else
        fail "metrics: PromQL did not give, within 15 s, every pinning container's bytes by namespace, pod and container (wanted: $(tr '\n' ' ' <<<"$want"))"
    fi
    answer=$(promql 'node_textfile_scrape_error')
    if [[ $answer == "{instance=\"127.0.0.1:$ne_port\",job=\"node\"} 0" ]]; then
        pass "metrics: node_exporter, as nobody, reads every pinguard file (node_textfile_scrape_error 0)"
    else
        fail "metrics: node_exporter, as nobody, cannot read every pinguard file: node_textfile_scrape_error ${answer:-missing}; files: $(stat -c '%A %n' "$metrics"/* 2>/dev/null | head -3 | tr '\n' ' '); $(grep -m1 'level=error' "$tmp/node_exporter.log" | cut -c1-240)"
    fi
}

# Whether the output $1 of a pin_hold names a PID namespace other than those of the live
# containers given ($2...; a dead one's number may be reused).
own_pidns() {
    local ns other
    ns=$(grep -m1 -o 'pidns=[^ ]*' <<<"$1")
    [[ -n $ns ]] || return 1
    for other in "${@:2}"; do [[ $ns != "$other" ]] || return 1; done
}

# A member joining the pod's group sees both live members in other PID namespaces: 24 MiB more
# would take the group to 72 MiB of its 64.
check_pod_join_refused() {
    local out c
    mapfile -t c < <(common)
    out=$(pm run --rm "${c[@]}" --ipc container:ct-a -e "PINGUARD_GROUP=$group" -e PINGUARD_GROUP_BUDGET=64MiB \
        -e PINGUARD_POD=infer-0 -e PINGUARD_CONTAINER=worker-c --hostname infer-0 "$image" /fx/pin_hold - 24 2>&1)
    if ! own_pidns "$out" "${pid_a:-}" "${pid_b:-}"; then
        fail "pod: the joining member is not in a PID namespace of its own: $(head -1 <<<"$out")"
    elif grep -qx 'alloc 24 MiB rc=2' <<<"$out"; then
        pass "pod: a member joining in a third PID namespace is refused 24 MiB: the live members' 48 MiB of the 64 MiB group budget are kept"
    else
        fail "pod: a member joining in a third PID namespace got 24 MiB past the 64 MiB group budget (48 MiB held by live members in other PID namespaces): $(grep '^alloc' <<<"$out" | tr '\n' ' ')"
    fi
}

# Waits for a container's series to be gone (ended at $2), then checks that the others are not.
check_gone() { # WHAT ENDED_AT POD CONTAINER STILL_LIVE_ROWS...
    local what=$1 t0=$2 pod=$3 ctr=$4 window=$((2 * scrape_s * 1000 + 500))
    shift 4
    local pattern="^\\{container=\"$ctr\",namespace=\"$kns\",pod=\"$pod\"\\}"
    if ! grep -qE -- "$pattern" <<<"$present"; then
        fail "metrics: $what: its series were never seen, nothing to see go"
        return
    fi
    if ! wait_for_absence "$by_pod" "$pattern" "$window" "$t0"; then
        local late="still there after 20 s"
        wait_for_absence "$by_pod" "$pattern" 20000 "$t0" && late="gone after $gone_after s"
        fail "metrics: $what: its series still there $((window / 1000)).$((window % 1000 / 100)) s (two scrape intervals and 0.5 s) after it ended ($late)"
        return
    fi
    say "PromQL $gone_after s after $what: $by_pod"
    say "returned:"
    sed 's/^/    /' <<<"${answer:-(nothing)}"
    local r missing=()
    for r in "$@"; do grep -qxF -- "$r" <<<"$answer" || missing+=("$r"); done
    if ((${#missing[@]})); then
        fail "metrics: $what: its series went (after $gone_after s), and so did live containers' ${missing[*]}"
    else
        pass "metrics: $what: its series gone from PromQL $gone_after s after it ended (two scrape intervals: $((2 * scrape_s)) s); live containers' still there"
    fi
}

check_sigkill() {
    pm kill -s KILL ct-b >/dev/null || { fail "pod: podman kill -s KILL ct-b failed"; return; }
    local t0
    t0=$(now)
    check_gone "worker-b SIGKILLed (podman kill -s KILL)" "$t0" infer-0 worker-b \
        "$(row infer-0 worker-a $((24 * MiB)))" "$(row small-0 worker $((24 * MiB)))"
}

# After worker-b's SIGKILL its 24 MiB come back to the group, worker-a's stay: a new member gets
# 24 MiB (24 + 24 of 64) and not 24 more (72 of 64).
check_pod_after_kill() {
    local out c
    mapfile -t c < <(common)
    out=$(pm run --rm "${c[@]}" --ipc container:ct-a -e "PINGUARD_GROUP=$group" -e PINGUARD_GROUP_BUDGET=64MiB \
        -e PINGUARD_POD=infer-0 -e PINGUARD_CONTAINER=worker-d --hostname infer-0 "$image" /fx/pin_hold - 24 24 2>&1)
    local got
    got=$(grep '^alloc' <<<"$out" | tr '\n' ' ')
    if ! own_pidns "$out" "${pid_a:-}"; then
        fail "pod: the member joining after the SIGKILL is not in a PID namespace of its own: $(head -1 <<<"$out")"
    elif [[ $got == "alloc 24 MiB rc=0 alloc 24 MiB rc=2 " ]]; then
        pass "pod: after worker-b's SIGKILL its 24 MiB came back to the group and worker-a's 24 MiB were kept (a new member: 24 MiB pinned, 24 more refused)"
    else
        fail "pod: after worker-b's SIGKILL, expected a new member to get 24 MiB (b's share back) and be refused 24 more (a's kept): $got"
    fi
}

check_exit() {
    touch "$tmp/ctl/m.stop"
    local rc
    rc=$(pm wait ct-m 2>/dev/null)
    local t0
    t0=$(now)
    [[ $rc == 0 ]] || { fail "metrics: the memory-limited container exited $rc, not 0: $(pm logs ct-m 2>&1 | tail -2 | tr '\n' ' ')"; return; }
    check_gone "the memory-limited container's normal exit" "$t0" small-0 worker "$(row infer-0 worker-a $((24 * MiB)))"
}

check_oom() {
    touch "$tmp/ctl/o.stop"
    local rc t0
    rc=$(pm wait ct-o 2>/dev/null)
    t0=$(now)
    if [[ $rc != 137 ]]; then
        fail "memory limit: pinning 48 MiB under --memory 32m should end in the OOM killer's SIGKILL (137), not exit $rc"
        return
    fi
    pass "memory limit: pinning 48 MiB under --memory 32m ends in the OOM killer's SIGKILL (exit 137)"
    check_gone "the OOM-killed container" "$t0" oom-0 worker "$(row infer-0 worker-a $((24 * MiB)))"
}

# pinguard doctor inside a container with a memory limit: it finds the container's limit and, with
# --probe, measures that the limit counts mlock and the (emulated, mlocking) runtimes' pins.
check_doctor() {
    local out rc
    out=$(pm run --rm --network none --cap-add IPC_LOCK --memory 256m -e LD_LIBRARY_PATH=/fx "$image" \
        /fx/pinguard doctor --probe --probe-size 8Mi 2>&1)
    rc=$?
    say "pinguard doctor --probe in a container with --memory 256m (exit $rc):"
    sed 's/^/    /' <<<"$out"
    if [[ $rc == 0 ]] && grep -q '^limit: *256 MiB' <<<"$out" && grep -q '^  mlock  *counted by the limit' <<<"$out"; then
        pass "doctor: in a container with --memory 256m it finds the 256 MiB limit and measures that it counts mlock and cudaHostAlloc (exit 0)"
    else
        fail "doctor: expected the 256 MiB limit, mlock counted and exit 0 in a container with --memory 256m (exit $rc)"
    fi
}

# The cgroup reserve in a container: under --memory 64m with a 24 MiB reserve, 24 MiB fit and 16
# more (which fit the limit, but not the reserve's headroom) are refused with the runtime's code.
check_cgroup_reserve() {
    local out
    mapfile -t c < <(common)
    out=$(pm run --rm --hostname reserve-0 "${c[@]}" --memory 64m -e PINGUARD_CGROUP_RESERVE=24Mi "$image" \
        /fx/pin_hold - 24 16 2>&1)
    if grep -qx 'alloc 24 MiB rc=0' <<<"$out" && grep -qx 'alloc 16 MiB rc=2' <<<"$out"; then
        pass "cgroup reserve: under --memory 64m, PINGUARD_CGROUP_RESERVE=24Mi lets 24 MiB pin and refuses 16 MiB more (cudaErrorMemoryAllocation) before the OOM killer"
    else
        fail "cgroup reserve: expected 24 MiB pinned and 16 MiB refused under --memory 64m with a 24 MiB reserve: $(tr '\n' ' ' <<<"$out" | cut -c1-400)"
    fi
}

# docs/deploy.md's own commands, every ```sh block in order, in namespaces of their own
# (scripts/walkthrough.sh says how); its PASS and FAIL lines count as this suite's.
check_walkthrough() {
    local rc
    scripts/walkthrough.sh "$tmp/walk" "$tmp/rootfs" "$lib" "$cli" 2>&1 | tee "$tmp/walkthrough.log"
    rc=${PIPESTATUS[0]}
    passed=$((passed + $(grep -c '^PASS:' "$tmp/walkthrough.log")))
    failed=$((failed + $(grep -c '^FAIL:' "$tmp/walkthrough.log")))
    if [[ $rc != 0 ]] && ! grep -q '^FAIL:' "$tmp/walkthrough.log"; then
        fail "walkthrough: scripts/walkthrough.sh exited $rc without a FAIL line"
    fi
}

main() {
    [[ $(id -u) == 0 ]] || not_run "needs root (rootful podman, a spec in /etc/cdi)"
    tmp=$(mktemp -d /tmp/pinguard-containers.XXXXXX) || not_run "no temporary folder"
    chmod 755 "$tmp"
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    install_missing
    build
    write_containers_conf
    metrics=$tmp/textfile
    mkdir -p "$metrics" "$tmp/ctl" && chmod 755 "$metrics"
    local probe
    probe_runtime=$(pm info --format '{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Version}}' 2>&1) ||
        not_run "podman cannot run here: $(tail -1 <<<"$probe_runtime")"
    probe_runtime=$(head -1 <<<"$probe_runtime")
    make_image
    probe=$(pm run --rm --network none "$image" /fx/pin_hold - 2>&1)
    grep -q '^exit$' <<<"$probe" || not_run "podman cannot start a container here: $(tail -1 <<<"$probe")"
    start_services
    install_cdi_spec || return
    say "container suite: podman $(podman --version | awk '{print $3}') with $probe_runtime, spec $spec ($cdi_source), Prometheus :$prom_port scraping node_exporter :$ne_port"
    check_scrape
    check_cdi
    check_cdi_image_preload
    start_workloads || return
    check_pod_namespaces
    check_memory_limit
    check_metrics_present
    check_pod_join_refused
    check_sigkill
    check_pod_after_kill
    check_exit
    check_oom
    touch "$tmp/ctl/a.stop"
    check_doctor
    check_cgroup_reserve
    check_walkthrough
}

main
say "containers: $passed passed, $failed failed"
say "container suite: took $(since "$started") s"
((failed)) && exit 1
exit 0
