//! Host resolution end to end: objects in, served hosts and reports out.

use std::sync::Arc;

use super::fixtures::{by_name, listener, none, now, tls_secret, Ing};
use super::ingress::{
    ingress_class, ingress_key, selected_ingresses, with_default_class,
    LEGACY_INGRESS_CLASS_ANNOTATION,
};
use super::resolve::{secret_key, SecretMap, TLS_KEY_KEY};
use super::*;
use crate::api::{annotations, reasons, ListenerHost};

#[test]
fn every_reason_is_reported_per_host() {
    let l = listener("public", Some("nginx"));
    let ing = Ing {
        rules: vec![
            "ok.example.com",
            "notls.example.com",
            "missing.example.com",
            "wrong.example.com",
            "broken.example.com",
        ],
        tls: vec![
            (vec!["ok.example.com"], Some("ok")),
            (vec!["missing.example.com"], Some("missing")),
            (vec!["wrong.example.com"], Some("wrong")),
            (vec!["broken.example.com"], Some("broken")),
        ],
        ..Default::default()
    }
    .build();
    let mut secrets: SecretMap = [
        tls_secret("default", "ok", &["ok.example.com"]),
        tls_secret("default", "wrong", &["other.example.com"]),
    ]
    .into_iter()
    .collect();
    let (k, mut broken) = tls_secret("default", "broken", &["broken.example.com"]);
    broken.data.as_mut().unwrap().remove(TLS_KEY_KEY);
    secrets.insert(k, broken);

    let r = resolve_hosts(&l, [&ing], &none(), &secrets, now());
    assert_eq!(
        r.served.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        ["ok.example.com"]
    );
    let s = |st: &str, re: &str| vec![(st.to_string(), re.to_string())];
    assert_eq!(
        by_name(&r, "ok.example.com"),
        s("Serving", reasons::SERVING)
    );
    assert_eq!(
        by_name(&r, "notls.example.com"),
        s("NotServing", reasons::NO_TLS)
    );
    assert_eq!(
        by_name(&r, "missing.example.com"),
        s("NotServing", reasons::SECRET_NOT_FOUND)
    );
    assert_eq!(
        by_name(&r, "wrong.example.com"),
        s("NotServing", reasons::CERTIFICATE_DOES_NOT_MATCH_HOST)
    );
    assert_eq!(
        by_name(&r, "broken.example.com"),
        s("NotServing", reasons::CERTIFICATE_INVALID)
    );
    let missing = r
        .reports
        .iter()
        .find(|h| h.name == "missing.example.com")
        .unwrap();
    assert_eq!(missing.message, "Secret default/missing not found");
    assert_eq!(missing.secret.as_deref(), Some("default/missing"));
    assert_eq!(missing.origin.ingress.as_deref(), Some("default/web"));
    let wrong = r
        .reports
        .iter()
        .find(|h| h.name == "wrong.example.com")
        .unwrap();
    assert!(
        wrong.message.contains("other.example.com"),
        "{}",
        wrong.message
    );
    // Sorted by name.
    let names: Vec<_> = r.reports.iter().map(|h| h.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
}

#[test]
fn conflicting_hosts_go_to_spec_hosts_then_the_oldest_ingress() {
    let mut l = listener("public", Some("nginx"));
    l.spec.hosts.push(ListenerHost {
        name: "pinned.example.com".into(),
        secret_ref: SecretRef {
            namespace: "infra".into(),
            name: "pinned".into(),
        },
    });
    let old = Ing {
        name: "old",
        rules: vec!["shared.example.com", "pinned.example.com"],
        tls: vec![(
            vec!["shared.example.com", "pinned.example.com"],
            Some("old-tls"),
        )],
        created: 100,
        ..Default::default()
    }
    .build();
    // Of another class (so its own TCP ingress serves it with its own Secret), named to this
    // listener: a real conflict. Of the same class it would get old-tls, the Secret the TCP
    // ingress serves the name with (`owners`).
    let new = Ing {
        name: "new",
        class: Some("other"),
        ann: vec![
            (annotations::ENABLED, "true"),
            (annotations::LISTENER, "public"),
        ],
        rules: vec!["shared.example.com"],
        tls: vec![(vec!["shared.example.com"], Some("new-tls"))],
        created: 200,
        ..Default::default()
    }
    .build();
    let same = Ing {
        name: "same",
        rules: vec!["shared.example.com"],
        tls: vec![(vec!["shared.example.com"], Some("old-tls"))],
        created: 300,
        ..Default::default()
    }
    .build();
    let secrets: SecretMap = [
        tls_secret("infra", "pinned", &["pinned.example.com"]),
        tls_secret(
            "default",
            "old-tls",
            &["shared.example.com", "pinned.example.com"],
        ),
        tls_secret("default", "new-tls", &["shared.example.com"]),
    ]
    .into_iter()
    .collect();
    // Input order must not matter: newest first here.
    let r = resolve_hosts(&l, [&same, &new, &old], &none(), &secrets, now());
    let shared: Vec<_> = r
        .reports
        .iter()
        .filter(|h| h.name == "shared.example.com")
        .map(|h| (h.origin.ingress.clone().unwrap(), h.reason.clone()))
        .collect();
    assert_eq!(
        shared,
        [
            (
                "default/new".to_string(),
                reasons::HOST_CONFLICT.to_string()
            ),
            ("default/old".to_string(), reasons::SERVING.to_string()),
        ],
        "same-secret duplicate is not a conflict and is not listed twice"
    );
    let pinned: Vec<_> = r
        .reports
        .iter()
        .filter(|h| h.name == "pinned.example.com")
        .map(|h| (h.origin.ingress.clone(), h.reason.clone()))
        .collect();
    assert_eq!(
        pinned,
        [
            (None, reasons::SERVING.to_string()),
            (
                Some("default/old".to_string()),
                reasons::HOST_CONFLICT.to_string()
            ),
        ]
    );
    let conflict = r
        .reports
        .iter()
        .find(|h| h.reason == reasons::HOST_CONFLICT && h.name == "pinned.example.com")
        .unwrap();
    assert_eq!(
        conflict.message,
        "pinned.example.com is already served from spec.hosts with Secret infra/pinned"
    );
    assert_eq!(r.served.len(), 2);
}

#[test]
fn referenced_secrets_are_only_those_of_selected_hosts() {
    let mut l = listener("public", Some("nginx"));
    l.spec.hosts.push(ListenerHost {
        name: "p.example.com".into(),
        secret_ref: SecretRef {
            namespace: "infra".into(),
            name: "p".into(),
        },
    });
    let a = Ing {
        rules: vec!["a.example.com"],
        tls: vec![(vec!["a.example.com"], Some("a"))],
        ..Default::default()
    }
    .build();
    let off = Ing {
        name: "off",
        ann: vec![],
        tls: vec![(vec!["x.example.com"], Some("x"))],
        ..Default::default()
    }
    .build();
    let mut deleting = Ing {
        name: "deleting",
        tls: vec![(vec!["d.example.com"], Some("d"))],
        ..Default::default()
    }
    .build();
    deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
    let refs: Vec<String> = referenced_secrets(&l, [&a, &off, &deleting], &none())
        .iter()
        .map(secret_key)
        .collect();
    assert_eq!(refs, ["default/a", "infra/p"]);
}
#[test]
fn an_ingress_without_a_class_is_served_by_the_listener_of_the_default_class() {
    let classless = Arc::new(
        Ing {
            class: None,
            tls: vec![(vec!["a.example.com"], Some("a-tls"))],
            ..Default::default()
        }
        .build(),
    );
    let legacy = Arc::new(
        Ing {
            name: "legacy",
            class: None,
            ann: vec![
                (annotations::ENABLED, "true"),
                (LEGACY_INGRESS_CLASS_ANNOTATION, "haproxy"),
            ],
            ..Default::default()
        }
        .build(),
    );
    let nginx = listener("public", Some("nginx"));
    let all = [classless.clone(), legacy.clone()];
    // Without a default class nobody serves the class-less Ingress.
    let seen = with_default_class(&all, None);
    assert!(selected_ingresses(&nginx, seen.iter().map(|i| i.as_ref())).is_empty());
    let seen = with_default_class(&all, Some("nginx"));
    let picked = selected_ingresses(&nginx, seen.iter().map(|i| i.as_ref()));
    assert_eq!(picked.len(), 1);
    assert_eq!(ingress_key(picked[0]), "default/web");
    assert_eq!(
        referenced_secrets(&nginx, seen.iter().map(|i| i.as_ref()), &none())
            .into_iter()
            .map(|s| s.name)
            .collect::<Vec<_>>(),
        ["a-tls"]
    );
    // The legacy annotation is a class: it stays haproxy's, and is not copied.
    assert!(Arc::ptr_eq(&seen[1], &legacy));
    assert_eq!(ingress_class(&seen[1]), Some("haproxy"));
}

/// A host an annotated Ingress asks for is served with the Secret the TCP ingress serves it
/// with: that of the oldest Ingress of the class naming it with a spec.tls section, annotated
/// or not (here in another namespace); the data plane may read that Secret, not the other.
#[test]
fn a_host_is_served_with_the_certificate_of_the_oldest_ingress_of_its_class_with_tls() {
    let l = listener("public", Some("nginx"));
    let web = Ing {
        ns: "shop",
        rules: vec!["shop.example.com"],
        tls: vec![(vec!["shop.example.com"], Some("web-tls"))],
        created: 200,
        ..Default::default()
    }
    .build();
    let old = Ing {
        ns: "legacy",
        name: "old",
        ann: vec![],
        rules: vec!["shop.example.com"],
        tls: vec![(vec!["shop.example.com"], Some("old-tls"))],
        created: 100,
        ..Default::default()
    }
    .build();
    let secrets: SecretMap = [
        tls_secret("shop", "web-tls", &["shop.example.com"]),
        tls_secret("legacy", "old-tls", &["shop.example.com"]),
    ]
    .into_iter()
    .collect();
    let r = resolve_hosts(&l, [&web, &old], &none(), &secrets, now());
    let served: Vec<_> = r
        .served
        .iter()
        .map(|h| (h.name.as_str(), secret_key(&h.secret), h.origin.text()))
        .collect();
    assert_eq!(
        served,
        [(
            "shop.example.com",
            "legacy/old-tls".to_string(),
            "Ingress shop/web".to_string()
        )]
    );
    assert_eq!(
        by_name(&r, "shop.example.com"),
        [("Serving".to_string(), reasons::SERVING.to_string())]
    );
    let refs: Vec<_> = referenced_secrets(&l, [&web, &old], &none())
        .iter()
        .map(secret_key)
        .collect();
    assert_eq!(refs, ["legacy/old-tls"]);
}
