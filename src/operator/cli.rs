//! The command line of `h3-ingress operator`: flags, their environment variables (which the
//! chart sets) and their defaults, turned into [`Options`].

use std::net::SocketAddr;

use super::placement;
use super::resources::{PodDefaults, TUNE_IMAGE};
use super::run::Options;

/// Port of the operator's `/healthz`, `/readyz` and `/metrics` (the chart's
/// `operator.adminPort`).
pub const ADMIN_PORT: u16 = 9477;

#[derive(clap::Args, Debug, Clone)]
pub struct OperatorArgs {
    /// Namespace of the data-plane DaemonSets, ServiceAccounts, Services and the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "h3-ingress")]
    pub namespace: String,
    /// Elect a leader through a Lease so several replicas are safe (the default).
    #[arg(long, overrides_with = "no_leader_election")]
    pub leader_election: bool,
    /// Act as leader unconditionally (one replica only).
    #[arg(long)]
    pub no_leader_election: bool,
    #[arg(long, default_value = "h3-ingress-operator")]
    pub lease_name: String,
    /// Apply this binary's Http3Listener CRD (server-side) when the served one is older; never
    /// over a newer one (the default).
    #[arg(long, overrides_with = "no_crd_upgrade")]
    pub crd_upgrade: bool,
    /// Leave the CRD alone (it is still checked, and an older one reported on every listener).
    #[arg(long)]
    pub no_crd_upgrade: bool,
    /// Data plane image for listeners without spec.image.
    #[arg(long, env = "H3_INGRESS_IMAGE", default_value = super::DEFAULT_IMAGE)]
    pub data_plane_image: String,
    /// Image pull Secrets (in --namespace) for the data plane's ServiceAccount and pods,
    /// comma-separated.
    #[arg(
        long,
        env = "H3_INGRESS_IMAGE_PULL_SECRETS",
        value_delimiter = ',',
        default_value = ""
    )]
    pub image_pull_secrets: Vec<String>,
    /// Image of the privileged init container of listeners with tuneNodeBufferLimits and
    /// without spec.tuneImage (needs sh; pin it by digest where tags may move).
    #[arg(long, env = "H3_INGRESS_TUNE_IMAGE", default_value = TUNE_IMAGE)]
    pub tune_image: String,
    /// The namespace of the certificate mirrors the data plane reads (it must exist and hold
    /// nothing else; the chart creates it). Default: `<namespace>-hosts`.
    #[arg(long, env = "H3_INGRESS_HOSTS_NAMESPACE")]
    pub hosts_namespace: Option<String>,
    /// priorityClassName of every data plane pod (the chart's `dataPlane.priorityClassName`).
    #[arg(long, env = "H3_INGRESS_DATA_PLANE_PRIORITY_CLASS")]
    pub data_plane_priority_class: Option<String>,
    /// The listeners this operator runs: those whose spec.controllerName is this name (a DNS
    /// name, '/', a path). Give each operator of a cluster its own (the chart's controllerName).
    #[arg(
        long,
        env = "H3_INGRESS_CONTROLLER_NAME",
        default_value = crate::api::DEFAULT_CONTROLLER_NAME,
        value_parser = parse_controller_name
    )]
    pub controller_name: String,
    /// The kubernetes.io/arch values the data plane image is built for, comma-separated: its
    /// pods go only to nodes of these (the chart's `image.architectures`). Narrow it for an
    /// image built for fewer.
    #[arg(
        long,
        env = "H3_INGRESS_ARCHITECTURES",
        value_delimiter = ',',
        value_parser = placement::parse_architecture,
        default_values_t = placement::default_architectures()
    )]
    pub architectures: Vec<String>,
    /// Serves /healthz, /readyz and /metrics. `[::]` answers on IPv4 and IPv6, and falls back
    /// to 0.0.0.0 on a host without IPv6.
    #[arg(long, default_value_t = crate::config::bind::any_address(ADMIN_PORT))]
    pub admin_address: SocketAddr,
}

fn parse_controller_name(s: &str) -> Result<String, String> {
    match crate::api::controller_name_error(s) {
        None => Ok(s.to_string()),
        Some(e) => Err(e),
    }
}

