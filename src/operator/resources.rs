//! The objects the operator creates for one `Http3Listener`, built by pure functions.
//!
//! Per listener: a ServiceAccount and a hostNetwork DaemonSet in the operator's namespace (and
//! a Service there when `spec.service` asks), a ClusterRole + ClusterRoleBinding (read its own
//! listener, by name), and a Role + RoleBinding in the hosts namespace (read the certificate
//! mirrors, `api::mirror`; that namespace holds nothing else). The data plane reads no Ingress,
//! no Gateway and no user's Secret. Every object carries an owner reference to the listener so
//! deleting it removes them all.
//!
//! Plus the listener's QUIC keys Secret ([`keys_secret`]): random bytes, created once and
//! never changed (immutable), mounted into every data plane pod, so a restarted pod and its
//! neighbours answer the listener's old connections with stateless resets and accept each
//! other's Retry tokens.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    LocalObjectReference, ObjectFieldSelector, Pod, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource, SecurityContext,
    Service, ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;
use kube::{Resource, ResourceExt};

use crate::api::{
    check_rollout, Http3Listener, ListenerService, ServiceType, RECOMMENDED_SYSCTL_BUFFER_MAX,
};
use crate::config::{build, ConfigError, HostTable, ProxyConfig};

use super::{labels, placement};

/// Listener names end up in label values (63 characters at most).
pub const MAX_LISTENER_NAME: usize = 63;
/// Pod template annotation whose change rolls the DaemonSet: a hash of what needs new sockets.
pub const SOCKET_HASH_ANNOTATION: &str = "h3-ingress.dev/socket-hash";
/// Pod template annotation with the TCP port of the pod's `/metrics` (`metrics.address`). The
/// container declares no port (see `data_plane_container`), so this is how the chart's
/// PodMonitor finds it; it changes only with the socket hash (which covers that address), so
/// it never rolls the pods by itself.
pub const METRICS_PORT_ANNOTATION: &str = "h3-ingress.dev/metrics-port";
/// Pod template label of data planes that hand their port over (SO_REUSEPORT, `proxy::handover`)
/// to a newer pod on the node; pods without it (0.1.0) hold the port alone.
pub const HANDOVER_LABEL: &str = "h3-ingress.dev/handover";
pub const HANDOVER_VERSION: &str = "1";
/// Default image of the opt-in init container that raises the node's buffer limits. It needs a
/// shell and nothing else, which the data plane image (FROM scratch) does not have. Overridden
/// by the operator's `--tune-image` and a listener's `spec.tuneImage`.
pub const TUNE_IMAGE: &str = "busybox:1.36.1";
/// Node label every data plane pod selects, next to the listener's own selector: the binary
/// is a Linux binary, and mixed clusters schedule by this label.
pub const OS_LABEL: &str = "kubernetes.io/os";
pub const OS_LINUX: &str = "linux";
/// Name of the data plane container (also used by `kubectl logs -c`).
pub const CONTAINER_NAME: &str = "h3-ingress";
pub const TUNE_CONTAINER_NAME: &str = "tune-node-buffers";
/// The image's non-root user ("nonroot"): the group the keys Secret is readable by (the data
/// plane itself runs as [`DATA_PLANE_UID`]).
pub const NON_ROOT_UID: i64 = 65532;
/// Where the keys Secret is mounted in the data plane container, and its one data key.
pub const KEYS_MOUNT_PATH: &str = "/etc/h3-ingress/keys";
pub const KEYS_SECRET_KEY: &str = crate::api::keys::SECRET_DATA_KEY;
const KEYS_VOLUME: &str = "quic-keys";
/// Added to `http.drainTimeoutSeconds` so the kubelet does not kill a pod still draining.
pub const TERMINATION_GRACE_MARGIN_SECONDS: i64 = 15;

/// Why the objects for a listener cannot be built; reported as `Ready=False/InvalidSpec`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("metadata.name {0:?} is longer than {MAX_LISTENER_NAME} characters")]
    NameTooLong(String),
    #[error("the listener has no metadata.uid yet (owner references need it)")]
    NoUid,
    #[error("{0}")]
    InvalidSpec(#[from] ConfigError),
    /// A Kubernetes-only field (`spec.service`, `spec.rollout`) the CRD's rules should have
    /// refused (a spec stored before they existed, or a cluster without CEL).
    #[error("spec.{0}")]
    InvalidField(String),
}

/// Operator-wide inputs of the builders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Namespace of the DaemonSet and ServiceAccount (the operator's own).
    pub namespace: String,
    /// Data plane image when `spec.image` is empty (normally the operator's own image).
    pub default_image: String,
    /// Where the certificate mirrors live (`api::mirror`), read by every data plane.
    pub hosts_namespace: String,
}

/// What the operator puts into every data plane pod whatever the listener says, from its
/// command line: pull secrets for the images, and the tune container's default image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDefaults {
    /// Secrets (in the operator's namespace) the data plane's ServiceAccount and pods pull
    /// their images with.
    pub image_pull_secrets: Vec<String>,
    /// Image of the opt-in init container when `spec.tuneImage` is empty.
    pub tune_image: String,
    /// `priorityClassName` of every data plane pod (none: the cluster's default priority).
    pub priority_class_name: Option<String>,
    /// The `kubernetes.io/arch` values the data plane image is built for: pods require a node
    /// of one of them ([`placement`]).
    pub architectures: Vec<String>,
}

impl Default for PodDefaults {
    fn default() -> Self {
        Self {
            image_pull_secrets: Vec::new(),
            tune_image: TUNE_IMAGE.to_string(),
            priority_class_name: None,
            architectures: placement::default_architectures(),
        }
    }
}

impl PodDefaults {
    fn pull_secrets(&self) -> Option<Vec<LocalObjectReference>> {
        (!self.image_pull_secrets.is_empty()).then(|| {
            self.image_pull_secrets
                .iter()
                .map(|n| LocalObjectReference { name: n.clone() })
                .collect()
        })
    }
}

/// Everything the operator applies for one listener.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub service_account: ServiceAccount,
    pub cluster_role: ClusterRole,
    pub cluster_role_binding: ClusterRoleBinding,
    /// The Role in the hosts namespace (one; a list, so Roles of earlier versions, one per
    /// namespace of a referenced Secret, are pruned like any Role no longer wanted).
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    pub daemon_set: DaemonSet,
    /// The Service `spec.service` asks for, if it does.
    pub service: Option<Service>,
    /// The pod template's [`SOCKET_HASH_ANNOTATION`] value.
    pub socket_hash: String,
    /// The keys Secret without its data: the operator creates it with random bytes when it
    /// does not exist, and never touches an existing one.
    pub keys_secret: Secret,
}

/// Name of the DaemonSet and ServiceAccount of a listener.
pub fn data_plane_name(listener: &str) -> String {
    format!("h3-ingress-{listener}")
}

/// Name of the Secret holding a listener's QUIC keys (in the operator's namespace).
pub fn keys_secret_name(listener: &str) -> String {
    format!("h3-ingress-keys-{listener}")
}

/// The listener's keys Secret with `secret` (random bytes the caller made), immutable so that
/// nothing rotates it by accident: a new key strands every client of the old one.
pub fn keys_secret(
    listener: &Http3Listener,
    params: &Params,
    secret: Vec<u8>,
) -> Result<Secret, BuildError> {
    let name = keys_secret_name(&listener.name_any());
    Ok(Secret {
        metadata: meta(listener, params, name, Some(&params.namespace))?,
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(
            [(KEYS_SECRET_KEY.to_string(), ByteString(secret))]
                .into_iter()
                .collect(),
        ),
        ..Default::default()
    })
}

/// Name of the Role(Binding) of a listener in the hosts namespace, and the name earlier
/// versions gave its ClusterRole(Binding) ([`cluster_rbac_name`] replaced it).
pub fn rbac_name(listener: &str) -> String {
    format!("h3-ingress-data-plane-{listener}")
}

