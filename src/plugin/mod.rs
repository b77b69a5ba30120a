//! `kubectl h3-ingress`: the same binary, installed (or symlinked) as `kubectl-h3_ingress`.
//!
//! kubectl runs any executable named `kubectl-<name>` on the PATH as `kubectl <name>`, mapping
//! `-` in the command to `_` in the file name. `main.rs` dispatches here on `argv[0]`.
//!
//! - `status [LISTENER]`: each `Http3Listener`'s status (conditions, hosts by state) and a
//!   per-host table: every host a data plane pod serves (its `/hosts`, read through the API
//!   server's pod proxy, [`pods`]) and every host the status says is not served, with DNS HTTPS
//!   records. The listener's status itself lists only hosts not served, so it stays small.
//! - `check HOST [--node ADDR]`: runs `h3-ingress check` for HOST against a node that runs the
//!   host's data plane, found through the listeners and their pods when `--node` is absent.
//!
//! Formatting and node selection are pure functions; the thin I/O shell reads the API server
//! (or a file, for offline use and tests).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Deserialize;

pub mod pods;

use crate::api::{
    conditions, host_states, reasons, HostReport, Http3Listener, Http3ListenerStatus,
};
use crate::config::host_matches;
use crate::operator::resources::label_selector;
use crate::operator::status::{dns_https_record, incomplete_chains_counted, private_roots_named};

/// The reasons of hosts not served because of the TCP ingress's own policy for them.
const HELD_BACK: [&str; 3] = [
    reasons::CLIENT_ADDRESS_POLICY,
    reasons::CLIENT_CERTIFICATE_REQUIRED,
    reasons::TLS_PASSTHROUGH,
];

/// What a host whose certificate does not chain to a public web root is told.
pub const CHROME_NOTE: &str =
    "Chrome will not use HTTP/3 (certificate not from a public web root; Firefox and Safari may)";

/// File name kubectl looks for to run `kubectl h3-ingress`.
pub const PLUGIN_EXECUTABLE: &str = "kubectl-h3_ingress";
/// `argv[0]` the plugin gives the binary when it re-executes itself for `check`.
pub const MAIN_EXECUTABLE: &str = "h3-ingress";

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot load kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("cannot reach the cluster: {0}")]
    Client(#[source] kube::Error),
    #[error("{0}")]
    Api(#[source] kube::Error),
    #[error("Http3Listener {0:?} not found")]
    ListenerNotFound(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an Http3Listener, a list of them, or a YAML stream of them: {source}")]
    Parse {
        path: PathBuf,
        source: serde_norway::Error,
    },
    #[error(
        "no Http3Listener serves {0}; `kubectl h3-ingress status` lists the hosts, or pass --node"
    )]
    HostNotServed(String),
    #[error("no ready data plane pod of listener {0} has a host IP; pass --node ADDR")]
    NoReadyNode(String),
    #[error("cannot resolve node address {0}: {1}")]
    Resolve(String, #[source] std::io::Error),
    #[error("cannot find this executable to run the check: {0}")]
    CurrentExe(#[source] std::io::Error),
    #[error("cannot run {exe}: {source}")]
    Exec {
        exe: PathBuf,
        source: std::io::Error,
    },
}

/// True when the binary was started under the plugin's name (directly or through kubectl).
pub fn invoked_as_plugin(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(PLUGIN_EXECUTABLE))
}

#[derive(Parser, Debug)]
#[command(
    name = "kubectl h3-ingress",
    bin_name = "kubectl h3-ingress",
    version,
    about = "Inspect and check h3-ingress HTTP/3 listeners"
)]
pub struct PluginCli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Subcommand, Debug)]
enum PluginCommand {
    /// Per-host HTTP/3 state of every Http3Listener, or of LISTENER.
    Status {
        listener: Option<String>,
        /// Read the listener(s) from a file (`kubectl get h3l -o yaml` output, `-` for stdin)
        /// instead of the cluster.
        #[arg(short = 'f', long)]
        filename: Option<PathBuf>,
        /// With -f: a data plane pod's `/hosts` (JSON) saved earlier, for the served hosts.
        #[arg(long, requires = "filename")]
        hosts_file: Option<PathBuf>,
    },
    /// Run `h3-ingress check https://HOST:PORT/ --resolve HOST:PORT:NODE-IP` against a node
    /// that serves HOST over HTTP/3.
    Check {
        host: String,
        /// Node to send the QUIC packets to (IP, IP:PORT or a name); found from the listener's
        /// data plane pods when absent. Without a port, the listener's port.
        #[arg(long)]
        node: Option<String>,
        /// Print the command instead of running it.
        #[arg(long)]
        dry_run: bool,
        /// Further arguments passed to `h3-ingress check` (after `--`).
        #[arg(last = true)]
        extra: Vec<OsString>,
    },
}

