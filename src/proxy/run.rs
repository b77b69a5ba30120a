//! The two ways to run the proxy, `proxy --config FILE` and `proxy --listener NAME`: each
//! connects one source ([`super::source`]) to the running proxy ([`super::server`]) through
//! one update channel, under one shutdown token.

use std::path::PathBuf;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::probe::ProbeState;
use super::server::{self, RunningProxy, ServeOptions, WhenSuperseded};
use super::source::{self, ConfigUpdate, UPDATE_QUEUE};
use super::ProxyError;
use crate::config::{self, ConfigError};
use crate::lifecycle;
use crate::memory;

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
    /// Kubernetes mode: this pod's name (the downward API's POD_NAME), so it knows when the
    /// listener's status names it to probe the TCP ingress for Alt-Svc.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Kubernetes mode: the secret the QUIC endpoint keys are derived from (the operator
    /// mounts the listener's keys Secret here). Standalone mode uses `keys.file`.
    #[arg(long, requires = "listener")]
    pub keys_file: Option<PathBuf>,
    /// Answer `h3-ingress probe` on this unix socket (Kubernetes mode: by default
    /// /tmp/h3-ingress-probe.sock, in the pod's own /tmp).
    #[arg(long)]
    pub probe_socket: Option<PathBuf>,
    /// Among processes sharing the port on this host, a higher rank takes the new
    /// connections whatever the start order (the operator passes the pod template
    /// generation, so a restarted container of an old pod never takes over from a new one).
    #[arg(long, env = "H3_INGRESS_ROLLOUT_RANK", default_value = "0", value_parser = parse_rank)]
    pub rank: u64,
}

/// A rank; empty is 0 (a pod without the template-generation label gets an empty variable).
fn parse_rank(s: &str) -> Result<u64, String> {
    if s.trim().is_empty() {
        return Ok(0);
    }
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number"))
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

/// Runs the proxy fed by the source `args` names until `shutdown`. The probe socket answers
/// from the start, before the configuration is loaded, to the end of the drain after
/// `shutdown`: the kubelet goes on probing readiness while a pod terminates, and a drained
/// pod whose successor on the node serves is still ready.
pub async fn run(args: ProxyArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let probe_path = args.probe_socket.clone().or_else(|| {
        args.listener
            .as_ref()
            .map(|_| PathBuf::from(crate::probe::DEFAULT_SOCKET))
    });
    let probe = ProbeState::new();
    let probe_stop = CancellationToken::new();
    let _stop_probes_on_return = probe_stop.clone().drop_guard();
    if let Some(p) = &probe_path {
        crate::probe::serve_or_warn(p, probe.clone(), probe_stop);
    }
    let mut opts = ServeOptions {
        keys_file: args.keys_file,
        when_superseded: WhenSuperseded::Exit,
        rank: args.rank,
        probe: Some(probe),
        identity: None,
        alt_svc_prober: None,
    };
    match (args.config, args.listener, args.hosts_namespace) {
        (Some(path), _, _) => file(path, shutdown, opts).await,
        (None, Some(listener), Some(hosts_namespace)) => {
            opts.when_superseded = WhenSuperseded::AwaitSignal;
            let source = KubeSource {
                listener,
                hosts_namespace,
                pod: args.pod_name,
            };
            kube(source, shutdown, opts).await
        }
        _ => Err(RunError::NoSource),
    }
}

/// Serves the configuration in `path` until `shutdown` (or until a newer process on the
/// same port has taken over and this one has drained), reloading it on SIGHUP. An invalid
/// file at start is [`RunError::Config`], with every field error.
pub async fn file(
    path: PathBuf,
    shutdown: CancellationToken,
    opts: ServeOptions,
) -> Result<(), RunError> {
    let initial = config::file::load(&path)?;
    let hangups = lifecycle::hangups().map_err(RunError::Signals)?;
    let (tx, rx) = mpsc::channel(UPDATE_QUEUE);
    let reloads = source::file::reload_on_hangup(path, hangups, tx, shutdown.clone());
    tokio::spawn(reloads);
    tokio::spawn(memory::trim_periodically(shutdown.clone()));
    server::serve(initial, rx, shutdown, None, opts).await?;
    Ok(())
}

/// What Kubernetes mode watches: a listener and the namespace of its certificate mirrors.
#[derive(Debug, Clone)]
pub struct KubeSource {
    pub listener: String,
    pub hosts_namespace: String,
    /// This pod's name: the listener's status names one pod to probe for Alt-Svc.
    pub pod: Option<String>,
}

/// [`kube_with_options`] on the cluster this process runs in (or KUBECONFIG's).
pub async fn kube(
    source: KubeSource,
    shutdown: CancellationToken,
    opts: ServeOptions,
) -> Result<(), RunError> {
    let client = ::kube::Client::try_default()
        .await
        .map_err(RunError::Kube)?;
    kube_with_options(client, source, shutdown, None, opts).await
}

/// [`kube_with_options`] with random per-process endpoint keys.
pub async fn kube_with(
    client: ::kube::Client,
    source: KubeSource,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
) -> Result<(), RunError> {
    let opts = ServeOptions {
        when_superseded: WhenSuperseded::AwaitSignal,
        ..ServeOptions::default()
    };
    kube_with_options(client, source, shutdown, ready, opts).await
}

/// [`kube_with_options`] with the endpoint keys from `keys_file`.
pub async fn kube_with_keys(
    client: ::kube::Client,
    source: KubeSource,
    keys_file: Option<PathBuf>,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
) -> Result<(), RunError> {
    let opts = ServeOptions {
        keys_file,
        when_superseded: WhenSuperseded::AwaitSignal,
        ..ServeOptions::default()
    };
    kube_with_options(client, source, shutdown, ready, opts).await
}

/// Serves the listener of `source` until `shutdown`: waits for its first usable
/// configuration (the listener and every mirror loaded), starts the proxy on it and applies
/// every later one live. Socket changes are refused by the proxy and rolled out by the
/// operator (the pod template carries their hash).
pub async fn kube_with_options(
    client: ::kube::Client,
    source: KubeSource,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
    mut opts: ServeOptions,
) -> Result<(), RunError> {
    let KubeSource {
        listener: name,
        hosts_namespace,
        pod,
    } = source;
    opts.identity = Some(format!("listener={name}"));
    let (tx, mut updates) = mpsc::channel(UPDATE_QUEUE);
    let (prober_tx, prober) = tokio::sync::watch::channel(false);
    opts.alt_svc_prober = Some(prober);
    info!(listener = %name, %hosts_namespace, "waiting for the Http3Listener and its certificate mirrors");
    let watch = tokio::spawn(source::kube::watch_listener(
        client,
        name.clone(),
        hosts_namespace,
        pod,
        tx,
        prober_tx,
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
    server::serve(initial, updates, shutdown, ready, opts).await?;
    Ok(())
}
