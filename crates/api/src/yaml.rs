//! Reading and writing DeviceConfig YAML.
//!
//! [`parse_documents`] reads a (multi-document) YAML text the way an
//! administrator's file is written: DeviceConfigs possibly mixed with other
//! objects (a Namespace first, say), YAML 1.1 spellings such as `enable: True`,
//! numbers quoted or not. It reports a syntax or type error with its line and
//! column, and records fields the API does not know (which `kubectl apply`
//! rejects) so that `validate` can list them with every other problem.
//!
//! This module must not judge values; that is `validate`.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::tracked::{WithUnknown, format_path};
use super::types::{DeviceConfig, DeviceConfigSpec, DeviceConfigStatus};

/// `kind` of a DeviceConfig document.
pub const KIND: &str = "DeviceConfig";

/// `apiVersion` of a DeviceConfig document.
pub fn api_version() -> String {
    DeviceConfig::api_version(&()).into_owned()
}

/// A YAML text that cannot be read: the first syntax or type error, with its
/// position (1-based) in the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    /// 1-based line of the error, 0 when unknown.
    pub line: u64,
    /// 1-based column of the error, 0 when unknown.
    pub column: u64,
    /// What is wrong.
    pub message: String,
}

impl ParseError {
    fn from_saphyr(err: &serde_saphyr::Error, text: &str) -> Self {
        let (line, column) = err.location().map_or((0, 0), |at| (at.line(), at.column()));
        let plain = serde_saphyr::render_options! {
            formatter: &serde_saphyr::UserMessageFormatter,
            snippets: serde_saphyr::SnippetMode::Off,
        };
        let mut message = err.render_with_options(plain);
        // The plain rendering ends with the position, which is reported separately.
        for suffix in [
            format!(" at line {line}, column {column}"),
            format!(" at line {line} column {column}"),
        ] {
            if let Some(stripped) = message.strip_suffix(suffix.as_str()) {
                message = stripped.to_string();
            }
        }
        // serde's wording for integers names Rust types ("invalid i32").
        let is_rust_int = message.strip_prefix("invalid ").is_some_and(|ty| {
            matches!(
                ty,
                "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64"
            )
        });
        if is_rust_int {
            message = "expected a whole number in range".to_string();
        }
        if let Some(found) = token_at(text, line, column) {
            message = format!("{message} (found {found:?})");
        }
        Self {
            line,
            column,
            message,
        }
    }
}

/// The rest of the line at a 1-based position, shortened, to show what was found there.
fn token_at(text: &str, line: u64, column: u64) -> Option<String> {
    let line_text = text
        .lines()
        .nth(usize::try_from(line.checked_sub(1)?).ok()?)?;
    let start = usize::try_from(column.checked_sub(1)?).ok()?;
    let rest: String = line_text.chars().skip(start).collect();
    let rest = rest.split(" #").next().unwrap_or("").trim();
    if rest.is_empty() {
        return None;
    }
    const MAX: usize = 40;
    Some(if rest.chars().count() > MAX {
        format!("{}...", rest.chars().take(MAX).collect::<String>())
    } else {
        rest.to_string()
    })
}

/// One document of a YAML text.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// 0-based position among the text's non-empty documents.
    pub index: usize,
    /// 1-based line where the document starts.
    pub line: u64,
    /// What the document holds.
    pub kind: DocumentKind,
}

/// What a document holds.
#[derive(Debug, Clone, PartialEq)]
pub enum DocumentKind {
    /// A `kind: DeviceConfig` document, with defaults applied.
    DeviceConfig {
        /// The resource as the agent and reconciler see it.
        config: Box<DeviceConfig>,
        /// `apiVersion` as written (`None` when missing); anything but
        /// `amd.com/v1alpha1` is a problem.
        api_version: Option<String>,
        /// Paths of fields the API does not define (e.g. `spec.driver.enabel`).
        unknown_fields: Vec<String>,
    },
    /// Another object (or no object at all); not a DeviceConfig.
    Other {
        /// `apiVersion` as written.
        api_version: Option<String>,
        /// `kind` as written.
        kind: Option<String>,
    },
}

