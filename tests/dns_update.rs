//! The operator's DNS update client against a real authoritative server (Debian's Knot DNS
//! 3.2): HTTPS records added, refused when a prerequisite fails, deleted, and nothing done
//! without the right TSIG key. Needs `knotd` and `kdig` (scripts/setup.sh installs them).

mod support;

use base64::Engine;
use h3_ingress::operator::advertise::dns::client::{DnsError, Outcome, Server};
use h3_ingress::operator::advertise::dns::tsig::{Algorithm, Key, TsigError};
use h3_ingress::operator::advertise::dns::wire::{Name, Record, Update, TYPE_HTTPS};
use support::knot::{KnotFixture, KnotOptions};

const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

fn knot() -> KnotFixture {
    let secret = base64::engine::general_purpose::STANDARD.encode(SECRET);
    KnotFixture::start(KnotOptions {
        zone: "example.test",
        records: &["user HTTPS 1 . alpn=h2", "www A 192.0.2.1"],
        key_name: "h3-ingress",
        secret_b64: &secret,
    })
    .unwrap()
}

fn server(k: &KnotFixture, secret: &[u8]) -> Server {
    Server {
        address: k.address(),
        key: Key::new(
            Name::parse("h3-ingress").unwrap(),
            Algorithm::HmacSha256,
            secret,
        ),
    }
}

fn update(id: u16, prerequisites: Vec<Record>, updates: Vec<Record>) -> Update {
    Update {
        id,
        zone: Name::parse("example.test").unwrap(),
        prerequisites,
        updates,
    }
}

#[tokio::test]
async fn records_are_added_refused_by_prerequisites_and_deleted() {
    let k = knot();
    let s = server(&k, SECRET);
    let a = Name::parse("a.example.test").unwrap();
    let https = Record::https(&a, 60, &["h3", "h2"], None);
    let create = update(
        1,
        vec![Record::rrset_absent(&a, TYPE_HTTPS)],
        vec![https.clone()],
    );
    assert_eq!(s.send(&create).await.unwrap(), Outcome::Applied);
    assert_eq!(
        k.query("a.example.test", "HTTPS").unwrap(),
        ["1 . alpn=h3,h2"],
        "{}",
        k.log()
    );
    // The same creation again: the RRset exists now, nothing changes.
    assert_eq!(
        s.send(&create).await.unwrap(),
        Outcome::Prerequisite("YXRRSET")
    );
    // A record the user made is never replaced by a creation.
    let user = Name::parse("user.example.test").unwrap();
    let mine = update(
        2,
        vec![Record::rrset_absent(&user, TYPE_HTTPS)],
        vec![Record::https(&user, 60, &["h3", "h2"], Some(8443))],
    );
    assert_eq!(
        s.send(&mine).await.unwrap(),
        Outcome::Prerequisite("YXRRSET")
    );
    assert_eq!(
        k.query("user.example.test", "HTTPS").unwrap(),
        ["1 . alpn=h2"]
    );
    // A port other than 443 is carried.
    let b = Name::parse("b.example.test").unwrap();
    let with_port = update(3, vec![], vec![Record::https(&b, 60, &["h3"], Some(8443))]);
    assert_eq!(s.send(&with_port).await.unwrap(), Outcome::Applied);
    assert_eq!(
        k.query("b.example.test", "HTTPS").unwrap(),
        ["1 . alpn=h3 port=8443"]
    );
    // Deleted only while it is exactly what we wrote.
    let delete = update(
        4,
        vec![Record::rrset_equals(&https)],
        vec![Record::delete_rrset(&a, TYPE_HTTPS)],
    );
    assert_eq!(s.send(&delete).await.unwrap(), Outcome::Applied);
    assert!(k.query("a.example.test", "HTTPS").unwrap().is_empty());
    assert_eq!(
        s.send(&delete).await.unwrap(),
        Outcome::Prerequisite("NXRRSET")
    );
}

