//! The test cluster's environment: `scripts/cluster.sh up`, then what `scripts/cluster.sh env`
//! prints (KUBECONFIG, PATH, `H3I_*`), exported into this process so that subprocesses (helm,
//! kubectl) see the same cluster, and read into [`Env`].

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cmd::repo;
use crate::{Error, Result};

/// What `scripts/cluster.sh env` says about the running cluster.
#[derive(Clone, Debug)]
pub struct Env {
    /// Node names, which are also their network namespaces' names.
    pub nodes: Vec<String>,
    pub ips: Vec<String>,
    pub ips6: Vec<String>,
    /// `https://IP:PORT` of the API server.
    pub apiserver: String,
    /// The node agent's per-pod files (pid, logs, kubeconfig).
    pub pod_logs: PathBuf,
    /// The binary the pods run (the image's on real nodes), also the kubectl plugin.
    pub binary: PathBuf,
    /// Real kubelets (`H3I_NODE_MODE=real`) rather than the node agent.
    pub real_nodes: bool,
    /// Real nodes: the kubelets' root directories (`NODE/pods/...`).
    pub node_lib: PathBuf,
    pub registry_user: String,
    pub registry_password_file: PathBuf,
    pub kubeconfig: PathBuf,
    /// Whether the cluster was up and healthy before this run's `cluster.sh up`.
    pub was_up: bool,
}

/// Parses `export NAME=VALUE` lines (values as `printf %q`/plain words or single-quoted).
pub fn parse_exports(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("export ") else {
            continue;
        };
        let Some((name, value)) = rest.split_once('=') else {
            continue;
        };
        out.push((name.to_string(), unquote(value)));
    }
    out
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        return inner.replace("'\\''", "'");
    }
    if let Some(inner) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        return inner.to_string();
    }
    v.replace("\\ ", " ")
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn words(name: &str) -> Vec<String> {
    var(name).split_whitespace().map(String::from).collect()
}

impl Env {
    /// `scripts/cluster.sh env`, exported into this process (before any thread reads the
    /// environment: call it from `main` before the runtime starts), then read.
    pub fn load_sync() -> Result<Env> {
        let cluster = repo().join("scripts/cluster.sh");
        let out = std::process::Command::new(&cluster)
            .arg("env")
            .output()
            .map_err(|e| Error::Command(format!("{}: {e}", cluster.display())))?;
        if !out.status.success() {
            return Err(Error::Command(format!(
                "scripts/cluster.sh env: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        for (name, value) in parse_exports(&String::from_utf8_lossy(&out.stdout)) {
            // `export PATH=BIN:$PATH`: the one reference to another variable it prints.
            let value = value.replace("$PATH", &var("PATH"));
            // Single-threaded here: main calls this before it builds the runtime.
            std::env::set_var(name, value);
        }
        Ok(Env::read())
    }

    /// The environment as it is (after `eval "$(scripts/cluster.sh env)"`).
    pub fn read() -> Env {
        Env {
            nodes: words("H3I_NODES"),
            ips: words("H3I_NODE_IPS"),
            ips6: words("H3I_NODE_IPS6"),
            apiserver: var("H3I_APISERVER"),
            pod_logs: var("H3I_POD_LOGS").into(),
            binary: var("H3I_BINARY").into(),
            real_nodes: var("H3I_NODE_MODE") == "real",
            node_lib: var("H3I_NODE_LIB").into(),
            registry_user: var("H3I_REGISTRY_USER"),
            registry_password_file: var("H3I_REGISTRY_PASSWORD_FILE").into(),
            kubeconfig: var("KUBECONFIG").into(),
            was_up: false,
        }
    }

    /// A client of the cluster as its admin (KUBECONFIG).
    pub async fn client(&self) -> Result<kube::Client> {
        self.client_as(None).await
    }

    /// A client that impersonates `user` (as `kubectl --as USER`), or the admin itself.
    pub async fn client_as(&self, user: Option<&str>) -> Result<kube::Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| {
            Error::Command(format!("kubeconfig {}: {e}", self.kubeconfig.display()))
        })?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Command(format!("kubeconfig: {e}")))?;
        config.auth_info.impersonate = user.map(String::from);
        Ok(kube::Client::try_from(config)?)
    }

    /// How the project's image reaches a pod, for step titles.
    pub fn image_source(&self) -> &'static str {
        if self.real_nodes {
            "the OCI image of the static binary, pulled by containerd from the authenticated registry"
        } else {
            "the local binary through the node agent"
        }
    }
}

/// Whether `scripts/cluster.sh status` says the cluster is up and healthy.
pub fn cluster_healthy() -> bool {
    let cluster = repo().join("scripts/cluster.sh");
    std::process::Command::new(cluster)
        .arg("status")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `scripts/cluster.sh up` (a health check when it is up already): what it printed. Runs
/// before the runtime starts (`main`), so it blocks.
pub fn cluster_up() -> Result<String> {
    let cluster = repo().join("scripts/cluster.sh");
    let out = std::process::Command::new(&cluster)
        .arg("up")
        .output()
        .map_err(|e| Error::Command(format!("scripts/cluster.sh up: {e}")))?;
    let text = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::Command(format!(
            "scripts/cluster.sh up: {}",
            crate::cmd::tail(&text, 2000)
        )));
    }
    Ok(text.into_owned())
}

/// `scripts/cluster.sh ARGS...` (environment plumbing: `restart-apiserver 5`, ...): what it
/// printed on stdout and stderr; a non-zero exit fails.
pub async fn cluster(args: &[&str]) -> Result<String> {
    let cluster = repo().join("scripts/cluster.sh");
    let out = crate::cmd::output(&cluster.to_string_lossy(), args).await?;
    if !out.success() {
        return Err(Error::Command(format!(
            "scripts/cluster.sh {}: {}",
            args.join(" "),
            out.stderr.trim()
        )));
    }
    Ok(out.stderr + &out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_cluster_sh_env_prints() {
        let text = "export KUBECONFIG=/run/h3i-cluster/admin.kubeconfig\n\
                    export H3I_NODES='h3i-node-1 h3i-node-2'\n\
                    export PATH=\"/cache/bin:/usr/bin\"\n\
                    # comment\nexport H3I_X=it'\\''s\n";
        let got = parse_exports(text);
        assert_eq!(
            got[0],
            (
                "KUBECONFIG".into(),
                "/run/h3i-cluster/admin.kubeconfig".into()
            )
        );
        assert_eq!(got[1], ("H3I_NODES".into(), "h3i-node-1 h3i-node-2".into()));
        assert_eq!(got[2], ("PATH".into(), "/cache/bin:/usr/bin".into()));
        assert_eq!(got.len(), 4);
    }
}