/// Name of the ClusterRole(Binding) of a listener run by the operator in `namespace`: scoped
/// to that operator, so two operators' objects never share a name (a listener handed from one
/// to the other has both for a while). The namespace comes first and has no dot, so the name
/// reads back unambiguously (`h3-ingress.h3-ingress-data-plane-public`).
pub fn cluster_rbac_name(listener: &str, namespace: &str) -> String {
    format!("{namespace}.{}", rbac_name(listener))
}

/// Labels on every data-plane object of a listener (and the DaemonSet's selector).
pub fn selector_labels(listener: &str) -> BTreeMap<String, String> {
    [
        (labels::NAME, labels::NAME_VALUE),
        (labels::COMPONENT, labels::COMPONENT_DATA_PLANE),
        (labels::INSTANCE, listener),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn object_labels(listener: &str) -> BTreeMap<String, String> {
    let mut l = selector_labels(listener);
    l.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    l
}

/// Labels of the data plane pods: the listener's, and that they hand their port over.
fn pod_labels(listener: &str) -> BTreeMap<String, String> {
    let mut l = object_labels(listener);
    l.insert(HANDOVER_LABEL.into(), HANDOVER_VERSION.into());
    l
}

/// A roll onto pods that share the port cannot start beside pods that hold it alone: the new
/// pod would wait for a port the old one never gives up, and the old one is deleted only once
/// the new one is ready. While such pods run, the DaemonSet replaces pods without surging
/// (`rollout.maxUnavailable`, or 10 % when that is 0): one short gap per node, once.
pub fn without_surge(ds: &mut DaemonSet, listener: &Http3Listener) {
    let unavailable = match &listener.spec.rollout.max_unavailable {
        IntOrString::Int(0) => IntOrString::String("10%".into()),
        IntOrString::String(s) if s == "0%" => IntOrString::String("10%".into()),
        other => other.clone(),
    };
    ds.spec.update_strategy = Some(DaemonSetUpdateStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: Some(RollingUpdateDaemonSet {
            max_surge: Some(IntOrString::Int(0)),
            max_unavailable: Some(unavailable),
        }),
    });
}

/// Whether a running data plane pod cannot share its port with a pod of the current template,
/// so that a roll must replace it without surging ([`without_surge`]): it holds the port alone
/// (no [`HANDOVER_LABEL`]: 0.1.0), or it runs under another uid than [`DATA_PLANE_UID`] (the
/// kernel keeps a SO_REUSEPORT group to one uid; releases before it chose the uid by port and
/// `forceBuffers`). A pod being deleted no longer counts.
pub fn cannot_share_port(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let alone = !pod.labels().contains_key(HANDOVER_LABEL);
    let uid = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == CONTAINER_NAME)
        .and_then(|c| c.security_context.as_ref()?.run_as_user);
    alone || uid.is_some_and(|u| u != DATA_PLANE_UID)
}

/// Label selector (`k=v,...`) matching every object made for a listener.
pub fn label_selector(listener: &str) -> String {
    selector_labels(listener)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Owner reference to the listener. `blockOwnerDeletion` stays unset: setting it needs
/// `update` on `http3listeners/finalizers`, which the least-privilege operator role omits,
/// and background garbage collection removes the objects either way.
pub fn owner_reference(listener: &Http3Listener) -> Result<OwnerReference, BuildError> {
    Ok(OwnerReference {
        api_version: Http3Listener::api_version(&()).into_owned(),
        kind: Http3Listener::kind(&()).into_owned(),
        name: listener.name_any(),
        uid: listener.uid().ok_or(BuildError::NoUid)?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// Metadata of an object made for `listener`: its labels, the operator's namespace as the
/// label that tells operators' objects apart ([`labels::OPERATOR_NAMESPACE`]), the owner
/// reference.
fn meta(
    listener: &Http3Listener,
    params: &Params,
    name: String,
    namespace: Option<&str>,
) -> Result<ObjectMeta, BuildError> {
    let mut labels_ = object_labels(&listener.name_any());
    labels_.insert(labels::OPERATOR_NAMESPACE.into(), params.namespace.clone());
    Ok(ObjectMeta {
        name: Some(name),
        namespace: namespace.map(str::to_string),
        labels: Some(labels_),
        owner_references: Some(vec![owner_reference(listener)?]),
        ..Default::default()
    })
}

/// Validates the listener's settings exactly as the data plane will, without hosts.
pub fn validate(listener: &Http3Listener) -> Result<ProxyConfig, BuildError> {
    let name = listener.name_any();
    if name.len() > MAX_LISTENER_NAME {
        return Err(BuildError::NameTooLong(name));
    }
    // Before the Kubernetes-only checks, which would judge the defaults put in their place.
    let unknown = crate::config::unknown_value_errors(listener.unknown_values(), "spec");
    if !unknown.is_empty() {
        return Err(BuildError::InvalidSpec(ConfigError { errors: unknown }));
    }
    check_rollout(&listener.spec.rollout).map_err(BuildError::InvalidField)?;
    if let Some(svc) = &listener.spec.service {
        check_service(svc)?;
    }
    for (i, g) in listener.spec.gateway_upstreams.iter().enumerate() {
        crate::config::parse_host_port(&g.address).map_err(|why| {
            BuildError::InvalidField(format!(
                "gatewayUpstreams[{i}].address: {:?} is not host:port ({why})",
                g.address
            ))
        })?;
    }
    Ok(build(
        listener.spec.listener_settings(),
        listener.spec.unknown_values.values(),
        HostTable::default(),
        "spec",
    )?)
}

/// The rule the CRD's CEL expression on `spec.service` states, for specs it did not check.
fn check_service(svc: &ListenerService) -> Result<(), BuildError> {
    let lb_only = svc.load_balancer_class.is_some() || svc.load_balancer_ip.is_some();
    if svc.type_ != ServiceType::LoadBalancer && lb_only {
        return Err(BuildError::InvalidField(
            "service.loadBalancerClass and service.loadBalancerIP need service.type: LoadBalancer"
                .into(),
        ));
    }
    Ok(())
}

/// Hash of exactly the settings a running pod cannot apply (the fields
/// [`ProxyConfig::restart_required_changes`] lists). It goes into the pod template, so such a
/// change rolls the DaemonSet while host and certificate changes do not.
pub fn socket_hash(c: &ProxyConfig) -> String {
    use sha2::Digest;
    let l = &c.listen;
    let text = format!(
        "port={}\nipv4={:?}\nipv6={:?}\nrcvbuf={}\nsndbuf={}\nforce={}\nmetrics={}\n",
        l.port,
        l.ipv4,
        l.ipv6,
        l.receive_buffer_bytes,
        l.send_buffer_bytes,
        l.force_buffers,
        c.metrics_address
    );
    hex::encode(&sha2::Sha256::digest(text.as_bytes())[..8])
}

/// The data plane's uid and gid, whatever the listener says: root. Ports below 1024 and
/// SO_RCVBUFFORCE need capabilities, and Kubernetes adds capabilities only to root's effective
/// set (it sets no ambient capabilities for other users); and the kernel lets a socket join a
/// SO_REUSEPORT group only with the uid of the sockets in it, so a roll whose new pods ran
/// under another uid than the old ones (as `socket.forceBuffers` once chose on ports from
/// 1024) could never hand the port over. Root here holds no capability but those below.
pub const DATA_PLANE_UID: i64 = 0;

/// The capabilities the data plane's sockets need: `NET_BIND_SERVICE` for a port below 1024
/// (UDP or metrics), `NET_ADMIN` for `socket.forceBuffers` (SO_RCVBUFFORCE/SO_SNDBUFFORCE).
pub fn capabilities(c: &ProxyConfig) -> Vec<String> {
    let mut add = Vec::new();
    if c.listen.port < 1024 || c.metrics_address.port() < 1024 {
        add.push("NET_BIND_SERVICE".to_string());
    }
    if c.listen.force_buffers {
        add.push("NET_ADMIN".to_string());
    }
    add
}

fn container_security(c: &ProxyConfig) -> SecurityContext {
    let add = capabilities(c);
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(false),
        run_as_user: Some(DATA_PLANE_UID),
        run_as_group: Some(DATA_PLANE_UID),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: (!add.is_empty()).then_some(add),
        }),
        ..Default::default()
    }
}

fn env_from_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_string(),
                api_version: None,
            }),
            ..Default::default()
        }),
        value: None,
    }
}

