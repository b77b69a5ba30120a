//! Runs `h3-ingress lab smoke` (network namespaces, TUN router, nginx, Caddy, aioquic) as CI
//! does. Needs root; without it the test says so loudly instead of pretending to pass.
#![cfg(feature = "lab")]

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn lab_smoke() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("H3I_TESTS_REQUIRE_ROOT").is_none(),
            "H3I_TESTS_REQUIRE_ROOT is set but lab_smoke is not running as root"
        );
        eprintln!(
            "\n*** SKIPPED: needs root: lab_smoke creates network namespaces and TUN devices ***\n"
        );
        return;
    }
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_h3-ingress"))
        .args(["lab", "smoke", "--prefix", "h3smoke-t"])
        .output()
        .expect("run h3-ingress lab smoke");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "lab smoke failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("checks passed"),
        "no summary line:\n{stdout}"
    );
    assert!(!stdout.contains("\nFAIL "), "a check failed:\n{stdout}");
    // The smoke must leave nothing behind.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let ns = String::from_utf8_lossy(&ns.stdout);
    assert!(!ns.contains("h3smoke-t-"), "namespaces left behind: {ns}");
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "smoke took {:?}",
        start.elapsed()
    );
}
