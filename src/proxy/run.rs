//! The two ways to run the proxy, `proxy --config FILE` and `proxy --listener NAME`: each
//! connects one source ([`super::source`]) to the running proxy ([`super::server`]) through
//! one update channel, under one shutdown token.

use std::path::PathBuf;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::server::{self, RunningProxy};
use super::source::{self, ConfigUpdate, UPDATE_QUEUE};
use super::{memory, ProxyError};
use crate::config::{self, ConfigError};
use crate::lifecycle;

/// `h3-ingress proxy`: where the configuration comes from.
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// Standalone mode: YAML configuration file (SIGHUP reloads hosts and certificates).
    #[arg(
        long,
        required_unless_present = "listener",
        conflicts_with = "listener"
    )]
    pub config: Option<PathBuf>,
    /// Kubernetes mode: serve this Http3Listener and the hosts of its certificate mirrors,
    /// following changes live.
    #[arg(long, requires = "hosts_namespace")]
    pub listener: Option<String>,
    /// Kubernetes mode: the namespace holding the listener's certificate mirrors (Secrets of
    /// type h3-ingress.dev/host-certificate that the operator writes).
    #[arg(long, env = "H3I_HOSTS_NAMESPACE", requires = "listener")]
    pub hosts_namespace: Option<String>,
    /// Kubernetes mode: the secret the QUIC endpoint keys are derived from (the operator
    /// mounts the listener's keys Secret here). Standalone mode uses `keys.file`.
    #[arg(long, requires = "listener")]
    pub keys_file: Option<PathBuf>,
}

/// Why a proxy run ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration to start with is invalid (each field error names the field).
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    #[error("installing the SIGHUP handler: {0}")]
    Signals(#[source] std::io::Error),
    #[error("connecting to the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Kube(#[source] ::kube::Error),
    #[error(transparent)]
    Watch(#[from] source::kube::WatchError),
    #[error("the listener watch ended before a configuration arrived")]
    SourceEnded,
    #[error("no configuration source: give --config FILE or --listener NAME --hosts-namespace NS")]
    NoSource,
}

/// Runs the proxy fed by the source `args` names until `shutdown`.
pub async fn run(args: ProxyArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    match (args.config, args.listener, args.hosts_namespace) {
        (Some(path), _, _) => file(path, shutdown).await,
        (None, Some(name), Some(ns)) => kube(name, ns, args.keys_file, shutdown).await,
        _ => Err(RunError::NoSource),
    }
}

/// Serves the configuration in `path` until `shutdown`, reloading it on SIGHUP. An invalid
/// file at start is [`RunError::Config`], with every field error.
pub async fn file(path: PathBuf, shutdown: CancellationToken) -> Result<(), RunError> {
    let initial = config::file::load(&path)?;
    let hangups = lifecycle::hangups().map_err(RunError::Signals)?;
    let (tx, rx) = mpsc::channel(UPDATE_QUEUE);
    let reloads = source::file::reload_on_hangup(path, hangups, tx, shutdown.clone());
    tokio::spawn(reloads);
    tokio::spawn(memory::trim_periodically(shutdown.clone()));
    server::serve(initial, rx, shutdown, None, None).await?;
    Ok(())
}

/// [`kube_with_keys`] on the cluster this process runs in (or KUBECONFIG's).
pub async fn kube(
    name: String,
    hosts_namespace: String,
    keys_file: Option<PathBuf>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let client = ::kube::Client::try_default()
        .await
        .map_err(RunError::Kube)?;
    let source = KubeSource {
        listener: name,
        hosts_namespace,
    };
    kube_with_keys(client, source, keys_file, shutdown, None).await
}

/// What Kubernetes mode watches: a listener and the namespace of its certificate mirrors.
#[derive(Debug, Clone)]
pub struct KubeSource {
    pub listener: String,
    pub hosts_namespace: String,
}

/// [`kube_with_keys`] with random per-process endpoint keys.
pub async fn kube_with(
    client: ::kube::Client,
    source: KubeSource,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
) -> Result<(), RunError> {
    kube_with_keys(client, source, None, shutdown, ready).await
}

/// Serves the listener of `source` until `shutdown`: waits for its first usable
/// configuration (the listener and every mirror loaded), starts the proxy on it and applies
/// every later one live. Socket changes are refused by
/// the proxy and rolled out by the operator (the pod template carries their hash). The
/// endpoint keys come from `keys_file`.
pub async fn kube_with_keys(
    client: ::kube::Client,
    source: KubeSource,
    keys_file: Option<PathBuf>,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
) -> Result<(), RunError> {
    let (tx, mut updates) = mpsc::channel(UPDATE_QUEUE);
    let KubeSource {
        listener: name,
        hosts_namespace,
    } = source;
    info!(listener = %name, %hosts_namespace, "waiting for the Http3Listener and its certificate mirrors");
    let watch = tokio::spawn(source::kube::watch_listener(
        client,
        name.clone(),
        hosts_namespace,
        tx,
    ));
    tokio::spawn(memory::trim_periodically(shutdown.clone()));
    let initial = loop {
        tokio::select! {
            u = updates.recv() => match u {
                Some(ConfigUpdate::Apply(c)) => break *c,
                Some(ConfigUpdate::Invalid(why)) => {
                    warn!(listener = %name, "no usable configuration yet: {why}");
                }
                None => {
                    return match watch.await {
                        Ok(Err(e)) => Err(e.into()),
                        _ => Err(RunError::SourceEnded),
                    }
                }
            },
            _ = shutdown.cancelled() => return Ok(()),
        }
    };
    server::serve(initial, updates, shutdown, ready, keys_file).await?;
    Ok(())
}
