//! (c) A response that takes [`SLOW_SECONDS`]: longer than the listener's default response
//! timeout (60 s) and shorter than the 120 s `proxy-read-timeout` of [`SLOW`]'s Ingress. The
//! answer comes from a backend on the host's bridge address that nginx proxies `/slow` to
//! (`proxy_read_timeout 120s`, as ingress-nginx renders the annotation). One HTTP/3 request
//! and its TCP twin start as soon as the host is served and are collected at (c), so the wait
//! overlaps the other checks: the HTTP/3 one meanwhile lives through nginx's reload and the
//! listener's change of upstream in (b), as a long request does through a user's changes. The
//! client does not PING (aioquic): the data plane's keep-alive holds the connection open.

use std::time::{Duration, Instant};

use h3i_scenarios::cmd::{output, repo, Output};
use h3i_scenarios::{ensure, expect_eq, fail, indent, ok, Error, Result, Run};
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::ResourceExt;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::setup::io;
use super::*;

/// How long the backend waits before it answers.
pub const SLOW_SECONDS: u64 = 90;
/// The path nginx proxies to the slow backend.
pub const SLOW_PATH: &str = "/slow";
/// The longest request head the backend reads.
const HEAD_BYTES: usize = 16 * 1024;
/// What the backend answers after its wait.
const SLOW_BODY: &str = "answered after the wait\n";

/// The backend's accept loop, stopped when this is dropped.
pub struct SlowBackend {
    pub address: String,
    task: JoinHandle<()>,
}

impl Drop for SlowBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowBackend {
    /// Listens on `ip`, port chosen by the kernel; every request is answered 200 after
    /// [`SLOW_SECONDS`].
    pub async fn start(ip: &str) -> Result<SlowBackend> {
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(io("slow backend"))?;
        let address = listener
            .local_addr()
            .map_err(io("slow backend"))?
            .to_string();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(answer_late(conn));
            }
        });
        Ok(SlowBackend { address, task })
    }
}

async fn answer_late(mut conn: tokio::net::TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_BYTES {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    tokio::time::sleep(Duration::from_secs(SLOW_SECONDS)).await;
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{SLOW_BODY}",
        SLOW_BODY.len()
    );
    let _ = conn.write_all(answer.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// The two requests in flight: HTTP/3 (aioquic) and TCP (curl), both to the first node.
pub struct SlowRequests {
    started: Instant,
    h3: JoinHandle<Result<(Output, Duration)>>,
    tcp: JoinHandle<Result<(Output, Duration)>>,
}

/// Runs `program` with `args` in a task, timing it from `started`.
fn timed(program: String, args: Vec<String>) -> JoinHandle<Result<(Output, Duration)>> {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let out = output(&program, &args).await?;
        Ok((out, t0.elapsed()))
    })
}

impl Frontdoor {
    /// Starts both requests once [`SLOW`] answers over HTTP/3 on every node.
    pub(super) async fn start_slow_requests(&self, run: &mut Run) -> Result<SlowRequests> {
        run.step(format!(
            "(c) a {SLOW_SECONDS} s response for {SLOW} (proxy-read-timeout \"120\"), HTTP/3 and TCP, \
             started now and collected at (c)"
        ));
        self.h3_served(SLOW, UDP_NGINX).await?;
        let ip = &self.env.ips[0];
        let url = format!("https://{SLOW}{SLOW_PATH}");
        let resolve = format!("{SLOW}:{UDP_NGINX}:{ip}");
        let ca = self.ca.to_string_lossy().to_string();
        let script = repo().join("tests/py/h3client.py");
        let py = h3i_scenarios::h3::python().to_string_lossy().to_string();
        let wait = (SLOW_SECONDS + 30).to_string();
        let h3_args = [&*script.to_string_lossy(), &url, "--resolve", &resolve]
            .into_iter()
            .chain([
                "--cacert",
                &ca,
                "--connect-timeout",
                "5",
                "--timeout",
                &wait,
            ])
            .map(String::from)
            .collect();
        let tcp_resolve = format!("{SLOW}:{TCP_NGINX}:{ip}");
        let tcp_args = ["-sS", "--http2", "--max-time", &wait, "--cacert", &ca]
            .into_iter()
            .chain(["--resolve", &tcp_resolve, "-w", "\n%{http_code}", &url])
            .map(String::from)
            .collect();
        let started = Instant::now();
        let requests = SlowRequests {
            started,
            h3: timed(py, h3_args),
            tcp: timed("curl".into(), tcp_args),
        };
        ok(format!(
            "GET {url} sent to {ip} over HTTP/3 (UDP {UDP_NGINX}) and TCP {TCP_NGINX}"
        ));
        Ok(requests)
    }

