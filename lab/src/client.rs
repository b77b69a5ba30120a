//! Clients run inside the client namespace: curl (the trixie chroot's 8.14 with HTTP/3, or the
//! system's h2-only curl) and the aioquic script for CI. Each run yields one [`Sample`].

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::servers::HOST;
use super::topology::SERVER_V4;
use super::LabError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Proto {
    H2,
    H3,
}

impl Proto {
    pub fn version(self) -> &'static str {
        match self {
            Proto::H2 => "2",
            Proto::H3 => "3",
        }
    }
}

/// One download or upload, as measured by the client.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub ok: bool,
    pub time_total: f64,
    /// TLS (h2) or QUIC (h3) handshake completed; 0 when it never did.
    pub time_appconnect: f64,
    pub time_starttransfer: f64,
    pub http_version: String,
    pub http_code: u16,
    /// Body bytes received (download) or sent (upload).
    pub bytes: u64,
    pub exit_code: i32,
    pub local_port: u16,
    pub error: Option<String>,
    /// Failed before the handshake completed.
    pub handshake_failed: bool,
}

/// What a transfer must look like to count as a success.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub proto: Proto,
    pub bytes: u64,
    pub upload: bool,
}

/// Everything after the program name of a curl invocation. Pure.
pub fn curl_args(
    proto: Proto,
    addr: IpAddr,
    port: u16,
    path: &str,
    ca: &str,
    upload: Option<&str>,
    max_time: f64,
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-sS".into(),
        "-o".into(),
        "/dev/null".into(),
        "-w".into(),
        "%{json}".into(),
        match proto {
            Proto::H2 => "--http2".into(),
            Proto::H3 => "--http3-only".into(),
        },
        "--cacert".into(),
        ca.into(),
        "--resolve".into(),
        match addr {
            IpAddr::V4(a) => format!("{HOST}:{port}:{a}"),
            IpAddr::V6(a) => format!("{HOST}:{port}:[{a}]"),
        },
        "--max-time".into(),
        format!("{max_time}"),
    ];
    if let Some(f) = upload {
        a.push("-T".into());
        a.push(f.into());
    }
    a.push(format!("https://{HOST}:{port}{path}"));
    a
}

fn num(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0)
}

/// A client's JSON report, or the failed sample that says it could not be read.
fn client_json(stdout: &str, exit_code: i32, tool: &str) -> Result<serde_json::Value, Sample> {
    serde_json::from_str(stdout.trim()).map_err(|e| Sample {
        exit_code,
        error: Some(format!(
            "unreadable {tool} output ({e}): {:.200}",
            stdout.trim()
        )),
        handshake_failed: true,
        ..Sample::default()
    })
}

/// Reads curl's `-w '%{json}'` output. Pure.
pub fn parse_curl(stdout: &str, exit_code: i32, expect: Expect) -> Sample {
    let v = match client_json(stdout, exit_code, "curl") {
        Ok(v) => v,
        Err(failed) => return failed,
    };
    let http_code = num(&v, "http_code") as u16;
    let http_version = v
        .get("http_version")
        .and_then(|x| x.as_str())
        .unwrap_or_default()
        .to_string();
    let bytes = if expect.upload {
        num(&v, "size_upload")
    } else {
        num(&v, "size_download")
    } as u64;
    let appconnect = num(&v, "time_appconnect");
    let mut error = v
        .get("errormsg")
        .and_then(|x| x.as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let ok_code = (200..300).contains(&http_code);
    let ok = exit_code == 0
        && ok_code
        && bytes == expect.bytes
        && http_version == expect.proto.version();
    if !ok && error.is_none() {
        error = Some(format!(
            "exit {exit_code}, status {http_code}, HTTP/{http_version}, {bytes} of {} bytes",
            expect.bytes
        ));
    }
    Sample {
        ok,
        time_total: num(&v, "time_total"),
        time_appconnect: appconnect,
        time_starttransfer: num(&v, "time_starttransfer"),
        http_version,
        http_code,
        bytes,
        exit_code,
        local_port: num(&v, "local_port") as u16,
        error: if ok { None } else { error },
        handshake_failed: !ok && appconnect == 0.0,
    }
}

/// Runs curl in namespace `ns`, inside `chroot` when given (the trixie curl), else the system's.
pub fn run_curl(
    ns: &str,
    chroot: Option<&Path>,
    args: &[String],
    expect: Expect,
) -> Result<Sample, LabError> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]);
    if let Some(root) = chroot {
        cmd.arg("chroot").arg(root);
    }
    let out = cmd
        .arg("curl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::io("run curl", e))?;
    let mut s = parse_curl(
        &String::from_utf8_lossy(&out.stdout),
        out.status.code().unwrap_or(-1),
        expect,
    );
    if !s.ok {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !stderr.is_empty() {
            s.error = Some(format!("{} | {stderr:.300}", s.error.unwrap_or_default()));
        }
    }
    Ok(s)
}

