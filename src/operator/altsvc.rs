//! How to make the TCP ingress advertise HTTP/3, said for the controller an Ingress is written
//! for. The data plane only sees that `Alt-Svc` is missing; the operator sees the Ingress's
//! annotations, which name the controller.

use k8s_openapi::api::networking::v1::Ingress;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// F5 NGINX Ingress Controller (`nginx.org/*` annotations).
    F5Nginx,
    /// Kubernetes ingress-nginx (`nginx.ingress.kubernetes.io/*`).
    IngressNginx,
    /// HAProxy Kubernetes Ingress Controller (`haproxy.org/*`).
    HaproxyOrg,
    /// Traefik (`traefik.ingress.kubernetes.io/*`).
    Traefik,
}

/// The controller an Ingress is written for, from its annotations (the class name is not
/// enough: both NGINX controllers default to `nginx`). `None` when nothing says.
pub fn controller_of(ing: &Ingress) -> Option<Controller> {
    let annotations = ing.metadata.annotations.as_ref()?;
    let has = |prefix: &str| annotations.keys().any(|k| k.starts_with(prefix));
    if has("nginx.org/") {
        Some(Controller::F5Nginx)
    } else if has("nginx.ingress.kubernetes.io/") {
        Some(Controller::IngressNginx)
    } else if has("haproxy.org/") {
        Some(Controller::HaproxyOrg)
    } else if has("traefik.ingress.kubernetes.io/") {
        Some(Controller::Traefik)
    } else {
        None
    }
}

/// The one line to add for `controller` so responses for `host` carry `Alt-Svc`.
pub fn advice(controller: Controller, host: &str, port: u16, max_age: u32) -> String {
    let value = format!("h3=\":{port}\"; ma={max_age}");
    let missing = format!("the TCP ingress does not send Alt-Svc: h3=\":{port}\" for {host}");
    match controller {
        Controller::F5Nginx => format!(
            "{missing}; add to the Ingress (F5 NGINX Ingress Controller, needs -enable-snippets): \
             nginx.org/server-snippets: \"add_header Alt-Svc '{value}' always;\""
        ),
        Controller::IngressNginx => format!(
            "{missing}; add to the Ingress (ingress-nginx, needs allow-snippet-annotations): \
             nginx.ingress.kubernetes.io/configuration-snippet: \"more_set_headers 'Alt-Svc: {value}';\""
        ),
        Controller::HaproxyOrg => format!(
            "{missing}; add to the Ingress (HAProxy Kubernetes Ingress Controller): \
             haproxy.org/response-set-header: \"Alt-Svc '{value}'\""
        ),
        Controller::Traefik => format!(
            "{missing}; add a Traefik Middleware with headers.customResponseHeaders \
             {{Alt-Svc: '{value}'}} and reference it in traefik.ingress.kubernetes.io/router.middlewares"
        ),
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
        assert_eq!(
            controller_of(&ing(&["nginx.org/proxy-read-timeout"])),
            Some(Controller::F5Nginx)
        );
        assert_eq!(
            controller_of(&ing(&["nginx.ingress.kubernetes.io/ssl-redirect"])),
            Some(Controller::IngressNginx)
        );
        assert_eq!(
            controller_of(&ing(&["haproxy.org/timeout-server"])),
            Some(Controller::HaproxyOrg)
        );
        assert_eq!(
            controller_of(&ing(&["traefik.ingress.kubernetes.io/router.tls"])),
            Some(Controller::Traefik)
        );
        assert_eq!(controller_of(&ing(&["h3-ingress.dev/enabled"])), None);
        assert_eq!(controller_of(&Ingress::default()), None);
    }

    #[test]
    fn advice_names_the_annotation_and_the_exact_header() {
        let a = advice(Controller::F5Nginx, "a.example.com", 443, 86400);
        assert!(
            a.starts_with("the TCP ingress does not send Alt-Svc: h3=\":443\" for a.example.com"),
            "{a}"
        );
        assert!(
            a.ends_with(
                "nginx.org/server-snippets: \"add_header Alt-Svc 'h3=\":443\"; ma=86400' always;\""
            ),
            "{a}"
        );
        let a = advice(Controller::IngressNginx, "a.example.com", 8443, 60);
        assert!(a.contains("nginx.ingress.kubernetes.io/configuration-snippet: \"more_set_headers 'Alt-Svc: h3=\":8443\"; ma=60';\""), "{a}");
        assert!(!a.contains("nginx.org/"), "{a}");
    }
}