/// Parses every document of a YAML text. Empty documents are skipped.
pub fn parse_documents(text: &str) -> Result<Vec<Document>, ParseError> {
    let docs: Vec<Spanned<WithUnknown<RawDoc>>> =
        serde_saphyr::from_multiple(text).map_err(|e| ParseError::from_saphyr(&e, text))?;
    docs.into_iter()
        .enumerate()
        .map(|(index, spanned)| {
            let line = spanned.referenced.line();
            let WithUnknown {
                value: mut raw,
                unknown,
            } = spanned.value;
            // Only a DeviceConfig's fields are this API's to judge.
            if raw.is_device_config() {
                raw.unknown_fields.extend(unknown);
            }
            let kind = raw.into_kind().map_err(|message| ParseError {
                line,
                column: 1,
                message,
            })?;
            Ok(Document { index, line, kind })
        })
        .collect()
}

/// Parses a YAML text that must hold DeviceConfigs only. Unknown fields are
/// dropped (as the API server prunes them); run `validate` to report them.
pub fn parse_device_configs(text: &str) -> Result<Vec<DeviceConfig>, ParseError> {
    parse_documents(text)?
        .into_iter()
        .map(|doc| device_config_only(doc).map(|(config, _)| config))
        .collect()
}

/// A DeviceConfig spec as a file gives it (see [`parse_specs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecDocument {
    /// 1-based line where the document starts.
    pub line: u64,
    pub spec: DeviceConfigSpec,
    /// Paths of fields the API does not define, `spec.` first
    /// (`spec.metricsExporter.prot`), sorted, each once.
    pub unknown_fields: Vec<String>,
}

/// Parses a text that gives DeviceConfig specs in any of the three shapes an
/// administrator writes one, as the agent reads its configuration in
/// standalone mode:
///
/// - DeviceConfig documents (`kind: DeviceConfig`), possibly several; then
///   every document must be one;
/// - one document with just `spec:` (other top-level keys are not the spec's
///   and are left alone);
/// - one bare spec (`metricsExporter: ...`); an empty text is the default spec.
///
/// A document with a `kind` or an `apiVersion` is read as a whole object.
/// Errors name their line and column.
pub fn parse_specs(text: &str) -> Result<Vec<SpecDocument>, ParseError> {
    let documents = parse_documents(text)?;
    let is_object = |doc: &Document| match &doc.kind {
        DocumentKind::DeviceConfig { .. } => true,
        DocumentKind::Other { api_version, kind } => api_version.is_some() || kind.is_some(),
    };
    if documents.len() > 1 || documents.iter().any(is_object) {
        return documents
            .into_iter()
            .map(|doc| {
                let line = doc.line;
                device_config_only(doc).map(|(config, unknown_fields)| SpecDocument {
                    line,
                    spec: config.spec,
                    unknown_fields,
                })
            })
            .collect();
    }
    let line = documents.first().map_or(1, |doc| doc.line);
    // The one document (empty ones are skipped), read again as its shape.
    fn one<T: de::DeserializeOwned>(text: &str) -> Result<Option<T>, ParseError> {
        serde_saphyr::from_multiple(text)
            .map(|docs: Vec<T>| docs.into_iter().next())
            .map_err(|e| ParseError::from_saphyr(&e, text))
    }
    let keys: Option<std::collections::BTreeMap<String, IgnoredAny>> = one(text)?;
    let (spec, unknown_fields) = if keys.is_some_and(|keys| keys.contains_key("spec")) {
        let read = one::<WithUnknown<SpecWrapper>>(text)?;
        let (spec, unknown) = read.map_or_else(Default::default, |r| (r.value.spec, r.unknown));
        // Other top-level keys are not the spec's.
        let unknown = unknown
            .into_iter()
            .filter(|path| path.starts_with("spec.") || path.starts_with("spec["))
            .collect();
        (spec.unwrap_or_default(), unknown)
    } else {
        let read = one::<WithUnknown<DeviceConfigSpec>>(text)?;
        let (spec, unknown) = read.map_or_else(Default::default, |r| (r.value, r.unknown));
        let unknown = unknown
            .iter()
            .map(|path| super::tracked::join("spec", path))
            .collect();
        (spec, unknown)
    };
    Ok(vec![SpecDocument {
        line,
        spec,
        unknown_fields,
    }])
}

/// A document with just `spec:`.
#[derive(Deserialize)]
struct SpecWrapper {
    #[serde(default)]
    spec: Option<DeviceConfigSpec>,
}

