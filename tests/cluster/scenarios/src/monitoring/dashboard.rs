//! What the dashboard (`deploy/grafana/h3-ingress.json`) asks Prometheus: every panel query and
//! every query-type template variable, with Grafana's variables replaced by what a user sees with
//! "All" selected (the values `tests/observe/dashboard_check.py` gives promtool).

use serde_json::Value;

use h3i_scenarios::cmd::repo;
use h3i_scenarios::{fail, Error, Result};

/// Grafana's variables and what they become: `$__rate_interval` the 5m the rules use, the
/// listener and host selectors "All" (`.*`).
const VARIABLES: [(&str, &str); 5] = [
    ("__rate_interval", "5m"),
    ("__interval", "1m"),
    ("__range", "1h"),
    ("listener", ".*"),
    ("host", ".*"),
];

/// `(where, PromQL)` for every query of the dashboard file, variables replaced.
pub fn queries() -> Result<Vec<(String, String)>> {
    let path = repo().join("deploy/grafana/h3-ingress.json");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        context: format!("read {}", path.display()),
        source,
    })?;
    let dash: Value = serde_json::from_str(&text).map_err(|source| Error::Json {
        context: path.display().to_string(),
        source,
    })?;
    let mut out = Vec::new();
    let top = dash["panels"].as_array().cloned().unwrap_or_default();
    // A collapsed row holds its panels inside it.
    let nested = top
        .iter()
        .flat_map(|p| p["panels"].as_array().cloned().unwrap_or_default());
    for p in top.iter().cloned().chain(nested) {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((format!("panel {title:?}"), expand(e)?));
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap_or("?");
        let def = v["definition"].as_str().unwrap_or_default();
        out.push((format!("variable {name}"), expand(&series_of(def))?));
    }
    if out.is_empty() {
        return fail(format!("{}: no query found", path.display()));
    }
    Ok(out)
}

/// The series selector of `label_values(SELECTOR, label)`; anything else as it is.
fn series_of(definition: &str) -> String {
    let Some(inner) = definition
        .trim()
        .strip_prefix("label_values(")
        .and_then(|d| d.strip_suffix(')'))
    else {
        return definition.to_string();
    };
    match inner.rsplit_once(',') {
        Some((selector, _label)) => selector.trim().to_string(),
        None => inner.to_string(),
    }
}

/// Replaces `$name` and `${name}` of [`VARIABLES`]; one left over fails.
fn expand(expr: &str) -> Result<String> {
    let mut out = expr.to_string();
    // Longest first: `$__rate_interval` before `$__range`... and `$host` never eats `$hosts`.
    let mut vars = VARIABLES.to_vec();
    vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    for (name, value) in vars {
        out = out.replace(&format!("${{{name}}}"), value);
        out = out.replace(&format!("${name}"), value);
    }
    if out.contains('$') {
        return fail(format!("a Grafana variable left in {out}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_of_the_dashboard_is_plain_promql() {
        let q = queries().unwrap();
        assert!(q.len() >= 30, "{} queries", q.len());
        assert!(q
            .iter()
            .any(|(w, e)| w == "variable listener" && e == "h3_ingress_build_info"));
        assert!(q.iter().all(|(_, e)| !e.contains('$')));
    }

    #[test]
    fn expands_both_forms_and_refuses_unknown_ones() {
        assert_eq!(
            expand("rate(x{listener=~\"$listener\"}[${__rate_interval}])").unwrap(),
            "rate(x{listener=~\".*\"}[5m])"
        );
        assert!(expand("x[$unknown]").is_err());
        assert_eq!(
            series_of("label_values(a{b=\"c,d\"}, host)"),
            "a{b=\"c,d\"}"
        );
    }
}
