//! Reading a configuration with serde while keeping track of where things are:
//! the one mechanism behind every format this project reads from a person
//! (DeviceConfig YAML, the exporter's and the test runner's `config.json`).
//!
//! - Fields the target type does not define are collected with their paths
//!   (`spec.driver.enabel`, `GPUConfig.Fieldz`), each distinct path once,
//!   through `serde_ignored`.
//! - A value of the wrong type is reported at its path (`TestCases[0].Iterations`),
//!   through `serde_path_to_error`: [`read`] stops at the first one, for formats
//!   where a bad value must stop the configuration; [`read_lenient`] leaves each
//!   bad value out, says why, and reads the rest, for formats where one bad
//!   value must not throw away a whole file.
//!
//! Paths are written the way a person refers to a field: keys joined by `.`,
//! list positions as `[i]` (`a.b[0].c`), always positions in the text as
//! written, also after [`read_lenient`] left list items out. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A value that cannot be read, at its path (empty for the whole text).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct PathError {
    pub path: String,
    pub message: String,
}

/// What was read, with what was not.
#[derive(Clone, Debug, PartialEq)]
pub struct Read<T> {
    pub value: T,
    /// Paths of fields the type does not define, sorted, each once.
    pub unknown: Vec<String>,
    /// Values left out because they did not fit ([`read_lenient`] only), in
    /// the order they were found.
    pub rejected: Vec<PathError>,
}

/// Reads `T` from `value`; the first value that does not fit is the error.
/// Paths start with `prefix` (the position of `value` in a larger document,
/// or empty).
pub fn read<T: DeserializeOwned>(value: &Value, prefix: &str) -> Result<Read<T>, PathError> {
    let removed = Removed::default();
    attempt(value)
        .map(|(value, unknown)| Read {
            value,
            unknown: unknown
                .iter()
                .map(|path| join(prefix, &format_segments(path)))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            rejected: Vec::new(),
        })
        .map_err(|failure| failure.into_error(prefix, &removed))
}

/// Reads `T` from `value`, leaving out every value that does not fit (a map
/// entry, a list item, a struct field, which then takes its default) with its
/// path and why. Only a `value` that does not fit as a whole is an error.
/// Every field of `T` should have a default (`#[serde(default)]`), or leaving a
/// value out makes its parent not fit in turn.
pub fn read_lenient<T: DeserializeOwned>(
    value: &Value,
    prefix: &str,
) -> Result<Read<T>, PathError> {
    let mut value = value.clone();
    let mut removed = Removed::default();
    let mut rejected = Vec::new();
    loop {
        match attempt::<T>(&value) {
            Ok((read, unknown)) => {
                let unknown = unknown
                    .iter()
                    .map(|path| join(prefix, &format_segments(&removed.original(path))))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                return Ok(Read {
                    value: read,
                    unknown,
                    rejected,
                });
            }
            Err(failure) => {
                let error = failure.clone().into_error(prefix, &removed);
                // Each round takes one value out, so this ends; a path that
                // cannot be taken out (the whole text) is the error.
                if !failure.path.is_empty() && removed.remove(&mut value, &failure.path) {
                    rejected.push(error);
                } else {
                    return Err(error);
                }
            }
        }
    }
}

/// `T` read from any serde format (YAML with its positions, say), with the
/// paths of the fields it does not define, sorted, each once.
#[derive(Clone, Debug, PartialEq)]
pub struct WithUnknown<T> {
    pub value: T,
    pub unknown: Vec<String>,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for WithUnknown<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut unknown = BTreeSet::new();
        let value = serde_ignored::deserialize(deserializer, |path| {
            unknown.insert(format_path(&path));
        })?;
        Ok(Self {
            value,
            unknown: unknown.into_iter().collect(),
        })
    }
}

/// For `#[serde(deserialize_with = "crate::tracked::present")]` on an
/// `Option` field: a key that is there must hold a `T`, `null` included
/// (plain `Option` would take `null` for a missing key).
pub fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// How a JSON value is named in messages: "a string", "a list", ...
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A type read from some kinds of value only: the others are refused with
/// "must be {WHAT}, found {kind}", the way [`kind`] names them.
pub trait Shape<'de>: Sized {
    /// What is expected: "an object", "a list of strings".
    const WHAT: &'static str;

    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        drop(map);
        Err(wrong_kind::<Self, _>("an object"))
    }

    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        drop(seq);
        Err(wrong_kind::<Self, _>("a list"))
    }

    fn from_str<E: de::Error>(text: &str) -> Result<Self, E> {
        let _ = text;
        Err(wrong_kind::<Self, _>("a string"))
    }
}

