//! Label and field selectors: parsing the query-string syntax and matching objects.
//!
//! Label selectors follow `k8s.io/apimachinery/pkg/labels`: equality (`a=b`, `a==b`, `a!=b`),
//! set-based (`a in (x,y)`, `a notin (x)`, `a`, `!a`) and the numeric `a>1` / `a<1`.
//! Field selectors accept `=`, `==` and `!=` on dotted paths; which paths a resource allows is
//! decided by the caller (see `resources`). Pure functions only, no I/O.

use serde_json::Value;

/// One label requirement.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector; all requirements must hold (an empty one matches everything).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(pub Vec<LabelReq>);

/// A parsed field selector: `(path, value, equal?)` terms, all of which must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(pub Vec<FieldReq>);

#[derive(Clone, Debug, PartialEq)]
pub struct FieldReq {
    pub field: String,
    pub value: String,
    pub equal: bool,
}

fn valid_key(k: &str) -> bool {
    // A qualified name with an optional DNS prefix: `example.com/name`.
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    });
    name_ok && prefix_ok
}

fn valid_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced parentheses".into());
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, found '{rest}'"))?;
    let mut values = Vec::new();
    for v in inner.split(',') {
        let v = v.trim();
        if !valid_value(v) {
            return Err(format!("invalid label value: '{v}'"));
        }
        values.push(v.to_string());
    }
    Ok(values)
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for term in split_top_level(s)? {
            let term = term.trim();
            if term.is_empty() {
                return Err("empty requirement in label selector".into());
            }
            reqs.push(Self::parse_term(term)?);
        }
        Ok(Self(reqs))
    }

    fn parse_term(term: &str) -> Result<LabelReq, String> {
        let key_checked = |k: &str| -> Result<String, String> {
            let k = k.trim();
            if valid_key(k) {
                Ok(k.to_string())
            } else {
                Err(format!("invalid label key: '{k}'"))
            }
        };
        let value_checked = |v: &str| -> Result<String, String> {
            let v = v.trim();
            if valid_value(v) {
                Ok(v.to_string())
            } else {
                Err(format!("invalid label value: '{v}'"))
            }
        };
        if let Some(k) = term.strip_prefix('!') {
            return Ok(LabelReq::NotExists(key_checked(k)?));
        }
        if let Some((k, v)) = term.split_once("!=") {
            return Ok(LabelReq::NotEq(key_checked(k)?, value_checked(v)?));
        }
        if let Some((k, v)) = term.split_once("==") {
            return Ok(LabelReq::Eq(key_checked(k)?, value_checked(v)?));
        }
        if let Some((k, v)) = term.split_once('=') {
            return Ok(LabelReq::Eq(key_checked(k)?, value_checked(v)?));
        }
        for (op, gt) in [('>', true), ('<', false)] {
            if let Some((k, v)) = term.split_once(op) {
                let n: i64 = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("invalid integer value: '{}'", v.trim()))?;
                let k = key_checked(k)?;
                return Ok(if gt {
                    LabelReq::Gt(k, n)
                } else {
                    LabelReq::Lt(k, n)
                });
            }
        }
        // Set-based: `key in (..)` / `key notin (..)`, or a bare `key`.
        let mut parts = term.splitn(2, char::is_whitespace);
        let key = parts.next().unwrap_or_default();
        let rest = parts.next().unwrap_or_default().trim_start();
        if rest.is_empty() {
            if let Some((k, r)) = key.split_once('(') {
                return Err(format!("invalid requirement near '{k}({r}'"));
            }
            return Ok(LabelReq::Exists(key_checked(key)?));
        }
        if let Some(r) = rest.strip_prefix("notin") {
            return Ok(LabelReq::NotIn(key_checked(key)?, parse_set(r)?));
        }
        if let Some(r) = rest.strip_prefix("in") {
            return Ok(LabelReq::In(key_checked(key)?, parse_set(r)?));
        }
        Err(format!("unable to parse requirement: '{term}'"))
    }

    /// Parses a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`), as found in
    /// PodDisruptionBudgets. `None` means the object's selector matches nothing.
    pub fn from_object(sel: &Value) -> Option<Self> {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(LabelReq::Eq(k.clone(), v.as_str()?.to_string()));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key")?.as_str()?.to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                reqs.push(match e.get("operator")?.as_str()? {
                    "In" => LabelReq::In(key, values),
                    "NotIn" => LabelReq::NotIn(key, values),
                    "Exists" => LabelReq::Exists(key),
                    "DoesNotExist" => LabelReq::NotExists(key),
                    _ => return None,
                });
            }
        }
        Some(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }

    /// Matches against a whole object.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(obj.pointer("/metadata/labels").and_then(Value::as_object))
    }
}

