//! Fields this binary does not know, collected while parsing instead of refused.
//!
//! The API server fills the defaults of the CRD it serves into every listener it returns, so
//! once a newer CRD is applied an older operator or data plane sees fields it has never heard
//! of. The Kubernetes path must read past them (and say so once); the standalone file and
//! `h3-ingress validate` must refuse them, because there an unknown field is a typo. So no type
//! denies unknown fields itself: each parse collects the ignored paths, and only the strict
//! paths turn them into errors. One set of types serves both.

use std::fmt;

/// Paths (`upstream.futureSetting`, `hosts[0].extra`) of fields a parse ignored, sorted and
/// without duplicates.
///
/// Part of the listener's spec and status without being part of their value: two specs that
/// differ only here are equal (this binary cannot act on the difference), and it is never
/// serialised (an apply must not echo fields back under our name).
#[derive(Clone, Default)]
pub struct UnknownFields(Vec<String>);

impl UnknownFields {
    pub fn new(mut paths: Vec<String>) -> Self {
        paths.sort();
        paths.dedup();
        Self(paths)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn paths(&self) -> &[String] {
        &self.0
    }
}

impl PartialEq for UnknownFields {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for UnknownFields {}

impl fmt::Debug for UnknownFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.0).finish()
    }
}

/// A path as the field errors of `config` write it: `a.b`, `hosts[2].name`. Options and
/// newtypes add nothing (serde_ignored writes them as `?`).
pub fn path_string(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", path_string(parent)),
        Path::Map { parent, key } => {
            let parent = path_string(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => path_string(parent),
    }
}

/// `Deserialize` and `Serialize` for a type declared with `#[serde(remote = "Self")]` (which
/// makes serde's derive produce inherent `deserialize`/`serialize` functions instead of the
/// trait impls) and holding an `unknown_fields: UnknownFields` field marked `#[serde(skip)]`:
/// deserialising goes through the derived code with every ignored field's path recorded there.
macro_rules! collect_unknown_fields {
    ($ty:ty) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let mut paths = Vec::new();
                let mut record =
                    |p: serde_ignored::Path<'_>| paths.push($crate::api::unknown::path_string(&p));
                let mut value =
                    <$ty>::deserialize(serde_ignored::Deserializer::new(d, &mut record))?;
                value.unknown_fields = $crate::api::unknown::UnknownFields::new(paths);
                Ok(value)
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                <$ty>::serialize(self, s)
            }
        }
    };
}
pub(crate) use collect_unknown_fields;

/// Parses `de` into `T`, also returning the paths of every field `T` does not know.
pub fn parse_collecting<'de, D, T>(de: D) -> Result<(T, UnknownFields), D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    let mut paths = Vec::new();
    let value = serde_ignored::deserialize(de, |p| paths.push(path_string(&p)))?;
    Ok((value, UnknownFields::new(paths)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Inner {
        #[allow(dead_code)]
        a: u32,
    }

    #[derive(serde::Deserialize)]
    struct Outer {
        #[allow(dead_code)]
        inner: Inner,
        #[allow(dead_code)]
        list: Vec<Inner>,
        #[allow(dead_code)]
        maybe: Option<Inner>,
    }

    #[test]
    fn paths_name_maps_sequences_and_skip_options() {
        let json = serde_json::json!({
            "inner": {"a": 1, "b": 2},
            "list": [{"a": 1}, {"a": 2, "c": {"deep": true}}],
            "maybe": {"a": 3, "d": null},
            "top": "x",
        });
        let (_, unknown) = parse_collecting::<_, Outer>(json).unwrap();
        assert_eq!(
            unknown.paths(),
            ["inner.b", "list[1].c", "maybe.d", "top"].map(String::from)
        );
    }

    #[test]
    fn unknown_fields_never_make_values_differ() {
        let a = UnknownFields::new(vec!["b".into(), "a".into(), "b".into()]);
        assert_eq!(a.paths(), ["a", "b"].map(String::from));
        assert_eq!(a, UnknownFields::default());
        assert_eq!(format!("{a:?}"), r#"["a", "b"]"#);
    }
}