fn wrong_kind<'de, T: Shape<'de>, E: de::Error>(found: &str) -> E {
    E::custom(format!("must be {}, found {found}", T::WHAT))
}

/// Reads a [`Shape`] (for its `Deserialize`).
pub fn deserialize_shape<'de, D: Deserializer<'de>, T: Shape<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    struct ShapeVisitor<T>(PhantomData<T>);

    impl<'de, T: Shape<'de>> Visitor<'de> for ShapeVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::WHAT)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::from_map(map)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
            T::from_seq(seq)
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            T::from_str(text)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<T, E> {
            Err(wrong_kind::<T, _>("a boolean"))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<T, E> {
            Err(wrong_kind::<T, _>("a number"))
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<T, E> {
            Err(wrong_kind::<T, _>("a number"))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<T, E> {
            Err(wrong_kind::<T, _>("a number"))
        }
        fn visit_unit<E: de::Error>(self) -> Result<T, E> {
            Err(wrong_kind::<T, _>("null"))
        }
        fn visit_none<E: de::Error>(self) -> Result<T, E> {
            Err(wrong_kind::<T, _>("null"))
        }
    }
    deserializer.deserialize_any(ShapeVisitor(PhantomData))
}

/// A `T` that must be written as an object: serde alone also takes a list of
/// a struct's fields in order, which no configuration means.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Shape<'de> for Object<T> {
    const WHAT: &'static str = "an object";
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Object)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_shape(deserializer)
    }
}

/// What a list of this type is called in messages ("a list of strings").
pub trait ListItem {
    const LIST: &'static str = "a list";
}

impl<T> ListItem for Object<T> {}

/// A list of `T`, anything else refused with "must be {LIST}, found ...".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct List<T>(pub Vec<T>);

impl<'de, T: Deserialize<'de> + ListItem> Shape<'de> for List<T> {
    const WHAT: &'static str = T::LIST;
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(List(items))
    }
}

impl<'de, T: Deserialize<'de> + ListItem> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_shape(deserializer)
    }
}

/// Formats a `serde_ignored` path as a field path: `spec.devicePlugin.x`,
/// `spec.remediationWorkflow.nodeRemediationTaints[0].colour`.
pub fn format_path(path: &serde_ignored::Path<'_>) -> String {
    format_segments(&ignored_segments(path))
}

/// `prefix.path`, or either alone when the other is empty; `path` may start
/// with a list position (`prefix[0]`).
pub fn join(prefix: &str, path: &str) -> String {
    if prefix.is_empty() || path.is_empty() || path.starts_with('[') {
        format!("{prefix}{path}")
    } else {
        format!("{prefix}.{path}")
    }
}

/// One step of a path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Segment {
    Key(String),
    Index(usize),
    /// A step serde cannot name (an enum variant, a key that is not a string).
    Other(String),
}

fn format_segments(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Index(index) => out.push_str(&format!("[{index}]")),
            Segment::Key(key) | Segment::Other(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
        }
    }
    out
}

