//! What to tell a user whose TCP ingress does not advertise HTTP/3.
//!
//! Browsers find HTTP/3 only through `Alt-Svc: h3=":PORT"` (or a DNS HTTPS record), and that
//! header has to come from the TCP ingress, which h3-ingress does not control. The data plane
//! sees only that the header is missing and gives the generic advice; the operator also sees
//! the Ingress's annotations, which name the controller, and gives the one line for it.
//! Annotation values are written as YAML double-quoted strings, ready to paste into an Ingress.

use k8s_openapi::api::networking::v1::Ingress;

/// TCP ingress controllers whose Alt-Svc recipe we know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressController {
    /// F5 NGINX Ingress Controller (`nginx.org/*` annotations).
    F5Nginx,
    /// Kubernetes ingress-nginx (`nginx.ingress.kubernetes.io/*`).
    IngressNginx,
    /// HAProxy Kubernetes Ingress Controller (`haproxy.org/*`).
    Haproxy,
    /// Traefik (`traefik.ingress.kubernetes.io/*`).
    Traefik,
}

impl IngressController {
    pub const ALL: [IngressController; 4] = [
        IngressController::F5Nginx,
        IngressController::IngressNginx,
        IngressController::Haproxy,
        IngressController::Traefik,
    ];

    /// The prefix of the annotations that belong to this controller.
    pub fn annotation_prefix(self) -> &'static str {
        match self {
            IngressController::F5Nginx => "nginx.org/",
            IngressController::IngressNginx => "nginx.ingress.kubernetes.io/",
            IngressController::Haproxy => "haproxy.org/",
            IngressController::Traefik => "traefik.ingress.kubernetes.io/",
        }
    }

    /// The controller's name and, where the recipe needs it, the controller setting to enable.
    fn name(self) -> (&'static str, Option<&'static str>) {
        match self {
            IngressController::F5Nginx => ("F5 NGINX Ingress Controller", Some("-enable-snippets")),
            IngressController::IngressNginx => ("ingress-nginx", Some("allow-snippet-annotations")),
            IngressController::Haproxy => ("HAProxy Kubernetes Ingress Controller", None),
            IngressController::Traefik => ("Traefik", None),
        }
    }

    /// What to add so responses carry `Alt-Svc: {value}`.
    fn recipe(self, value: &str) -> String {
        match self {
            IngressController::F5Nginx => annotation(
                "nginx.org/server-snippets",
                &format!("add_header Alt-Svc '{value}' always;"),
            ),
            IngressController::IngressNginx => annotation(
                "nginx.ingress.kubernetes.io/configuration-snippet",
                &format!("more_set_headers 'Alt-Svc: {value}';"),
            ),
            IngressController::Haproxy => annotation(
                "haproxy.org/response-set-header",
                &format!("Alt-Svc '{value}'"),
            ),
            IngressController::Traefik => format!(
                "a Middleware with headers.customResponseHeaders {{Alt-Svc: '{value}'}}, \
                 referenced in traefik.ingress.kubernetes.io/router.middlewares"
            ),
        }
    }
}

/// What to add to an HTTPRoute (Gateway API, any implementation) so responses carry
/// `Alt-Svc: {value}`: a `ResponseHeaderModifier` filter, written as flow-style YAML.
fn route_filter(value: &str) -> String {
    const HEAD: &str =
        "filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: Alt-Svc, value: ";
    const TAIL: &str = "}]}}]";
    [HEAD, &yaml_quoted(value), TAIL].concat()
}

/// How to make a Gateway API gateway advertise HTTP/3 for `host`: a ResponseHeaderModifier
/// filter in each rule of the HTTPRoute (the same for every conformant implementation).
pub fn gateway_advice(host: &str, port: u16, max_age: u32) -> String {
    let value = header_value(port, max_age);
    format!(
        "{MISSING}\":{port}\" for {host}; add to each rule of the HTTPRoute (Gateway API): {}",
        route_filter(&value)
    )
}

/// `key: "value"` with the value as a YAML double-quoted string.
fn annotation(key: &str, value: &str) -> String {
    format!("{key}: {}", yaml_quoted(value))
}