/// Entry point when invoked as `kubectl-h3_ingress`.
pub fn main() -> ExitCode {
    let cli = PluginCli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: PluginCli) -> Result<ExitCode, PluginError> {
    let (kubeconfig, context) = (cli.kubeconfig.as_deref(), cli.context.as_deref());
    match cli.command {
        PluginCommand::Status {
            listener,
            filename,
            hosts_file,
        } => {
            let (listeners, views) = match filename {
                Some(path) => {
                    let listeners = listeners_from_file(&path, listener.as_deref())?;
                    let views = match hosts_file {
                        Some(f) => views_from_file(&f, &listeners)?,
                        None => Views::new(),
                    };
                    (listeners, views)
                }
                None => {
                    let client = client(kubeconfig, context).await?;
                    let listeners = fetch_listeners(&client, listener.as_deref()).await?;
                    let views = pods::host_views(&client, &listeners).await;
                    (listeners, views)
                }
            };
            print!("{}", render_status(&listeners, &views));
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Check {
            host,
            node,
            dry_run,
            extra,
        } => {
            let target = match node {
                Some(addr) => given_node(kubeconfig, context, &host, &addr).await?,
                None => find_target(&client(kubeconfig, context).await?, &host).await?,
            };
            let args = check_args(&host, target.address, &extra);
            let exe = std::env::current_exe().map_err(PluginError::CurrentExe)?;
            eprintln!("checking {host} at {} ({})", target.address, target.via);
            if dry_run {
                let shown: Vec<String> = args
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                println!("{MAIN_EXECUTABLE} {}", shown.join(" "));
                return Ok(ExitCode::SUCCESS);
            }
            Err(exec_check(&exe, &args))
        }
    }
}

/// A saved `/hosts` document, as the view of every listener given.
fn views_from_file(path: &Path, listeners: &[Http3Listener]) -> Result<Views, PluginError> {
    let read = |e| PluginError::Read {
        path: path.to_path_buf(),
        source: e,
    };
    let text = std::fs::read_to_string(path).map_err(read)?;
    let hosts: Vec<HostReport> = serde_json::from_str(&text)
        .map_err(|e| read(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    Ok(listeners
        .iter()
        .map(|l| {
            (
                l.metadata.name.clone().unwrap_or_default(),
                Ok(hosts.clone()),
            )
        })
        .collect())
}

/// The listeners of a file, or only the one named.
fn listeners_from_file(path: &Path, name: Option<&str>) -> Result<Vec<Http3Listener>, PluginError> {
    let mut all = read_listeners(path)?;
    if let Some(name) = name {
        all.retain(|l| l.metadata.name.as_deref() == Some(name));
        if all.is_empty() {
            return Err(PluginError::ListenerNotFound(name.to_string()));
        }
    }
    for note in all.iter().filter_map(unknown_fields_note) {
        eprintln!("{note}");
    }
    Ok(all)
}

/// The node given with `--node`; without a port there, the port of the listener serving `host`
/// when the cluster answers, else 443.
async fn given_node(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    host: &str,
    addr: &str,
) -> Result<CheckTarget, PluginError> {
    let port = if has_port(addr) {
        None
    } else {
        let found = match client(kubeconfig, context).await {
            Ok(c) => fetch_listeners(&c, None).await,
            Err(e) => Err(e),
        };
        match found {
            Ok(ls) => listener_for_host(&ls, host, &Views::new()).map(|l| l.spec.port),
            Err(e) => {
                eprintln!("warning: using port 443 ({e})");
                None
            }
        }
    };
    let address = node_address(addr, port.unwrap_or(443));
    Ok(CheckTarget {
        address: resolve_node(&address).await?,
        via: "--node".to_string(),
    })
}

/// Replaces this process with `h3-ingress check ...`, so its output and exit code are the
/// check's own. Returns only on failure.
fn exec_check(exe: &Path, args: &[OsString]) -> PluginError {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .arg0(MAIN_EXECUTABLE)
        .args(args)
        .exec();
    PluginError::Exec {
        exe: exe.to_path_buf(),
        source: err,
    }
}

async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, PluginError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?
        }
        None => Config::from_kubeconfig(&options).await?,
    };
    Client::try_from(config).map_err(PluginError::Client)
}

/// One listener by name, or all of them sorted by name.
pub async fn fetch_listeners(
    client: &Client,
    name: Option<&str>,
) -> Result<Vec<Http3Listener>, PluginError> {
    let api: Api<Http3Listener> = Api::all(client.clone());
    let listeners = match name {
        Some(name) => match api.get_opt(name).await.map_err(PluginError::Api)? {
            Some(l) => vec![l],
            None => return Err(PluginError::ListenerNotFound(name.to_string())),
        },
        None => {
            let mut items = api
                .list(&ListParams::default())
                .await
                .map_err(PluginError::Api)?
                .items;
            items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            items
        }
    };
    for l in &listeners {
        if let Some(note) = unknown_fields_note(l) {
            eprintln!("{note}");
        }
    }
    Ok(listeners)
}

/// The plugin's line for a listener with fields it does not know (a CRD newer than this
/// binary); it runs once per invocation, so each listener's line comes once.
pub fn unknown_fields_note(l: &Http3Listener) -> Option<String> {
    let fields = l.unknown_fields();
    (!fields.is_empty()).then(|| {
        format!(
            "note: Http3Listener {} has fields this kubectl-h3_ingress ({}) does not know, \
             shown as if absent: {}; the served CRD is newer, upgrade the plugin",
            l.metadata.name.as_deref().unwrap_or("?"),
            crate::version::BUILD,
            fields.join(", ")
        )
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckTarget {
    /// The node's IP and the listener's UDP port.
    pub address: SocketAddr,
    /// Where the address came from, for the user.
    pub via: String,
}

/// The listener serving `host`, then a ready data plane pod of it and that pod's node IP.
pub async fn find_target(client: &Client, host: &str) -> Result<CheckTarget, PluginError> {
    let listeners = fetch_listeners(client, None).await?;
    let views = if listener_for_host(&listeners, host, &Views::new()).is_some() {
        Views::new()
    } else {
        pods::host_views(client, &listeners).await
    };
    let listener = listener_for_host(&listeners, host, &views)
        .ok_or_else(|| PluginError::HostNotServed(host.to_string()))?;
    let name = listener.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::all(client.clone());
    let pods = pods
        .list(&ListParams::default().labels(&label_selector(&name)))
        .await
        .map_err(PluginError::Api)?
        .items;
    let (pod, ip, node) = pick_node(&pods).ok_or_else(|| PluginError::NoReadyNode(name.clone()))?;
    Ok(CheckTarget {
        address: resolve_node(&node_address(&ip, listener.spec.port)).await?,
        via: format!("listener {name}, pod {pod} on node {node}"),
    })
}

/// Reads listeners from a file (or `-`): one object, a `List`, or a multi-document stream.
pub fn read_listeners(path: &Path) -> Result<Vec<Http3Listener>, PluginError> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(|source| PluginError::Read {
            path: path.to_path_buf(),
            source,
        })?
    } else {
        std::fs::read_to_string(path).map_err(|source| PluginError::Read {
            path: path.to_path_buf(),
            source,
        })?
    };
    parse_listeners(&text).map_err(|source| PluginError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Document {
    List { items: Vec<Http3Listener> },
    One(Box<Http3Listener>),
}

pub fn parse_listeners(text: &str) -> Result<Vec<Http3Listener>, serde_norway::Error> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = serde_norway::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        match serde_norway::from_value::<Document>(value)? {
            Document::List { items } => out.extend(items),
            Document::One(l) => out.push(*l),
        }
    }
    Ok(out)
}

/// What each listener's pods serve (`/hosts`), by listener name, or why it could not be read.
pub type Views = BTreeMap<String, Result<Vec<HostReport>, String>>;

/// The listener that serves `host`: the only one when there is one; else one whose pods serve
/// it, then any that wants it (its spec, or its status's hosts not served), so `check` can
/// still show why it fails.
pub fn listener_for_host<'a>(
    listeners: &'a [Http3Listener],
    host: &str,
    views: &Views,
) -> Option<&'a Http3Listener> {
    if let [only] = listeners {
        return Some(only);
    }
    let served = |l: &Http3Listener| {
        let name = l.metadata.name.clone().unwrap_or_default();
        views
            .get(&name)
            .and_then(|v| v.as_ref().ok())
            .is_some_and(|hosts| {
                hosts
                    .iter()
                    .any(|h| h.state == host_states::SERVING && host_matches(&h.name, host))
            })
    };
    let wanted = |l: &Http3Listener| {
        let listed = l
            .status
            .as_ref()
            .map(|s| s.hosts.as_slice())
            .unwrap_or_default();
        listed.iter().any(|h| host_matches(&h.name, host))
            || l.spec.hosts.iter().any(|h| host_matches(&h.name, host))
    };
    listeners
        .iter()
        .find(|l| served(l))
        .or_else(|| listeners.iter().find(|l| wanted(l)))
}

