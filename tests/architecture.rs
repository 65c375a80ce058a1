//! The module order of `src/`, checked: no module imports from a module above
//! it.
//!
//! Every file under `src/` belongs to the top-level module it is in
//! (`src/metrics/render.rs` to `metrics`, `src/host.rs` to `host`). Its code
//! refers to other modules through `crate::…` paths (in `use` lines or inline,
//! grouped `use crate::{a, b::c}` included) and `super::…` chains that climb out
//! of its module. Each such reference is an edge, and an edge is allowed only
//! downwards in [`LAYERS`]: a module may use the modules of lower layers, never
//! those of its own layer or above. Comments and string literals do not count;
//! doc links are not dependencies.
//!
//! Test code (items under `#[cfg(test)]`, `#[test]` functions, and files named
//! `tests.rs`) is held to the same order, except that it may also use the
//! modules in [`TEST_FIXTURES`]: the simulated hosts that tests of low modules
//! run against. Production code gets no such exception.
//!
//! The checker is plain text processing (no `syn`), tested on fabricated
//! sources below, so that it keeps failing on an upward import.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// The allowed order, lowest first. A module may use modules of lower layers
/// only; modules of one layer may not use each other. Every top-level module
/// under `src/` must be listed, so a new module has to be placed here.
const LAYERS: &[&[&str]] = &[
    // Plain data and counters: the DeviceConfig API and the node-leader
    // contract (with the field-manager names), process-wide counters.
    &["api", "counters"],
    // Host access: path mapping, bounded reads; and running host commands.
    &["host", "command"],
    // Discovery and the change stream.
    &["device"],
    // Simulated hosts, written through the real layout.
    &["simulate"],
    // The supervised-service kernel every node service implements, the one
    // writer of Nodes that every concern (and the leader's upgrades) writes
    // through, and the one sink every Event about the node goes through.
    &["service", "node_writer", "events"],
    // GPU nodes found without NFD: the PCI ids and the node's own labels,
    // through the Node writer.
    &["detect"],
    // The node side of the driver lifecycle: what is loaded, bundles, loading.
    // Above the Node writer and events (its refusals become conditions and
    // Events), below the labeller and the agent that publish its report.
    &["driver"],
    // GPU partitioning: profiles, the plan against the node, the sysfs
    // writes. Above the driver (whose holder scan it uses).
    &["partition"],
    // Node remediation's domain: the condition mapping, the Node record and
    // the decisions (pure; the leader and the agent carry them out).
    &["remediation"],
    // The kubelet device plugin: resource naming, device IDs, and the
    // HealthReport interface health sources feed.
    &["plugin"],
    // The DRA kubelet plugin: the same inventory and HealthReport, with the
    // device plugin's health rules and socket server.
    &["dra"],
    // sysfs sampling and the exporter's config.json and field catalogue, below
    // both health (thresholds, samples) and metrics.
    &["telemetry"],
    // The node services that produce things for others to read.
    &["health", "labeller", "testrunner"],
    // The exporter: shows the inventory, health, and test results.
    &["metrics"],
    // The reference exporter's health socket: health's verdicts with the
    // exporter's pod association, for AMD's own device plugin.
    &["metricssvc"],
    // The Lease-elected cluster role.
    &["cluster"],
    // The node agent, which runs all of the above.
    &["agent"],
    // The command line.
    &["cli"],
];

/// Modules that test code of any module may use as fixtures.
const TEST_FIXTURES: &[&str] = &["simulate"];

/// Upward edges that are known and due to go: `(from, to, why)`. Each must
/// still occur (a stale entry fails), so the list only shrinks.
const KNOWN_UPWARD: &[(&str, &str, &str)] = &[];

/// One reference from a file to another top-level module.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    /// Line number, from 1.
    line: usize,
    /// The top-level module referred to.
    to: String,
    /// The reference is in test code.
    test: bool,
}

/// An edge the order does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    from: String,
    to: String,
    why: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} -> {}: {}",
            self.file, self.line, self.from, self.to, self.why
        )
    }
}