#[tokio::test]
async fn a_wrong_key_changes_nothing_and_says_why() {
    let k = knot();
    let s = server(&k, b"not the secret the server holds!");
    let a = Name::parse("a.example.test").unwrap();
    let u = update(9, vec![], vec![Record::https(&a, 60, &["h3"], None)]);
    let e = s.send(&u).await.unwrap_err();
    assert!(
        matches!(
            &e,
            DnsError::Tsig {
                source: TsigError::Refused("BADSIG"),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(k.query("a.example.test", "HTTPS").unwrap().is_empty());
}

#[tokio::test]
async fn a_server_that_is_down_is_an_error_not_a_hang() {
    let k = knot();
    let mut s = server(&k, SECRET);
    s.address = format!("127.0.0.1:{}", support::free_tcp_port());
    let a = Name::parse("a.example.test").unwrap();
    let u = update(10, vec![], vec![Record::https(&a, 60, &["h3"], None)]);
    let t = std::time::Instant::now();
    let e = s.send(&u).await.unwrap_err();
    assert!(matches!(e, DnsError::Io { .. }), "{e:?}");
    assert!(t.elapsed() < std::time::Duration::from_secs(6));
}

mod publisher {
    use super::*;
    use h3_ingress::operator::advertise::dns::plan::{self, Owner};
    use h3_ingress::operator::advertise::dns::publish::{Publisher, Target};
    use std::collections::BTreeMap;

    fn target(k: &KnotFixture, owner: &str) -> Target {
        Target {
            server: server(k, SECRET),
            zones: vec![Name::parse("example.test").unwrap()],
            owner: Owner {
                id: owner.into(),
                listener: "public".into(),
            },
        }
    }

    fn want(hosts: &[&str], port: u16) -> BTreeMap<Name, Record> {
        hosts
            .iter()
            .map(|h| {
                let n = Name::parse(h).unwrap();
                let r = plan::record(&n, port, 60);
                (n, r)
            })
            .collect()
    }

    /// 150 hosts (three batches), one of them the user's own: it is left alone and reported;
    /// the rest are published; a second sync sends nothing; a restarted publisher adopts its
    /// records without rewriting them; another owner's publisher touches none of them; a
    /// withdrawn host loses its record and its registry record.
    #[tokio::test]
    async fn a_listeners_records_are_kept_exactly_and_never_someone_elses() {
        let k = knot();
        let mut names: Vec<String> = (0..149).map(|i| format!("h{i}.example.test")).collect();
        names.push("user.example.test".into());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let all = want(&refs, 443);
        let mut p = Publisher::new(target(&k, "ours"));
        let r = p.sync(&all).await.unwrap();
        assert_eq!(r.published, 149, "{r:?}");
        assert_eq!(
            r.conflicts
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>(),
            ["user.example.test"]
        );
        assert!(
            r.updates <= 3 + 2 * 8 + 2,
            "a few splits for one conflict: {}",
            r.updates
        );
        assert_eq!(
            k.query("h7.example.test", "HTTPS").unwrap(),
            ["1 . alpn=h3,h2"]
        );
        assert_eq!(
            k.query("user.example.test", "HTTPS").unwrap(),
            ["1 . alpn=h2"]
        );
        assert_eq!(
            k.query("_h3-ingress.h7.example.test", "TXT").unwrap(),
            ["\"heritage=h3-ingress,h3-ingress/owner=ours,h3-ingress/resource=http3listener/public\""]
        );

        let again = p.sync(&all).await.unwrap();
        assert_eq!(again.updates, 0, "at rest nothing is sent");
        assert!(p.check().await.unwrap(), "the zone is as we left it");

        let mut restarted = Publisher::new(target(&k, "ours"));
        let adopted = restarted.sync(&all).await.unwrap();
        assert_eq!(adopted.published, 149);
        assert_eq!(
            adopted.updates, 0,
            "its own records are adopted as they are"
        );

        let mut other = Publisher::new(target(&k, "another-install"));
        let theirs = other.sync(&want(&["h1.example.test"], 8443)).await.unwrap();
        assert_eq!(theirs.published, 0);
        assert_eq!(theirs.conflicts.len(), 1);
        assert_eq!(
            k.query("h1.example.test", "HTTPS").unwrap(),
            ["1 . alpn=h3,h2"]
        );
        assert_eq!(theirs.updates, 0, "read as someone else's without writing");
        assert!(p.check().await.unwrap(), "nobody wrote the zone");

        let fewer = want(&refs[1..149], 443);
        let r = restarted.sync(&fewer).await.unwrap();
        assert_eq!(r.published, 148);
        assert!(k.query("h0.example.test", "HTTPS").unwrap().is_empty());
        assert!(k
            .query("_h3-ingress.h0.example.test", "TXT")
            .unwrap()
            .is_empty());
        assert_eq!(
            k.query("user.example.test", "HTTPS").unwrap(),
            ["1 . alpn=h2"]
        );
    }

    #[tokio::test]
    async fn a_port_change_replaces_the_record_and_outside_hosts_are_reported() {
        let k = knot();
        let mut p = Publisher::new(target(&k, "ours"));
        p.sync(&want(&["a.example.test"], 443)).await.unwrap();
        let r = p
            .sync(&want(&["a.example.test", "b.elsewhere.test"], 8443))
            .await
            .unwrap();
        assert_eq!(r.updates, 1);
        assert_eq!(
            r.outside.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            ["b.elsewhere.test"]
        );
        assert_eq!(
            k.query("a.example.test", "HTTPS").unwrap(),
            ["1 . alpn=h3,h2 port=8443"]
        );
    }
}