/// (pod namespace/name, host IP, node name) of the first ready, running pod with a host IP,
/// in name order so repeated runs pick the same node.
pub fn pick_node(pods: &[Pod]) -> Option<(String, String, String)> {
    let mut ready: Vec<(String, String, String)> = pods
        .iter()
        .filter(|p| {
            let status = p.status.as_ref();
            let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
            let is_ready = status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            running && is_ready && p.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|p| {
            let ip = p.status.as_ref()?.host_ip.clone()?;
            let name = format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            );
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            Some((name, ip, node))
        })
        .collect();
    ready.sort();
    ready.into_iter().next()
}

fn has_port(addr: &str) -> bool {
    addr.parse::<std::net::SocketAddr>().is_ok()
        || addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
}

/// `addr` with `port` appended when it has none; bare IPv6 addresses get brackets.
pub fn node_address(addr: &str, port: u16) -> String {
    if has_port(addr) {
        return addr.to_string();
    }
    let bare = addr.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{bare}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

/// The node as an IP address and port (a name is resolved here: `check --resolve` takes an IP).
pub async fn resolve_node(address: &str) -> Result<SocketAddr, PluginError> {
    if let Ok(a) = address.parse::<SocketAddr>() {
        return Ok(a);
    }
    tokio::net::lookup_host(address)
        .await
        .map_err(|e| PluginError::Resolve(address.to_string(), e))?
        .next()
        .ok_or_else(|| {
            PluginError::Resolve(address.to_string(), std::io::ErrorKind::NotFound.into())
        })
}

/// Arguments of the `h3-ingress check` run the plugin delegates to: the host's URL on the
/// listener's port, with the connection pinned to the node like curl's `--resolve`.
pub fn check_args(host: &str, node: SocketAddr, extra: &[OsString]) -> Vec<OsString> {
    let port = node.port();
    let ip = match node.ip() {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    };
    let mut args: Vec<OsString> = vec![
        "check".into(),
        format!("https://{host}:{port}/").into(),
        "--resolve".into(),
        format!("{host}:{port}:{ip}").into(),
    ];
    args.extend(extra.iter().cloned());
    args
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "unknown",
    }
}

/// Columns padded to their widest cell, three spaces apart, like kubectl's tables.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}   ", w = widths[i]);
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// The human view of listener statuses: one block per listener with its conditions, hosts by
/// state and reason, and a per-host table (state, reason, Alt-Svc, h3 requests, Secret, and
/// the Ingress, HTTPRoute or Gateway the host came from) from its pods' `/hosts` and its
/// status.
pub fn render_status(listeners: &[Http3Listener], views: &Views) -> String {
    if listeners.is_empty() {
        return "No Http3Listener found. Create one (deploy/examples/) and annotate an Ingress with h3-ingress.dev/enabled=true.\n".to_string();
    }
    let blocks: Vec<String> = listeners
        .iter()
        .map(|l| {
            let name = l.metadata.name.clone().unwrap_or_default();
            render_listener(l, views.get(&name))
        })
        .collect();
    blocks.join("\n")
}

fn render_listener(l: &Http3Listener, view: Option<&Result<Vec<HostReport>, String>>) -> String {
    let status = l.status.clone().unwrap_or_default();
    let mut out = summary_line(l, &status);
    out.push_str(&conditions_block(l, &status));
    if !status.host_counts.is_empty() {
        let counts: Vec<String> = status
            .host_counts
            .iter()
            .map(|c| format!("{} {}/{}", c.count, c.state, c.reason))
            .collect();
        let _ = writeln!(out, "  Hosts: {}", counts.join(", "));
    }
    let rows = host_rows(&status, view);
    if rows.is_empty() {
        out.push_str("  No hosts: annotate an Ingress of this listener's class, or an HTTPRoute attached to a Gateway of its gatewayClassName, with h3-ingress.dev/enabled=true.\n");
        return out;
    }
    if let Some(Err(why)) = view {
        let _ = writeln!(
            out,
            "  Served hosts not shown: the data plane's /hosts could not be read ({why})."
        );
    }
    if status.hosts_omitted > 0 {
        let _ = writeln!(
            out,
            "  {} more hosts not served are not listed in the status.",
            status.hosts_omitted
        );
    }
    out.push_str(&hosts_block(&rows, &Roots::of(&status)));
    out.push_str(&advertise_block(&status));
    out.push_str(&dns_records_block(&rows, l.spec.port));
    out
}