/// The DeviceConfig a document holds, with its unknown fields; any other
/// document is an error.
fn device_config_only(doc: Document) -> Result<(DeviceConfig, Vec<String>), ParseError> {
    match doc.kind {
        DocumentKind::DeviceConfig {
            config,
            unknown_fields,
            ..
        } => Ok((*config, unknown_fields)),
        DocumentKind::Other { kind, .. } => Err(ParseError {
            line: doc.line,
            column: 1,
            message: format!(
                "document {} is not a DeviceConfig (kind {})",
                doc.index,
                kind.as_deref().unwrap_or("missing")
            ),
        }),
    }
}

/// The 1-based line of every field of every document: `field_lines(text)[1]
/// ["spec.driver.enable"]` is where that value is written in the second
/// document. A key whose value is a block (a mapping or a list) gets the line
/// of the key itself. Used to point a problem at its field; a text that cannot
/// be read gives no lines.
pub fn field_lines(text: &str) -> Vec<std::collections::BTreeMap<String, u64>> {
    let Ok(docs) = serde_saphyr::from_multiple::<Spanned<Node>>(text) else {
        return Vec::new();
    };
    docs.into_iter()
        .map(|doc| {
            let mut lines = std::collections::BTreeMap::new();
            doc.value.flatten("", &mut lines);
            lines
        })
        .collect()
}

/// The nearest line for `path` among `lines`: its own, else its closest
/// ancestor's (a missing field is reported at its parent).
pub fn line_of(lines: &std::collections::BTreeMap<String, u64>, path: &str) -> Option<u64> {
    let mut path = path;
    loop {
        if let Some(line) = lines.get(path) {
            return Some(*line);
        }
        let cut = path.rfind(['.', '['])?;
        path = &path[..cut];
    }
}

/// Any YAML value, remembering where each field's key and value are.
enum Node {
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Scalar,
}

impl Node {
    fn flatten(&self, prefix: &str, out: &mut std::collections::BTreeMap<String, u64>) {
        match self {
            Node::Map(fields) => {
                for (key, value) in fields {
                    let path = if prefix.is_empty() {
                        key.value.clone()
                    } else {
                        format!("{prefix}.{}", key.value)
                    };
                    out.insert(path.clone(), key.referenced.line());
                    value.value.flatten(&path, out);
                }
            }
            Node::Seq(items) => {
                for (index, item) in items.iter().enumerate() {
                    let path = format!("{prefix}[{index}]");
                    out.insert(path.clone(), item.referenced.line());
                    item.value.flatten(&path, out);
                }
            }
            Node::Scalar => {}
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut fields = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    fields.push((key, map.next_value()?));
                }
                Ok(Node::Map(fields))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_str<E>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}

/// Writes a value as YAML (one document, no `---`).
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(value)
}

/// A document as read, before it is known to be a DeviceConfig.
#[derive(Default)]
struct RawDoc {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: Option<ObjectMeta>,
    spec: Option<Slot<DeviceConfigSpec>>,
    status: Option<Slot<DeviceConfigStatus>>,
    unknown_fields: Vec<String>,
}

/// A section read either straight into its type (when `kind` came first, as it
/// does in practice, so type errors keep their line and column) or buffered
/// because `kind` was not known yet.
enum Slot<T> {
    Typed(T),
    Buffered(serde_json::Value),
}

impl<T: de::DeserializeOwned + Default> Slot<T> {
    fn resolve(self, section: &str, unknown: &mut Vec<String>) -> Result<T, String> {
        match self {
            Self::Typed(value) => Ok(value),
            Self::Buffered(serde_json::Value::Null) => Ok(T::default()),
            Self::Buffered(value) => serde_ignored::deserialize(value, |path| {
                unknown.push(format!("{section}.{}", format_path(&path)))
            })
            .map_err(|e| format!("{section}: {e}")),
        }
    }
}

impl RawDoc {
    fn is_device_config(&self) -> bool {
        self.kind.as_deref() == Some(KIND)
    }

    fn into_kind(mut self) -> Result<DocumentKind, String> {
        if !self.is_device_config() {
            return Ok(DocumentKind::Other {
                api_version: self.api_version,
                kind: self.kind,
            });
        }
        let mut unknown = std::mem::take(&mut self.unknown_fields);
        let spec = match self.spec {
            Some(slot) => slot.resolve("spec", &mut unknown)?,
            None => DeviceConfigSpec::default(),
        };
        let status = match self.status {
            Some(slot) => Some(slot.resolve("status", &mut unknown)?),
            None => None,
        };
        unknown.sort();
        unknown.dedup();
        let config = DeviceConfig {
            metadata: self.metadata.unwrap_or_default(),
            spec,
            status,
        };
        Ok(DocumentKind::DeviceConfig {
            config: Box::new(config),
            api_version: self.api_version,
            unknown_fields: unknown,
        })
    }
}

