//! Writes every object the operator would create for two example listeners (all defaults, and
//! every option on) as YAML, so they can be validated against the upstream Kubernetes schemas
//! (`tests/manifests/validate.sh`) without an API server.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::resources::{desired, BuildError, Params, PodDefaults};
use crate::api::{Http3Listener, Http3ListenerSpec};

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("listener {0}: {1}")]
    Build(String, BuildError),
    #[error("YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
}

/// A listener the way the API server would hand it to the operator (uid and generation set).
fn example(name: &str, spec: serde_json::Value) -> Http3Listener {
    let spec: Http3ListenerSpec =
        serde_json::from_value(spec).expect("example listener spec is valid");
    let mut l = Http3Listener::new(name, spec);
    l.metadata.uid = Some(format!("00000000-0000-4000-8000-{:012x}", name.len()));
    l.metadata.generation = Some(1);
    l
}

/// The two example listeners, with the operator's per-pod defaults (none, and pull secrets
/// with a priority class).
pub fn examples() -> Vec<(Http3Listener, PodDefaults)> {
    let default = example(
        "default",
        serde_json::json!({
            "ingressClassName": "nginx",
            "upstream": {"address": "ingress-nginx-controller.ingress-nginx.svc:443"}
        }),
    );
    let everything = example(
        "everything",
        serde_json::json!({
            "ingressClassName": "nginx",
            "port": 8443,
            "addresses": {"ipv4": "0.0.0.0", "ipv6": "::"},
            "upstream": {
                "address": "nginx-ingress.nginx-ingress.svc:443",
                "verify": "system",
                "proxyProtocol": true,
                "connectTimeoutSeconds": 3,
                "responseTimeoutSeconds": 120
            },
            "socket": {"receiveBufferBytes": 8388608, "sendBufferBytes": 8388608, "forceBuffers": true},
            "transport": {"congestionControl": "cubic-hs", "initialWindowPackets": 20},
            "altSvc": {"maxAgeSeconds": 604800},
            "metrics": {"address": "0.0.0.0:9476"},
            "http": {"drainTimeoutSeconds": 60},
            "hosts": [
                {"name": "static.example.com", "secretRef": {"namespace": "infra", "name": "static-tls"}}
            ],
            "nodeSelector": {"node-role.kubernetes.io/ingress": ""},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ingress", "effect": "NoSchedule"}],
            "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "image": "registry.example.com/h3-ingress:0.1.0",
            "tuneNodeBufferLimits": true,
            "tuneImage": "registry.example.com/busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "service": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": "Cluster",
                "annotations": {"metallb.universe.tf/allow-shared-ip": "ingress-443"},
                "loadBalancerIP": "192.0.2.10",
                "loadBalancerClass": "metallb",
                "nodePort": 30443,
                "includeTcp": true,
                "ipFamilyPolicy": "PreferDualStack"
            },
            "rollout": {"maxUnavailable": "25%"}
        }),
    );
    let pull = PodDefaults {
        image_pull_secrets: vec!["regcred".into()],
        priority_class_name: Some("system-node-critical".into()),
        ..PodDefaults::default()
    };
    vec![(default, PodDefaults::default()), (everything, pull)]
}

fn write(dir: &Path, file: String, obj: &impl Serialize) -> Result<PathBuf, RenderError> {
    let path = dir.join(file);
    let yaml = serde_norway::to_string(obj)?;
    std::fs::write(&path, yaml).map_err(|e| RenderError::Io(path.clone(), e))?;
    Ok(path)
}

/// Renders the examples into `dir` (created if needed) and returns the files written. The
/// example listeners themselves go to `http3listener-NAME.yaml`, the objects the operator
/// makes for them to `NAME/KIND-NAMESPACE-NAME.yaml`.
pub fn write_all(dir: &Path, params: &Params) -> Result<Vec<PathBuf>, RenderError> {
    let mut out = Vec::new();
    std::fs::create_dir_all(dir).map_err(|e| RenderError::Io(dir.to_path_buf(), e))?;
    for (listener, pod) in examples() {
        let name = listener.metadata.name.clone().unwrap_or_default();
        let d =
            desired(&listener, params, &pod).map_err(|e| RenderError::Build(name.clone(), e))?;
        let sub = dir.join(&name);
        std::fs::create_dir_all(&sub).map_err(|e| RenderError::Io(sub.clone(), e))?;
        let ns = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            format!(
                "{}-{}",
                m.namespace.as_deref().unwrap_or("cluster"),
                m.name.as_deref().unwrap_or_default()
            )
        };
        out.push(write(dir, format!("http3listener-{name}.yaml"), &listener)?);
        out.push(write(
            &sub,
            format!("daemonset-{}.yaml", ns(&d.daemon_set.metadata)),
            &d.daemon_set,
        )?);
        out.push(write(
            &sub,
            format!("serviceaccount-{}.yaml", ns(&d.service_account.metadata)),
            &d.service_account,
        )?);
        out.push(write(
            &sub,
            format!("clusterrole-{}.yaml", ns(&d.cluster_role.metadata)),
            &d.cluster_role,
        )?);
        out.push(write(
            &sub,
            format!(
                "clusterrolebinding-{}.yaml",
                ns(&d.cluster_role_binding.metadata)
            ),
            &d.cluster_role_binding,
        )?);
        if let Some(svc) = &d.service {
            out.push(write(
                &sub,
                format!("service-{}.yaml", ns(&svc.metadata)),
                svc,
            )?);
        }
        for r in &d.roles {
            out.push(write(&sub, format!("role-{}.yaml", ns(&r.metadata)), r)?);
        }
        for rb in &d.role_bindings {
            out.push(write(
                &sub,
                format!("rolebinding-{}.yaml", ns(&rb.metadata)),
                rb,
            )?);
        }
    }
    Ok(out)
}