/// What `spec.advertise` keeps published, and where (nothing when it is off).
fn advertise_block(status: &Http3ListenerStatus) -> String {
    let mut out = String::new();
    let Some(a) = &status.advertise else {
        return out;
    };
    if let Some(d) = &a.dns {
        let _ = writeln!(
            out,
            "  Advertised in DNS: {} HTTPS records in {} on {}",
            d.published,
            d.zones.join(", "),
            d.server
        );
    }
    if let Some(t) = &a.alt_svc {
        let _ = writeln!(
            out,
            "  Advertised by Traefik (Alt-Svc): {} Ingresses send h3, {} send clear",
            t.advertised, t.withdrawn
        );
        for n in &t.needs_reference {
            let _ = writeln!(out, "    add to router.middlewares of {n}");
        }
        if !t.unmanaged.is_empty() {
            let _ = writeln!(
                out,
                "    not managed (recipe per host): {}",
                t.unmanaged.join(", ")
            );
        }
        if !t.error.is_empty() {
            let _ = writeln!(out, "    last error: {}", t.error);
        }
    }
    out
}

/// Each served host's certificate verdict, from the listener's `PublicRoots` condition (the
/// pods do not know it: the operator judges each Secret and keeps the verdict out of the
/// mirrors). The condition names at most five hosts whose chain does not reach a public web
/// root and counts the rest, so a host it does not name chains to a public root when it names
/// them all, and is unknown otherwise.
struct Roots<'a> {
    named: Vec<&'a str>,
    /// The PUBLIC-ROOT cell of a served host the condition does not name.
    others: &'static str,
}

impl<'a> Roots<'a> {
    fn of(status: &'a Http3ListenerStatus) -> Self {
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::PUBLIC_ROOTS);
        let Some(c) = c else {
            return Roots {
                named: Vec::new(),
                others: "-",
            };
        };
        let (named, more) = private_roots_named(c);
        let others = match c.status.as_str() {
            _ if incomplete_chains_counted(c) => "?",
            "True" => "yes",
            "False" if more => "?",
            "False" => "yes",
            _ => "-",
        };
        Roots { named, others }
    }

    /// `yes`, `NO`, `?` (one of the hosts the condition counts but does not name, or not)
    /// or `-` (not served, or no verdict).
    fn cell(&self, h: &HostReport) -> &'static str {
        if h.state != host_states::SERVING {
            return "-";
        }
        if self.named.contains(&h.name.as_str()) {
            "NO"
        } else {
            self.others
        }
    }
}

/// Every host a pod serves, then every host the status lists as not served (the status is
/// the operator's word on those), in name order.
fn host_rows(
    status: &Http3ListenerStatus,
    view: Option<&Result<Vec<HostReport>, String>>,
) -> Vec<HostReport> {
    let mut rows: BTreeMap<(String, String), HostReport> = BTreeMap::new();
    if let Some(Ok(hosts)) = view {
        for h in hosts.iter().filter(|h| h.state == host_states::SERVING) {
            rows.insert((h.name.clone(), source_of(h)), h.clone());
        }
    }
    for h in &status.hosts {
        let r = HostReport {
            name: h.name.clone(),
            state: h.state.clone(),
            reason: h.reason.clone(),
            message: h.message.clone(),
            origin: h.origin.clone(),
            secret: h.secret.clone(),
            ..Default::default()
        };
        rows.insert((r.name.clone(), source_of(&r)), r);
    }
    rows.into_values().collect()
}

/// Where a host came from, as people read it: what the pod's report says (the mirror's
/// `hosts.json` carries it as text), else from the report's fields (the listener's status).
fn source_of(h: &HostReport) -> String {
    if !h.source.is_empty() {
        return h.source.clone();
    }
    h.origin.text()
}

/// `Listener NAME: UDP port, pods ready, hosts serving[, UDP drops and buffers]`.
fn summary_line(l: &Http3Listener, status: &Http3ListenerStatus) -> String {
    let name = l.metadata.name.as_deref().unwrap_or("?");
    let nodes = status
        .nodes
        .as_ref()
        .map(|n| format!("{}/{}", n.ready, n.desired))
        .unwrap_or_else(|| "-".into());
    let hosts = status.hosts_summary.as_deref().unwrap_or("-");
    let mut out = format!(
        "Listener {name}: UDP port {}, pods ready {nodes}, hosts serving {hosts}",
        l.spec.port
    );
    if let Some(udp) = &status.udp {
        let _ = write!(out, ", UDP drops {}", udp.drops);
        if let Some(min) = udp.min_receive_buffer_bytes {
            let _ = write!(out, ", smallest receive buffer {min} B");
        }
        if udp.clamped {
            out.push_str(" (CLAMPED by net.core.rmem_max)");
        }
    }
    out.push('\n');
    out
}

/// One line of `Type=Status (Reason)`, then the message of every condition in a bad state.
fn conditions_block(l: &Http3Listener, status: &Http3ListenerStatus) -> String {
    let stale = match (status.observed_generation, l.metadata.generation) {
        (Some(seen), Some(generation)) if seen < generation => {
            format!(" (status is for generation {seen}, spec is at {generation})")
        }
        _ => String::new(),
    };
    if status.conditions.is_empty() {
        return format!("  No conditions yet: is the operator running?{stale}\n");
    }
    let conds: Vec<String> = status
        .conditions
        .iter()
        .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
        .collect();
    let mut out = format!("  {}{stale}\n", conds.join("  "));
    for c in &status.conditions {
        let bad = if c.type_ == conditions::DEGRADED {
            c.status == "True"
        } else {
            c.status != "True"
        };
        if bad && !c.message.is_empty() {
            let _ = writeln!(out, "  {}: {}", c.type_, c.message);
        }
    }
    out
}

