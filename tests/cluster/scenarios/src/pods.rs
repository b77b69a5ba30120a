//! Where a pod's process and token are, on real nodes (containerd's cgroups, the token mounted
//! in the container) and on the node agent (its pid and kubeconfig files under `H3I_POD_LOGS`).

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, UserInfo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Api;

use crate::error::IoContext;
use crate::{fail, Env, Error, Result};

/// The main process of a pod's container.
pub async fn pid(env: &Env, pods: &Api<Pod>, ns: &str, pod: &str, container: &str) -> Result<u32> {
    if !env.real_nodes {
        let file = env
            .pod_logs
            .join(ns)
            .join(pod)
            .join(format!("{container}.pid"));
        let text = std::fs::read_to_string(&file).context(|| format!("read {}", file.display()))?;
        return text
            .trim()
            .parse()
            .map_err(|_| Error::Check(format!("{}: {text:?}", file.display())));
    }
    let p = pods.get(pod).await?;
    let id = p
        .status
        .and_then(|s| s.container_statuses)
        .into_iter()
        .flatten()
        .find(|c| c.name == container)
        .and_then(|c| c.container_id)
        .unwrap_or_default();
    let id = id.trim_start_matches("containerd://");
    if id.is_empty() {
        return fail(format!(
            "{ns}/{pod}: container {container} has no containerID yet"
        ));
    }
    // runc names the container's cgroups after its ID; the lowest pid in them is init.
    lowest_pid_in_cgroup(id).ok_or_else(|| {
        Error::Check(format!(
            "no process of container {id} ({ns}/{pod} {container})"
        ))
    })
}

fn lowest_pid_in_cgroup(id: &str) -> Option<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cgroup")).is_ok_and(|c| c.contains(id))
        })
        .collect();
    pids.sort_unstable();
    pids.first().copied()
}

/// The executable a pod of the project's image runs, as `/proc/PID/exe` names it.
pub fn exe(env: &Env) -> PathBuf {
    if env.real_nodes {
        "/h3-ingress".into()
    } else {
        std::fs::canonicalize(&env.binary).unwrap_or_else(|_| env.binary.clone())
    }
}

/// What `/proc/PID/exe` points at.
pub fn exe_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default()
}

/// The process's command line, arguments joined by spaces, without the program.
pub fn args_of(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let s = String::from_utf8_lossy(&raw);
    s.split('\0')
        .skip(1)
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The process's environment, one `NAME=value` a line.
pub fn environ_of(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .split('\0')
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// A container's log files: the agent keeps one file for all runs; a kubelet keeps the
/// current and the previous instance's under its `podLogsDir`.
pub async fn log_files(
    env: &Env,
    pods: &Api<Pod>,
    ns: &str,
    pod: &str,
    container: &str,
) -> Result<Vec<PathBuf>> {
    if !env.real_nodes {
        return Ok(vec![env
            .pod_logs
            .join(ns)
            .join(pod)
            .join(format!("{container}.log"))]);
    }
    let p = pods.get(pod).await?;
    let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
    let uid = p.metadata.uid.unwrap_or_default();
    let dir = env
        .node_lib
        .join(&node)
        .join("pods")
        .join(format!("{ns}_{pod}_{uid}"))
        .join(container);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .context(|| format!("read {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    Ok(files)
}

/// The network namespace a process is in, by name (`ip netns identify`).
pub async fn netns_of(pid: u32) -> Result<String> {
    Ok(
        crate::cmd::run("ip", &["netns", "identify", &pid.to_string()])
            .await?
            .trim()
            .to_string(),
    )
}

/// A kubeconfig with the pod's own ServiceAccount token: the agent's file, or (real nodes) one
/// written to `out` from the token and CA mounted in the container of process `pid`.
pub fn kubeconfig(env: &Env, ns: &str, pod: &str, pid: u32, out: &Path) -> Result<Kubeconfig> {
    let path = if env.real_nodes {
        let sa = PathBuf::from(format!(
            "/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount"
        ));
        let token =
            std::fs::read_to_string(sa.join("token")).context(|| format!("{pod}'s token"))?;
        write_kubeconfig(out, &env.apiserver, &sa.join("ca.crt"), token.trim())?;
        out.to_path_buf()
    } else {
        env.pod_logs.join(ns).join(pod).join("kubeconfig")
    };
    Kubeconfig::read_from(&path)
        .map_err(|e| Error::Command(format!("kubeconfig {}: {e}", path.display())))
}

fn write_kubeconfig(out: &Path, server: &str, ca: &Path, token: &str) -> Result<()> {
    let ca = std::fs::read(ca).context(|| format!("read {}", ca.display()))?;
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "pod", "cluster": {"server": server, "certificate-authority-data": base64(&ca)}}],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "pod", "user": "pod"}}],
        "current-context": "pod",
    });
    std::fs::write(out, kc.to_string()).context(|| format!("write {}", out.display()))
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |a, &b| (a << 8) | b as u32) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Who the API server says a kubeconfig's credentials are (a SelfSubjectReview).
pub async fn whoami(kc: Kubeconfig) -> Result<UserInfo> {
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Command(format!("pod kubeconfig: {e}")))?;
    let client = kube::Client::try_from(config)?;
    let api: Api<SelfSubjectReview> = Api::all(client);
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review.status.and_then(|s| s.user_info).unwrap_or_default())
}

/// Whether the kubeconfig's credentials may `verb` `resource` in `ns`, as the API server
/// judges (a SelfSubjectAccessReview, what `kubectl auth can-i` sends).
pub async fn can_i(kc: Kubeconfig, verb: &str, resource: &str, ns: &str) -> Result<bool> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Command(format!("pod kubeconfig: {e}")))?;
    let api: Api<SelfSubjectAccessReview> = Api::all(kube::Client::try_from(config)?);
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let got = api.create(&PostParams::default(), &review).await?;
    Ok(got.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_like_the_standard() {
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b"hi"), "aGk=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(b""), "");
    }
}
