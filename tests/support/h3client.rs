//! Runs tests/py/h3client.py, the independent HTTP/3 client built on aioquic, and
//! parses its one JSON document. See the script's --help for the output fields.

use std::path::PathBuf;
use std::process::Command;

use super::error::{HarnessError, IoContext, Result};

/// Interpreter override; otherwise the repo's `.venv` (created by scripts/setup.sh on
/// an externally-managed system python) or `python3` from PATH.
pub const PYTHON_ENV: &str = "H3I_PYTHON";

/// Exit codes of h3client.py.
pub mod exit {
    pub const OK: i32 = 0;
    pub const CONNECTION_FAILED: i32 = 4;
    pub const HANDSHAKE_FAILED: i32 = 3;
    pub const USAGE: i32 = 2;
}

pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os(PYTHON_ENV) {
        return PathBuf::from(p);
    }
    let venv = super::repo_root().join(".venv/bin/python3");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

pub fn script() -> PathBuf {
    super::repo_root().join("tests/py/h3client.py")
}

pub struct H3Client {
    args: Vec<String>,
}

#[derive(Debug)]
pub struct H3Run {
    pub exit_code: i32,
    pub json: serde_json::Value,
    pub stderr: String,
}

impl H3Run {
    pub fn connection(&self) -> &serde_json::Value {
        &self.json["connection"]
    }

    pub fn requests(&self) -> &[serde_json::Value] {
        self.json["requests"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn request(&self, i: usize) -> &serde_json::Value {
        &self.requests()[i]
    }

    /// Status of request `i`, or None if it was reset / failed.
    pub fn status(&self, i: usize) -> Option<u64> {
        self.request(i)["status"].as_u64()
    }
}

impl H3Client {
    pub fn new(url: impl Into<String>) -> H3Client {
        H3Client {
            args: vec![url.into()],
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> H3Client {
        self.args.push(a.into());
        self
    }

    /// curl-style `HOST:PORT:ADDR` (ADDR may be `[::1]`).
    pub fn resolve(self, spec: impl Into<String>) -> H3Client {
        self.arg("--resolve").arg(spec)
    }

    /// The client's source address (any 127.0.0.0/8 address works on loopback).
    pub fn bind(self, addr: &str) -> H3Client {
        self.arg("--bind").arg(addr)
    }

    pub fn cacert(self, path: &std::path::Path) -> H3Client {
        self.arg("--cacert").arg(path.display().to_string())
    }

    pub fn insecure(self) -> H3Client {
        self.arg("--insecure")
    }

    pub fn method(self, m: &str) -> H3Client {
        self.arg("--method").arg(m)
    }

    pub fn upload(self, path: &std::path::Path) -> H3Client {
        self.arg("--upload").arg(path.display().to_string())
    }

    pub fn header(self, h: &str) -> H3Client {
        self.arg("--header").arg(h)
    }

    /// A verbatim header list `[[name, value], ...]` for the single request.
    pub fn raw_headers(self, headers: &serde_json::Value) -> H3Client {
        self.arg("--raw-headers").arg(headers.to_string())
    }

    /// Several requests on one connection (see h3client.py --help for the spec).
    pub fn requests(self, specs: &serde_json::Value) -> H3Client {
        self.arg("--requests").arg(specs.to_string())
    }

    pub fn run(self) -> Result<H3Run> {
        let out = Command::new(python())
            .arg(script())
            .args(&self.args)
            .output()
            .ctx(|| format!("running {} {}", python().display(), script().display()))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let json = serde_json::from_slice(&out.stdout).map_err(|e| HarnessError::Command {
            program: format!("h3client.py {}", self.args.join(" ")),
            status: out.status.to_string(),
            stderr: format!(
                "stdout is not JSON ({e}): {}\nstderr: {stderr}",
                String::from_utf8_lossy(&out.stdout)
            ),
        })?;
        Ok(H3Run {
            exit_code: out.status.code().unwrap_or(-1),
            json,
            stderr,
        })
    }
}
