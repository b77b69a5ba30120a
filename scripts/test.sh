#!/usr/bin/env bash
# The project's one test command (README, CI). Installs what the tests need (idempotent),
# then runs every check. Exits non-zero on the first failure.
#
#   scripts/test.sh                             everything
#   OBSERVE_STATIC_BUILD=0 scripts/test.sh      reuse target/static/h3-ingress (faster local loop)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

step "setup: system and Python packages"
scripts/setup.sh

# Cargo's build directories (debug, static release, fuzz) live outside the checkout, in a
# cache keyed by the toolchain, so a fresh clone (CI) compiles only the workspace's own
# crates, not its 400 dependencies (cold: about 20 of CI's minutes). A checkout that already
# has its own target/ keeps it. Cargo locks the directory, so concurrent clones only wait.
cargo_cache() {
    local root=${H3I_CARGO_CACHE:-/var/cache/h3-ingress/cargo} key dir d
    key=$( (rustc -vV; cargo +nightly -V 2>/dev/null || true) | sha256sum | cut -c1-12)
    dir=$root/$key
    mkdir -p "$root" 2>/dev/null || return 0 # not writable: build in the checkout
    # Nothing ever leaves a target directory: past this size it starts over (cold once);
    # another toolchain's directory goes after two weeks unused.
    if [[ -d $dir ]] && (($(du -sm "$dir" | cut -f1) > ${H3I_CARGO_CACHE_MAX_MB:-30000})); then
        rm -rf "$dir"
    fi
    find "$root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -mtime +14 -exec rm -rf {} +
    for d in target fuzz/target; do
        if [[ ! -e $d && ! -L $d ]]; then
            mkdir -p "$dir/$d"
            ln -s "$dir/$d" "$d"
        fi
    done
    echo "cargo build directories: $(readlink -f target), $(readlink -f fuzz/target)"
}
cargo_cache

# Root-only tests (network namespaces, TUN) must run, not skip, where we are root.
if [[ $(id -u) -eq 0 ]]; then export H3I_TESTS_REQUIRE_ROOT=1; fi

# The workspace: the product (h3-ingress, what the image ships) and the network lab
# (lab/, h3-ingress-lab). The image's own build (scripts/build-static.sh, -p h3-ingress) runs in
# tests/observe/run.sh below.
step "format and lints (workspace: product, lab, scenario runner; shellcheck; rustdoc links)"
cargo fmt --all --check
cargo fmt --manifest-path fuzz/Cargo.toml --check  # fuzz/ is its own workspace
# Its lock must name what the product now depends on (checked here, not 10 minutes later in fuzz.sh).
cargo metadata --manifest-path fuzz/Cargo.toml --locked --format-version 1 >/dev/null
cargo clippy --workspace --all-targets --locked -- -D warnings
# No function longer than 120 lines, tests included, in the product, the lab, the tests and the
# cluster scenario runner (tests/cluster/scenarios).
python3 scripts/fn-length.py src lab/src tests
# What is left in shell (bringing environments up and down, the unported cluster scripts).
find scripts tests -name '*.sh' -type f -print0 | sort -z | xargs -0 shellcheck -x
# Every intra-doc link resolves, private items included (the scenario runner's too).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --locked
# Every relative link in README.md and docs/ names an existing file and heading.
python3 scripts/check-links.py

step "cargo test (workspace: unit, end-to-end against nginx/aioquic/promtool, operator mocks, lab smoke)"
cargo test --workspace --locked

# Coverage-guided fuzz targets (nightly toolchain, cargo-fuzz: installed by setup above),
# 20 s each (FUZZ_SECONDS) from the committed corpus; any crash fails the run.
step "scripts/fuzz.sh ci (request validation, header translation, frame scanner, config file, QUIC headers)"
scripts/fuzz.sh ci

# Manifests rendered by the operator; then chart, deploy/, rules, dashboard, Dockerfile and
# the static release binary its build stage produces (tests/observe/run.sh).
for extra in tests/manifests/validate.sh tests/observe/run.sh; do
    if [[ -x $extra ]]; then
        step "$extra"
        "$extra"
    fi
done

# Attacks on the static release binary (built by tests/observe/run.sh above; built here when
# missing) with default settings: each attack bounded, one table printed.
step "tests/adversarial/run.sh (attacks on the release binary, default settings)"
tests/adversarial/run.sh

# Debian's Chromium, headless, against nginx (Alt-Svc) and target/debug/h3-ingress on 443 in a
# private network namespace (root): Alt-Svc discovery in the net log, then page and 1 MiB fetch
# over h3 with QUIC forced; then a first visit that finds HTTP/3 from a DNS HTTPS record alone
# (Knot DNS, no Alt-Svc, no --host-resolver-rules) against a control without the record
# (tests/README.md). About 35 s.
step "tests/browser/run.sh (headless Chromium: Alt-Svc discovery, forced h3, DNS HTTPS discovery)"
tests/browser/run.sh

# The real Kubernetes control plane (root; tests/cluster/README.md): the control plane, helm,
# the node agent, the real node components (kubelet, kube-proxy, containerd, runc, CNI) and
# the registry built once per version into /var/cache/h3-ingress (cold: 30-45 min on the
# shared 2-core machine; warm: seconds). On real nodes, the image of target/static/h3-ingress
# (built by tests/observe/run.sh above) pulled from the authenticated registry: the smoke,
# the user's journey, Gateway API and the real-node checks (Chromium through a node among
# them). Then on the node agent, which runs target/debug/h3-ingress (built by cargo test
# above): version skew, a DaemonSet roll and a helm upgrade under clients, the scale harness
# at 1,000 hosts. Then `scripts/cluster.sh down` whatever happened. Without root it prints
# CLUSTER TESTS SKIPPED (and fails where H3I_TESTS_REQUIRE_ROOT=1).
step "tests/cluster/run.sh (build; real nodes: smoke, journey, Gateway API, node checks; agent: skew, rollout, upgrade, scale 1000; down)"
tests/cluster/run.sh

step "all checks passed"
