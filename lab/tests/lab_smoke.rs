//! Runs `h3-ingress-lab smoke` (network namespaces, TUN router, nginx, Caddy, aioquic, our
//! proxy) as CI does. Needs root; without it the test says so loudly instead of pretending to
//! pass, and fails when `H3I_TESTS_REQUIRE_ROOT` is set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const LAB: &str = env!("CARGO_BIN_EXE_h3-ingress-lab");

/// Variables cargo sets for a test run that a plain `cargo build` does not have.
const TEST_ONLY_VARS: &[&str] = &[
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "OUT_DIR",
];

/// The product binary of the same build profile, beside the lab's. Cargo builds a dependency's
/// library, never its binaries, so this asks cargo for it: a no-op when `cargo test --workspace`
/// has built it already, and never a stale proxy when only the lab's tests run.
fn product_binary() -> PathBuf {
    let profile_dir = Path::new(LAB)
        .parent()
        .expect("the lab binary has a directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("unexpected target layout: {}", profile_dir.display()),
    };
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--locked", "--profile", profile])
        .args(["-p", "h3-ingress", "--bin", "h3-ingress"])
        .current_dir(workspace_root());
    // Cargo gives this test the variables it sets for a package (CARGO_MANIFEST_DIR, ...);
    // build scripts that watch one (ring's does) would see it changed and rebuild half the
    // dependency tree.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if TEST_ONLY_VARS.contains(&k.as_ref())
            || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_BIN_EXE_")
        {
            cargo.env_remove(k.as_ref());
        }
    }
    let status = cargo.status().expect("run cargo build -p h3-ingress");
    assert!(status.success(), "building the product binary failed");
    let bin = profile_dir.join("h3-ingress");
    assert!(bin.exists(), "cargo built no {}", bin.display());
    bin
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("lab/ sits in the workspace root")
        .to_path_buf()
}

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
    let proxy = product_binary();
    let start = Instant::now();
    // From the workspace root: results go to target/lab/, the smoke finds tests/py/h3client.py.
    let out = Command::new(LAB)
        .args(["smoke", "--prefix", "h3smoke-t", "--proxy-bin"])
        .arg(&proxy)
        .current_dir(workspace_root())
        .output()
        .expect("run h3-ingress-lab smoke");
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
    assert!(
        stdout.contains("PASS S1 h3 h3-ingress"),
        "our proxy was not measured:\n{stdout}"
    );
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