    /// Both requests answered 200, the HTTP/3 one after at least [`SLOW_SECONDS`],
    /// and the data plane's access log on that node has the HTTP/3 one.
    pub(super) async fn slow_answered(&self, run: &mut Run, r: SlowRequests) -> Result<()> {
        run.step(format!(
            "(c) the {SLOW_SECONDS} s responses (waiting {} s more)",
            SLOW_SECONDS.saturating_sub(r.started.elapsed().as_secs())
        ));
        let ip = &self.env.ips[0];
        let joined = |e: tokio::task::JoinError| Error::Check(format!("slow request: {e}"));
        let (h3, h3_took) = r.h3.await.map_err(joined)??;
        let (tcp, tcp_took) = r.tcp.await.map_err(joined)??;
        let rep: Value = serde_json::from_str(&h3.stdout).map_err(|_| {
            Error::Check(format!("h3client.py: no JSON: {} {}", h3.stdout, h3.stderr))
        })?;
        let answer = &rep["requests"][0];
        let h3_status = answer["status"].as_u64();
        let tcp_status = tcp
            .stdout
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        self.record(format!(
            "{ip} {SLOW}{SLOW_PATH} ({SLOW_SECONDS} s upstream): HTTP/3 {} after {:.1} s, TCP {tcp_status} after {:.1} s",
            h3_status.map_or("none".into(), |s| s.to_string()),
            h3_took.as_secs_f64(),
            tcp_took.as_secs_f64()
        ));
        expect_eq(&format!("{SLOW}: HTTP/3 status"), &Some(200), &h3_status)?;
        expect_eq(&format!("{SLOW}: TCP status"), "200", tcp_status.as_str())?;
        ensure!(
            h3_took.as_secs() >= SLOW_SECONDS,
            "{SLOW}: HTTP/3 answered after {h3_took:?}, before the backend's {SLOW_SECONDS} s: not the slow answer: {answer}"
        );
        ok(format!(
            "{SLOW}: 200 over HTTP/3 after {:.1} s (the listener's own response timeout is 60 s), as over TCP",
            h3_took.as_secs_f64()
        ));
        self.slow_access_logged().await
    }

    /// The access log of the data-plane pod on the first node has the request: 200, at least
    /// [`SLOW_SECONDS`].
    async fn slow_access_logged(&self) -> Result<()> {
        let node = &self.env.nodes[0];
        let pods = self.ns::<Pod>(NS_OP);
        let all = k8s::list(&pods, &h3i_scenarios::app::dp_selector(L_NGINX)).await?;
        let Some(pod) = all
            .iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        else {
            return fail(format!("no {L_NGINX} data-plane pod on {node}"));
        };
        let lp = LogParams {
            container: Some(h3_ingress::operator::resources::CONTAINER_NAME.into()),
            ..Default::default()
        };
        let text = pods.logs(&pod.name_any(), &lp).await?;
        let line = text.lines().find(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_default();
            v["path"] == SLOW_PATH && v["status"] == 200
        });
        let Some(line) = line else {
            return fail(format!(
                "no access-log line for {SLOW_PATH} with status 200 in {}",
                pod.name_any()
            ));
        };
        indent(line);
        let v: Value = serde_json::from_str(line).unwrap_or_default();
        let ms = v["duration_ms"].as_f64().unwrap_or_default();
        ensure!(
            ms >= (SLOW_SECONDS * 1000) as f64,
            "access log: duration_ms {ms}, want at least {} s",
            SLOW_SECONDS
        );
        ok(format!(
            "{}'s access log: {SLOW}{SLOW_PATH} 200 in {:.1} s, client {}",
            pod.name_any(),
            ms / 1000.0,
            v["client"]
        ));
        Ok(())
    }
}
