//! A Prometheus server's HTTP API (`/api/v1/...`), as the monitoring scenario asks it: instant
//! queries, the scrape targets, the loaded rules and the build. Plain HTTP/1.0 GETs through
//! [`crate::prom::http_get`]; every answer's `status` must be `success`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{fail, Error, Result};

/// A Prometheus server at `IP:PORT` (`[IPv6]:PORT`).
#[derive(Clone, Debug)]
pub struct Prometheus {
    addr: String,
}

/// One series of an instant vector: its labels and its value as Prometheus writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: String,
}

impl Sample {
    /// The label's value, `""` when the series lacks it.
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

impl Prometheus {
    /// From `http://IP:PORT` (what `tests/cluster/prometheus-up.sh` prints) or `IP:PORT`.
    pub fn new(url: &str) -> Prometheus {
        let addr = url
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/');
        Prometheus {
            addr: addr.to_string(),
        }
    }

    /// `http://IP:PORT`, for messages.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `data` of `GET path?params` (`/api/v1/...`).
    pub async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value> {
        let full = if params.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", query_string(params))
        };
        let (status, body) = crate::prom::http_get(&self.addr, &full).await?;
        let doc: Value = serde_json::from_str(&body).map_err(|source| Error::Json {
            context: format!("GET {}{full} (status {status})", self.url()),
            source,
        })?;
        if doc["status"] != "success" {
            return fail(format!(
                "GET {}{full}: status {status}, {} {}",
                self.url(),
                doc["errorType"],
                doc["error"]
            ));
        }
        Ok(doc["data"].clone())
    }

    /// An instant query: the series of the vector it returns (a scalar or string fails).
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await?;
        if data["resultType"] != "vector" {
            return fail(format!(
                "query {expr}: result type {}, want vector",
                data["resultType"]
            ));
        }
        Ok(samples(&data["result"]))
    }

    /// The active targets of a scrape pool (`podMonitor/NAMESPACE/NAME/0`): each one's labels
    /// after relabelling.
    pub async fn active_targets(&self, pool: &str) -> Result<Vec<BTreeMap<String, String>>> {
        let params = [("state", "active"), ("scrapePool", pool)];
        let data = self.api("/api/v1/targets", &params).await?;
        let targets = data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(targets.iter().map(|t| labels_of(&t["labels"])).collect())
    }

    /// Every loaded rule as `(group, rule name) -> health`.
    pub async fn rules(&self) -> Result<BTreeMap<(String, String), String>> {
        let data = self.api("/api/v1/rules", &[]).await?;
        let mut out = BTreeMap::new();
        for g in data["groups"].as_array().into_iter().flatten() {
            let group = g["name"].as_str().unwrap_or_default();
            for r in g["rules"].as_array().into_iter().flatten() {
                let name = r["name"].as_str().unwrap_or_default();
                let health = r["health"].as_str().unwrap_or_default();
                out.insert((group.to_string(), name.to_string()), health.to_string());
            }
        }
        Ok(out)
    }

    /// `version` and `goVersion` of `/api/v1/status/buildinfo`.
    pub async fn build(&self) -> Result<(String, String)> {
        let data = self.api("/api/v1/status/buildinfo", &[]).await?;
        let s = |k: &str| data[k].as_str().unwrap_or_default().to_string();
        Ok((s("version"), s("goVersion")))
    }
}

fn labels_of(v: &Value) -> BTreeMap<String, String> {
    let Some(m) = v.as_object() else {
        return BTreeMap::new();
    };
    m.iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// The series of a `result` array of `resultType: vector`.
fn samples(result: &Value) -> Vec<Sample> {
    let items = result.as_array().cloned().unwrap_or_default();
    items
        .iter()
        .map(|r| Sample {
            labels: labels_of(&r["metric"]),
            value: r["value"][1].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

/// `k=v&k2=v2` with every byte but RFC 3986's unreserved ones percent-encoded.
pub fn query_string(params: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(b as char);
            } else {
                out += &format!("%{b:02X}");
            }
        }
        out
    };
    let pairs: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect();
    pairs.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_promql_for_a_query_string() {
        let q = query_string(&[("query", r#"up{job="ns/a b"} > 0"#), ("x", "é")]);
        assert_eq!(q, "query=up%7Bjob%3D%22ns%2Fa%20b%22%7D%20%3E%200&x=%C3%A9");
    }

    #[test]
    fn reads_a_vector_answer() {
        let doc: Value = serde_json::from_str(
            r#"[{"metric": {"__name__": "up", "node": "n1"}, "value": [1.5, "1"]},
                {"metric": {}, "value": [1.5, "0"]}]"#,
        )
        .unwrap();
        let s = samples(&doc);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].label("node"), s[0].value.as_str()), ("n1", "1"));
        assert_eq!((s[1].label("node"), s[1].value.as_str()), ("", "0"));
        assert_eq!(
            Prometheus::new("http://10.0.0.1:9090/").url(),
            "http://10.0.0.1:9090"
        );
    }
}