/// Splits a field selector term list, honouring `\,` escapes.
fn split_escaped(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                cur.push(c);
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ',' => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for term in split_escaped(s) {
            let term = term.trim();
            let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(format!("invalid field selector term: '{term}'"));
            }
            reqs.push(FieldReq {
                field: field.to_string(),
                value: unescape(value.trim()),
                equal,
            });
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the object satisfies every term. A missing field compares as the empty
    /// string, and booleans and numbers compare by their text, as the real server's field
    /// label conversion does.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = field_value(obj, &r.field);
            (actual == r.value) == r.equal
        })
    }
}

/// The text of a dotted field path in an object (`""` when absent).
pub fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn equality_and_inequality() {
        let l = labels(json!({"app": "gpu", "tier": "node"}));
        assert!(LabelSelector::parse("app=gpu").unwrap().matches(Some(&l)));
        assert!(
            LabelSelector::parse("app==gpu,tier=node")
                .unwrap()
                .matches(Some(&l))
        );
        assert!(!LabelSelector::parse("app=cpu").unwrap().matches(Some(&l)));
        assert!(LabelSelector::parse("app!=cpu").unwrap().matches(Some(&l)));
        // `!=` also matches objects without the label at all.
        assert!(LabelSelector::parse("zone!=a").unwrap().matches(Some(&l)));
        assert!(LabelSelector::parse("zone!=a").unwrap().matches(None));
    }

    #[test]
    fn set_based() {
        let l = labels(json!({"app": "gpu", "amd.com/gpu.family": "MI300"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&l));
        assert!(m("app in (gpu, cpu)"));
        assert!(!m("app in (cpu)"));
        assert!(m("app notin (cpu)"));
        assert!(!m("app notin (gpu,cpu)"));
        assert!(m("missing notin (x)"));
        assert!(!m("missing in (x)"));
        assert!(m("amd.com/gpu.family"));
        assert!(!m("!amd.com/gpu.family"));
        assert!(m("!missing"));
        assert!(m("app in (gpu),amd.com/gpu.family=MI300,!missing"));
    }

    #[test]
    fn numeric_comparisons() {
        let l = labels(json!({"count": "8"}));
        assert!(LabelSelector::parse("count>4").unwrap().matches(Some(&l)));
        assert!(!LabelSelector::parse("count<4").unwrap().matches(Some(&l)));
    }

    #[test]
    fn rejects_garbage() {
        assert!(LabelSelector::parse("app in gpu").is_err());
        assert!(LabelSelector::parse("app in (gpu").is_err());
        assert!(LabelSelector::parse("-bad-=x").is_err());
        assert!(LabelSelector::parse("a=b,,c=d").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
    }

    #[test]
    fn label_selector_object() {
        let sel = LabelSelector::from_object(&json!({
            "matchLabels": {"app": "x"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]
        }))
        .unwrap();
        assert!(sel.matches(Some(&labels(json!({"app": "x", "tier": "web"})))));
        assert!(!sel.matches(Some(&labels(json!({"app": "x", "tier": "db"})))));
        assert!(
            LabelSelector::from_object(
                &json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]})
            )
            .is_none()
        );
    }

    #[test]
    fn field_selectors() {
        let pod =
            json!({"metadata": {"name": "p1", "namespace": "ns"}, "spec": {"nodeName": "n1"}});
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&pod);
        assert!(m("metadata.name=p1"));
        assert!(m("metadata.namespace==ns,spec.nodeName=n1"));
        assert!(!m("spec.nodeName!=n1"));
        assert!(m("spec.nodeName!=n2"));
        // Unscheduled pods have an empty nodeName.
        assert!(
            FieldSelector::parse("spec.nodeName=")
                .unwrap()
                .matches(&json!({"spec": {}}))
        );
        assert!(FieldSelector::parse("nonsense").is_err());
        let node = json!({"spec": {"unschedulable": true}});
        assert!(
            FieldSelector::parse("spec.unschedulable=true")
                .unwrap()
                .matches(&node)
        );
    }
}
