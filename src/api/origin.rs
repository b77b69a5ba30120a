//! Where a host came from, one type for every place that says it: the listener's status, the
//! data plane's report, the operator's resolved hosts and its events. On the wire its four
//! fields sit flat in the host's entry (`ingress`, `httpRoute`, `gateway`, `gatewayListener`),
//! as they always have.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// The Ingress that asked for the host; or the HTTPRoute (none when the Gateway itself is
// annotated) and the Gateway listener it comes through; or none of them (`spec.hosts`, the
// standalone file). (Not a doc comment: flattened into the status's host entry, a schema
// description would become that entry's description in the CRD.)
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Default, Hash,
)]
#[serde(rename_all = "camelCase")]
pub struct HostOrigin {
    /// `namespace/name` of the Ingress that asked for this host, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<String>,
    /// `namespace/name` of the HTTPRoute that asked for this host (Gateway API), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_route: Option<String>,
    /// `namespace/name` of the Gateway whose listener this host comes through, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The name of that Gateway listener (its `sectionName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_listener: Option<String>,
}

impl HostOrigin {
    pub fn ingress(key: impl Into<String>) -> Self {
        Self {
            ingress: Some(key.into()),
            ..Self::default()
        }
    }

    /// A Gateway API host: through `gateway`'s listener `listener`, asked for by `http_route`
    /// (none when the Gateway itself is annotated).
    pub fn gateway(http_route: Option<String>, gateway: String, listener: String) -> Self {
        Self {
            ingress: None,
            http_route,
            gateway: Some(gateway),
            gateway_listener: Some(listener),
        }
    }

    /// As people read it: `Ingress ns/name`, `HTTPRoute ns/name, Gateway ns/name listener L`,
    /// `Gateway ns/name listener L`, or `spec.hosts`.
    pub fn text(&self) -> String {
        let gateway = || {
            format!(
                "Gateway {} listener {}",
                self.gateway.as_deref().unwrap_or("-"),
                self.gateway_listener.as_deref().unwrap_or("-")
            )
        };
        match (&self.ingress, &self.http_route, &self.gateway) {
            (Some(i), _, _) => format!("Ingress {i}"),
            (None, Some(r), _) => format!("HTTPRoute {r}, {}", gateway()),
            (None, None, Some(_)) => gateway(),
            (None, None, None) => "spec.hosts".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_origin_reads_as_people_say_it_and_sits_flat_on_the_wire() {
        let route = HostOrigin::gateway(Some("apps/web".into()), "infra/gw".into(), "https".into());
        assert_eq!(
            route.text(),
            "HTTPRoute apps/web, Gateway infra/gw listener https"
        );
        let gw = HostOrigin::gateway(None, "infra/gw".into(), "https".into());
        assert_eq!(gw.text(), "Gateway infra/gw listener https");
        assert_eq!(HostOrigin::ingress("shop/web").text(), "Ingress shop/web");
        assert_eq!(HostOrigin::default().text(), "spec.hosts");
        let v = serde_json::to_value(&route).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"httpRoute": "apps/web", "gateway": "infra/gw", "gatewayListener": "https"})
        );
        assert_eq!(
            serde_json::to_value(HostOrigin::default()).unwrap(),
            serde_json::json!({})
        );
    }
}