/// The path of the binary in the data plane image.
pub const IMAGE_BINARY: &str = "/h3-ingress";
/// Environment variable the pod template generation reaches the data plane in: among two
/// pods of one listener on a node, the higher one takes the new connections.
pub const RANK_ENV: &str = "H3_INGRESS_ROLLOUT_RANK";
/// The label the DaemonSet controller puts the pod template generation in.
const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// How long the startup probe gives the data plane to load its configuration (all hosts
/// and Secrets): 300 x 1 s.
pub const STARTUP_PROBE_FAILURES: i32 = 300;
/// Period of the startup and readiness probes: a pod that serves is called ready within about
/// a second, and the advertisements (`spec.advertise`), which wait for a ready pod, follow.
const PROBE_PERIOD_SECONDS: i32 = 1;
/// The grace a data plane that failed its liveness probe gets before SIGKILL, instead of the
/// pod's drain grace: a process that cannot answer its probe cannot drain either. On real
/// nodes a SIGSTOPped data plane was replaced 74 s after it hung with the pod's 45 s; the
/// probe's own grace takes that to about 30 s plus this (`h3i-scenarios node-checks`).
pub const LIVENESS_KILL_GRACE_SECONDS: i64 = 5;

/// `h3-ingress probe CHECK`, run in the container: the question goes to this pod's own
/// process over a socket in its `/tmp`, never to the other pod of a rollout that shares the
/// node's ports (an HTTP probe on the metrics port would reach whichever accepts).
fn probe(check: &str, period: i32, failures: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![IMAGE_BINARY.into(), "probe".into(), check.into()]),
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(3),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn quantity(s: &str) -> Quantity {
    Quantity(s.to_string())
}

/// Memory the data plane needs besides its buffered request bytes: the process (the static
/// release binary: 13 MB RSS idle, 23 MB with 1000 streams open, 55 MB at the peak of the
/// adversarial suite's pre-read attack), QUIC connection state and response bytes in flight.
pub const DATA_PLANE_MEMORY_OVERHEAD_BYTES: u64 = 192 << 20;

/// What one open QUIC connection holds, idle (about 57 KB measured: 1000 connections held by
/// one client in the adversarial suite took the proxy from 14 to 71 MB RSS).
pub const CONNECTION_MEMORY_BYTES: u64 = 64 << 10;

/// The data plane's memory limit: `limits.bufferedRequestBytes`, `limits.connections` open
/// connections and the fixed overhead, so a flood is refused by the budget and the connection
/// cap long before the kernel kills the pod, and a leak kills the pod, not the node.
pub fn memory_limit(c: &ProxyConfig) -> Quantity {
    let connections = u64::from(c.limits.connections) * CONNECTION_MEMORY_BYTES;
    let bytes = c.limits.buffered_request_bytes + connections + DATA_PLANE_MEMORY_OVERHEAD_BYTES;
    quantity(&format!("{}Mi", bytes.div_ceil(1 << 20)))
}

/// The listener's resources (or our default requests), with the derived memory limit unless
/// the listener sets one.
fn data_plane_resources(listener: &Http3Listener, c: &ProxyConfig) -> ResourceRequirements {
    let mut r = listener
        .spec
        .resources
        .clone()
        .unwrap_or_else(default_resources);
    r.limits
        .get_or_insert_with(Default::default)
        .entry("memory".to_string())
        .or_insert_with(|| memory_limit(c));
    r
}

/// The data plane's requests without `spec.resources`: 128 MiB covers a pod serving 10,000
/// hosts at rest (the scale harness: 197 MiB within a minute of a request to every host,
/// 92 MiB two minutes later in the data-plane bench once idle upstream connections are
/// gone), so the scheduler and the kubelet's eviction see what it really holds.
fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(
            [
                ("cpu".to_string(), quantity("100m")),
                ("memory".to_string(), quantity("128Mi")),
            ]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    }
}

/// Shell script of the opt-in init container: raise, never lower, the node-wide maxima.
fn tune_script(c: &ProxyConfig) -> String {
    let rmem = RECOMMENDED_SYSCTL_BUFFER_MAX.max(c.listen.receive_buffer_bytes);
    let wmem = RECOMMENDED_SYSCTL_BUFFER_MAX.max(c.listen.send_buffer_bytes);
    format!(
        "set -eu\n\
         raise() {{ f=/proc/sys/net/core/$1; cur=$(cat \"$f\"); \
         if [ \"$cur\" -lt \"$2\" ]; then echo \"$2\" > \"$f\"; echo \"net.core.$1: $cur -> $2\"; \
         else echo \"net.core.$1: $cur (kept, >= $2)\"; fi; }}\n\
         raise rmem_max {rmem}\n\
         raise wmem_max {wmem}\n"
    )
}