impl OperatorArgs {
    /// What goes into every data plane pod besides the listener's spec.
    pub fn pod_defaults(&self) -> PodDefaults {
        PodDefaults {
            image_pull_secrets: self
                .image_pull_secrets
                .iter()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            tune_image: self.tune_image.clone(),
            priority_class_name: self
                .data_plane_priority_class
                .clone()
                .filter(|s| !s.trim().is_empty()),
            architectures: self.architectures.clone(),
        }
    }

    /// `--hosts-namespace`, or `<namespace>-hosts`.
    pub fn hosts_namespace(&self) -> String {
        self.hosts_namespace
            .clone()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| format!("{}-hosts", self.namespace))
    }

    pub fn options(&self) -> Options {
        Options {
            namespace: self.namespace.clone(),
            leader_election: !self.no_leader_election,
            lease_name: self.lease_name.clone(),
            data_plane_image: self.data_plane_image.clone(),
            hosts_namespace: self.hosts_namespace(),
            admin_address: self.admin_address,
            pod_defaults: self.pod_defaults(),
            crd_upgrade: !self.no_crd_upgrade,
            controller_name: self.controller_name.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    fn parse(args: &[&str]) -> OperatorArgs {
        Cli::try_parse_from(std::iter::once("operator").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn defaults_and_flags() {
        // The chart sets these through the environment; none is set in tests.
        for var in [
            "POD_NAMESPACE",
            "H3_INGRESS_IMAGE",
            "H3_INGRESS_IMAGE_PULL_SECRETS",
            "H3_INGRESS_TUNE_IMAGE",
            "H3_INGRESS_HOSTS_NAMESPACE",
            "H3_INGRESS_DATA_PLANE_PRIORITY_CLASS",
            "H3_INGRESS_CONTROLLER_NAME",
            "H3_INGRESS_ARCHITECTURES",
        ] {
            assert!(
                std::env::var_os(var).is_none(),
                "{var} set in the test environment"
            );
        }
        let a = parse(&[]);
        assert_eq!(a.admin_address.to_string(), "[::]:9477");
        assert_eq!(a.pod_defaults(), PodDefaults::default());
        assert_eq!(a.options().data_plane_image, super::super::DEFAULT_IMAGE);
        assert!(a.options().leader_election);
        assert_eq!(a.options().hosts_namespace, "h3-ingress-hosts");
        assert!(
            a.options().crd_upgrade,
            "upgrading an older CRD is the default"
        );
        assert!(!parse(&["--no-crd-upgrade"]).options().crd_upgrade);
        assert_eq!(
            a.options().controller_name,
            crate::api::DEFAULT_CONTROLLER_NAME
        );
        let named = parse(&["--controller-name", "example.com/staging"]);
        assert_eq!(named.options().controller_name, "example.com/staging");
        for bad in [
            "staging",
            "Example.com/x",
            "example.com/",
            "-a.b/c",
            "a..b/c",
            "a.b/c d",
        ] {
            let flag = format!("--controller-name={bad}");
            let e = Cli::try_parse_from(["operator", flag.as_str()])
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(e.to_string().contains("controller name"), "{bad}: {e}");
        }
        assert!(
            parse(&["--no-crd-upgrade", "--crd-upgrade"])
                .options()
                .crd_upgrade
        );

        let a = parse(&[
            "--image-pull-secrets",
            "regcred, mirror",
            "--tune-image",
            "busybox@sha256:0123",
            "--no-leader-election",
            "--admin-address",
            "0.0.0.0:9000",
            "--hosts-namespace",
            "certs",
            "--data-plane-priority-class",
            "system-node-critical",
            "--architectures",
            "arm64",
        ]);
        assert_eq!(
            a.pod_defaults(),
            PodDefaults {
                image_pull_secrets: vec!["regcred".into(), "mirror".into()],
                tune_image: "busybox@sha256:0123".into(),
                priority_class_name: Some("system-node-critical".into()),
                architectures: vec!["arm64".into()],
            }
        );
        assert!(!a.options().leader_election);
        assert_eq!(a.options().hosts_namespace, "certs");
        assert_eq!(a.options().pod_defaults, a.pod_defaults());
        assert_eq!(a.options().admin_address.to_string(), "0.0.0.0:9000");
        assert_eq!(
            parse(&["--architectures", "amd64, arm64"]).architectures,
            ["amd64", "arm64"]
        );
        for bad in ["", "amd64,", "arm64/v8"] {
            let e = Cli::try_parse_from(["operator", "--architectures", bad]).err();
            let e = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("kubernetes.io/arch value"), "{bad:?}: {e}");
        }
    }
}
