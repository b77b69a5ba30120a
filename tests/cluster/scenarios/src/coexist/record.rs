//! A listener's conditions recorded once a second in the background, and the verdict on a
//! stretch of the record: one value the whole time (no flip), `Ready=True`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use h3_ingress::api::{conditions, Http3Listener};
use kube::Api;
use tokio::task::JoinHandle;

/// `(epoch seconds, value)` per observation.
pub type Rows = Arc<Mutex<Vec<(u64, String)>>>;

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A background task that records the listener's observed generation and conditions
/// (`TYPE=STATUS/REASON@lastTransitionTime`) every second until stopped.
pub struct Recorder {
    pub rows: Rows,
    task: JoinHandle<()>,
}

impl Recorder {
    pub fn start(api: Api<Http3Listener>, name: &str) -> Recorder {
        let rows: Rows = Arc::default();
        let (out, name) = (rows.clone(), name.to_string());
        let task = tokio::spawn(async move {
            loop {
                let value = match api.get(&name).await {
                    Ok(l) => value_of(&l),
                    Err(e) => format!("error: {e}"),
                };
                if let Ok(mut r) = out.lock() {
                    r.push((now(), value));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Recorder { rows, task }
    }

    pub fn stop(&self) {
        self.task.abort();
    }

    pub fn snapshot(&self) -> Vec<(u64, String)> {
        self.rows.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one observation records.
fn value_of(l: &Http3Listener) -> String {
    let Some(st) = &l.status else {
        return "no status".into();
    };
    let mut v = st.observed_generation.unwrap_or(0).to_string();
    for c in &st.conditions {
        v += &format!(
            " {}={}/{}@{}",
            c.type_, c.status, c.reason, c.last_transition_time.0
        );
    }
    v
}

/// The verdict on the observations from `from` on: the lines to print (a summary, then each
/// distinct value with when it was seen), and whether there was exactly one value and it had
/// `Ready=True`.
pub fn one_value(rows: &[(u64, String)], from: u64) -> (Vec<String>, bool) {
    let rows: Vec<&(u64, String)> = rows.iter().filter(|(t, _)| *t >= from).collect();
    let mut values: Vec<(&str, Vec<u64>)> = Vec::new();
    for (t, v) in &rows {
        match values.iter_mut().find(|(seen, _)| seen == v) {
            Some((_, ts)) => ts.push(*t),
            None => values.push((v, vec![*t])),
        }
    }
    let span = match (rows.first(), rows.last()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0,
    };
    let mut lines = vec![format!(
        "{} observations over {span} s, {} distinct value(s)",
        rows.len(),
        values.len()
    )];
    for (v, ts) in &values {
        let (a, b) = (ts[0] - from, ts[ts.len() - 1] - from);
        lines.push(format!("  {}x from +{a} s to +{b} s: {v}", ts.len()));
    }
    let ready = format!("{}=True/", conditions::READY);
    let ok = values.len() == 1 && values[0].0.contains(&ready);
    (lines, ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use h3_ingress::api::reasons;

    fn ready(reason: &str) -> String {
        format!("3 {}=True/{reason}@2026-12-04T10:00:00Z", conditions::READY)
    }

    #[test]
    fn one_ready_value_throughout_passes_and_earlier_rows_do_not_count() {
        let rows = vec![
            (99, "error: not found".to_string()),
            (100, ready(reasons::ALL_HOSTS_SERVING)),
            (101, ready(reasons::ALL_HOSTS_SERVING)),
            (103, ready(reasons::ALL_HOSTS_SERVING)),
        ];
        let (lines, ok) = one_value(&rows, 100);
        assert!(ok, "{lines:?}");
        assert_eq!(lines[0], "3 observations over 3 s, 1 distinct value(s)");
        assert!(lines[1].starts_with("  3x from +0 s to +3 s: 3 "));
    }

    #[test]
    fn a_flip_or_no_ready_or_no_rows_fails() {
        let flip = vec![(1, ready("A")), (2, ready("B")), (3, ready("A"))];
        let (lines, ok) = one_value(&flip, 1);
        assert!(!ok);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[1].starts_with("  2x from +0 s to +2 s"));
        let not_ready = vec![(1, format!("1 {}=False/X@t", conditions::READY))];
        assert!(!one_value(&not_ready, 0).1);
        assert!(!one_value(&[], 0).1);
    }
}
