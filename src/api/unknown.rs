//! What this binary does not know, collected while parsing instead of refused: fields, and
//! values of its enums.
//!
//! The API server fills the defaults of the CRD it serves into every listener it returns, so
//! once a newer CRD is applied an older operator or data plane sees fields it has never heard
//! of. The Kubernetes path must read past them (and say so once); the standalone file and
//! `h3-ingress validate` must refuse them, because there an unknown field is a typo. So no type
//! denies unknown fields itself: each parse collects the ignored paths, and only the strict
//! paths turn them into errors. One set of types serves both.
//!
//! A newer CRD may also add a value to an enum (`transport.congestionControl: new-cc`). An
//! enum cannot be read past: this binary cannot act on a value it does not know, and refusing
//! the whole object would fail the whole list of listeners (a watch or list fails on one bad
//! item), so after a rollback no listener would be reconciled and a restarting data plane pod
//! would never become ready. Instead the listener's spec is read with every such value taken
//! out ([`take_unknown_values`], against the `enum` lists of this binary's own CRD schema, so
//! every enum of the CRD is covered and the schema stays the one source of its values) and
//! named in [`UnknownValues`]; validation then refuses that one listener, naming the field
//! (`InvalidSpec` in the operator; the data plane keeps its last good configuration). The
//! enums themselves stay closed: the CRD publishes them as `enum`, so the API server refuses
//! typos, and the file refuses them while parsing.

use std::fmt;

use serde_json::Value;

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

/// A value that an enum field of this binary's schema does not list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownValue {
    /// As the field errors write it, from the parsed object's root: `transport.congestionControl`.
    pub path: String,
    /// The value as served (a string; anything else is left to the parse, which refuses it).
    pub value: String,
    /// The values this binary knows there.
    pub known: Vec<String>,
}

impl UnknownValue {
    /// The message of its field error.
    pub fn message(&self) -> String {
        format!(
            "{:?} is not a value this h3-ingress knows (it knows {}); the served CRD is newer \
             than this binary: upgrade the operator (its data plane follows)",
            self.value,
            self.known.join(", ")
        )
    }
}

/// Enum values a parse took out of the object (see the module), in path order. Unlike
/// [`UnknownFields`], part of the value: a spec whose unknown value changed is another spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnknownValues(Vec<UnknownValue>);

impl UnknownValues {
    pub fn new(mut values: Vec<UnknownValue>) -> Self {
        values.sort_by(|a, b| a.path.cmp(&b.path));
        Self(values)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn values(&self) -> &[UnknownValue] {
        &self.0
    }
}

/// Takes out of `value` every string that the `enum` of `schema` at its place does not list,
/// and returns each with its path. `schema` is a structural (CRD) schema: objects nest their
/// fields in `properties` (and `additionalProperties`), arrays their items in `items`. The
/// field is removed, so the parse gives it its default; the listener is invalid anyway.
pub fn take_unknown_values(schema: &Value, value: &mut Value) -> Vec<UnknownValue> {
    let mut out = Vec::new();
    if unknown_here(schema, value, "", &mut out) {
        *value = Value::Null;
    }
    out
}

/// Whether `value` itself is unknown to `schema` (recorded in `out`); takes out what is
/// unknown below it.
fn unknown_here(
    schema: &Value,
    value: &mut Value,
    path: &str,
    out: &mut Vec<UnknownValue>,
) -> bool {
    if let (Some(known), Value::String(s)) = (schema.get("enum").and_then(Value::as_array), &*value)
    {
        if !known.iter().any(|k| k.as_str() == Some(s.as_str())) {
            out.push(UnknownValue {
                path: path.to_string(),
                value: s.clone(),
                known: known
                    .iter()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect(),
            });
            return true;
        }
        return false;
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            map.retain(|key, v| {
                let Some(s) = props.and_then(|p| p.get(key)).or(extra) else {
                    return true;
                };
                !unknown_here(s, v, &join(key), out)
            });
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                let mut i = 0;
                items.retain_mut(|v| {
                    let unknown = unknown_here(s, v, &format!("{path}[{i}]"), out);
                    i += 1;
                    !unknown
                });
            }
        }
        _ => {}
    }
    false
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
///
/// `collect_unknown_fields!(T, values: SCHEMA)` also takes out the enum values `SCHEMA` (a
/// `&serde_json::Value`, the type's structural schema) does not list, into an
/// `unknown_values: UnknownValues` field marked `#[serde(skip)]` ([`take_unknown_values`]).
/// The object is read into a JSON value first, so the format must describe itself (JSON, YAML).
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
        $crate::api::unknown::collect_unknown_fields!(@serialize $ty);
    };
    ($ty:ty, values: $schema:expr) => {
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                use serde::de::Error as _;
                let mut json = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
                let values = $crate::api::unknown::take_unknown_values($schema, &mut json);
                let mut paths = Vec::new();
                let mut record =
                    |p: serde_ignored::Path<'_>| paths.push($crate::api::unknown::path_string(&p));
                let mut value =
                    <$ty>::deserialize(serde_ignored::Deserializer::new(json, &mut record))
                        .map_err(D::Error::custom)?;
                value.unknown_fields = $crate::api::unknown::UnknownFields::new(paths);
                value.unknown_values = $crate::api::unknown::UnknownValues::new(values);
                Ok(value)
            }
        }
        $crate::api::unknown::collect_unknown_fields!(@serialize $ty);
    };
    (@serialize $ty:ty) => {
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
