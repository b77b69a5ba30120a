//! The system curl as an HTTP/1.1 / HTTP/2 client: independent of our code, and what
//! operators use by hand.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::{HarnessError, IoContext, Result};

pub struct Curl {
    url: String,
    args: Vec<OsString>,
    output: Option<PathBuf>,
}

#[derive(Debug)]
pub struct CurlResult {
    /// curl's own exit code (0 = transfer done, whatever the HTTP status).
    pub exit_code: i32,
    pub status: u16,
    /// "1.1", "2", "3".
    pub http_version: String,
    /// The body, unless `output()` sent it to a file.
    pub body: Vec<u8>,
    /// Headers of the final response, names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// curl's `-w '%{json}'` report (remote_ip, size_upload, time_total, ...).
    pub info: serde_json::Value,
    pub stderr: String,
}

impl CurlResult {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn remote_ip(&self) -> &str {
        self.info["remote_ip"].as_str().unwrap_or("")
    }
}

impl Curl {
    pub fn new(url: impl Into<String>) -> Curl {
        Curl {
            url: url.into(),
            args: Vec::new(),
            output: None,
        }
    }

    pub fn arg(mut self, a: impl Into<OsString>) -> Curl {
        self.args.push(a.into());
        self
    }

    /// HTTP/2 over TLS via ALPN (fails over to 1.1 only if the server refuses h2).
    pub fn http2(self) -> Curl {
        self.arg("--http2")
    }

    pub fn resolve(self, spec: impl Into<OsString>) -> Curl {
        self.arg("--resolve").arg(spec)
    }

    pub fn cacert(self, path: &Path) -> Curl {
        self.arg("--cacert").arg(path)
    }

    pub fn method(self, m: &str) -> Curl {
        self.arg("-X").arg(m)
    }

    pub fn header(self, h: &str) -> Curl {
        self.arg("-H").arg(h)
    }

    /// PUT the file's bytes (`-T`).
    pub fn upload(self, path: &Path) -> Curl {
        self.arg("-T").arg(path)
    }

    /// Write the body to `path` instead of keeping it in memory.
    pub fn output(mut self, path: &Path) -> Curl {
        self.output = Some(path.to_path_buf());
        self
    }

    pub fn run(self) -> Result<CurlResult> {
        let tmp = tempfile::Builder::new()
            .prefix("h3i-curl-")
            .tempdir()
            .ctx(|| "curl temp dir".into())?;
        let headers_path = tmp.path().join("headers");
        let body_path = self
            .output
            .clone()
            .unwrap_or_else(|| tmp.path().join("body"));
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "120", "-D"])
            .arg(&headers_path)
            .arg("-o")
            .arg(&body_path)
            .args(["-w", "%{json}"])
            .args(&self.args)
            .arg(&self.url)
            .output()
            .ctx(|| "running curl".into())?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let info: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| HarnessError::Command {
                program: format!("curl {}", self.url),
                status: out.status.to_string(),
                stderr: format!("unparsable -w json ({e}): {stderr}"),
            })?;
        let headers =
            parse_last_header_block(&std::fs::read_to_string(&headers_path).unwrap_or_default());
        let body = if self.output.is_some() {
            Vec::new()
        } else {
            std::fs::read(&body_path).unwrap_or_default()
        };
        Ok(CurlResult {
            exit_code: out.status.code().unwrap_or(-1),
            status: info["response_code"].as_u64().unwrap_or(0) as u16,
            http_version: info["http_version"].as_str().unwrap_or("").to_string(),
            body,
            headers,
            info,
            stderr,
        })
    }
}

/// `-D` holds every response (interim 100s, redirects); the last block is the answer.
fn parse_last_header_block(text: &str) -> Vec<(String, String)> {
    let blocks: Vec<&str> = text
        .split("\r\n\r\n")
        .filter(|b| !b.trim().is_empty())
        .collect();
    let Some(last) = blocks.last() else {
        return Vec::new();
    };
    last.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}