/// The per-host table, then the message of every host that has one, then what Chrome does
/// with the hosts whose certificate is not from a public web root (a few by name; the
/// PUBLIC-ROOT column marks them all).
fn hosts_block(rows: &[HostReport], roots: &Roots) -> String {
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|h| {
            let served = h.state == host_states::SERVING;
            let count = |n: u64| {
                if served {
                    n.to_string()
                } else {
                    "-".to_string()
                }
            };
            vec![
                h.name.clone(),
                h.state.clone(),
                h.reason.clone(),
                yes_no(h.alt_svc_advertised).to_string(),
                roots.cell(h).to_string(),
                count(h.requests),
                count(h.requests_last5m),
                h.secret.clone().unwrap_or_else(|| "-".into()),
                source_of(h),
            ]
        })
        .collect();
    let header = [
        "HOST",
        "STATE",
        "REASON",
        "ALT-SVC",
        "PUBLIC-ROOT",
        "H3-REQUESTS",
        "LAST-5M",
        "SECRET",
        "SOURCE",
    ];
    let mut out = String::new();
    for line in table(&header, &table_rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
    for h in rows {
        let msg = if h.message.is_empty() {
            &h.alt_svc_message
        } else {
            &h.message
        };
        if !msg.is_empty() {
            let _ = writeln!(out, "  {}: {msg}", h.name);
        }
    }
    let held = rows
        .iter()
        .filter(|h| HELD_BACK.contains(&h.reason.as_str()))
        .count();
    if held > 0 {
        let _ = writeln!(
            out,
            "  {held} hosts held back on purpose: the TCP ingress's policy for them (named above) \
             cannot be kept over HTTP/3 as the listener is set up; they stay on TCP"
        );
    }
    let private: Vec<&str> = rows
        .iter()
        .filter(|h| roots.cell(h) == "NO")
        .map(|h| h.name.as_str())
        .collect();
    // Only hosts the condition names are NO, and it names at most five: bounded.
    for name in private {
        let _ = writeln!(out, "  {name}: {CHROME_NOTE}");
    }
    if rows.iter().any(|h| roots.cell(h) == "?") {
        let _ = writeln!(
            out,
            "  PUBLIC-ROOT ?: the PublicRoots condition names a few hosts that are not from a \
             public web root and counts the rest, or counts Secrets whose chain is incomplete; \
             hosts marked ? may be among them (its message says which)"
        );
    }
    out
}

/// The DNS HTTPS records of the served hosts, if any.
fn dns_records_block(rows: &[HostReport], port: u16) -> String {
    let records: Vec<String> = rows
        .iter()
        .filter(|h| h.state == host_states::SERVING)
        .map(|h| dns_https_record(&h.name, port))
        .collect();
    if records.is_empty() {
        return String::new();
    }
    let mut out = "  DNS HTTPS records to publish (first visits can use HTTP/3):\n".to_string();
    for r in records {
        let _ = writeln!(out, "    {r}");
    }
    out
}

#[cfg(test)]
mod advertise_tests {
    use super::*;
    use crate::api::{AdvertiseStatus, AltSvcAdvertiseStatus};