fn tune_container(c: &ProxyConfig, image: String) -> Container {
    Container {
        name: TUNE_CONTAINER_NAME.into(),
        image: Some(image),
        command: Some(vec!["sh".into(), "-c".into(), tune_script(c)]),
        security_context: Some(SecurityContext {
            // Writing /proc/sys/net/core needs a writable /proc/sys, which only privileged
            // containers get; this is why the init container is opt-in.
            privileged: Some(true),
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            read_only_root_filesystem: Some(true),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_string(), quantity("10m")),
                    ("memory".to_string(), quantity("8Mi")),
                ]
                .into_iter()
                .collect(),
            ),
            limits: Some(
                [("memory".to_string(), quantity("16Mi"))]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The data plane container: `h3-ingress proxy --listener NAME`, exec probes through its own
/// probe socket, locked down except for the capabilities the sockets need. It declares no
/// ports: under hostNetwork a container port is a host port to the scheduler, which would
/// keep the rollout's second pod off the node; the two share the ports with SO_REUSEPORT.
fn data_plane_container(
    listener: &Http3Listener,
    config: &ProxyConfig,
    image: String,
    hosts_namespace: &str,
) -> Container {
    // Version skew: IfNotPresent only for a tag that names one build (crate::version).
    let pull_policy = crate::version::pull_policy(&image);
    Container {
        name: CONTAINER_NAME.into(),
        image: Some(image),
        image_pull_policy: Some(pull_policy.into()),
        args: Some(vec![
            "proxy".into(),
            "--listener".into(),
            listener.name_any(),
            "--keys-file".into(),
            format!("{KEYS_MOUNT_PATH}/{KEYS_SECRET_KEY}"),
            "--hosts-namespace".into(),
            hosts_namespace.to_string(),
        ]),
        env: Some(vec![
            env_from_field("NODE_NAME", "spec.nodeName"),
            env_from_field("POD_NAME", "metadata.name"),
            env_from_field("POD_NAMESPACE", "metadata.namespace"),
            env_from_field(
                RANK_ENV,
                &format!("metadata.labels['{TEMPLATE_GENERATION_LABEL}']"),
            ),
        ]),
        ports: None,
        // Live answers from the first instant (before the configuration is loaded), so a
        // slow load is never taken for a hang; the startup probe gives the load its time.
        startup_probe: Some(probe(
            "startup",
            PROBE_PERIOD_SECONDS,
            STARTUP_PROBE_FAILURES,
        )),
        liveness_probe: Some(Probe {
            termination_grace_period_seconds: Some(LIVENESS_KILL_GRACE_SECONDS),
            ..probe("live", 10, 3)
        }),
        readiness_probe: Some(probe("ready", PROBE_PERIOD_SECONDS, 4)),
        resources: Some(data_plane_resources(listener, config)),
        security_context: Some(container_security(config)),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "tmp".into(),
                mount_path: "/tmp".into(),
                ..Default::default()
            },
            VolumeMount {
                name: KEYS_VOLUME.into(),
                mount_path: KEYS_MOUNT_PATH.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

/// The listener's node selector with `kubernetes.io/os: linux` added (a value the user set
/// for that key stays).
pub fn node_selector(listener: &Http3Listener) -> BTreeMap<String, String> {
    let mut sel = listener.spec.node_selector.clone();
    sel.entry(OS_LABEL.to_string())
        .or_insert_with(|| OS_LINUX.to_string());
    sel
}

/// The pod: on the node's network, placed by the listener's selector and tolerations, with
/// time to drain before the kubelet kills it.
fn data_plane_pod(
    listener: &Http3Listener,
    config: &ProxyConfig,
    container: Container,
    pod: &PodDefaults,
) -> PodSpec {
    let spec = &listener.spec;
    let tune_image = spec
        .tune_image
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| pod.tune_image.clone());
    PodSpec {
        host_network: Some(true),
        // Without this a hostNetwork pod resolves with the node's resolv.conf and cannot
        // reach the API server or an in-cluster upstream by its Service name.
        dns_policy: Some("ClusterFirstWithHostNet".into()),
        service_account_name: Some(data_plane_name(&listener.name_any())),
        automount_service_account_token: Some(true),
        termination_grace_period_seconds: Some(
            i64::from(config.http.drain_timeout_seconds) + TERMINATION_GRACE_MARGIN_SECONDS,
        ),
        node_selector: Some(node_selector(listener)),
        affinity: Some(placement::affinity(&pod.architectures)),
        image_pull_secrets: pod.pull_secrets(),
        priority_class_name: pod.priority_class_name.clone(),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        security_context: Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            // The keys Secret is mounted group-readable (0440) for this group, so the
            // non-root user (whose group it is) can read it and nobody else.
            fs_group: Some(NON_ROOT_UID),
            ..Default::default()
        }),
        init_containers: spec
            .tune_node_buffer_limits
            .then(|| vec![tune_container(config, tune_image)]),
        containers: vec![container],
        volumes: Some(vec![
            Volume {
                name: "tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    mode: None,
                    size_limit: Some(quantity("16Mi")),
                }),
                ..Default::default()
            },
            // The kubelet mounts it (no API access needed); the pod waits until it exists.
            Volume {
                name: KEYS_VOLUME.into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(keys_secret_name(&listener.name_any())),
                    default_mode: Some(0o440),
                    optional: Some(false),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

/// The hostNetwork DaemonSet running `h3-ingress proxy --listener NAME` on the selected nodes.
pub fn daemon_set(
    listener: &Http3Listener,
    config: &ProxyConfig,
    params: &Params,
    pod: &PodDefaults,
) -> Result<DaemonSet, BuildError> {
    let name = listener.name_any();
    let image = listener
        .spec
        .image
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| params.default_image.clone());
    let container = data_plane_container(listener, config, image, &params.hosts_namespace);
    let template_annotations: BTreeMap<String, String> = [
        (SOCKET_HASH_ANNOTATION.to_string(), socket_hash(config)),
        (
            METRICS_PORT_ANNOTATION.to_string(),
            config.metrics_address.port().to_string(),
        ),
    ]
    .into_iter()
    .collect();
    Ok(DaemonSet {
        metadata: meta(
            listener,
            params,
            data_plane_name(&name),
            Some(&params.namespace),
        )?,
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            },
            // Surge: the new pod shares the node's ports with the old one (SO_REUSEPORT) and
            // takes the new connections once ready; the old one drains, then is deleted.
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_surge: Some(listener.spec.rollout.max_surge.clone()),
                    max_unavailable: Some(listener.spec.rollout.max_unavailable.clone()),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(&name)),
                    annotations: Some(template_annotations),
                    ..Default::default()
                }),
                spec: Some(data_plane_pod(listener, config, container, pod)),
            },
            ..Default::default()
        },
        status: None,
    })
}

fn rule(group: &str, resource: &str, names: Option<Vec<String>>) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(vec![resource.to_string()]),
        resource_names: names,
        verbs: ["get", "list", "watch"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        non_resource_urls: None,
    }
}

fn subject(listener: &str, params: &Params) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: data_plane_name(listener),
        namespace: Some(params.namespace.clone()),
        api_group: None,
    }
}

/// Name of the UDP port of the Service and of the pod (`quic`), and of the TCP one.
pub const QUIC_PORT_NAME: &str = "quic";
pub const TCP_PORT_NAME: &str = "https";

/// The Service `spec.service` asks for: the UDP port (`spec.port` on the load balancer and on
/// the pods, so `Alt-Svc: h3=":PORT"` names what clients reach), selecting this listener's pods.
pub fn service(listener: &Http3Listener, params: &Params) -> Result<Option<Service>, BuildError> {
    let Some(svc) = &listener.spec.service else {
        return Ok(None);
    };
    let name = listener.name_any();
    let port = i32::from(listener.spec.port);
    let lb = svc.type_ == ServiceType::LoadBalancer;
    let mut ports = vec![ServicePort {
        name: Some(QUIC_PORT_NAME.into()),
        protocol: Some("UDP".into()),
        port,
        target_port: Some(IntOrString::Int(port)),
        node_port: svc.node_port.map(i32::from),
        ..Default::default()
    }];
    if svc.include_tcp {
        ports.push(ServicePort {
            name: Some(TCP_PORT_NAME.into()),
            protocol: Some("TCP".into()),
            port,
            target_port: Some(IntOrString::Int(port)),
            ..Default::default()
        });
    }
    let mut metadata = meta(
        listener,
        params,
        data_plane_name(&name),
        Some(&params.namespace),
    )?;
    metadata.annotations = (!svc.annotations.is_empty()).then(|| svc.annotations.clone());
    Ok(Some(Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(svc.type_.as_str().into()),
            selector: Some(selector_labels(&name)),
            ports: Some(ports),
            external_traffic_policy: Some(svc.external_traffic_policy.as_str().into()),
            ip_family_policy: svc.ip_family_policy.map(|p| p.as_str().to_string()),
            load_balancer_class: svc.load_balancer_class.clone().filter(|_| lb),
            load_balancer_ip: svc.load_balancer_ip.clone().filter(|_| lb),
            allocate_load_balancer_node_ports: lb.then_some(svc.allocate_load_balancer_node_ports),
            ..Default::default()
        }),
        status: None,
    }))
}

