#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers a client or a user feeds (fuzz/, cargo-fuzz and
# libFuzzer). What each target checks: docs/reliability.md.
#
# Needs rustup's nightly toolchain (libFuzzer's coverage instrumentation is a nightly-only
# rustc flag; the product itself builds on stable) and cargo-fuzz $CARGO_FUZZ_VERSION.
# `scripts/fuzz.sh install` (which scripts/setup.sh runs) installs both when missing; every
# other command fails, naming what is missing, rather than skip.
#
#   scripts/fuzz.sh install               the nightly toolchain (minimal profile) and cargo-fuzz
#                                         into ~/.cargo/bin, each only when missing
#   scripts/fuzz.sh list                  the targets
#   scripts/fuzz.sh ci [SECONDS]          build every target, run each SECONDS (default
#                                         $FUZZ_SECONDS or 20) from the committed corpus and
#                                         seeds only; fails on any crash, timeout or OOM
#                                         (scripts/test.sh)
#   scripts/fuzz.sh run TARGET [SECONDS]  a long local run (default 900 s); what it finds stays in
#                                         fuzz/work/ (not committed): see `cmin` to keep it
#   scripts/fuzz.sh cmin TARGET           keep, of fuzz/corpus/TARGET and fuzz/work/TARGET, the
#                                         inputs that add coverage beyond fuzz/seeds/TARGET, in
#                                         fuzz/corpus/TARGET (committed)
#
# fuzz/seeds/TARGET: hand-written inputs, named for what they are (committed, never minimised).
#
# FUZZ_SANITIZER=address|none (default none, see docs/reliability.md for the trade),
# FUZZ_JOBS (cargo build jobs, default 2), FUZZ_CODEGEN_UNITS (default 16; cargo-fuzz's own
# default of 1 compiles the instrumented h3-ingress in one thread, and every commit repeats
# that compile: the cold fuzz build took 1031 s here. More units fuzz a little slower, which
# CI's 20-s runs do not notice; set 1 for long local runs). Builds go to fuzz/target (its own
# workspace, ignored by git; scripts/test.sh keeps it in a cache outside the checkout: a warm
# build only recompiles h3-ingress and the targets).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

# Pinned: the flags cargo-fuzz passes to rustc change between releases.
CARGO_FUZZ_VERSION=0.13.2
TOOLCHAIN=nightly
SANITIZER=${FUZZ_SANITIZER:-none}
JOBS=${FUZZ_JOBS:-2}
CODEGEN_UNITS=${FUZZ_CODEGEN_UNITS:-16}
TARGETS=(request_validate header_translate frame_scanner config_file quic_header)
TRIPLE=x86_64-unknown-linux-gnu

log() { echo "fuzz: $*"; }
die() { echo "fuzz: ERROR: $*" >&2; exit 1; }

have_nightly() { rustc "+$TOOLCHAIN" --version >/dev/null 2>&1; }
have_cargo_fuzz() { [[ $(cargo fuzz --version 2>/dev/null) == "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; }

# Idempotent: each piece only when missing, so a machine that has them needs no network.
install_tools() {
    if have_nightly; then
        log "toolchain: $(rustc "+$TOOLCHAIN" --version)"
    else
        command -v rustup >/dev/null ||
            die "no rustup: the fuzz targets need rustup's $TOOLCHAIN toolchain (https://rustup.rs)"
        log "installing the $TOOLCHAIN toolchain (minimal profile, from static.rust-lang.org)"
        rustup toolchain install "$TOOLCHAIN" --profile minimal ||
            die "could not install the $TOOLCHAIN toolchain; the fuzz step cannot run without it"
        have_nightly || die "the $TOOLCHAIN toolchain is installed but rustc +$TOOLCHAIN fails"
    fi
    if have_cargo_fuzz; then
        log "cargo-fuzz $CARGO_FUZZ_VERSION present"
    else
        log "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io (found: $(cargo fuzz --version 2>/dev/null || echo none))"
        # Built with the stable toolchain: cargo-fuzz itself needs no nightly.
        nice -n 10 cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --force ||
            die "could not install cargo-fuzz $CARGO_FUZZ_VERSION"
    fi
}

need_tools() {
    have_nightly ||
        die "the $TOOLCHAIN toolchain is missing (rustup toolchain list): run scripts/setup.sh or scripts/fuzz.sh install"
    have_cargo_fuzz ||
        die "cargo-fuzz $CARGO_FUZZ_VERSION is missing (found: $(cargo fuzz --version 2>/dev/null || echo none)): run scripts/setup.sh or scripts/fuzz.sh install"
}

# Arguments every cargo fuzz build/run shares: a release build with debug assertions
# (cargo-fuzz's default), overflow checks on, the chosen sanitizer and codegen units.
fuzz_flags() {
    echo --sanitizer "$SANITIZER" --codegen-units "$CODEGEN_UNITS"
}
export CARGO_BUILD_JOBS=$JOBS

build_all() {
    # shellcheck disable=SC2046
    nice -n 10 cargo "+$TOOLCHAIN" fuzz build $(fuzz_flags)
    # cargo fuzz has no --locked: a lock file the build had to change is stale.
    git diff --quiet -- fuzz/Cargo.lock ||
        die "fuzz/Cargo.lock was out of date (the build updated it): commit it"
}

# Runs TARGET for SECONDS: new inputs go to OUT (the first corpus directory, where
# libFuzzer writes); the committed seeds and corpus are only read. A crash, a 10 s input or
# 2 GB of RSS is saved to fuzz/artifacts/TARGET and fails the run.
run_target() {
    local target=$1 seconds=$2 out=$3
    mkdir -p "$out" "fuzz/corpus/$target"
    # shellcheck disable=SC2046
    nice -n 10 cargo "+$TOOLCHAIN" fuzz run $(fuzz_flags) "$target" \
        "$out" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
}

# One line from a run's log: executions, their rate, coverage (edges), features, corpus size.
summary() {
    local log=$1 last
    last=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n1)
    printf 'execs %s (%s/s), %s\n' \
        "$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")" \
        "$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")" \
        "$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$last")"
}