/// The module path of a file relative to `src/`: `metrics/render.rs` is
/// `[metrics, render]`, `metrics/mod.rs` is `[metrics]`, `lib.rs` is `[]`.
fn module_path(relative: &str) -> Vec<String> {
    let without = relative.strip_suffix(".rs").unwrap_or(relative);
    let mut parts: Vec<String> = without.split('/').map(str::to_owned).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Replaces comments and the contents of string and char literals with
/// spaces, keeping every newline, so that line numbers stay right and only
/// code is left.
fn strip(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && starts_literal(&chars, i)
        {
            // A raw string r"…", r#"…"#: find its closing quote and hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push(' ');
            for _ in 0..=hashes {
                out.push(' ');
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) => {
                        for _ in 0..=hashes {
                            out.push(' ');
                        }
                        j += 1 + hashes;
                        break;
                    }
                    Some(&other) => {
                        out.push(blank(other));
                        j += 1;
                    }
                }
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    out.push(' ');
                    i += 1;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\''), not a lifetime ('a).
            let len = if next == Some('\\') {
                (i + 2..chars.len())
                    .find(|&j| chars[j] == '\'')
                    .map(|j| j + 1 - i)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            match len {
                Some(len) => {
                    out.extend(std::iter::repeat_n(' ', len));
                    i += len;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the `r` at `chars[at]` begins a (byte) raw string rather than
/// ending an identifier: nothing word-like before it but a lone `b`.
fn starts_literal(chars: &[char], at: usize) -> bool {
    let word = |k: Option<usize>| {
        k.and_then(|k| chars.get(k))
            .is_some_and(|p| p.is_alphanumeric() || *p == '_')
    };
    let before = at.checked_sub(1);
    !word(before)
        || (before.map(|k| chars[k]) == Some('b') && !word(before.and_then(|k| k.checked_sub(1))))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// Tokens with their line numbers. Attributes come out as one identifier
/// each, `#[cfg(test)]` as `#cfg_test` and `#[test]`-like ones as `#test`.
fn tokens(code: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '#' && matches!(chars.get(i + 1), Some('[')) {
            let start = i + 2;
            let mut depth = 1;
            let mut j = start;
            while j < chars.len() && depth > 0 {
                match chars[j] {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    '\n' => line += 1,
                    _ => {}
                }
                j += 1;
            }
            let text: String = chars[start..j.saturating_sub(1)].iter().collect();
            let words: Vec<&str> = text
                .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            if words.first() == Some(&"cfg") {
                if words.contains(&"test") && !words.contains(&"not") {
                    out.push((line, Token::Ident("#cfg_test".into())));
                }
            } else if words.last() == Some(&"test") {
                out.push((line, Token::Ident("#test".into())));
            }
            i = j;
        } else if c == '$' || c.is_alphabetic() || c == '_' {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let word = word.strip_prefix('$').unwrap_or(&word).to_owned();
            out.push((line, Token::Ident(word)));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((line, Token::Path));
            i += 2;
        } else {
            out.push((line, Token::Punct(c)));
            i += 1;
        }
    }
    out
}

/// The top-level modules named by a `use` group starting at `tokens[at]`
/// (just after `{`), and the index after its closing `}`.
fn group_heads(tokens: &[(usize, Token)], at: usize) -> (Vec<(usize, String)>, usize) {
    let mut heads = Vec::new();
    let mut depth = 1;
    let mut expect_head = true;
    let mut i = at;
    while i < tokens.len() && depth > 0 {
        match &tokens[i].1 {
            Token::Punct('{') => {
                depth += 1;
                expect_head = false;
            }
            Token::Punct('}') => depth -= 1,
            Token::Punct(',') if depth == 1 => expect_head = true,
            Token::Ident(word) if depth == 1 && expect_head => {
                if word != "self" && word != "*" {
                    heads.push((tokens[i].0, word.clone()));
                }
                expect_head = false;
            }
            _ => {}
        }
        i += 1;
    }
    (heads, i)
}

struct Frame {
    /// The inline module this brace opened, if any.
    module: Option<String>,
    test: bool,
}

/// The references from one source file (path relative to `src/`) to
/// top-level modules, its own included.
fn edges(relative: &str, source: &str) -> Vec<Edge> {
    let file_path = module_path(relative);
    let file_is_test = relative.ends_with("/tests.rs") || relative == "tests.rs";
    let toks = tokens(&strip(source));
    let mut frames: Vec<Frame> = Vec::new();
    let mut pending_test = false;
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (line, token) = &toks[i];
        let in_test = file_is_test || pending_test || frames.iter().any(|f| f.test);
        match token {
            Token::Ident(word) if word == "#cfg_test" || word == "#test" => {
                pending_test = true;
                i += 1;
            }
            Token::Punct('{') => {
                let module = match (
                    i.checked_sub(2).map(|k| &toks[k].1),
                    i.checked_sub(1).map(|k| &toks[k].1),
                ) {
                    (Some(Token::Ident(m)), Some(Token::Ident(name))) if m == "mod" => {
                        Some(name.clone())
                    }
                    _ => None,
                };
                frames.push(Frame {
                    module,
                    test: pending_test,
                });
                pending_test = false;
                i += 1;
            }
            Token::Punct('}') => {
                frames.pop();
                i += 1;
            }
            Token::Punct(';') => {
                pending_test = false;
                i += 1;
            }
            Token::Ident(word)
                if word == "crate" && toks.get(i + 1).map(|t| &t.1) == Some(&Token::Path) =>
            {
                i += 2;
                match toks.get(i).map(|t| &t.1) {
                    Some(Token::Ident(head)) => {
                        out.push(Edge {
                            line: *line,
                            to: head.clone(),
                            test: in_test,
                        });
                        i += 1;
                    }
                    Some(Token::Punct('{')) => {
                        let (heads, after) = group_heads(&toks, i + 1);
                        for (l, head) in heads {
                            out.push(Edge {
                                line: l,
                                to: head,
                                test: in_test,
                            });
                        }
                        i = after;
                    }
                    _ => {}
                }
            }
            Token::Ident(word) if word == "super" => {
                // Where the chain of `super::` lands.
                let mut here: Vec<String> = file_path.clone();
                here.extend(frames.iter().filter_map(|f| f.module.clone()));
                let mut j = i;
                while matches!(toks.get(j).map(|t| &t.1), Some(Token::Ident(w)) if w == "super")
                    && toks.get(j + 1).map(|t| &t.1) == Some(&Token::Path)
                {
                    here.pop();
                    j += 2;
                }
                if let Some(top) = here.first() {
                    out.push(Edge {
                        line: *line,
                        to: top.clone(),
                        test: in_test,
                    });
                } else {
                    match toks.get(j).map(|t| &t.1) {
                        Some(Token::Ident(head)) => out.push(Edge {
                            line: *line,
                            to: head.clone(),
                            test: in_test,
                        }),
                        Some(Token::Punct('{')) => {
                            let (heads, after) = group_heads(&toks, j + 1);
                            for (l, head) in heads {
                                out.push(Edge {
                                    line: l,
                                    to: head,
                                    test: in_test,
                                });
                            }
                            j = after;
                        }
                        _ => {}
                    }
                }
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The violations of the order among `files` (path relative to `src/`,
/// source text), and the known upward edges that were seen.
fn check(files: &[(String, String)]) -> (Vec<Violation>, BTreeSet<(String, String)>) {
    let mut violations = Vec::new();
    let mut known_seen = BTreeSet::new();
    for (relative, source) in files {
        let Some(from) = module_path(relative).first().cloned() else {
            // lib.rs and main.rs: the crate root may use every module.
            continue;
        };
        let Some(from_layer) = layer_of(&from) else {
            violations.push(Violation {
                file: relative.clone(),
                line: 1,
                from: from.clone(),
                to: String::new(),
                why: "module is not in LAYERS; place it there".into(),
            });
            continue;
        };
        for edge in edges(relative, source) {
            if edge.to == from {
                continue;
            }
            let violation = |why: String| Violation {
                file: relative.clone(),
                line: edge.line,
                from: from.clone(),
                to: edge.to.clone(),
                why,
            };
            let Some(to_layer) = layer_of(&edge.to) else {
                violations.push(violation("not a module in LAYERS".into()));
                continue;
            };
            if to_layer < from_layer || (edge.test && TEST_FIXTURES.contains(&edge.to.as_str())) {
                continue;
            }
            if KNOWN_UPWARD
                .iter()
                .any(|(f, t, _)| *f == from && *t == edge.to)
            {
                known_seen.insert((from.clone(), edge.to.clone()));
                continue;
            }
            violations.push(violation(if to_layer == from_layer {
                "modules of one layer may not use each other".into()
            } else {
                format!(
                    "upward: {} is in layer {to_layer}, above {from}'s layer {from_layer}",
                    edge.to
                )
            }));
        }
    }
    (violations, known_seen)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn crate_sources() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(&src)
                .expect("found under src/")
                .to_string_lossy()
                .replace('\\', "/");
            let text =
                fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (relative, text)
        })
        .collect()
}

#[test]
fn src_follows_the_module_order() {
    let files = crate_sources();
    assert!(
        files.len() > 50,
        "found only {} files under src/",
        files.len()
    );
    let (violations, known_seen) = check(&files);
    let listed: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        violations.is_empty(),
        "imports against the module order (lowest first: {LAYERS:?}):\n{}",
        listed.join("\n")
    );
    for (from, to, why) in KNOWN_UPWARD {
        assert!(
            known_seen.contains(&(from.to_string(), to.to_string())),
            "{from} -> {to} is listed in KNOWN_UPWARD ({why}) but no longer occurs: remove it"
        );
    }
}

#[test]
fn the_scan_sees_the_crate_s_real_imports() {
    // A checker that found nothing would pass everything.
    let files = crate_sources();
    let seen: BTreeSet<(String, String)> = files
        .iter()
        .filter_map(|(relative, source)| {
            let from = module_path(relative).first().cloned()?;
            Some(
                edges(relative, source)
                    .into_iter()
                    .map(move |e| (from.clone(), e.to)),
            )
        })
        .flatten()
        .collect();
    for (from, to) in [
        ("agent", "cluster"),
        ("health", "plugin"),
        ("metrics", "health"),
        ("device", "simulate"),
    ] {
        assert!(
            seen.contains(&(from.to_owned(), to.to_owned())),
            "{from} -> {to} not seen"
        );
    }
}

#[test]
fn every_module_under_src_is_placed_and_every_placed_module_exists() {
    let files = crate_sources();
    let present: BTreeSet<String> = files
        .iter()
        .filter_map(|(relative, _)| module_path(relative).first().cloned())
        .collect();
    let placed: BTreeSet<String> = LAYERS
        .iter()
        .flat_map(|layer| layer.iter().map(|m| m.to_string()))
        .collect();
    assert_eq!(present, placed);
}

// The checker itself, on fabricated sources.

fn violations_in(relative: &str, source: &str) -> Vec<String> {
    let (violations, _) = check(&[(relative.to_owned(), source.to_owned())]);
    violations
        .into_iter()
        .map(|v| format!("{}:{} -> {}", v.line, v.from, v.to))
        .collect()
}

#[test]
fn an_upward_use_fails() {
    let source = "use std::sync::Arc;\n\nuse crate::agent::select::Selected;\nuse crate::api::DeviceConfig;\n";
    assert_eq!(
        violations_in("health/monitor.rs", source),
        ["3:health -> agent"]
    );
    // An inline path counts as much as a use line.
    let inline = "fn f() {\n    crate::cluster::run();\n}\n";
    assert_eq!(
        violations_in("metrics/server.rs", inline),
        ["2:metrics -> cluster"]
    );
}

#[test]
fn a_use_within_one_layer_fails() {
    let source = "use crate::labeller::desired_labels;\n";
    assert_eq!(
        violations_in("health/node.rs", source),
        ["1:health -> labeller"]
    );
}

#[test]
fn downward_uses_and_uses_of_its_own_module_pass() {
    let source = "use crate::device::Inventory;\nuse crate::plugin::{DeviceRef, HealthReport};\nuse crate::health::checks;\nuse super::damping::Damping;\n";
    assert!(violations_in("health/monitor.rs", source).is_empty());
    assert!(violations_in("agent/mod.rs", "use crate::cluster::run;\n").is_empty());
}

#[test]
fn grouped_uses_are_read_head_by_head() {
    let source =
        "use crate::{\n    api::DeviceConfig,\n    cluster::{lease, run},\n    host,\n};\n";
    assert_eq!(
        violations_in("device/mod.rs", source),
        ["3:device -> cluster"]
    );
}

#[test]
fn super_chains_that_leave_the_module_count() {
    let source = "use super::super::agent::select;\nuse super::checks;\n";
    assert_eq!(
        violations_in("health/monitor.rs", source),
        ["1:health -> agent"]
    );
    // From mod.rs, one `super` is the crate root already.
    assert_eq!(
        violations_in("health/mod.rs", "use super::cluster::lease;\n"),
        ["1:health -> cluster"]
    );
    // Inside an inline module, `super` is the file's module.
    let inline = "mod inner {\n    use super::super::agent::x;\n    use super::Thing;\n}\n";
    assert!(violations_in("health/monitor.rs", inline).is_empty());
    let deeper = "mod inner {\n    use super::super::super::agent::x;\n}\n";
    assert_eq!(
        violations_in("health/monitor.rs", deeper),
        ["2:health -> agent"]
    );
}

#[test]
fn comments_and_strings_are_not_imports() {
    let source = r####"//! Shows [`crate::agent`]'s verdict.
/// See crate::cluster::run.
/* crate::cli */
const A: &str = "crate::agent::x";
const D: &[u8] = br#"crate::agent"#;
const B: &str = r#"use crate::agent;"#;
const C: char = '"';
fn f<'a>(x: &'a str) -> &'a str { x }
"####;
    assert!(violations_in("metrics/mod.rs", source).is_empty());
}

#[test]
fn test_code_may_use_fixtures_and_production_code_may_not() {
    let prod = "use crate::simulate::write_host;\n";
    assert_eq!(
        violations_in("device/kfd.rs", prod),
        ["1:device -> simulate"]
    );
    let test = "fn f() {}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::simulate::{self, SimSpec};\n}\n";
    assert!(violations_in("device/kfd.rs", test).is_empty());
    let not_test = "#[cfg(not(test))]\nuse crate::simulate::x;\n";
    assert_eq!(
        violations_in("device/kfd.rs", not_test),
        ["2:device -> simulate"]
    );
    let test_fn = "#[tokio::test]\nasync fn t() {\n    crate::simulate::write_host();\n}\n";
    assert!(violations_in("device/kfd.rs", test_fn).is_empty());
    assert!(violations_in("labeller/tests.rs", prod).is_empty());
    // Fixtures only: test code is held to the order otherwise.
    let upward = "#[cfg(test)]\nmod tests {\n    use crate::agent::x;\n}\n";
    assert_eq!(
        violations_in("device/kfd.rs", upward),
        ["3:device -> agent"]
    );
    // After the test module, production code again.
    let after = "#[cfg(test)]\nmod tests {\n}\nuse crate::simulate::x;\n";
    assert_eq!(
        violations_in("device/kfd.rs", after),
        ["4:device -> simulate"]
    );
}

#[test]
fn an_unplaced_module_fails() {
    assert_eq!(
        violations_in("newthing/mod.rs", "fn f() {}\n"),
        ["1:newthing -> "]
    );
    assert_eq!(
        violations_in("health/mod.rs", "use crate::newthing::X;\n"),
        ["1:health -> newthing"]
    );
}