fn ignored_segments(path: &serde_ignored::Path<'_>) -> Vec<Segment> {
    use serde_ignored::Path;
    match path {
        Path::Root => Vec::new(),
        Path::Seq { parent, index } => {
            let mut out = ignored_segments(parent);
            out.push(Segment::Index(*index));
            out
        }
        Path::Map { parent, key } => {
            let mut out = ignored_segments(parent);
            out.push(Segment::Key(key.clone()));
            out
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_segments(parent),
    }
}

fn error_segments(path: &serde_path_to_error::Path) -> Vec<Segment> {
    use serde_path_to_error::Segment as S;
    path.iter()
        .map(|segment| match segment {
            S::Seq { index } => Segment::Index(*index),
            S::Map { key } => Segment::Key(key.clone()),
            S::Enum { variant } => Segment::Other(variant.clone()),
            S::Unknown => Segment::Other("?".into()),
        })
        .collect()
}

/// A value that did not fit, at its path in the value as it was read.
#[derive(Clone)]
struct Failure {
    path: Vec<Segment>,
    message: String,
}

impl Failure {
    fn into_error(self, prefix: &str, removed: &Removed) -> PathError {
        PathError {
            path: join(prefix, &format_segments(&removed.original(&self.path))),
            message: self.message,
        }
    }
}

/// One read of `value`: `T` and the paths of the fields it ignored.
fn attempt<T: DeserializeOwned>(value: &Value) -> Result<(T, Vec<Vec<Segment>>), Failure> {
    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(ignored_segments(&path));
    let ignoring = serde_ignored::Deserializer::new(value, &mut note);
    let read = serde_path_to_error::deserialize(ignoring).map_err(|e| Failure {
        path: error_segments(e.path()),
        message: e.inner().to_string(),
    });
    read.map(|value| (value, unknown))
}

/// List items left out so far, by the path of their list in the original
/// value, so that later paths can be told as they were written.
#[derive(Default)]
struct Removed {
    items: BTreeMap<Vec<Segment>, BTreeSet<usize>>,
}

impl Removed {
    /// `path` in the value as it is now, as a path in the original value.
    fn original(&self, path: &[Segment]) -> Vec<Segment> {
        let mut out = Vec::with_capacity(path.len());
        for segment in path {
            let segment = match segment {
                Segment::Index(index) => Segment::Index(self.original_index(&out, *index)),
                other => other.clone(),
            };
            out.push(segment);
        }
        out
    }

    fn original_index(&self, list: &[Segment], index: usize) -> usize {
        let mut original = index;
        if let Some(gone) = self.items.get(list) {
            for &removed in gone {
                if removed <= original {
                    original += 1;
                } else {
                    break;
                }
            }
        }
        original
    }

    /// Takes the value at `path` out of `value`. `false` when there is none.
    fn remove(&mut self, value: &mut Value, path: &[Segment]) -> bool {
        let Some((last, parent_path)) = path.split_last() else {
            return false;
        };
        let mut parent = &mut *value;
        for segment in parent_path {
            let next = match (segment, parent) {
                (Segment::Key(key), Value::Object(map)) => map.get_mut(key),
                (Segment::Index(index), Value::Array(items)) => items.get_mut(*index),
                _ => None,
            };
            let Some(next) = next else {
                return false;
            };
            parent = next;
        }
        match (last, parent) {
            (Segment::Key(key), Value::Object(map)) => map.remove(key).is_some(),
            (Segment::Index(index), Value::Array(items)) if *index < items.len() => {
                let list = self.original(parent_path);
                let original = self.original_index(&list, *index);
                items.remove(*index);
                self.items.entry(list).or_default().insert(original);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default)]
    struct Outer {
        name: String,
        count: u32,
        items: Vec<Inner>,
        tags: Vec<String>,
        labels: BTreeMap<String, String>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default)]
    struct Inner {
        size: u32,
    }

    #[test]
    fn unknown_fields_come_with_their_paths_once_each() {
        let value = json!({"name": "a", "colour": 1, "items": [{"size": 1, "x": 2}, {"x": 3}]});
        let plain: Read<Outer> = read(&value, "").unwrap();
        assert_eq!(plain.value.items.len(), 2);
        assert_eq!(plain.unknown, ["colour", "items[0].x", "items[1].x"]);
        let prefixed: Read<Outer> = read(&value, "top").unwrap();
        assert_eq!(prefixed.unknown[1], "top.items[0].x");
        assert!(prefixed.rejected.is_empty());
        // Read again, each path still once.
        let twice = json!({"items": [{"x": 1, "y": {"z": 2}}]});
        let again: WithUnknown<Outer> = serde_json::from_value(twice).unwrap();
        assert_eq!(again.unknown, ["items[0].x", "items[0].y"]);
    }

    #[test]
    fn strict_reading_stops_at_the_first_bad_value_with_its_path() {
        let value = json!({"items": [{"size": 1}, {"size": "big"}]});
        let err = read::<Outer>(&value, "root").unwrap_err();
        assert_eq!(err.path, "root.items[1].size");
        assert!(err.message.contains("big"), "{err}");
        assert_eq!(
            err.to_string(),
            format!("root.items[1].size: {}", err.message)
        );
        let err = read::<Outer>(&json!("text"), "").unwrap_err();
        assert_eq!(err.path, "");
        assert!(!err.to_string().starts_with(':'), "{err}");
    }

    #[test]
    fn lenient_reading_leaves_out_each_bad_value_and_keeps_the_rest() {
        let value = json!({
            "name": 7, "count": 3,
            "tags": ["a", 1, "b", false, "c"],
            "labels": {"x": "1", "y": 2},
            "items": [{"size": "big"}, {"size": 2, "odd": true}],
        });
        let read: Read<Outer> = read_lenient(&value, "").unwrap();
        assert_eq!(read.value.name, "", "a bad field takes its default");
        assert_eq!(read.value.count, 3);
        assert_eq!(read.value.tags, ["a", "b", "c"]);
        assert_eq!(
            read.value.labels,
            BTreeMap::from([("x".to_owned(), "1".to_owned())])
        );
        assert_eq!(read.value.items, [Inner::default(), Inner { size: 2 }]);
        let paths: Vec<&str> = read.rejected.iter().map(|e| e.path.as_str()).collect();
        // Positions are those of the text, also after earlier items left out.
        let mut sorted = paths.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ["items[0].size", "labels.y", "name", "tags[1]", "tags[3]"]
        );
        assert_eq!(read.unknown, ["items[1].odd"]);
    }

    #[test]
    fn lenient_positions_survive_removals_in_nested_lists() {
        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct Grid {
            rows: Vec<Vec<u8>>,
        }
        let value = json!({"rows": [[1, "x"], "y", [2, "z", 3, "w"]]});
        let read: Read<Grid> = read_lenient(&value, "g").unwrap();
        assert_eq!(read.value.rows, [vec![1], vec![2, 3]]);
        let mut paths: Vec<String> = read.rejected.into_iter().map(|e| e.path).collect();
        paths.sort();
        assert_eq!(
            paths,
            ["g.rows[0][1]", "g.rows[1]", "g.rows[2][1]", "g.rows[2][3]"]
        );
    }

    #[test]
    fn lenient_reading_fails_only_when_the_whole_value_does_not_fit() {
        let err = read_lenient::<Outer>(&json!("text"), "").unwrap_err();
        assert_eq!(err.path, "");
    }

    #[test]
    fn shapes_take_only_their_kind_of_value_and_keep_paths() {
        #[derive(Debug, Default, Deserialize, PartialEq)]
        #[serde(default)]
        struct Case {
            #[serde(deserialize_with = "present")]
            size: Option<u32>,
        }
        #[derive(Debug, Deserialize, PartialEq)]
        struct Word(String);
        impl ListItem for Word {
            const LIST: &'static str = "a list of words";
        }
        #[derive(Debug, Default, Deserialize)]
        #[serde(default)]
        struct Top {
            cases: Option<List<Object<Case>>>,
            words: Option<List<Word>>,
        }
        // A struct written as a list of its fields is refused.
        let err = read::<Object<Case>>(&json!([1]), "c").unwrap_err();
        assert_eq!(
            (err.path.as_str(), err.message.as_str()),
            ("c", "must be an object, found a list")
        );
        let err = read::<Object<Top>>(&json!({"cases": {"size": 1}}), "").unwrap_err();
        assert_eq!(err.to_string(), "cases: must be a list, found an object");
        let err = read::<Object<Top>>(&json!({"words": "w"}), "").unwrap_err();
        assert_eq!(
            err.to_string(),
            "words: must be a list of words, found a string"
        );
        let err = read::<Object<Top>>(&json!({"cases": [{}, {"size": null}]}), "").unwrap_err();
        assert_eq!(err.path, "cases[1].size", "null is not a missing key");
        let top = read::<Object<Top>>(
            &json!({"cases": [{"size": 2, "x": 1}], "words": ["a"]}),
            "t",
        )
        .unwrap();
        assert_eq!(
            top.value.0.cases,
            Some(List(vec![Object(Case { size: Some(2) })]))
        );
        assert_eq!(top.unknown, ["t.cases[0].x"]);
        for (value, found) in [
            (json!(true), "a boolean"),
            (json!(-1), "a number"),
            (json!(1.5), "a number"),
            (json!(null), "null"),
            (json!("s"), "a string"),
        ] {
            assert_eq!(kind(&value), found);
            let err = read::<Object<Case>>(&value, "").unwrap_err();
            assert_eq!(err.message, format!("must be an object, found {found}"));
        }
    }

    #[test]
    fn joins() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", ""), "a");
        assert_eq!(join("a", "b[0]"), "a.b[0]");
        assert_eq!(join("a", "[0].b"), "a[0].b");
    }
}