/// Builds every object for a listener.
pub fn desired(
    listener: &Http3Listener,
    params: &Params,
    pod: &PodDefaults,
) -> Result<Desired, BuildError> {
    let config = validate(listener)?;
    placement::check_node_selector(listener, &pod.architectures)
        .map_err(BuildError::InvalidField)?;
    let name = listener.name_any();

    let service_account = ServiceAccount {
        metadata: meta(
            listener,
            params,
            data_plane_name(&name),
            Some(&params.namespace),
        )?,
        automount_service_account_token: Some(true),
        image_pull_secrets: pod.pull_secrets(),
        ..Default::default()
    };
    let cluster_role = ClusterRole {
        metadata: meta(
            listener,
            params,
            cluster_rbac_name(&name, &params.namespace),
            None,
        )?,
        // list/watch with resourceNames are authorised for `metadata.name=` field selectors,
        // which is how the data plane watches its one listener.
        rules: Some(vec![rule(
            "h3-ingress.dev",
            "http3listeners",
            Some(vec![name.clone()]),
        )]),
        aggregation_rule: None,
    };
    let cluster_role_binding = ClusterRoleBinding {
        metadata: meta(
            listener,
            params,
            cluster_rbac_name(&name, &params.namespace),
            None,
        )?,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: cluster_rbac_name(&name, &params.namespace),
        },
        subjects: Some(vec![subject(&name, params)]),
    };
    // The mirrors of every listener share the namespace and RBAC cannot select by label, so
    // a data plane may read other listeners' mirrors there; it reads nothing else.
    let ns = params.hosts_namespace.as_str();
    let roles = vec![Role {
        metadata: meta(listener, params, rbac_name(&name), Some(ns))?,
        rules: Some(vec![rule("", "secrets", None)]),
    }];
    let role_bindings = vec![RoleBinding {
        metadata: meta(listener, params, rbac_name(&name), Some(ns))?,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: rbac_name(&name),
        },
        subjects: Some(vec![subject(&name, params)]),
    }];

    Ok(Desired {
        service_account,
        cluster_role,
        cluster_role_binding,
        roles,
        role_bindings,
        daemon_set: daemon_set(listener, &config, params, pod)?,
        service: service(listener, params)?,
        socket_hash: socket_hash(&config),
        keys_secret: keys_secret(listener, params, Vec::new())?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::Http3ListenerSpec;

    pub(crate) fn listener(name: &str, spec: serde_json::Value) -> Http3Listener {
        let spec: Http3ListenerSpec = serde_json::from_value(spec).unwrap();
        let mut l = Http3Listener::new(name, spec);
        l.metadata.uid = Some(format!("uid-{name}"));
        l.metadata.generation = Some(1);
        l
    }

    fn params() -> Params {
        Params {
            namespace: "h3-system".into(),
            default_image: "ghcr.io/h3-ingress/h3-ingress:0.1.0".into(),
            hosts_namespace: "h3-system-hosts".into(),
        }
    }

    fn base() -> serde_json::Value {
        serde_json::json!({"upstream": {"address": "ingress-nginx-controller.ingress-nginx:443"}})
    }

    fn pod(ds: &DaemonSet) -> &PodSpec {
        ds.spec.template.spec.as_ref().unwrap()
    }

    #[test]
    fn default_daemon_set_is_host_network_locked_down_and_runs_as_root_for_port_443() {
        let l = listener("public", base());
        let d = desired(&l, &params(), &PodDefaults::default()).unwrap();
        let ds = &d.daemon_set;
        assert_eq!(ds.metadata.name.as_deref(), Some("h3-ingress-public"));
        assert_eq!(ds.metadata.namespace.as_deref(), Some("h3-system"));
        let p = pod(ds);
        assert_eq!(p.host_network, Some(true));
        assert_eq!(p.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
        assert_eq!(p.service_account_name.as_deref(), Some("h3-ingress-public"));
        assert_eq!(p.termination_grace_period_seconds, Some(30 + 15));
        assert!(p.init_containers.is_none(), "buffer tuning is opt-in");
        assert_eq!(
            p.security_context
                .as_ref()
                .unwrap()
                .seccomp_profile
                .as_ref()
                .unwrap()
                .type_,
            "RuntimeDefault"
        );
        let c = &p.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some("ghcr.io/h3-ingress/h3-ingress:0.1.0")
        );
        assert_eq!(
            c.args.as_ref().unwrap()[..3],
            ["proxy", "--listener", "public"]
        );
        // No container port: under hostNetwork it would be a host port to the scheduler and
        // keep the rollout's surge pod off the node.
        assert_eq!(c.ports, None);
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_ref().unwrap(), &["ALL"]);
        assert_eq!(caps.add.as_ref().unwrap(), &["NET_BIND_SERVICE"]);
        // Port 443 needs NET_BIND_SERVICE in the effective set, which only root gets.
        assert_eq!(sc.run_as_user, Some(DATA_PLANE_UID));
        assert_eq!(sc.run_as_non_root, Some(false));
        let exec = |p: &Option<Probe>| {
            let p = p.as_ref().unwrap();
            (
                p.exec.as_ref().unwrap().command.clone().unwrap(),
                p.period_seconds.unwrap() * p.failure_threshold.unwrap(),
            )
        };
        let cmd = |check: &str| vec!["/h3-ingress".to_string(), "probe".into(), check.into()];
        assert_eq!(exec(&c.liveness_probe), (cmd("live"), 30));
        // A hung process is killed after a short grace, not the pod's drain grace.
        let live_grace = c.liveness_probe.as_ref().unwrap();
        assert_eq!(live_grace.termination_grace_period_seconds, Some(5));
        assert_eq!(exec(&c.readiness_probe), (cmd("ready"), 4));
        // Five minutes to load every host before the kubelet gives up.
        assert_eq!(exec(&c.startup_probe), (cmd("startup"), 300));
        let env: Vec<_> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(
            env,
            [
                "NODE_NAME",
                "POD_NAME",
                "POD_NAMESPACE",
                "H3_INGRESS_ROLLOUT_RANK"
            ]
        );
        let rank = &c.env.as_ref().unwrap()[3];
        let field = rank
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            field.field_path,
            "metadata.labels['pod-template-generation']"
        );
        let strategy = ds.spec.update_strategy.as_ref().unwrap();
        let ru = strategy.rolling_update.as_ref().unwrap();
        assert_eq!(ru.max_surge, Some(IntOrString::String("10%".into())));
        assert_eq!(ru.max_unavailable, Some(IntOrString::Int(0)));
        // The kubelet waits for the whole drain before it kills the old pod.
        assert!(p.termination_grace_period_seconds.unwrap() >= 30);
    }

    #[test]
    fn one_uid_whatever_the_port_and_force_buffers_with_only_the_capabilities_needed() {
        let security = |spec: &serde_json::Value| {
            let d = desired(
                &listener("alt", spec.clone()),
                &params(),
                &PodDefaults::default(),
            );
            pod(&d.unwrap().daemon_set).containers[0]
                .security_context
                .clone()
                .unwrap()
        };
        let caps = |sc: &SecurityContext| sc.capabilities.clone().unwrap().add.unwrap_or_default();
        let mut spec = base();
        spec["port"] = 8443.into();
        let plain = security(&spec);
        spec["socket"] = serde_json::json!({"forceBuffers": true});
        let forced = security(&spec);
        // The roll between the two hands the port over within one SO_REUSEPORT group, which
        // the kernel allows only under one uid.
        for sc in [&plain, &forced] {
            assert_eq!((sc.run_as_user, sc.run_as_group), (Some(0), Some(0)));
            assert_eq!(sc.run_as_non_root, Some(false));
            assert_eq!(sc.capabilities.clone().unwrap().drop.unwrap(), ["ALL"]);
            assert_eq!(sc.allow_privilege_escalation, Some(false));
        }
        assert!(caps(&plain).is_empty(), "{:?}", caps(&plain));
        assert_eq!(caps(&forced), ["NET_ADMIN"]);
        spec["port"] = 443.into();
        assert_eq!(caps(&security(&spec)), ["NET_BIND_SERVICE", "NET_ADMIN"]);
        spec["port"] = 8443.into();
        spec["socket"] = serde_json::json!({});
        spec["metrics"] = serde_json::json!({"address": "0.0.0.0:947"});
        assert_eq!(caps(&security(&spec)), ["NET_BIND_SERVICE"]);
    }

    #[test]
    fn the_keys_secret_is_immutable_owned_and_mounted_read_only() {
        let l = listener("k", base());
        let d = desired(&l, &params(), &PodDefaults::default()).unwrap();
        let s = &d.keys_secret;
        assert_eq!(s.metadata.name.as_deref(), Some("h3-ingress-keys-k"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("h3-system"));
        assert_eq!(s.immutable, Some(true));
        assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].name, "k");
        // Data comes from the controller, at creation only.
        assert!(s.data.as_ref().unwrap()[KEYS_SECRET_KEY].0.is_empty());
        let p = pod(&d.daemon_set);
        let c = &p.containers[0];
        let args = c.args.as_ref().unwrap();
        assert_eq!(args[3..5], ["--keys-file", "/etc/h3-ingress/keys/key"]);
        let mount = &c.volume_mounts.as_ref().unwrap()[1];
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (KEYS_MOUNT_PATH, Some(true))
        );
        let volume = &p.volumes.as_ref().unwrap()[1];
        let secret = volume.secret.as_ref().unwrap();
        assert_eq!(volume.name, mount.name);
        assert_eq!(secret.secret_name.as_deref(), Some("h3-ingress-keys-k"));
        assert_eq!(secret.default_mode, Some(0o440));
        // Group-readable for the image's non-root group, which fsGroup gives the files.
        let fs_group = p.security_context.as_ref().unwrap().fs_group;
        assert_eq!(fs_group, Some(NON_ROOT_UID));
    }

    #[test]
    fn data_plane_memory_limit_follows_the_request_budget() {
        let memory = |spec: serde_json::Value| {
            let d = desired(&listener("m", spec), &params(), &PodDefaults::default()).unwrap();
            let r = pod(&d.daemon_set).containers[0].resources.clone().unwrap();
            r.limits.unwrap()["memory"].0.clone()
        };
        // 64 MiB default budget + 4096 connections x 64 KiB + 192 MiB overhead.
        assert_eq!(memory(base()), "512Mi");
        let mut spec = base();
        spec["limits"] = serde_json::json!({"bufferedRequestBytes": 134217728});
        assert_eq!(memory(spec.clone()), "576Mi");
        spec["limits"]["connections"] = 1024.into();
        assert_eq!(memory(spec), "384Mi");
        // The listener's own limit wins; its requests are kept.
        let mut spec = base();
        spec["resources"] =
            serde_json::json!({"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}});
        assert_eq!(memory(spec), "1Gi");
    }

    #[test]
    fn everything_on_listener_places_pods_and_tunes_buffers() {
        let mut spec = base();
        spec["image"] = "registry.local/h3:dev".into();
        spec["tuneNodeBufferLimits"] = true.into();
        spec["nodeSelector"] = serde_json::json!({"node-role.kubernetes.io/ingress": ""});
        spec["tolerations"] =
            serde_json::json!([{"key": "ingress", "operator": "Exists", "effect": "NoSchedule"}]);
        spec["resources"] = serde_json::json!({"limits": {"memory": "512Mi"}});
        spec["socket"] = serde_json::json!({"receiveBufferBytes": 16777216});
        spec["metrics"] = serde_json::json!({"address": "127.0.0.1:9476"});
        spec["http"] = serde_json::json!({"drainTimeoutSeconds": 120});
        let d = desired(&listener("all", spec), &params(), &PodDefaults::default()).unwrap();
        let p = pod(&d.daemon_set);
        assert_eq!(
            p.containers[0].image.as_deref(),
            Some("registry.local/h3:dev")
        );
        assert_eq!(
            p.node_selector.as_ref().unwrap(),
            &[
                ("kubernetes.io/os".to_string(), "linux".to_string()),
                ("node-role.kubernetes.io/ingress".to_string(), String::new())
            ]
            .into_iter()
            .collect::<BTreeMap<_, _>>()
        );
        assert_eq!(
            p.tolerations.as_ref().unwrap()[0].key.as_deref(),
            Some("ingress")
        );
        assert_eq!(p.termination_grace_period_seconds, Some(135));
        assert_eq!(
            p.containers[0]
                .resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()["memory"]
                .0,
            "512Mi"
        );
        let init = &p.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.security_context.as_ref().unwrap().privileged,
            Some(true)
        );
        let script = &init.command.as_ref().unwrap()[2];
        // The larger of the recommendation and the request, never lowered.
        assert!(script.contains("raise rmem_max 16777216"), "{script}");
        assert!(script.contains("raise wmem_max 7500000"), "{script}");
        assert!(script.contains("-lt"), "{script}");
        // Probes ask the process itself, wherever its metrics endpoint is bound.
        let live = p.containers[0].liveness_probe.as_ref().unwrap();
        assert!(live.http_get.is_none() && live.exec.is_some());
    }

    #[test]
    fn the_tune_script_really_raises_and_never_lowers() {
        // Runs the generated script against a fake /proc/sys tree with a real shell.
        let dir = tempfile::tempdir().unwrap();
        let core = dir.path().join("proc/sys/net/core");
        std::fs::create_dir_all(&core).unwrap();
        std::fs::write(core.join("rmem_max"), "212992\n").unwrap();
        std::fs::write(core.join("wmem_max"), "9000000\n").unwrap();
        let c = validate(&listener("x", base())).unwrap();
        let script =
            tune_script(&c).replace("/proc/sys", &dir.path().join("proc/sys").to_string_lossy());
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read = |k: &str| {
            std::fs::read_to_string(core.join(k))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(read("rmem_max"), "7500000");
        assert_eq!(read("wmem_max"), "9000000");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("net.core.rmem_max: 212992 -> 7500000"),
            "{stdout}"
        );
        assert!(stdout.contains("kept"), "{stdout}");
    }

    #[test]
    fn socket_hash_changes_exactly_when_a_restart_is_required() {
        let base_l = listener("h", base());
        let base_c = validate(&base_l).unwrap();
        let mutations: Vec<(&str, serde_json::Value)> = vec![
            ("port", serde_json::json!(8443)),
            ("addresses", serde_json::json!({"ipv6": null})),
            ("addresses", serde_json::json!({"ipv4": "10.0.0.1"})),
            ("socket", serde_json::json!({"receiveBufferBytes": 212992})),
            ("socket", serde_json::json!({"sendBufferBytes": 212992})),
            ("socket", serde_json::json!({"forceBuffers": true})),
            ("metrics", serde_json::json!({"address": "0.0.0.0:9999"})),
            // Live changes:
            ("transport", serde_json::json!({"congestionControl": "bbr"})),
            ("upstream", serde_json::json!({"address": "other:443"})),
            ("altSvc", serde_json::json!({"maxAgeSeconds": 60})),
            (
                "hosts",
                serde_json::json!([{"name": "a.example.com", "secretRef": {"namespace": "n", "name": "s"}}]),
            ),
        ];
        for (field, value) in mutations {
            let mut spec = base();
            spec[field] = value.clone();
            let c = validate(&listener("h", spec)).unwrap();
            let restart = !base_c.restart_required_changes(&c).is_empty();
            let rolled = socket_hash(&base_c) != socket_hash(&c);
            assert_eq!(restart, rolled, "{field}: {value}");
        }
        // And the hash lands in the pod template.
        let d = desired(&base_l, &params(), &PodDefaults::default()).unwrap();
        let ann = d
            .daemon_set
            .spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap();
        assert_eq!(ann[SOCKET_HASH_ANNOTATION], socket_hash(&base_c));
        // The metrics port, for the chart's PodMonitor (no container port declares it).
        assert_eq!(ann[METRICS_PORT_ANNOTATION], "9476");
        let mut spec = base();
        spec["metrics"] = serde_json::json!({"address": "0.0.0.0:9600"});
        let d = desired(&listener("h", spec), &params(), &PodDefaults::default()).unwrap();
        let ann = d.daemon_set.spec.template.metadata.unwrap().annotations;
        assert_eq!(ann.unwrap()[METRICS_PORT_ANNOTATION], "9600");
    }

    #[test]
    fn rbac_is_read_only_its_listener_and_the_hosts_namespace() {
        let l = listener("public", base());
        let d = desired(&l, &params(), &PodDefaults::default()).unwrap();
        let cr_rules = d.cluster_role.rules.as_ref().unwrap();
        assert_eq!(cr_rules.len(), 1, "{cr_rules:?}");
        assert_eq!(cr_rules[0].resources.as_ref().unwrap(), &["http3listeners"]);
        assert_eq!(cr_rules[0].resource_names.as_ref().unwrap(), &["public"]);
        assert_eq!(d.roles.len(), 1);
        let role = &d.roles[0];
        assert_eq!(role.metadata.namespace.as_deref(), Some("h3-system-hosts"));
        let rules = role.rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources.as_ref().unwrap(), &["secrets"]);
        for r in cr_rules.iter().chain(rules) {
            assert_eq!(r.verbs, ["get", "list", "watch"], "{r:?}");
        }
        assert_eq!(d.role_bindings.len(), 1);
        let sub = &d.role_bindings[0].subjects.as_ref().unwrap()[0];
        assert_eq!(
            (sub.name.as_str(), sub.namespace.as_deref()),
            ("h3-ingress-public", Some("h3-system"))
        );
        // Cluster-scoped: named after the operator's namespace too, as two installations of
        // the operator may both have made one for the listener (a hand-over).
        assert_eq!(
            d.cluster_role_binding.role_ref.name,
            "h3-system.h3-ingress-data-plane-public"
        );
        assert_eq!(
            (
                d.cluster_role.metadata.name.as_deref(),
                d.cluster_role_binding.metadata.name.as_deref()
            ),
            (
                Some("h3-system.h3-ingress-data-plane-public"),
                Some("h3-system.h3-ingress-data-plane-public")
            )
        );
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("h3-ingress-data-plane-public")
        );
        let args = pod(&d.daemon_set).containers[0].args.clone().unwrap();
        let at = args.iter().position(|a| a == "--hosts-namespace").unwrap();
        assert_eq!(args[at + 1], "h3-system-hosts");
    }

    #[test]
    fn everything_is_owned_by_the_listener_and_labelled() {
        let mut spec = base();
        spec["service"] = serde_json::json!({});
        let l = listener("public", spec);
        let d = desired(&l, &params(), &PodDefaults::default()).unwrap();
        let metas = [
            &d.service_account.metadata,
            &d.service.as_ref().unwrap().metadata,
            &d.cluster_role.metadata,
            &d.cluster_role_binding.metadata,
            &d.roles[0].metadata,
            &d.role_bindings[0].metadata,
            &d.daemon_set.metadata,
        ];
        for m in metas {
            let o = &m.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
                ("Http3Listener", "public", "uid-public")
            );
            assert_eq!(o.api_version, "h3-ingress.dev/v1alpha1");
            assert_eq!(o.controller, Some(true));
            let labels = m.labels.as_ref().unwrap();
            assert_eq!(labels["app.kubernetes.io/name"], "h3-ingress");
            assert_eq!(labels["app.kubernetes.io/component"], "data-plane");
            assert_eq!(labels["app.kubernetes.io/instance"], "public");
            assert_eq!(
                labels["app.kubernetes.io/managed-by"],
                "h3-ingress-operator"
            );
            // Which operator made it: the one whose namespace this is prunes it, no other.
            assert_eq!(labels["h3-ingress.dev/operator-namespace"], "h3-system");
        }
        assert_eq!(
            label_selector("public"),
            "app.kubernetes.io/component=data-plane,app.kubernetes.io/instance=public,app.kubernetes.io/name=h3-ingress"
        );
    }

    #[test]
    fn invalid_listeners_are_refused_with_the_reason() {
        let mut l = listener("public", base());
        l.spec.upstream.address = "nope".into();
        let e = desired(&l, &params(), &PodDefaults::default()).unwrap_err();
        assert!(e.to_string().starts_with("spec.upstream.address"), "{e}");
        let long = listener(&"x".repeat(64), base());
        assert!(matches!(
            desired(&long, &params(), &PodDefaults::default()),
            Err(BuildError::NameTooLong(_))
        ));
        let mut no_uid = listener("public", base());
        no_uid.metadata.uid = None;
        assert_eq!(
            desired(&no_uid, &params(), &PodDefaults::default()).unwrap_err(),
            BuildError::NoUid
        );
    }

    #[test]
    fn pods_select_linux_nodes_unless_the_user_chose_an_os() {
        let d = desired(&listener("l", base()), &params(), &PodDefaults::default()).unwrap();
        let sel = pod(&d.daemon_set).node_selector.clone().unwrap();
        assert_eq!(sel.len(), 1);
        assert_eq!(sel["kubernetes.io/os"], "linux");
        let mut spec = base();
        spec["nodeSelector"] = serde_json::json!({"kubernetes.io/os": "other", "pool": "edge"});
        let d = desired(&listener("l", spec), &params(), &PodDefaults::default()).unwrap();
        let sel = pod(&d.daemon_set).node_selector.clone().unwrap();
        assert_eq!(
            (sel["kubernetes.io/os"].as_str(), sel["pool"].as_str()),
            ("other", "edge")
        );
    }

    /// The node affinity lists the image's architectures beside the listener's own selector,
    /// which still narrows it; a selector for an architecture not built is refused.
    #[test]
    fn pods_require_a_node_of_an_architecture_the_image_is_built_for() {
        let arch_terms = |d: &Desired| {
            let a = pod(&d.daemon_set).affinity.clone().unwrap();
            let terms = a
                .node_affinity
                .unwrap()
                .required_during_scheduling_ignored_during_execution
                .unwrap()
                .node_selector_terms;
            serde_json::to_value(terms).unwrap()
        };
        let d = desired(&listener("l", base()), &params(), &PodDefaults::default()).unwrap();
        assert_eq!(
            arch_terms(&d),
            serde_json::json!([{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}]}])
        );
        let arm_only = PodDefaults {
            architectures: vec!["arm64".into()],
            ..Default::default()
        };
        let mut spec = base();
        spec["nodeSelector"] = serde_json::json!({"pool": "edge", "kubernetes.io/arch": "arm64"});
        let d = desired(&listener("l", spec.clone()), &params(), &arm_only).unwrap();
        assert_eq!(
            arch_terms(&d)[0]["matchExpressions"][0]["values"],
            serde_json::json!(["arm64"])
        );
        let sel = pod(&d.daemon_set).node_selector.clone().unwrap();
        assert_eq!(sel["pool"], "edge");
        assert_eq!(sel["kubernetes.io/arch"], "arm64");
        assert_eq!(sel["kubernetes.io/os"], "linux");

        spec["nodeSelector"]["kubernetes.io/arch"] = "amd64".into();
        let e = desired(&listener("l", spec), &params(), &arm_only).unwrap_err();
        assert!(
            matches!(e, BuildError::InvalidField(_))
                && e.to_string()
                    .starts_with("spec.nodeSelector: kubernetes.io/arch=amd64, but")
                && e.to_string().contains("built for arm64 only"),
            "{e}"
        );
    }

    #[test]
    fn pull_secrets_reach_the_service_account_and_the_pods_and_the_tune_image_is_chosen() {
        let mut spec = base();
        spec["tuneNodeBufferLimits"] = true.into();
        let none = PodDefaults::default();
        let d = desired(&listener("l", spec.clone()), &params(), &none).unwrap();
        assert!(d.service_account.image_pull_secrets.is_none());
        assert!(pod(&d.daemon_set).image_pull_secrets.is_none());
        let init = &pod(&d.daemon_set).init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image.as_deref(), Some(TUNE_IMAGE));

        let pinned = "registry.local/busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let opts = PodDefaults {
            image_pull_secrets: vec!["regcred".into(), "mirror".into()],
            tune_image: pinned.into(),
            priority_class_name: Some("system-node-critical".into()),
            ..Default::default()
        };
        let d = desired(&listener("l", spec.clone()), &params(), &opts).unwrap();
        let names = |v: &Option<Vec<LocalObjectReference>>| {
            v.as_ref()
                .unwrap()
                .iter()
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&d.service_account.image_pull_secrets),
            ["regcred", "mirror"]
        );
        assert_eq!(
            names(&pod(&d.daemon_set).image_pull_secrets),
            ["regcred", "mirror"]
        );
        let init = &pod(&d.daemon_set).init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image.as_deref(), Some(pinned));

        spec["tuneImage"] = "busybox:1.37.0".into();
        let d = desired(&listener("l", spec), &params(), &opts).unwrap();
        let init = &pod(&d.daemon_set).init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image.as_deref(), Some("busybox:1.37.0"), "spec wins");
    }

    #[test]
    fn rollouts_surge_on_a_tenth_of_the_nodes_by_default_and_follow_the_spec() {
        let strategy = |spec: serde_json::Value| {
            let d = desired(&listener("l", spec), &params(), &PodDefaults::default())?;
            let ru = d
                .daemon_set
                .spec
                .update_strategy
                .unwrap()
                .rolling_update
                .unwrap();
            Ok::<_, BuildError>((ru.max_surge.unwrap(), ru.max_unavailable.unwrap()))
        };
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(strategy(base()).unwrap(), (pct("10%"), IntOrString::Int(0)));
        let mut spec = base();
        spec["rollout"] = serde_json::json!({"maxSurge": 2, "maxUnavailable": 1});
        assert_eq!(
            strategy(spec.clone()).unwrap(),
            (IntOrString::Int(2), IntOrString::Int(1))
        );
        // The roll from a release whose sockets cannot be shared: replace, never surge.
        spec["rollout"] = serde_json::json!({"maxSurge": 0, "maxUnavailable": "10%"});
        assert_eq!(
            strategy(spec.clone()).unwrap(),
            (IntOrString::Int(0), pct("10%"))
        );
        spec["rollout"] = serde_json::json!({"maxSurge": "0%"});
        let e = strategy(spec).unwrap_err();
        assert!(e.to_string().contains("cannot both be 0"), "{e}");
    }

    #[test]
    fn pods_that_hold_the_port_alone_are_replaced_without_surging() {
        let l = listener("l", base());
        let mut d = desired(&l, &params(), &PodDefaults::default()).unwrap();
        let labels = d
            .daemon_set
            .spec
            .template
            .metadata
            .clone()
            .unwrap()
            .labels
            .unwrap();
        assert_eq!(labels[HANDOVER_LABEL], HANDOVER_VERSION);
        // The selector does not include it: pods of 0.1.0 still belong to the DaemonSet.
        let selector = d.daemon_set.spec.selector.match_labels.clone().unwrap();
        assert!(!selector.contains_key(HANDOVER_LABEL));
        let template = d.daemon_set.spec.template.clone();
        without_surge(&mut d.daemon_set, &l);
        let ru = d
            .daemon_set
            .spec
            .update_strategy
            .unwrap()
            .rolling_update
            .unwrap();
        assert_eq!(
            (ru.max_surge.unwrap(), ru.max_unavailable.unwrap()),
            (IntOrString::Int(0), IntOrString::String("10%".into()))
        );
        assert_eq!(
            d.daemon_set.spec.template, template,
            "the template is the same"
        );
    }

    #[test]
    fn pods_of_another_uid_or_without_hand_over_are_replaced_without_surge() {
        let running = |uid: Option<i64>, handover: bool, deleted: bool| {
            let mut p = Pod::default();
            if handover {
                p.metadata.labels = Some(
                    [(HANDOVER_LABEL.to_string(), HANDOVER_VERSION.to_string())]
                        .into_iter()
                        .collect(),
                );
            }
            if deleted {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            p.spec = Some(PodSpec {
                containers: vec![Container {
                    name: CONTAINER_NAME.into(),
                    security_context: Some(SecurityContext {
                        run_as_user: uid,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            });
            p
        };
        assert!(!cannot_share_port(&running(Some(0), true, false)));
        assert!(!cannot_share_port(&running(None, true, false)));
        // A high port without forceBuffers ran as 65532 before one uid.
        assert!(cannot_share_port(&running(Some(NON_ROOT_UID), true, false)));
        assert!(cannot_share_port(&running(Some(0), false, false)));
        assert!(!cannot_share_port(&running(Some(NON_ROOT_UID), true, true)));
    }

    #[test]
    fn the_service_carries_udp_on_the_listener_port_to_its_pods_only() {
        let d = desired(
            &listener("public", base()),
            &params(),
            &PodDefaults::default(),
        )
        .unwrap();
        assert!(d.service.is_none(), "no Service unless asked");

        let mut spec = base();
        spec["service"] = serde_json::json!({
            "annotations": {"metallb.universe.tf/allow-shared-ip": "ingress"},
            "loadBalancerIP": "192.0.2.10",
            "loadBalancerClass": "metallb",
            "includeTcp": true,
            "ipFamilyPolicy": "PreferDualStack"
        });
        let d = desired(
            &listener("public", spec),
            &params(),
            &PodDefaults::default(),
        )
        .unwrap();
        let svc = d.service.unwrap();
        assert_eq!(svc.metadata.name.as_deref(), Some("h3-ingress-public"));
        assert_eq!(svc.metadata.namespace.as_deref(), Some("h3-system"));
        assert_eq!(
            svc.metadata.owner_references.as_ref().unwrap()[0].name,
            "public"
        );
        assert_eq!(
            svc.metadata.annotations.as_ref().unwrap()["metallb.universe.tf/allow-shared-ip"],
            "ingress"
        );
        let s = svc.spec.unwrap();
        assert_eq!(s.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(s.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(s.selector.unwrap(), selector_labels("public"));
        assert_eq!(s.load_balancer_ip.as_deref(), Some("192.0.2.10"));
        assert_eq!(s.load_balancer_class.as_deref(), Some("metallb"));
        assert_eq!(s.ip_family_policy.as_deref(), Some("PreferDualStack"));
        assert_eq!(s.allocate_load_balancer_node_ports, Some(true));
        let ports: Vec<_> = s
            .ports
            .unwrap()
            .into_iter()
            .map(|p| {
                (
                    p.name.unwrap(),
                    p.protocol.unwrap(),
                    p.port,
                    p.target_port.unwrap(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                (
                    "quic".to_string(),
                    "UDP".to_string(),
                    443,
                    IntOrString::Int(443)
                ),
                (
                    "https".to_string(),
                    "TCP".to_string(),
                    443,
                    IntOrString::Int(443)
                ),
            ]
        );

        let mut spec = base();
        spec["port"] = 8443.into();
        spec["service"] = serde_json::json!({"type": "NodePort", "nodePort": 30443, "externalTrafficPolicy": "Cluster"});
        let d = desired(
            &listener("np", spec.clone()),
            &params(),
            &PodDefaults::default(),
        )
        .unwrap();
        let s = d.service.unwrap().spec.unwrap();
        assert_eq!(s.type_.as_deref(), Some("NodePort"));
        assert_eq!(s.external_traffic_policy.as_deref(), Some("Cluster"));
        assert_eq!(s.allocate_load_balancer_node_ports, None);
        let p = &s.ports.unwrap()[0];
        assert_eq!((p.port, p.node_port), (8443, Some(30443)));

        spec["service"]["loadBalancerIP"] = "192.0.2.10".into();
        let e = desired(&listener("np", spec), &params(), &PodDefaults::default()).unwrap_err();
        assert!(
            e.to_string().contains("need service.type: LoadBalancer"),
            "{e}"
        );
    }
}
