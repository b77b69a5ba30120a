//! Standalone mode (`proxy --config FILE`): the configuration is a YAML file, loaded at start
//! and again on every SIGHUP. A file that does not load is an invalid update: the proxy
//! counts it and keeps serving what it has.

use std::path::{Path, PathBuf};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::ConfigUpdate;
use crate::config;

/// The file as an update: its configuration, or why it is unusable.
pub fn reload(path: &Path) -> ConfigUpdate {
    match config::file::load(path) {
        Ok(c) => ConfigUpdate::Apply(Box::new(c)),
        Err(e) => ConfigUpdate::Invalid(e.to_string()),
    }
}

/// Reloads `path` once per item of `hangups` and sends the result; ends when `hangups` or the
/// proxy's receiver closes, or `shutdown` fires.
pub async fn reload_on_hangup(
    path: PathBuf,
    mut hangups: mpsc::Receiver<()>,
    tx: mpsc::Sender<ConfigUpdate>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            h = hangups.recv() => if h.is_none() { return },
            _ = shutdown.cancelled() => return,
        }
        info!(file = %path.display(), "SIGHUP: reloading configuration");
        if tx.send(reload(&path)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::source::UPDATE_QUEUE;
    use std::time::Duration;

    async fn next(rx: &mut mpsc::Receiver<ConfigUpdate>) -> ConfigUpdate {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an update per hangup")
            .expect("source alive")
    }

    #[tokio::test]
    async fn every_hangup_reloads_the_file_and_a_bad_file_is_an_invalid_update() {
        let dir = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["a.test".to_string()]).unwrap();
        std::fs::write(dir.path().join("a.pem"), ck.cert.pem()).unwrap();
        std::fs::write(dir.path().join("a.key"), ck.signing_key.serialize_pem()).unwrap();
        let path = dir.path().join("h3-ingress.yaml");
        std::fs::write(&path, "upstream: {address: nope}\n").unwrap();

        let (hup_tx, hups) = mpsc::channel(1);
        let (tx, mut rx) = mpsc::channel(UPDATE_QUEUE);
        let shutdown = CancellationToken::new();
        let source = tokio::spawn(reload_on_hangup(path.clone(), hups, tx, shutdown.clone()));

        hup_tx.send(()).await.unwrap();
        match next(&mut rx).await {
            ConfigUpdate::Invalid(why) => {
                assert!(why.contains("upstream.address: \"nope\""), "{why}")
            }
            other => panic!("expected an invalid update, got {other:?}"),
        }

        std::fs::write(
            &path,
            "upstream: {address: '127.0.0.1:8443'}\nhosts:\n- {name: a.test, certFile: a.pem, keyFile: a.key}\n",
        )
        .unwrap();
        hup_tx.send(()).await.unwrap();
        match next(&mut rx).await {
            ConfigUpdate::Apply(c) => assert!(c.hosts.lookup("a.test").is_some()),
            other => panic!("expected a configuration, got {other:?}"),
        }

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), source)
            .await
            .expect("the source ends on shutdown")
            .unwrap();
    }
}
