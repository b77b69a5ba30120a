#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers a client or a user feeds (fuzz/, cargo-fuzz and
# libFuzzer on the nightly toolchain). What each target checks: docs/reliability.md.
#
#   scripts/fuzz.sh install               cargo-fuzz $CARGO_FUZZ_VERSION into ~/.cargo/bin (idempotent)
#   scripts/fuzz.sh list                  the targets
#   scripts/fuzz.sh ci [SECONDS]          build every target, run each SECONDS (default 30) from
#                                         the committed corpus; fails on any crash (scripts/test.sh)
#   scripts/fuzz.sh run TARGET [SECONDS]  a long local run (default 900 s); what it finds stays in
#                                         fuzz/work/ (not committed): see `cmin` to keep it
#   scripts/fuzz.sh cmin TARGET           keep, of fuzz/corpus/TARGET and fuzz/work/TARGET, the
#                                         inputs that add coverage beyond fuzz/seeds/TARGET, in
#                                         fuzz/corpus/TARGET (committed)
#
# fuzz/seeds/TARGET: hand-written inputs, named for what they are (committed, never minimised).
#
# FUZZ_SANITIZER=address|none (default none, see docs/reliability.md for the trade),
# FUZZ_JOBS (cargo build jobs, default 2). Builds go to fuzz/target (its own workspace).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

# Pinned: the flags cargo-fuzz passes to rustc change between releases.
CARGO_FUZZ_VERSION=0.13.2
TOOLCHAIN=nightly
SANITIZER=${FUZZ_SANITIZER:-none}
JOBS=${FUZZ_JOBS:-2}
TARGETS=(request_validate header_translate frame_scanner config_file)
TRIPLE=x86_64-unknown-linux-gnu

log() { echo "fuzz: $*"; }
die() { echo "fuzz: ERROR: $*" >&2; exit 1; }

install_cargo_fuzz() {
    local have
    have=$(cargo fuzz --version 2>/dev/null || true)
    if [[ $have == "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
        return
    fi
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION (found: ${have:-none})"
    # Built with the stable toolchain: cargo-fuzz itself needs no nightly.
    nice -n 10 cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --force
}

need_nightly() {
    rustc "+$TOOLCHAIN" --version >/dev/null 2>&1 ||
        die "the $TOOLCHAIN toolchain is missing (rustup toolchain list); cargo-fuzz needs it"
}

# Arguments every cargo fuzz build/run shares: a release build with debug assertions
# (cargo-fuzz's default), overflow checks on, the chosen sanitizer.
fuzz_flags() {
    echo --sanitizer "$SANITIZER"
}
export CARGO_BUILD_JOBS=$JOBS

build_all() {
    # shellcheck disable=SC2046
    nice -n 10 cargo "+$TOOLCHAIN" fuzz build $(fuzz_flags)
}

# Runs TARGET for SECONDS: new inputs go to fuzz/work/TARGET (the first corpus directory,
# where libFuzzer writes); the committed seeds and corpus are only read. A crash is saved
# to fuzz/artifacts/TARGET and fails the run.
run_target() {
    local target=$1 seconds=$2
    mkdir -p "fuzz/work/$target" "fuzz/corpus/$target"
    # shellcheck disable=SC2046
    nice -n 10 cargo "+$TOOLCHAIN" fuzz run $(fuzz_flags) "$target" \
        "fuzz/work/$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
}

cmd=${1:-}
case $cmd in
install)
    install_cargo_fuzz
    ;;
list)
    printf '%s\n' "${TARGETS[@]}"
    ;;
ci)
    seconds=${2:-30}
    need_nightly
    install_cargo_fuzz
    start=$(date +%s)
    build_all
    log "build: $(($(date +%s) - start)) s"
    for t in "${TARGETS[@]}"; do
        t0=$(date +%s)
        run_target "$t" "$seconds" 2>"fuzz/work/$t.log" || {
            tail -n 40 "fuzz/work/$t.log" >&2
            die "$t failed: the input is in fuzz/artifacts/$t/ (reproduce: cargo +$TOOLCHAIN fuzz run $t <file>)"
        }
        log "$t: $(grep -E '^Done|stat::number_of_executed_units' "fuzz/work/$t.log" | tr '\n' ' ') ($(($(date +%s) - t0)) s)"
    done
    log "total: $(($(date +%s) - start)) s"
    ;;
run)
    [[ -n ${2:-} ]] || die "usage: scripts/fuzz.sh run TARGET [SECONDS]"
    need_nightly
    install_cargo_fuzz
    run_target "$2" "${3:-900}"
    ;;
cmin)
    [[ -n ${2:-} ]] || die "usage: scripts/fuzz.sh cmin TARGET"
    need_nightly
    install_cargo_fuzz
    t=$2
    # libFuzzer's merge adds to its first directory only the inputs that bring coverage it
    # lacks: starting from the seeds, what it adds from the committed corpus and
    # fuzz/work/ is the new committed corpus (named by content hash).
    # shellcheck disable=SC2046
    nice -n 10 cargo "+$TOOLCHAIN" fuzz build $(fuzz_flags) "$t"
    merged=$(mktemp -d)
    trap 'rm -rf "$merged"' EXIT
    cp "fuzz/seeds/$t"/* "$merged"/
    mkdir -p "fuzz/work/$t" "fuzz/corpus/$t"
    nice -n 10 "fuzz/target/$TRIPLE/release/$t" -merge=1 "$merged" \
        "fuzz/corpus/$t" "fuzz/work/$t" 2>"fuzz/work/$t.cmin.log"
    for f in "fuzz/seeds/$t"/*; do rm -f "$merged/$(basename "$f")"; done
    rm -rf "fuzz/corpus/$t" && mkdir -p "fuzz/corpus/$t"
    cp "$merged"/* "fuzz/corpus/$t"/ 2>/dev/null || true
    log "$t: $(find "fuzz/corpus/$t" -type f | wc -l) inputs in fuzz/corpus/$t beyond the seeds"
    ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
