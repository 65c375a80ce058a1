//! An object kept as its JSON text: what the store holds for every object and every
//! history record, thawed into a [`Value`] only when a request reads it.
//!
//! A `serde_json::Value` costs about six times its JSON size (a B-tree node per map, an
//! allocation per string): a realistic 18 KB Node is ~110 KB as a `Value`, and the store
//! keeps each object's latest version plus the versions its history still names. Frozen,
//! the latest version and the history record of the write that made it share one
//! allocation, so a 130,000-Node fleet fits the emulator's machine. This module only
//! converts; it knows nothing of the API.

use std::sync::Arc;

use serde_json::Value;

/// An immutable object as JSON text. Cloning shares the text.
#[derive(Clone, Debug, PartialEq)]
pub struct Frozen(Arc<str>);

impl Frozen {
    pub fn new(value: &Value) -> Self {
        // Serialising a `Value` cannot fail: its map keys are strings.
        Frozen(Arc::from(serde_json::to_string(value).unwrap_or_default()))
    }

    /// The length of the JSON text, in bytes.
    pub fn json_len(&self) -> usize {
        self.0.len()
    }

    /// The object as a `Value`. The text was written by [`Frozen::new`], so it parses; if it
    /// ever did not, the reader sees `null` rather than a panic in the server.
    pub fn thaw(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn thawing_gives_back_what_was_frozen_numbers_included() {
        let v = json!({"a": [1, -2, 3.5, 1e300, u64::MAX, i64::MIN], "b": {"c": null, "d": "é\n"}});
        let f = Frozen::new(&v);
        assert_eq!(f.thaw(), v);
        assert_eq!(f.clone(), f);
    }
}
