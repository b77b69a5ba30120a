//! Which nodes a data plane pod may run on, besides what the listener selects: Linux nodes of an
//! architecture its image is built for. A pod placed on a node of another architecture never
//! starts (the kernel refuses the binary: `exec format error`), so the DaemonSet requires
//! `kubernetes.io/arch In [...]` (the operator's `--architectures`, by default
//! [`ARCHITECTURES`](super::ARCHITECTURES)), and the listener's status names that rule when no
//! node matches. Pure: no I/O.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};

use super::text;
use crate::api::Http3Listener;

/// The node label the kubelet sets from its own architecture (Go's GOARCH names).
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
/// The longest label value Kubernetes accepts.
const MAX_LABEL_VALUE: usize = 63;
/// At most this many characters of the listener's node selector go into the status.
const MAX_SELECTOR_TEXT: usize = 300;

/// [`ARCHITECTURES`](super::ARCHITECTURES) as the operator's default `--architectures`.
pub fn default_architectures() -> Vec<String> {
    super::ARCHITECTURES.iter().map(|a| a.to_string()).collect()
}

/// One `--architectures` entry: a label value (`amd64`, `arm64`, `ppc64le`, ...), since it goes
/// into a node affinity the API server would refuse otherwise.
pub fn parse_architecture(s: &str) -> Result<String, String> {
    let s = s.trim();
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = !s.is_empty()
        && s.len() <= MAX_LABEL_VALUE
        && edge_ok(s.chars().next())
        && edge_ok(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a {ARCH_LABEL} value (amd64, arm64, ...: letters, digits, '-', '_', '.', \
             at most {MAX_LABEL_VALUE})"
        ))
    }
}

/// The pods' affinity: a node of one of `architectures`. The listener has no affinity of its
/// own (its `nodeSelector` and `tolerations` are separate fields, which the scheduler applies
/// together with this), so there is nothing to merge.
pub fn affinity(architectures: &[String]) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: ARCH_LABEL.into(),
                        operator: "In".into(),
                        values: Some(architectures.to_vec()),
                    }]),
                    match_fields: None,
                }],
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        ..Default::default()
    }
}

/// A listener whose `spec.nodeSelector` asks for an architecture the image is not built for
/// could never run a pod: refused with the field named, before any DaemonSet is made.
pub fn check_node_selector(
    listener: &Http3Listener,
    architectures: &[String],
) -> Result<(), String> {
    match listener.spec.node_selector.get(ARCH_LABEL) {
        Some(arch) if !architectures.contains(arch) => Err(format!(
            "nodeSelector: {ARCH_LABEL}={arch}, but the data plane image is built for {} only \
             (the operator's --architectures, the chart's image.architectures)",
            architectures.join(", ")
        )),
        _ => Ok(()),
    }
}

/// Where the data plane may run, in words, for a status that says why no node runs it.
pub fn describe(listener: &Http3Listener, architectures: &[String]) -> String {
    let arch = match architectures {
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
        [] => "(none)".into(),
    };
    let mut s = format!(
        "a Linux node of architecture {arch} (what the data plane image is built for: the \
         operator's --architectures, the chart's image.architectures)"
    );
    let selector: Vec<String> = (listener.spec.node_selector.iter())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !selector.is_empty() {
        let selector = text::cut(&selector.join(", "), MAX_SELECTOR_TEXT);
        s.push_str(&format!(" with {selector} (spec.nodeSelector)"));
    }
    s.push_str(" whose taints spec.tolerations tolerates");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::resources::tests::listener;

    fn archs(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn architectures_are_label_values() {
        assert_eq!(parse_architecture(" arm64 ").unwrap(), "arm64");
        assert_eq!(parse_architecture("ppc64le").unwrap(), "ppc64le");
        for bad in ["", "-arm", "arm64/v8", "x86 64", &"a".repeat(64)] {
            let e = parse_architecture(bad).unwrap_err();
            assert!(e.contains("kubernetes.io/arch"), "{bad:?}: {e}");
        }
        assert_eq!(default_architectures(), ["amd64", "arm64"]);
    }

    #[test]
    fn the_affinity_requires_one_of_the_architectures() {
        let a = affinity(&archs(&["amd64", "arm64"]));
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}
                ]}]
            }}})
        );
    }

    #[test]
    fn a_node_selector_for_an_architecture_not_built_is_refused() {
        let base = serde_json::json!({"upstream": {"address": "in:443"}});
        let mut spec = base.clone();
        spec["nodeSelector"] = serde_json::json!({"kubernetes.io/arch": "s390x"});
        let e = check_node_selector(&listener("l", spec), &archs(&["amd64", "arm64"]));
        assert_eq!(
            e.unwrap_err(),
            "nodeSelector: kubernetes.io/arch=s390x, but the data plane image is built for \
             amd64, arm64 only (the operator's --architectures, the chart's image.architectures)"
        );
        let mut spec = base.clone();
        spec["nodeSelector"] = serde_json::json!({"kubernetes.io/arch": "arm64"});
        assert!(check_node_selector(&listener("l", spec), &archs(&["amd64", "arm64"])).is_ok());
        assert!(check_node_selector(&listener("l", base), &archs(&["arm64"])).is_ok());
    }

    #[test]
    fn the_description_names_every_rule_and_where_it_is_set() {
        let base = serde_json::json!({"upstream": {"address": "in:443"}});
        let d = describe(&listener("l", base.clone()), &archs(&["arm64"]));
        assert_eq!(
            d,
            "a Linux node of architecture arm64 (what the data plane image is built for: the \
             operator's --architectures, the chart's image.architectures) whose taints \
             spec.tolerations tolerates"
        );
        let mut spec = base;
        spec["nodeSelector"] = serde_json::json!({"pool": "edge", "zone": "a"});
        let d = describe(&listener("l", spec), &archs(&["amd64", "arm64", "riscv64"]));
        assert!(
            d.contains("architecture amd64, arm64 or riscv64 (")
                && d.contains(") with pool=edge, zone=a (spec.nodeSelector) whose taints"),
            "{d}"
        );
        // A user's selector is cut, whatever its size.
        let mut spec = serde_json::json!({"upstream": {"address": "in:443"}});
        spec["nodeSelector"] = serde_json::json!({"pool": "x".repeat(5000)});
        let d = describe(&listener("l", spec), &archs(&["amd64"]));
        assert!(
            d.len() < 600 && d.contains("... (spec.nodeSelector)"),
            "{}",
            d.len()
        );
    }
}