/// Reads the aioquic script's JSON line. Pure.
pub fn parse_h3get(stdout: &str, exit_code: i32, expect: Expect) -> Sample {
    let v = match client_json(stdout, exit_code, "h3get") {
        Ok(v) => v,
        Err(failed) => return failed,
    };
    let status = num(&v, "status") as u16;
    let bytes = num(&v, "bytes") as u64;
    let connect = num(&v, "time_connect");
    let reported_ok = v.get("ok").and_then(|x| x.as_bool()).unwrap_or(false);
    // An upload's response body is tiny; only downloads are checked by size.
    let size_ok = expect.upload || bytes == expect.bytes;
    let ok = exit_code == 0 && reported_ok && size_ok;
    let error = if ok {
        None
    } else {
        Some(
            v.get("error")
                .and_then(|x| x.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| format!("status {status}, {bytes} of {} bytes", expect.bytes)),
        )
    };
    Sample {
        ok,
        time_total: num(&v, "time_total"),
        time_appconnect: connect,
        time_starttransfer: 0.0,
        http_version: "3".into(),
        http_code: status,
        bytes: if expect.upload { expect.bytes } else { bytes },
        exit_code,
        local_port: 0,
        error,
        handshake_failed: !ok && connect == 0.0,
    }
}

/// Which aioquic-based HTTP/3 client runs a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AioquicClient {
    /// The project's test client, `tests/py/h3client.py` (preferred when present).
    Harness(std::path::PathBuf),
    /// The lab's own minimal script, `scripts/lab/h3get.py`.
    Own(std::path::PathBuf),
}

impl AioquicClient {
    pub fn script(&self) -> &Path {
        match self {
            AioquicClient::Harness(p) | AioquicClient::Own(p) => p,
        }
    }
}

/// Reads `tests/py/h3client.py`'s JSON document (one request). Pure.
pub fn parse_h3client(stdout: &str, exit_code: i32, expect: Expect) -> Sample {
    let v = match client_json(stdout, exit_code, "h3client") {
        Ok(v) => v,
        Err(failed) => return failed,
    };
    let hs = &v["connection"]["handshake"];
    let hs_ok = hs["ok"].as_bool().unwrap_or(false);
    let hs_s = hs["ms"].as_f64().unwrap_or(0.0) / 1000.0;
    let req = &v["requests"][0];
    let status = req["status"].as_u64().unwrap_or(0) as u16;
    let bytes = req["body_length"].as_u64().unwrap_or(0);
    let total = hs_s + req["total_ms"].as_f64().unwrap_or(0.0) / 1000.0;
    let size_ok = expect.upload || bytes == expect.bytes;
    let ok = exit_code == 0
        && hs_ok
        && (200..300).contains(&status)
        && size_ok
        && req["error"].is_null();
    let error = (!ok).then(|| {
        let detail = req["error"]
            .as_str()
            .map(str::to_string)
            .or_else(|| hs["detail"].as_str().map(str::to_string))
            .or_else(|| v["error"].as_str().map(str::to_string))
            .unwrap_or_default();
        format!(
            "exit {exit_code}, status {status}, {bytes} of {} bytes {detail}",
            expect.bytes
        )
    });
    Sample {
        ok,
        time_total: total,
        time_appconnect: if hs_ok { hs_s } else { 0.0 },
        time_starttransfer: 0.0,
        http_version: "3".into(),
        http_code: status,
        bytes: if expect.upload { expect.bytes } else { bytes },
        exit_code,
        local_port: 0,
        error,
        handshake_failed: !hs_ok,
    }
}

/// One request of an aioquic client.
pub struct H3Get<'a> {
    pub script: &'a Path,
    pub ca: &'a Path,
    pub port: u16,
    pub path: &'a str,
    pub upload: Option<&'a Path>,
    pub max_time: f64,
    /// The client address to send from (S6's second client); `None`: the kernel's choice.
    pub bind: Option<Ipv4Addr>,
}

/// Runs the project's `tests/py/h3client.py` in the client namespace.
pub fn run_h3client(ns: &str, req: &H3Get<'_>, expect: Expect) -> Result<Sample, LabError> {
    if let Some(addr) = req.bind {
        return Err(LabError::Config(format!(
            "tests/py/h3client.py cannot send from {addr}: it has no option to bind an address"
        )));
    }
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, "python3"])
        .arg(req.script)
        .arg(format!("https://{HOST}:{}{}", req.port, req.path))
        .arg("--resolve")
        .arg(format!("{HOST}:{}:{SERVER_V4}", req.port))
        .arg("--cacert")
        .arg(req.ca)
        .arg("--timeout")
        .arg(req.max_time.to_string());
    if let Some(f) = req.upload {
        cmd.arg("--upload").arg(f);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::io("run python3 h3client.py", e))?;
    Ok(parse_h3client(
        &String::from_utf8_lossy(&out.stdout),
        out.status.code().unwrap_or(-1),
        expect,
    ))
}

