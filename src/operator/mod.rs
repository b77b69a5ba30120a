//! The Kubernetes operator: turns `Http3Listener`s into data-plane DaemonSets and status.
//! (The data plane's own watch of its listener is [`crate::proxy::source::kube`].)
//!
//! Pure builders ([`resources`], [`status`], [`events`]) are kept apart from the thin I/O
//! shells that talk to the API server.

pub mod advertise;
pub mod apply;
pub mod cli;
pub mod conflicts;
pub mod context;
pub mod controller;
pub mod crd;
pub mod events;
pub mod hosts;
pub mod leader;
pub mod metrics;
pub mod mirrors;
pub mod podstate;
pub mod render;
pub mod reports;
pub mod resources;
pub mod run;
pub mod secrets;
pub mod status;
pub mod text;
pub mod triggers;
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

/// The image repository, written once for [`IMAGE_REPOSITORY`] and [`DEFAULT_IMAGE`] (a macro,
/// because `concat!` takes only literals).
macro_rules! image_repository {
    () => {
        "ghcr.io/h3-ingress/h3-ingress"
    };
}

/// Repository of the project's image; the chart's `image.repository` default is the same (a
/// test holds them, the chart's appVersion and the Dockerfile's documented tag together).
pub const IMAGE_REPOSITORY: &str = image_repository!();

/// Data plane image when neither `spec.image` nor `--data-plane-image` says otherwise: the
/// repository at this crate's version, which is the chart's appVersion.
pub const DEFAULT_IMAGE: &str = concat!(image_repository!(), ":", env!("CARGO_PKG_VERSION"));

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_file(path: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn yaml(path: &str) -> serde_json::Value {
        serde_norway::from_str(&repo_file(path)).unwrap()
    }

    /// One default image: Cargo's version = the chart's appVersion = DEFAULT_IMAGE's tag, one
    /// repository in the chart's values and here, and the Dockerfile documents that reference.
    #[test]
    fn the_default_image_is_one_reference_everywhere() {
        let version = env!("CARGO_PKG_VERSION");
        let chart = yaml("charts/h3-ingress/Chart.yaml");
        assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
        let values = yaml("charts/h3-ingress/values.yaml");
        assert_eq!(values["image"]["repository"], IMAGE_REPOSITORY);
        assert_eq!(values["image"]["tag"], "", "the tag defaults to appVersion");
        assert_eq!(DEFAULT_IMAGE, format!("{IMAGE_REPOSITORY}:{version}"));
        let dockerfile = repo_file("Dockerfile");
        assert!(
            dockerfile.contains(&format!("docker build -t {DEFAULT_IMAGE} ")),
            "the Dockerfile's documented build command must tag {DEFAULT_IMAGE}"
        );
        assert!(
            dockerfile.contains(&format!("--build-arg VERSION={version} ")),
            "the Dockerfile's documented VERSION"
        );
        assert!(dockerfile.contains(&format!("ARG VERSION={version}\n")));
        // The rendered install without Helm runs it too.
        let deploy = repo_file("deploy/operator.yaml");
        assert!(
            deploy.contains(&format!("image: {DEFAULT_IMAGE}\n")),
            "deploy/operator.yaml"
        );
    }
}