cmd=${1:-}
case $cmd in
install)
    install_tools
    ;;
list)
    printf '%s\n' "${TARGETS[@]}"
    ;;
ci)
    seconds=${2:-${FUZZ_SECONDS:-20}}
    need_tools
    start=$(date +%s)
    build_all
    log "build: $(($(date +%s) - start)) s"
    for t in "${TARGETS[@]}"; do
        t0=$(date +%s)
        # A fresh output directory: CI starts from what is committed, nothing else.
        out=fuzz/work/ci/$t
        rm -rf "$out" && mkdir -p "$out"
        run_target "$t" "$seconds" "$out" 2>"fuzz/work/ci/$t.log" || {
            tail -n 40 "fuzz/work/ci/$t.log" >&2
            die "$t failed: the input is in fuzz/artifacts/$t/ (reproduce: cargo +$TOOLCHAIN fuzz run $t <file>)"
        }
        log "$t: $(summary "fuzz/work/ci/$t.log") ($(($(date +%s) - t0)) s)"
    done
    log "total: $(($(date +%s) - start)) s"
    ;;
run)
    [[ -n ${2:-} ]] || die "usage: scripts/fuzz.sh run TARGET [SECONDS]"
    need_tools
    mkdir -p fuzz/work
    log "$2 for ${3:-900} s; progress in fuzz/work/$2.log"
    run_target "$2" "${3:-900}" "fuzz/work/$2" 2>"fuzz/work/$2.log" || {
        tail -n 40 "fuzz/work/$2.log" >&2
        die "$2 failed: the input is in fuzz/artifacts/$2/"
    }
    log "$2: $(summary "fuzz/work/$2.log")"
    ;;
cmin)
    [[ -n ${2:-} ]] || die "usage: scripts/fuzz.sh cmin TARGET"
    need_tools
    t=$2
    # libFuzzer's merge adds to its first directory only the inputs that bring coverage it
    # lacks: starting from the seeds, what it adds from the committed corpus and
    # fuzz/work/ is the new committed corpus (named by content hash). The set-cover variant
    # keeps every feature with about half the files of -merge=1.
    # shellcheck disable=SC2046
    nice -n 10 cargo "+$TOOLCHAIN" fuzz build $(fuzz_flags) "$t"
    merged=$(mktemp -d)
    trap 'rm -rf "$merged"' EXIT
    cp "fuzz/seeds/$t"/* "$merged"/
    mkdir -p "fuzz/work/$t" "fuzz/corpus/$t"
    nice -n 10 "fuzz/target/$TRIPLE/release/$t" -set_cover_merge=1 "$merged" \
        "fuzz/corpus/$t" "fuzz/work/$t" 2>"fuzz/work/$t.cmin.log"
    for f in "fuzz/seeds/$t"/*; do rm -f "$merged/$(basename "$f")"; done
    rm -rf "fuzz/corpus/$t" && mkdir -p "fuzz/corpus/$t"
    cp "$merged"/* "fuzz/corpus/$t"/ 2>/dev/null || true
    log "$t: $(find "fuzz/corpus/$t" -type f | wc -l) inputs in fuzz/corpus/$t beyond the seeds"
    ;;
*)
    sed -n '2,27p' "$0" >&2
    exit 2
    ;;
esac
