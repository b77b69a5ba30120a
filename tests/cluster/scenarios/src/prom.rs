//! Plain HTTP GETs of the admin endpoints (`/healthz`, `/metrics`) and Prometheus samples read
//! from a scrape: a metric summed over the samples whose labels match.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{fail, Error, Result};

/// `GET path` on `addr` (`IP:PORT` or `[IPv6]:PORT`) over HTTP/1.0: status and body.
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let io = |e: std::io::Error| Error::Io {
        context: format!("GET http://{addr}{path}"),
        source: e,
    };
    let fetch = async {
        let mut s = TcpStream::connect(addr).await.map_err(io)?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.map_err(io)?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(io)?;
        Ok::<_, Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| Error::Command(format!("GET http://{addr}{path}: no answer in 10 s")))??;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    match status {
        Some(s) => Ok((s, body.to_string())),
        None => fail(format!(
            "GET http://{addr}{path}: no HTTP status in {:?}",
            crate::cmd::head(head, 100)
        )),
    }
}

/// The sum of the samples of `name` whose labels include every `(key, value)` of `want`, or
/// `None` when no sample matches.
pub fn sum(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = split_sample(line) else {
            continue;
        };
        let (metric, labels) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.strip_suffix('}').unwrap_or(rest)),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let labels = parse_labels(labels);
        if want
            .iter()
            .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        {
            if let Ok(v) = value.parse::<f64>() {
                *total.get_or_insert(0.0) += v;
            }
        }
    }
    total
}

/// `series value [timestamp]`, the series possibly holding spaces inside quoted labels.
fn split_sample(line: &str) -> Option<(&str, &str)> {
    let end = match line.find('{') {
        Some(open) => open + line[open..].rfind('}')? + 1,
        None => line.find(char::is_whitespace)?,
    };
    let (series, rest) = line.split_at(end);
    Some((series, rest.split_whitespace().next()?))
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let key = key.trim_start_matches([',', ' ']).to_string();
        let (mut value, mut escaped, mut end) = (String::new(), false, after.len());
        for (i, c) in after.char_indices() {
            match (escaped, c) {
                (true, 'n') => (value.push('\n'), escaped = false).1,
                (true, c) => (value.push(c), escaped = false).1,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = i + 1;
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        out.push((key, value));
        rest = &after[end..];
    }
    out
}

/// Scrapes `http://addr/metrics` and sums `name` over the samples matching `want`; a metric
/// the scrape lacks fails.
pub async fn metric(addr: &str, name: &str, want: &[(&str, &str)]) -> Result<f64> {
    let (status, body) = http_get(addr, "/metrics").await?;
    if status != 200 {
        return fail(format!("http://{addr}/metrics: status {status}"));
    }
    match sum(&body, name, want) {
        Some(v) => Ok(v),
        None => fail(format!("http://{addr}/metrics exports no {name}{want:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "# HELP x_total things\n# TYPE x_total counter\n\
        x_total{kind=\"a\",family=\"ipv4\"} 3\n\
        x_total{kind=\"b c\",family=\"ipv6\"} 4 1700000000\n\
        x_total 1\n\
        y{msg=\"say \\\"hi\\\", ok\"} 2.5\n";

    #[test]
    fn sums_the_matching_samples() {
        assert_eq!(sum(SCRAPE, "x_total", &[]), Some(8.0));
        assert_eq!(sum(SCRAPE, "x_total", &[("family", "ipv4")]), Some(3.0));
        assert_eq!(sum(SCRAPE, "x_total", &[("kind", "b c")]), Some(4.0));
        assert_eq!(sum(SCRAPE, "y", &[("msg", "say \"hi\", ok")]), Some(2.5));
        assert_eq!(sum(SCRAPE, "x_total", &[("family", "ipv9")]), None);
        assert_eq!(sum(SCRAPE, "x", &[]), None);
    }
}
