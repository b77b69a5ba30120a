//! The Kubernetes side: the operator that turns `Http3Listener`s into data-plane DaemonSets and
//! status, and the data plane's own watch of its listener.
//!
//! Pure builders ([`resources`], [`status`], [`events`]) are kept apart from the thin I/O
//! shells that talk to the API server.

pub mod admin;
pub mod apply;
pub mod conflicts;
pub mod controller;
pub mod dataplane;
pub mod events;
pub mod leader;
pub mod render;
pub mod reports;
pub mod resources;
pub mod status;
pub mod watches;

/// Labels on everything the operator makes: the Kubernetes recommended labels. The chart's
/// PodMonitor selects data plane pods by `component`, and `kubectl h3-ingress check` finds
/// them through [`resources::label_selector`], so a change here must go there too.
pub mod labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const NAME_VALUE: &str = "h3-ingress";
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    pub const COMPONENT_DATA_PLANE: &str = "data-plane";
    pub const COMPONENT_OPERATOR: &str = "operator";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const MANAGED_BY_VALUE: &str = "h3-ingress-operator";
}

/// The one server-side-apply field manager of the operator.
pub const FIELD_MANAGER: &str = "h3-ingress-operator";

/// Data plane image when neither `spec.image` nor `--data-plane-image` says otherwise.
pub const DEFAULT_IMAGE: &str =
    concat!("ghcr.io/h3-ingress/h3-ingress:", env!("CARGO_PKG_VERSION"));