impl<'de> Deserialize<'de> for RawDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RawDocVisitor)
    }
}

struct RawDocVisitor;

impl<'de> Visitor<'de> for RawDocVisitor {
    type Value = RawDoc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object (a mapping with apiVersion, kind, metadata and spec)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawDoc, A::Error> {
        let mut doc = RawDoc::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => doc.api_version = map.next_value()?,
                "kind" => doc.kind = map.next_value()?,
                "metadata" => doc.metadata = map.next_value()?,
                "spec" => doc.spec = next_slot(&mut map, &doc)?,
                "status" => doc.status = next_slot(&mut map, &doc)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(doc)
    }
}

fn next_slot<'de, A, T>(map: &mut A, doc: &RawDoc) -> Result<Option<Slot<T>>, A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de> + Default,
{
    if doc.is_device_config() {
        let value: Option<T> = map.next_value()?;
        Ok(Some(Slot::Typed(value.unwrap_or_default())))
    } else if doc.kind.is_none() {
        Ok(Some(Slot::Buffered(map.next_value()?)))
    } else {
        map.next_value::<IgnoredAny>()?;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata: {name: x}\nspec:\n  metricsExporter: {enable: true, port: 5001, prot: 1}\n";

    fn one(text: &str) -> SpecDocument {
        let mut specs = parse_specs(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(specs.len(), 1, "{text}");
        specs.remove(0)
    }

    #[test]
    fn the_three_shapes_give_the_same_spec_and_unknown_fields() {
        let wrapped =
            "metadata: {name: x}\nspec:\n  metricsExporter: {enable: true, port: 5001, prot: 1}\n";
        let bare = "metricsExporter: {enable: True, port: 5001, prot: 1}\n";
        let docs = [one(FULL), one(wrapped), one(bare)];
        for doc in &docs {
            assert_eq!(doc.spec.metrics_exporter.port, 5001);
            assert_eq!(doc.spec.metrics_exporter.enable, Some(true));
            assert_eq!(doc.unknown_fields, ["spec.metricsExporter.prot"]);
        }
        assert_eq!(docs[0].spec, docs[2].spec);
        assert_eq!(docs[2].line, 1);
    }

    #[test]
    fn empty_texts_and_empty_specs_are_the_default() {
        for text in [
            "",
            "# nothing\n",
            "---\n",
            "spec:\n",
            "spec: null\n",
            "{}\n",
        ] {
            let doc = one(text);
            assert_eq!(doc.spec, DeviceConfigSpec::default(), "{text:?}");
            assert!(doc.unknown_fields.is_empty(), "{text:?}");
        }
        // Empty documents around a bare spec are skipped.
        assert_eq!(
            one("---\nmetricsExporter: {port: 5002}\n---\n")
                .spec
                .metrics_exporter
                .port,
            5002
        );
    }

    #[test]
    fn several_documents_must_all_be_device_configs() {
        let two = parse_specs(&format!("{FULL}---\n{FULL}")).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].line, 7);
        let err = parse_specs(&format!("{FULL}---\nmetricsExporter: {{port: 1}}\n")).unwrap_err();
        assert!(
            err.message
                .contains("document 1 is not a DeviceConfig (kind missing)"),
            "{err}"
        );
        assert_eq!(err.line, 7);
        let err =
            parse_specs("apiVersion: v1\nkind: Namespace\nmetadata: {name: n}\n").unwrap_err();
        assert!(err.message.contains("kind Namespace"), "{err}");
    }

    #[test]
    fn bad_values_name_their_line_in_every_shape() {
        let err = parse_specs("metricsExporter:\n  port: lots\n").unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        let err = parse_specs("spec:\n  metricsExporter:\n    port: lots\n").unwrap_err();
        assert_eq!(err.line, 3, "{err}");
        assert!(parse_specs("metricsExporter: [1, 2]").is_err());
        assert!(parse_specs(": : :").is_err());
    }
}