/// Runs `python3 SCRIPT URL ...` (aioquic) in the client namespace.
pub fn run_h3get(ns: &str, req: &H3Get<'_>, expect: Expect) -> Result<Sample, LabError> {
    let H3Get {
        script,
        ca,
        port,
        path,
        upload,
        max_time,
        bind,
    } = *req;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, "python3"])
        .arg(script)
        .arg(format!("https://{HOST}:{port}{path}"))
        .arg("--resolve")
        .arg(format!("{HOST}:{port}:{SERVER_V4}"))
        .arg("--cacert")
        .arg(ca)
        .arg("--max-time")
        .arg(max_time.to_string());
    if let Some(f) = upload {
        cmd.arg("--upload").arg(f);
    }
    if let Some(a) = bind {
        cmd.arg("--bind").arg(a.to_string());
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::io("run python3 h3get", e))?;
    let mut s = parse_h3get(
        &String::from_utf8_lossy(&out.stdout),
        out.status.code().unwrap_or(-1),
        expect,
    );
    if !s.ok {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !stderr.is_empty() {
            s.error = Some(format!("{} | {stderr:.300}", s.error.unwrap_or_default()));
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DL: Expect = Expect {
        proto: Proto::H3,
        bytes: 1048576,
        upload: false,
    };

    #[test]
    fn curl_arguments() {
        let v4 = IpAddr::V4(SERVER_V4);
        let a = curl_args(Proto::H3, v4, 9443, "/1m.bin", "/ca.pem", None, 30.0);
        assert!(a.contains(&"--http3-only".to_string()));
        assert!(a.contains(&"lab.test:9443:10.77.2.2".to_string()));
        assert_eq!(a.last().unwrap(), "https://lab.test:9443/1m.bin");
        let a = curl_args(
            Proto::H2,
            v4,
            443,
            "/upload/x",
            "/ca.pem",
            Some("/w/20m.bin"),
            60.0,
        );
        assert!(a.windows(2).any(|w| w[0] == "-T" && w[1] == "/w/20m.bin"));
        let v6 = IpAddr::V6(crate::topology::SERVER_V6);
        let a = curl_args(Proto::H2, v6, 443, "/", "/ca.pem", None, 5.0);
        assert!(a.contains(&"lab.test:443:[fd77:2::2]".to_string()));
    }

    #[test]
    fn parses_curl_success_and_failures() {
        let out = r#"{"http_code":200,"http_version":"3","size_download":1048576,"size_upload":0,"time_appconnect":0.402,"time_starttransfer":0.61,"time_total":1.63,"exitcode":0,"errormsg":null,"local_port":40000}"#;
        let s = parse_curl(out, 0, DL);
        assert!(s.ok, "{s:?}");
        assert_eq!(s.time_total, 1.63);
        assert_eq!(s.local_port, 40000);
        // Wrong protocol (curl fell back or the server spoke h2) is a failure.
        let h2 = out.replace(r#""http_version":"3""#, r#""http_version":"2""#);
        assert!(!parse_curl(&h2, 0, DL).ok);
        // Short body.
        let short = out.replace("1048576", "1000");
        assert!(!parse_curl(&short, 0, DL).ok);
        // Handshake never completed: timeout with appconnect 0.
        let hs = r#"{"http_code":0,"http_version":"0","size_download":0,"time_appconnect":0,"time_total":10.0,"exitcode":28,"errormsg":"Connection timed out after 10000 milliseconds"}"#;
        let s = parse_curl(hs, 28, DL);
        assert!(!s.ok && s.handshake_failed);
        assert!(s.error.unwrap().contains("timed out"));
        assert!(parse_curl("garbage", 7, DL).handshake_failed);
    }

    #[test]
    fn parses_h3client() {
        let out = r#"{"exit_code": 0, "connection": {"handshake": {"ok": true, "ms": 210.5, "alpn": "h3"}},
            "requests": [{"status": 200, "body_length": 1048576, "total_ms": 1400.0, "error": null}]}"#;
        let s = parse_h3client(out, 0, DL);
        assert!(s.ok, "{s:?}");
        assert!((s.time_total - 1.6105).abs() < 1e-9);
        let hs = r#"{"exit_code": 3, "connection": {"handshake": {"ok": false, "kind": "timeout", "detail": "no answer"}}, "requests": []}"#;
        let s = parse_h3client(hs, 3, DL);
        assert!(!s.ok && s.handshake_failed);
        assert!(s.error.unwrap().contains("no answer"));
        let reset = r#"{"exit_code": 0, "connection": {"handshake": {"ok": true, "ms": 1}},
            "requests": [{"status": 200, "body_length": 10, "total_ms": 5, "error": "stream reset"}]}"#;
        assert!(!parse_h3client(reset, 0, DL).ok);
    }

    #[test]
    fn parses_h3get() {
        let out = r#"{"ok": true, "error": null, "status": 200, "bytes": 1048576, "sha256": "x", "time_connect": 0.2, "time_total": 1.1}"#;
        assert!(parse_h3get(out, 0, DL).ok);
        let bad = r#"{"ok": false, "error": "timeout after 30 s"}"#;
        let s = parse_h3get(bad, 1, DL);
        assert!(!s.ok && s.handshake_failed);
        assert_eq!(s.error.as_deref(), Some("timeout after 30 s"));
    }
}
