//! Carries out a [`Plan`]: Middlewares first (a router that names a missing Middleware is
//! dropped by Traefik, and its host with it), then the Ingresses' annotation, then the
//! deletions. A failed call stops nothing else: every error is kept for the status, and the
//! next reconcile plans again from the caches.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use super::{Key, MiddlewareWrite, Plan, FIELD_MANAGER, HEADER};
use crate::api::traefik::{Headers, Middleware, MiddlewareSpec};
use crate::operator::hosts::policy::keys::TRAEFIK_ROUTER_MIDDLEWARES;
use crate::operator::labels;

/// How many API calls the plan made, and the first error.
#[derive(Debug, Default)]
pub struct Applied {
    pub calls: usize,
    pub error: Option<String>,
}

impl Applied {
    fn record(&mut self, what: String, r: Result<(), kube::Error>) {
        self.calls += 1;
        if let Err(e) = r {
            tracing::warn!(error = %e, "{what}");
            self.error.get_or_insert(format!("{what}: {e}"));
        }
    }
}

/// Who writes: the listener a Middleware is for and the operator's namespace (its labels:
/// [`super::orphans`] and the uninstall hook find them by these).
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    pub listener: &'a str,
    pub operator_ns: &'a str,
}

/// The Middleware the operator keeps for one Ingress, owned by it (it goes with the Ingress).
pub fn middleware(w: &MiddlewareWrite, by: Writer) -> Middleware {
    let spec = MiddlewareSpec {
        headers: Some(Headers {
            custom_response_headers: BTreeMap::from([(HEADER.to_string(), w.value.clone())]),
        }),
        ..MiddlewareSpec::default()
    };
    let mut m = Middleware::new(&w.name, spec);
    m.metadata = ObjectMeta {
        name: Some(w.name.clone()),
        namespace: Some(w.namespace.clone()),
        labels: Some(BTreeMap::from([
            (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
            (labels::INSTANCE.into(), by.listener.into()),
            (labels::OPERATOR_NAMESPACE.into(), by.operator_ns.into()),
        ])),
        owner_references: Some(vec![OwnerReference {
            api_version: "networking.k8s.io/v1".into(),
            kind: "Ingress".into(),
            name: w.ingress.clone(),
            uid: w.ingress_uid.clone(),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    };
    m
}

/// Makes the plan's writes, in its order.
pub async fn apply(client: &Client, by: Writer<'_>, plan: &Plan) -> Applied {
    let mut out = Applied::default();
    let own = PatchParams::apply(crate::operator::FIELD_MANAGER).force();
    for w in &plan.middlewares {
        let api: Api<Middleware> = Api::namespaced(client.clone(), &w.namespace);
        let r = api
            .patch(&w.name, &own, &Patch::Apply(middleware(w, by)))
            .await;
        let what = format!("applying Middleware {}/{}", w.namespace, w.name);
        out.record(what, r.map(drop));
    }
    // Never forced: a field someone else holds is theirs (a conflict is reported, not won).
    let shared = PatchParams::apply(FIELD_MANAGER);
    for (k, reference) in &plan.annotate {
        let body = ingress_patch(k, Some(reference));
        let r = ingresses(client, k)
            .patch(&k.name, &shared, &Patch::Apply(body))
            .await;
        let what = format!("adding {reference} to Ingress {}/{}", k.namespace, k.name);
        out.record(what, r.map(drop));
    }
    for k in &plan.release {
        let body = ingress_patch(k, None);
        let r = ingresses(client, k)
            .patch(&k.name, &shared, &Patch::Apply(body))
            .await;
        let what = format!(
            "giving up router.middlewares of Ingress {}/{}",
            k.namespace, k.name
        );
        out.record(what, r.map(drop));
    }
    for k in &plan.delete {
        let api: Api<Middleware> = Api::namespaced(client.clone(), &k.namespace);
        let r = match api.delete(&k.name, &DeleteParams::default()).await {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            r => r.map(drop),
        };
        out.record(format!("deleting Middleware {}/{}", k.namespace, k.name), r);
    }
    out
}

fn ingresses(client: &Client, k: &Key) -> Api<Ingress> {
    Api::namespaced(client.clone(), &k.namespace)
}

/// The operator's whole view of an Ingress under its own field manager: the annotation, or
/// nothing (which gives the annotation up).
fn ingress_patch(k: &Key, reference: Option<&String>) -> serde_json::Value {
    let mut metadata = json!({"name": k.name, "namespace": k.namespace});
    if let Some(r) = reference {
        metadata["annotations"] = json!({ TRAEFIK_ROUTER_MIDDLEWARES: r });
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": metadata})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_middleware_is_owned_by_its_ingress_and_says_only_alt_svc() {
        let w = MiddlewareWrite {
            namespace: "shop".into(),
            name: "h3-ingress-alt-svc-web".into(),
            value: "clear".into(),
            ingress: "web".into(),
            ingress_uid: "u-1".into(),
        };
        let by = Writer {
            listener: "edge",
            operator_ns: "h3-ingress",
        };
        let v = serde_json::to_value(middleware(&w, by)).unwrap();
        assert_eq!(
            v["metadata"]["labels"][labels::OPERATOR_NAMESPACE],
            "h3-ingress"
        );
        assert_eq!(v["apiVersion"], "traefik.io/v1alpha1");
        assert_eq!(
            v["spec"],
            json!({"headers": {"customResponseHeaders": {"Alt-Svc": "clear"}}})
        );
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "Ingress");
    }

    #[test]
    fn giving_up_the_annotation_applies_an_ingress_without_it() {
        let k = Key {
            namespace: "shop".into(),
            name: "web".into(),
        };
        let r = "shop-h3-ingress-alt-svc-web@kubernetescrd".to_string();
        let on = ingress_patch(&k, Some(&r));
        assert_eq!(
            on["metadata"]["annotations"][TRAEFIK_ROUTER_MIDDLEWARES],
            r.as_str()
        );
        let off = ingress_patch(&k, None);
        assert!(off["metadata"].get("annotations").is_none());
        assert!(off.get("spec").is_none());
    }
}