    #[test]
    fn the_alt_svc_block_names_what_the_user_must_add() {
        let status = Http3ListenerStatus {
            advertise: Some(AdvertiseStatus {
                dns: None,
                alt_svc: Some(AltSvcAdvertiseStatus {
                    advertised: 2,
                    withdrawn: 1,
                    needs_reference: vec![
                        "shop/web: shop-h3-ingress-alt-svc-web@kubernetescrd".into()
                    ],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let b = advertise_block(&status);
        assert!(b.contains("2 Ingresses send h3, 1 send clear"), "{b}");
        assert!(
            b.contains(
                "add to router.middlewares of shop/web: shop-h3-ingress-alt-svc-web@kubernetescrd"
            ),
            "{b}"
        );
        assert_eq!(advertise_block(&Http3ListenerStatus::default()), "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use std::pin::pin;

    const LISTENER: &str = r#"
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata:
  name: nginx
  generation: 3
spec:
  port: 8443
  upstream:
    address: ingress-nginx-controller.ingress-nginx.svc:443
  hosts:
    - name: static.example.com
      secretRef: {namespace: web, name: static-tls}
status:
  observedGeneration: 3
  hostsSummary: 1/3
  conditions:
    - type: Ready
      status: "False"
      reason: SomeHostsNotServing
      message: 2 of 3 hosts are not served
      lastTransitionTime: "2026-11-30T00:00:00Z"
    - type: BuffersApplied
      status: "False"
      reason: Clamped
      message: net.core.rmem_max 212992 is below the requested 4194304
      lastTransitionTime: "2026-11-30T00:00:00Z"
    - type: Degraded
      status: "False"
      reason: AsExpected
      message: ""
      lastTransitionTime: "2026-11-30T00:00:00Z"
    - type: PublicRoots
      status: "False"
      reason: PrivateRoots
      message: "1 of 2 hosts has a certificate that does not chain to a public web root: Chrome will not use HTTP/3 for it (Firefox and Safari may); e.g. *.apps.example.com"
      lastTransitionTime: "2026-11-30T00:00:00Z"
  hostCounts:
    - {state: Serving, reason: Serving, count: 2}
    - {state: NotServing, reason: SecretNotFound, count: 1}
  hosts:
    - name: api.example.com
      ingress: web/shop
      secret: web/api-tls
      state: NotServing
      reason: SecretNotFound
      message: Secret web/api-tls not found
  nodes: {desired: 3, ready: 2, summary: 2/3}
  udp: {drops: 17, minReceiveBufferBytes: 425984, clamped: true}
"#;

    /// The PUBLIC-ROOT cell of `host`'s row in `kubectl h3-ingress status` output.
    fn public_root_cell(out: &str, host: &str) -> String {
        let line = out
            .lines()
            .find(|x| x.starts_with(&format!("  {host} ")))
            .unwrap();
        line.split_whitespace().nth(4).unwrap().to_string()
    }

    fn listener() -> Http3Listener {
        parse_listeners(LISTENER).unwrap().remove(0)
    }

    /// What the listener's pods serve (their `/hosts`).
    fn views() -> Views {
        let served = |name: &str, secret: &str, alt: Option<bool>, requests: u64| HostReport {
            name: name.into(),
            state: host_states::SERVING.into(),
            reason: "Serving".into(),
            secret: Some(secret.into()),
            alt_svc_advertised: alt,
            requests,
            requests_last5m: requests / 22,
            ..Default::default()
        };
        // As a pod's /hosts says it: where each host came from is the text of its mirror.
        let shop = HostReport {
            source: "Ingress web/shop".into(),
            ..served("shop.example.com", "web/shop-tls", Some(true), 1234)
        };
        let apps = HostReport {
            source: "HTTPRoute apps/web, Gateway infra/gw listener https".into(),
            ..served("*.apps.example.com", "infra/apps-tls", Some(false), 0)
        };
        [("nginx".to_string(), Ok(vec![shop, apps]))]
            .into_iter()
            .collect()
    }

    #[test]
    fn listeners_a_newer_crd_wrote_are_read_with_a_note_naming_the_new_fields() {
        let newer = LISTENER
            .replace("  port: 8443\n", "  port: 8443\n  futureTop: 1\n")
            .replace(
                "    address: ingress-nginx-controller.ingress-nginx.svc:443\n",
                "    address: ingress-nginx-controller.ingress-nginx.svc:443\n    futureSetting: x\n",
            );
        let ls = parse_listeners(&newer).unwrap();
        assert_eq!(ls.len(), 1);
        assert_eq!(ls[0].spec.port, 8443);
        let note = unknown_fields_note(&ls[0]).expect("a note");
        assert!(
            note.contains("Http3Listener nginx")
                && note.ends_with(
                    "spec.futureTop, spec.upstream.futureSetting; the served CRD is newer, upgrade the plugin"
                ),
            "{note}"
        );
        let known = parse_listeners(LISTENER).unwrap();
        assert_eq!(unknown_fields_note(&known[0]), None);
        assert!(
            render_status(&ls, &Views::new()) == render_status(&known, &Views::new()),
            "the same table"
        );
    }

    #[test]
    fn argv0_dispatch() {
        assert!(invoked_as_plugin(OsStr::new("kubectl-h3_ingress")));
        assert!(invoked_as_plugin(OsStr::new(
            "/usr/local/bin/kubectl-h3_ingress"
        )));
        assert!(!invoked_as_plugin(OsStr::new("/usr/local/bin/h3-ingress")));
        assert!(!invoked_as_plugin(OsStr::new("kubectl-h3_ingress-old")));
    }

    #[test]
    fn status_table_shows_every_host_with_reason_and_requests() {
        let out = render_status(&[listener()], &views());
        let expected = "\
Listener nginx: UDP port 8443, pods ready 2/3, hosts serving 1/3, UDP drops 17, smallest receive buffer 425984 B (CLAMPED by net.core.rmem_max)
  Ready=False (SomeHostsNotServing)  BuffersApplied=False (Clamped)  Degraded=False (AsExpected)  PublicRoots=False (PrivateRoots)
  Ready: 2 of 3 hosts are not served
  BuffersApplied: net.core.rmem_max 212992 is below the requested 4194304
  PublicRoots: 1 of 2 hosts has a certificate that does not chain to a public web root: Chrome will not use HTTP/3 for it (Firefox and Safari may); e.g. *.apps.example.com
  Hosts: 2 Serving/Serving, 1 NotServing/SecretNotFound
  HOST                 STATE        REASON           ALT-SVC   PUBLIC-ROOT   H3-REQUESTS   LAST-5M   SECRET           SOURCE
  *.apps.example.com   Serving      Serving          NO        NO            0             0         infra/apps-tls   HTTPRoute apps/web, Gateway infra/gw listener https
  api.example.com      NotServing   SecretNotFound   unknown   -             -             -         web/api-tls      Ingress web/shop
  shop.example.com     Serving      Serving          yes       yes           1234          56        web/shop-tls     Ingress web/shop
  api.example.com: Secret web/api-tls not found
  *.apps.example.com: Chrome will not use HTTP/3 (certificate not from a public web root; Firefox and Safari may)
  DNS HTTPS records to publish (first visits can use HTTP/3):
    *.apps.example.com. 3600 IN HTTPS 1 . alpn=\"h3,h2\" port=8443
    shop.example.com. 3600 IN HTTPS 1 . alpn=\"h3,h2\" port=8443
";
        assert_eq!(out, expected, "\n{out}");
        // Without the pods' view: the hosts the status lists, and why the rest are missing.
        let unreadable: Views = [(
            "nginx".to_string(),
            Err("no ready data plane pod".to_string()),
        )]
        .into_iter()
        .collect();
        let out = render_status(&[listener()], &unreadable);
        assert!(out.contains("Served hosts not shown: the data plane's /hosts could not be read (no ready data plane pod)."), "{out}");
        assert!(!out.contains("shop.example.com "), "{out}");
    }

    #[test]
    fn held_back_hosts_show_their_reason_and_what_holds_them_back() {
        let mut l = listener();
        let status = l.status.as_mut().unwrap();
        status.hosts.push(crate::api::HostStatus {
            name: "admin.example.com".into(),
            origin: crate::api::HostOrigin::ingress("web/admin"),
            secret: Some("web/admin-tls".into()),
            state: host_states::NOT_SERVING.into(),
            reason: reasons::CLIENT_ADDRESS_POLICY.into(),
            message: "nginx.ingress.kubernetes.io/whitelist-source-range: \"10.0.0.0/8\" on \
                      Ingress web/admin: the TCP ingress would judge the node's address"
                .into(),
            ..Default::default()
        });
        status
            .conditions
            .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: conditions::CLIENT_ADDRESS.into(),
                status: "False".into(),
                reason: reasons::UNTRUSTED_FORWARDED_HEADERS.into(),
                message: "the TCP ingress sees the node's address for HTTP/3 requests".into(),
                observed_generation: None,
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            });
        let out = render_status(&[l], &views());
        let row = out
            .lines()
            .find(|x| x.starts_with("  admin.example.com "))
            .unwrap();
        assert!(row.contains("NotServing   ClientAddressPolicy"), "{row}");
        assert!(row.ends_with("Ingress web/admin"), "{row}");
        assert!(out.contains(
            "  admin.example.com: nginx.ingress.kubernetes.io/whitelist-source-range: \"10.0.0.0/8\""
        ));
        assert!(
            out.contains("  ClientAddress: the TCP ingress sees the node's address"),
            "{out}"
        );
        assert!(out.contains("  1 hosts held back on purpose"), "{out}");
    }

    #[test]
    fn public_roots_at_ten_thousand_hosts_is_a_column_and_a_few_lines() {
        let mut l = listener();
        let status = l.status.as_mut().unwrap();
        let c = status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == conditions::PUBLIC_ROOTS)
            .unwrap();
        c.message = "1000 of 10000 hosts have certificates that do not chain to a public web \
                     root: Chrome will not use HTTP/3 for them (Firefox and Safari may); e.g. \
                     h00000.example.com, h00010.example.com, h00020.example.com, \
                     h00030.example.com, h00040.example.com and 995 more"
            .into();
        status.hosts.clear();
        let served: Vec<HostReport> = (0..10_000)
            .map(|i| HostReport {
                name: format!("h{i:05}.example.com"),
                state: host_states::SERVING.into(),
                reason: "Serving".into(),
                ..Default::default()
            })
            .collect();
        let views: Views = [("nginx".to_string(), Ok(served))].into_iter().collect();
        let out = render_status(&[l], &views);
        let cell = |host: &str| public_root_cell(&out, host);
        assert_eq!(cell("h00010.example.com"), "NO");
        assert_eq!(cell("h00011.example.com"), "?");
        let noted = out.lines().filter(|x| x.ends_with(CHROME_NOTE)).count();
        assert_eq!(noted, 5, "the named hosts only");
        assert_eq!(out.matches("PUBLIC-ROOT ?:").count(), 1);
        assert_eq!(out.lines().count(), 10_000 + 10_000 + 14);
        let notes: Vec<&str> = out
            .lines()
            .filter(|x| x.contains("public web root") && !x.starts_with("    "))
            .collect();
        println!("{}", notes.join("\n"));
    }

    /// A Secret without its intermediate leaves the verdict unknown: `?`, never `NO`.
    #[test]
    fn an_incomplete_chain_is_a_question_mark_not_a_no() {
        let mut l = listener();
        let status = l.status.as_mut().unwrap();
        let c = status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == conditions::PUBLIC_ROOTS)
            .unwrap();
        c.status = "Unknown".into();
        c.reason = crate::api::reasons::INCOMPLETE_CHAIN.into();
        c.message = "the Secrets of 1 of 2 hosts hold an incomplete chain (the leaf without the \
                     intermediate that issued it), ...; e.g. shop.example.com"
            .into();
        let out = render_status(&[l], &views());
        assert_eq!(public_root_cell(&out, "shop.example.com"), "?");
        assert!(!out.contains(CHROME_NOTE), "{out}");
        assert_eq!(out.matches("PUBLIC-ROOT ?:").count(), 1);
    }

    #[test]
    fn status_without_status_or_listeners_says_what_to_do() {
        assert!(render_status(&[], &Views::new()).starts_with("No Http3Listener found"));
        let mut l = listener();
        l.status = None;
        l.metadata.generation = Some(1);
        let out = render_status(&[l], &Views::new());
        assert!(
            out.contains("No conditions yet: is the operator running?"),
            "{out}"
        );
        assert!(out.contains("No hosts: annotate an Ingress"), "{out}");
    }

    #[test]
    fn stale_status_is_flagged() {
        let mut l = listener();
        l.metadata.generation = Some(4);
        assert!(render_status(&[l], &Views::new())
            .contains("(status is for generation 3, spec is at 4)"));
    }

    #[test]
    fn parses_single_list_and_stream() {
        assert_eq!(parse_listeners(LISTENER).unwrap().len(), 1);
        let list = format!(
            "apiVersion: v1\nkind: List\nitems:\n{}",
            LISTENER
                .trim_start()
                .lines()
                .enumerate()
                .map(|(i, l)| if i == 0 {
                    format!("- {l}\n")
                } else {
                    format!("  {l}\n")
                })
                .collect::<String>()
        );
        assert_eq!(parse_listeners(&list).unwrap().len(), 1);
        let stream = format!("{LISTENER}\n---\n{LISTENER}\n---\n");
        assert_eq!(parse_listeners(&stream).unwrap().len(), 2);
        assert!(parse_listeners("kind: Http3Listener\nspec: 7\n").is_err());
    }

    #[test]
    fn host_lookup_prefers_serving_and_understands_wildcards() {
        let mut other = listener();
        other.metadata.name = Some("other".into());
        other.spec.hosts.clear();
        other.status = None;
        let ls = vec![other, listener()];
        let v = views();
        let name = |l: Option<&Http3Listener>| l.and_then(|l| l.metadata.name.clone());
        assert_eq!(
            name(listener_for_host(&ls, "shop.example.com", &v)).as_deref(),
            Some("nginx")
        );
        assert!(listener_for_host(&ls, "x.apps.example.com", &v).is_some());
        assert!(listener_for_host(&ls, "a.b.apps.example.com", &v).is_none());
        assert!(listener_for_host(&ls, "apps.example.com", &v).is_none());
        // Wanted but not serving still finds the listener, so check can show the failure.
        assert!(listener_for_host(&ls, "api.example.com", &Views::new()).is_some());
        // Only in spec.hosts.
        assert!(listener_for_host(&ls, "static.example.com", &Views::new()).is_some());
        assert!(listener_for_host(&ls, "nope.example.com", &v).is_none());
        // With one listener there is nothing to choose.
        assert!(listener_for_host(&ls[1..], "nope.example.com", &Views::new()).is_some());
        assert!(host_matches("SHOP.example.com", "shop.EXAMPLE.com"));
    }

    fn pod(name: &str, node: &str, ip: Option<&str>, ready: bool, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "h3-ingress"},
            "spec": {"nodeName": node, "containers": []},
            "status": {
                "phase": phase,
                "hostIP": ip,
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn picks_a_ready_running_pod_with_a_host_ip() {
        let pods = vec![
            pod("dp-c", "node-c", Some("10.0.0.3"), false, "Running"),
            pod("dp-b", "node-b", Some("10.0.0.2"), true, "Running"),
            pod("dp-a", "node-a", None, true, "Running"),
            pod("dp-0", "node-0", Some("10.0.0.9"), true, "Pending"),
            pod("dp-d", "node-d", Some("10.0.0.4"), true, "Running"),
        ];
        assert_eq!(
            pick_node(&pods),
            Some((
                "h3-ingress/dp-b".to_string(),
                "10.0.0.2".to_string(),
                "node-b".to_string()
            ))
        );
        assert_eq!(pick_node(&pods[..1]), None);
    }

    #[test]
    fn reads_hosts_from_the_alt_svc_prober_while_it_is_ready() {
        let pods = vec![
            pod("dp-b", "node-b", Some("10.0.0.2"), true, "Running"),
            pod("dp-d", "node-d", Some("10.0.0.4"), true, "Running"),
            pod("dp-e", "node-e", Some("10.0.0.5"), false, "Running"),
        ];
        let with_prober = |p: Option<&str>| {
            let mut l = listener();
            l.status.get_or_insert_with(Default::default).alt_svc_prober = p.map(str::to_string);
            l
        };
        let chosen = |p| pods::view_pod(&with_prober(p), &pods).map(|(name, _, _)| name);
        assert_eq!(chosen(Some("dp-d")).as_deref(), Some("h3-ingress/dp-d"));
        assert_eq!(
            chosen(Some("dp-e")).as_deref(),
            Some("h3-ingress/dp-b"),
            "not ready"
        );
        assert_eq!(chosen(None).as_deref(), Some("h3-ingress/dp-b"));
    }

    #[test]
    fn node_addresses() {
        assert_eq!(node_address("10.0.0.2", 443), "10.0.0.2:443");
        assert_eq!(node_address("10.0.0.2:8443", 443), "10.0.0.2:8443");
        assert_eq!(node_address("fd00::2", 443), "[fd00::2]:443");
        assert_eq!(node_address("[fd00::2]", 8443), "[fd00::2]:8443");
        assert_eq!(node_address("[fd00::2]:9443", 443), "[fd00::2]:9443");
        assert_eq!(node_address("node-1.example", 443), "node-1.example:443");
        assert_eq!(
            node_address("node-1.example:444", 443),
            "node-1.example:444"
        );
    }

    #[test]
    fn check_arguments() {
        let args = check_args(
            "a.example.com",
            "10.0.0.2:8443".parse().unwrap(),
            &["--insecure".into()],
        );
        let want = [
            "check",
            "https://a.example.com:8443/",
            "--resolve",
            "a.example.com:8443:10.0.0.2",
            "--insecure",
        ];
        assert_eq!(args, want.map(OsString::from).to_vec());
        let args = check_args("a.example.com", "[fd00::2]:443".parse().unwrap(), &[]);
        assert_eq!(args[3], "a.example.com:443:[fd00::2]");
    }

    #[test]
    fn cli_parses_kubectl_style_invocations() {
        let cli = PluginCli::try_parse_from([
            "kubectl-h3_ingress",
            "check",
            "a.example.com",
            "--context",
            "prod",
            "--node",
            "10.0.0.2",
            "--",
            "--insecure",
        ])
        .unwrap();
        assert_eq!(cli.context.as_deref(), Some("prod"));
        match cli.command {
            PluginCommand::Check {
                host, node, extra, ..
            } => {
                assert_eq!(host, "a.example.com");
                assert_eq!(node.as_deref(), Some("10.0.0.2"));
                assert_eq!(extra, vec![OsString::from("--insecure")]);
            }
            other => panic!("{other:?}"),
        }
        assert!(PluginCli::try_parse_from(["kubectl-h3_ingress", "statsu"]).is_err());
    }

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    async fn answer(handle: &mut std::pin::Pin<&mut Handle>, path: &str, body: serde_json::Value) {
        let (request, send) = handle.next_request().await.expect("service called");
        assert_eq!(request.method(), http::Method::GET);
        assert_eq!(request.uri().to_string(), path);
        let status = if body.get("kind").and_then(|k| k.as_str()) == Some("Status") {
            404
        } else {
            200
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        );
    }

    #[tokio::test]
    async fn finds_the_node_through_the_api() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let l = serde_json::to_value(listener()).unwrap();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            answer(
                &mut handle,
                "/apis/h3-ingress.dev/v1alpha1/http3listeners?",
                serde_json::json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3ListenerList",
                                   "metadata": {}, "items": [l]}),
            )
            .await;
            let pods = vec![
                pod("dp-b", "node-b", Some("10.0.0.2"), true, "Running"),
                pod("dp-a", "node-a", Some("10.0.0.1"), false, "Running"),
            ];
            answer(
                &mut handle,
                "/api/v1/pods?&labelSelector=app.kubernetes.io%2Fcomponent%3Ddata-plane%2Capp.kubernetes.io%2Finstance%3Dnginx%2Capp.kubernetes.io%2Fname%3Dh3-ingress",
                serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}),
            )
            .await;
        });
        let target = find_target(&client, "shop.example.com").await.unwrap();
        server.await.unwrap();
        assert_eq!(
            target,
            CheckTarget {
                address: "10.0.0.2:8443".parse().unwrap(),
                via: "listener nginx, pod h3-ingress/dp-b on node node-b".into()
            }
        );
    }

    #[tokio::test]
    async fn missing_listener_is_a_clear_error() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            answer(
                &mut handle,
                "/apis/h3-ingress.dev/v1alpha1/http3listeners/nope",
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                   "status": "Failure", "reason": "NotFound", "code": 404,
                                   "message": "http3listeners.h3-ingress.dev \"nope\" not found"}),
            )
            .await;
        });
        let err = fetch_listeners(&client, Some("nope")).await.unwrap_err();
        server.await.unwrap();
        assert_eq!(err.to_string(), "Http3Listener \"nope\" not found");
    }
}
