//! Shared fixtures for the integration tests: `mod support;` from any `tests/*.rs`.
//!
//! Everything here drives real, independent programs (Debian's nginx, Caddy, curl,
//! openssl, aioquic) so the data plane is judged by software we did not write.
//! See tests/README.md for how the pieces fit.

// Each integration test binary compiles this module on its own and uses a different
// subset of it; unused helpers in one binary are not dead code in the suite.
#![allow(dead_code)]

pub mod caddy;
pub mod curl;
pub mod error;
pub mod h3client;
pub mod knot;
pub mod net;
pub mod nginx;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod quic;
pub mod tls;

// Re-exports for convenience; a given test binary uses only some of them.
#[allow(unused_imports)]
pub use error::HarnessError;
#[allow(unused_imports)]
pub use net::{free_tcp_port, free_udp_port, ClosedPort, Family, StalledUpstream};
#[allow(unused_imports)]
pub use nginx::{NginxFixture, NginxOptions};
#[allow(unused_imports)]
pub use pki::{LeafCert, RsaChain, RsaChainBits, TestPki, Validity};

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Root of the repository (where Cargo.toml lives).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Hex SHA-256 of a file, read in chunks so multi-megabyte bodies are cheap.
pub fn sha256_of(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    let mut file = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("sha256_of: cannot open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("sha256_of: reading {}: {e}", path.display()));
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hex::encode(hasher.finalize())
}

/// Hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// True when the test process runs with effective uid 0.
/// Standard base64 (with padding), as Kubernetes writes Secret data.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Set this to make root-only tests fail instead of skip (CI runs as root and must not
/// lose coverage silently if that ever changes).
pub const REQUIRE_ROOT_ENV: &str = "H3I_TESTS_REQUIRE_ROOT";

/// Writes straight to the process's stderr, bypassing libtest's output capture, so a skip
/// is visible in a normal `cargo test` run instead of being swallowed with the test's
/// output.
pub fn loud(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Decides whether a root-only test may run. Not root: prints the loud skip line and
/// returns false, or panics when [`REQUIRE_ROOT_ENV`] is set.
pub fn root_or_skip(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os(REQUIRE_ROOT_ENV).is_some() {
        panic!("{test} needs root and {REQUIRE_ROOT_ENV} is set");
    }
    loud(&format!(
        "\n!!!!!!!! SKIPPED (needs root): {test} !!!!!!!!\n"
    ));
    false
}

/// The current test's name (libtest names each test thread after its test).
pub fn current_test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string()
}

/// `support::require_root_or_skip!();` at the top of a test that needs root (netns,
/// TUN, nftables). Without root it prints `SKIPPED (needs root): <test>` to the real
/// stderr and returns; pass a value for tests that return one:
/// `require_root_or_skip!(Ok(()))`.
#[allow(unused_macros)]
macro_rules! require_root_or_skip {
    () => {
        if !$crate::support::root_or_skip(&$crate::support::current_test_name()) {
            return;
        }
    };
    ($ret:expr) => {
        if !$crate::support::root_or_skip(&$crate::support::current_test_name()) {
            return $ret;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use require_root_or_skip;