/// `value` as a YAML double-quoted string.
fn yaml_quoted(value: &str) -> String {
    let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// The controller an Ingress is written for, from its annotations (the class name is not
/// enough: both NGINX controllers default to `nginx`). `None` when nothing says.
pub fn controller_of(ing: &Ingress) -> Option<IngressController> {
    let annotations = ing.metadata.annotations.as_ref()?;
    IngressController::ALL.into_iter().find(|c| {
        annotations
            .keys()
            .any(|k| k.starts_with(c.annotation_prefix()))
    })
}

/// The `Alt-Svc` value that advertises HTTP/3 on `port`.
pub fn header_value(port: u16, max_age: u32) -> String {
    format!("h3=\":{port}\"; ma={max_age}")
}

/// The text every advice starts with; [`says_header_missing`] recognises it.
const MISSING: &str = "the TCP ingress does not send Alt-Svc: h3=";

/// Whether a probe message is this module's advice (the header is missing), rather than a
/// probe that failed outright. Empty counts as missing: the probe saw no header.
pub fn says_header_missing(message: &str) -> bool {
    message.is_empty() || message.contains(MISSING)
}

/// How to make the TCP ingress advertise HTTP/3 for `host`: the one line for `controller`,
/// or, when the controller is unknown, the line for each known one and a generic one.
pub fn advice(
    controller: Option<IngressController>,
    host: &str,
    port: u16,
    max_age: u32,
) -> String {
    let value = header_value(port, max_age);
    let missing = format!("{MISSING}\":{port}\" for {host}");
    match controller {
        Some(c) => {
            let (name, needs) = c.name();
            let needs = needs.map(|n| format!(", needs {n}")).unwrap_or_default();
            format!(
                "{missing}; add to the Ingress ({name}{needs}): {}",
                c.recipe(&value)
            )
        }
        None => {
            let each: Vec<String> = IngressController::ALL
                .iter()
                .map(|c| {
                    let (name, needs) = c.name();
                    let needs = needs.map(|n| format!(" (with {n})")).unwrap_or_default();
                    format!("{name}{needs}: {}", c.recipe(&value))
                })
                .collect();
            format!(
                "{missing}, so browsers will not try HTTP/3; add it to that host's responses, \
                 e.g. {}; Gateway API: an HTTPRoute rule with {}; any other server: the \
                 response header Alt-Svc: {value}",
                each.join("; "),
                route_filter(&value)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ing(keys: &[&str]) -> Ingress {
        Ingress {
            metadata: ObjectMeta {
                annotations: Some(
                    keys.iter()
                        .map(|k| (k.to_string(), "x".to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn detects_the_controller_from_annotations() {
        let cases = [
            ("nginx.org/proxy-read-timeout", IngressController::F5Nginx),
            (
                "nginx.ingress.kubernetes.io/ssl-redirect",
                IngressController::IngressNginx,
            ),
            ("haproxy.org/timeout-server", IngressController::Haproxy),
            (
                "traefik.ingress.kubernetes.io/router.tls",
                IngressController::Traefik,
            ),
        ];
        for (key, want) in cases {
            assert_eq!(controller_of(&ing(&[key])), Some(want), "{key}");
        }
        assert_eq!(controller_of(&ing(&["h3-ingress.dev/enabled"])), None);
        assert_eq!(controller_of(&Ingress::default()), None);
    }

    #[test]
    fn advice_names_the_annotation_and_the_exact_header() {
        let a = advice(
            Some(IngressController::F5Nginx),
            "a.example.com",
            443,
            86400,
        );
        assert!(
            a.starts_with("the TCP ingress does not send Alt-Svc: h3=\":443\" for a.example.com"),
            "{a}"
        );
        assert!(
            a.ends_with(
                r#"nginx.org/server-snippets: "add_header Alt-Svc 'h3=\":443\"; ma=86400' always;""#
            ),
            "{a}"
        );
        let a = advice(
            Some(IngressController::IngressNginx),
            "a.example.com",
            8443,
            60,
        );
        assert!(
            a.contains(r#"nginx.ingress.kubernetes.io/configuration-snippet: "more_set_headers 'Alt-Svc: h3=\":8443\"; ma=60';""#),
            "{a}"
        );
        assert!(!a.contains("nginx.org/"), "{a}");
        assert!(says_header_missing(&a));
        assert!(!says_header_missing(
            "probing the TCP ingress failed: timeout"
        ));
    }

    #[test]
    fn generic_advice_names_every_controller_and_the_header() {
        let a = advice(None, "a.example.com", 443, 86400);
        assert!(a.starts_with("the TCP ingress does not send Alt-Svc: h3=\":443\" for a.example.com, so browsers will not try HTTP/3"), "{a}");
        for c in IngressController::ALL {
            assert!(a.contains(c.annotation_prefix()), "{c:?}: {a}");
        }
        assert!(
            a.ends_with("any other server: the response header Alt-Svc: h3=\":443\"; ma=86400"),
            "{a}"
        );
    }

    #[test]
    fn gateway_advice_is_a_response_header_modifier_filter_in_yaml() {
        let a = gateway_advice("a.example.com", 443, 86400);
        assert!(a.starts_with("the TCP ingress does not send Alt-Svc: h3=\":443\" for a.example.com; add to each rule of the HTTPRoute"), "{a}");
        assert!(says_header_missing(&a));
        let yaml = a.split_once("(Gateway API): ").unwrap().1;
        let v: serde_json::Value =
            serde_norway::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        assert_eq!(
            v,
            serde_json::json!({"filters": [{"type": "ResponseHeaderModifier",
                "responseHeaderModifier": {"set": [{"name": "Alt-Svc", "value": "h3=\":443\"; ma=86400"}]}}]})
        );
        assert!(advice(None, "a.example.com", 443, 86400).contains(
            "Gateway API: an HTTPRoute rule with filters: [{type: ResponseHeaderModifier"
        ));
    }

    #[test]
    fn annotation_lines_are_yaml_that_yields_the_directive() {
        let value = header_value(443, 86400);
        assert_eq!(value, "h3=\":443\"; ma=86400");
        for c in [
            IngressController::F5Nginx,
            IngressController::IngressNginx,
            IngressController::Haproxy,
        ] {
            let line = c.recipe(&value);
            let parsed: std::collections::BTreeMap<String, String> =
                serde_norway::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
            let (_, directive) = parsed.into_iter().next().unwrap();
            assert!(directive.contains(&value), "{c:?}: {directive}");
        }
    }
}
