//! The module order of `src/`, checked: no module imports from a module above
//! it.
//!
//! Every file under `src/` belongs to the top-level module it is in
//! (`src/metrics/render.rs` to `metrics`). The lowest layers are crates of
//! their own ([`CRATES`]: `crates/api/`, `crates/host/`), which `src/lib.rs`
//! re-exports under their module names; their files belong to that module
//! (`crates/host/src/reader/mod.rs` to `host`), and their `crate::…` paths
//! are read as that module's. The compiler already keeps such a crate from
//! importing the crate above it; what it does not refuse, a path dependency
//! on a crate of its own layer or above, is checked on its `Cargo.toml`. Its code
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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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
    // Which pods hold which GPU, from the kubelet's PodResources API: above
    // the device plugin and DRA (whose device names it matches), below the
    // exporter and the agent's remediation that both ask it.
    &["pod_resources"],
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

/// The modules of [`LAYERS`] that are crates of their own: `(module,
/// directory, crate name)`. `src/lib.rs` re-exports each under its module
/// name (`pub use gpu_operator_api as api;`), so the rest of the code and
/// this check read `crate::api::…` as before.
const CRATES: &[(&str, &str, &str)] = &[
    ("api", "crates/api", "gpu_operator_api"),
    ("host", "crates/host", "gpu_operator_host"),
];

/// The crates of [`CRATES`] that need no `unsafe` code and so must say
/// `#![forbid(unsafe_code)]`.
const UNSAFE_FREE: &[&str] = &["api"];

/// Modules that test code of any module may use as fixtures.
const TEST_FIXTURES: &[&str] = &["simulate"];

/// Upward edges that are known and due to go: `(from, to, why)`. Each must
/// still occur (a stale entry fails), so the list only shrinks.
const KNOWN_UPWARD: &[(&str, &str, &str)] = &[];

/// Loops between files of one module that are known and due to go, each as
/// [`file_loops`] reports it without the member list and without line
/// numbers (`cluster/a.rs -> cluster/b.rs -> cluster/a.rs`), so that an edit
/// elsewhere in a file does not stale it: `(loop, why)`. Each must still
/// occur (a stale entry fails), so the list only shrinks.
const KNOWN_LOOPS: &[(&str, &str)] = &[];

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

/// The paths a path starting at `tokens[at]` names, each from the crate
/// root (`prefix` is where it starts), and the index after it. A path is
/// read as far as its module-like segments go (`a::b::C`); a `use` group
/// (`a::{b, c::{d, e}}`) names one path per item, on the item's line.
fn read_path(
    tokens: &[(usize, Token)],
    at: usize,
    mut prefix: Vec<String>,
    line: usize,
) -> (Vec<(usize, Vec<String>)>, usize) {
    let mut i = at;
    loop {
        match tokens.get(i).map(|t| &t.1) {
            Some(Token::Ident(word)) if word != "as" => {
                prefix.push(word.clone());
                i += 1;
                if tokens.get(i).map(|t| &t.1) == Some(&Token::Path) {
                    i += 1;
                } else {
                    break;
                }
            }
            Some(Token::Punct('{')) => return use_group(tokens, i + 1, &prefix),
            _ => break,
        }
    }
    (vec![(line, prefix)], i)
}

/// The paths a `use` group starting at `tokens[at]` (just after `{`) names
/// under `prefix`, and the index after its closing `}`.
fn use_group(
    tokens: &[(usize, Token)],
    at: usize,
    prefix: &[String],
) -> (Vec<(usize, Vec<String>)>, usize) {
    let mut paths = Vec::new();
    let mut i = at;
    while let Some((line, token)) = tokens.get(i) {
        match token {
            Token::Punct('}') => return (paths, i + 1),
            Token::Punct(',') => i += 1,
            Token::Ident(word) if word == "self" => {
                paths.push((*line, prefix.to_vec()));
                i += 1;
            }
            Token::Punct('*') => {
                paths.push((*line, prefix.to_vec()));
                i += 1;
            }
            Token::Ident(_) | Token::Punct('{') => {
                let (found, after) = read_path(tokens, i, prefix.to_vec(), *line);
                paths.extend(found);
                i = after;
                // An `as` rename, up to the item's end.
                while let Some((_, t)) = tokens.get(i) {
                    if matches!(t, Token::Punct(',' | '}')) {
                        break;
                    }
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    (paths, i)
}

struct Frame {
    /// The inline module this brace opened, if any.
    module: Option<String>,
    test: bool,
}

/// One path in a file's code that may name an item of the crate, from the
/// crate root: `crate::a::b`, a `super::` or `self::` path, or a relative
/// path (`child::item`, which names a child module when one exists; other
/// relative paths, `kube::Api` say, land in the file's own module).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reference {
    line: usize,
    path: Vec<String>,
    test: bool,
}

/// The paths of one source file (path relative to `src/`).
fn references(relative: &str, source: &str) -> Vec<Reference> {
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
        let here = || -> Vec<String> {
            let mut here = file_path.clone();
            here.extend(frames.iter().filter_map(|f| f.module.clone()));
            here
        };
        let path_follows = toks.get(i + 1).map(|t| &t.1) == Some(&Token::Path);
        let starts_path = i == 0 || toks[i - 1].1 != Token::Path;
        let mut push = |found: Vec<(usize, Vec<String>)>| {
            out.extend(found.into_iter().filter(|(_, path)| !path.is_empty()).map(
                |(line, path)| Reference {
                    line,
                    path,
                    test: in_test,
                },
            ));
        };
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
            Token::Ident(word) if word == "crate" && path_follows => {
                let (found, after) = read_path(&toks, i + 2, Vec::new(), *line);
                push(found);
                i = after.max(i + 2);
            }
            Token::Ident(word) if word == "self" && path_follows && starts_path => {
                let (found, after) = read_path(&toks, i + 2, here(), *line);
                push(found);
                i = after.max(i + 2);
            }
            Token::Ident(word) if word == "super" && path_follows => {
                // Where the chain of `super::` lands.
                let mut landed = here();
                let mut j = i;
                while matches!(toks.get(j).map(|t| &t.1), Some(Token::Ident(w)) if w == "super")
                    && toks.get(j + 1).map(|t| &t.1) == Some(&Token::Path)
                {
                    landed.pop();
                    j += 2;
                }
                let (found, after) = read_path(&toks, j, landed, *line);
                push(found);
                i = after.max(j);
            }
            Token::Ident(word)
                if path_follows
                    && starts_path
                    && !matches!(word.as_str(), "crate" | "super" | "self" | "Self") =>
            {
                let (found, after) = read_path(&toks, i, here(), *line);
                push(found);
                i = after.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// The references from one source file (path relative to `src/`) to
/// top-level modules, its own included.
fn edges(relative: &str, source: &str) -> Vec<Edge> {
    references(relative, source)
        .into_iter()
        .map(|r| Edge {
            line: r.line,
            to: r.path[0].clone(),
            test: r.test,
        })
        .fold(Vec::new(), |mut edges, edge| {
            // One per group item; `a::{b, c}` is one use of `a`.
            if edges.last() != Some(&edge) {
                edges.push(edge);
            }
            edges
        })
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

/// The import loops between files of one top-level module: each as
/// `a.rs:LINE -> b.rs:LINE -> a.rs` (the line of each file's use of the
/// next), the shortest through the loop's first file in name order, one per
/// set of files that reach each other. A file's use of another file is a
/// path that lands in it (see [`references`]); test code counts too, and a
/// file's test module using the file itself does not. A file's use of its
/// parent files (`super::Item` from `mod.rs`'s child) does not count: the
/// parent is the module's face, and only declares the child.
fn file_loops(files: &[(String, String)]) -> Vec<String> {
    let modules: Vec<Vec<String>> = files.iter().map(|(r, _)| module_path(r)).collect();
    let index: HashMap<&[String], usize> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_slice(), i))
        .collect();
    // File → the files it uses, with the line of its first use of each.
    let mut uses: Vec<BTreeMap<usize, usize>> = vec![BTreeMap::new(); files.len()];
    for (i, (relative, source)) in files.iter().enumerate() {
        let Some(top) = modules[i].first() else {
            continue;
        };
        for reference in references(relative, source) {
            let path = &reference.path;
            let target = (1..=path.len())
                .rev()
                .find_map(|k| index.get(&path[..k]).copied());
            // A file may use what its parent files define (a module's
            // face); the parent only declares it.
            if let Some(j) = target
                && j != i
                && modules[j].first() == Some(top)
                && !modules[i].starts_with(&modules[j])
            {
                uses[i].entry(j).or_insert(reference.line);
            }
        }
    }
    let reach = |from: usize| -> BTreeSet<usize> {
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<usize> = uses[from].keys().copied().collect();
        while let Some(f) = queue.pop_front() {
            if seen.insert(f) {
                queue.extend(uses[f].keys().copied());
            }
        }
        seen
    };
    let reaches: Vec<BTreeSet<usize>> = (0..files.len()).map(reach).collect();
    let mut reported = vec![false; files.len()];
    let mut loops = Vec::new();
    for first in 0..files.len() {
        if reported[first] || !reaches[first].contains(&first) {
            continue;
        }
        for (other, reported) in reported.iter_mut().enumerate() {
            if reaches[first].contains(&other) && reaches[other].contains(&first) {
                *reported = true;
            }
        }
        // The shortest way back to `first`, breadth first.
        let mut came_from: HashMap<usize, usize> = HashMap::new();
        let mut queue = VecDeque::from([first]);
        'search: while let Some(f) = queue.pop_front() {
            for &next in uses[f].keys() {
                if next == first {
                    came_from.insert(first, f);
                    break 'search;
                }
                if let std::collections::hash_map::Entry::Vacant(e) = came_from.entry(next) {
                    e.insert(f);
                    queue.push_back(next);
                }
            }
        }
        let mut chain = vec![first];
        let mut at = came_from[&first];
        while at != first {
            chain.push(at);
            at = came_from[&at];
        }
        chain[1..].reverse();
        chain.push(first);
        let text: Vec<String> = chain
            .windows(2)
            .map(|pair| format!("{}:{}", files[pair[0]].0, uses[pair[0]][&pair[1]]))
            .chain(std::iter::once(files[first].0.clone()))
            .collect();
        let members: Vec<&str> = (0..files.len())
            .filter(|&f| reaches[first].contains(&f) && reaches[f].contains(&first))
            .map(|f| files[f].0.as_str())
            .collect();
        loops.push(format!(
            "{} (all in the loop: {})",
            text.join(" -> "),
            members.join(", ")
        ));
    }
    loops
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

/// `source` as the checker reads it: in a file of the crate of `module`
/// (`Some`), `crate::` is that module's root, so it becomes `crate::module::`;
/// in every file, a path through a crate's own name (`gpu_operator_host::…`)
/// becomes one through its module (`crate::host::…`).
fn as_module_source(module: Option<&str>, source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut previous: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        let word_start = previous.is_none_or(|p| !(p.is_alphanumeric() || "_$".contains(p)));
        if word_start {
            let own = module.zip(rest.strip_prefix("crate::"));
            let named = || {
                CRATES.iter().find_map(|(m, _, name)| {
                    Some((*m, rest.strip_prefix(name)?.strip_prefix("::")?))
                })
            };
            if let Some((m, after)) = own.or_else(named) {
                out.push_str(&format!("crate::{m}::"));
                rest = after;
                previous = Some(':');
                continue;
            }
        }
        out.push(c);
        previous = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The `.rs` files under `dir`, each as (its path relative to `dir` with
/// `prefix` before it, its text as [`as_module_source`] gives it for
/// `module`).
fn sources_under(dir: &Path, prefix: &str, module: Option<&str>) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    rust_files(dir, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(dir)
                .expect("found under its directory")
                .to_string_lossy()
                .replace('\\', "/");
            let text =
                fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (
                format!("{prefix}{relative}"),
                as_module_source(module, &text),
            )
        })
        .collect()
}

/// The files of `src/` and of the [`CRATES`] (`crates/host/src/lib.rs` as
/// `host/lib.rs`), paths relative to `src/` as if the crates were modules.
fn crate_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = sources_under(&root.join("src"), "", None);
    for (module, dir, _) in CRATES {
        files.extend(sources_under(
            &root.join(dir).join("src"),
            &format!("{module}/"),
            Some(module),
        ));
    }
    files
}

/// The path dependencies of one of the [`CRATES`] (`module`, its
/// `Cargo.toml` text) that the order does not allow: on this package
/// (`gpu-operator`), or on a crate of its own layer or above. Every section
/// counts, dev and build dependencies too.
fn crate_dependency_violations(module: &str, cargo_toml: &str) -> Vec<String> {
    let from_layer = layer_of(module);
    cargo_toml
        .lines()
        .filter_map(|line| {
            let name = line.split(['=', '.', ' ']).next()?.trim();
            (name.starts_with("gpu-operator") || name.starts_with("gpu_operator"))
                .then(|| name.replace('-', "_"))
        })
        .filter_map(|name| {
            let Some((to, _, _)) = CRATES.iter().find(|(_, _, n)| *n == name) else {
                return Some(format!("{module} -> {name}: not a crate below it"));
            };
            match (from_layer, layer_of(to)) {
                (Some(from), Some(to_layer)) if to_layer < from => None,
                _ => Some(format!("{module} -> {to}: not in a lower layer")),
            }
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

/// A loop as [`file_loops`] reports it, with `:line` after each file dropped.
fn without_line_numbers(reported: &str) -> String {
    reported
        .split(" -> ")
        .map(|step| match step.split_once(".rs:") {
            Some((file, rest)) => {
                let tail = rest.trim_start_matches(|c: char| c.is_ascii_digit());
                format!("{file}.rs{tail}")
            }
            None => step.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn known_loops_are_matched_without_line_numbers() {
    assert_eq!(
        without_line_numbers(
            "cluster/partitioner.rs:32 -> cluster/reconcile.rs:295 -> cluster/partitioner.rs (all in the loop: a, b)"
        ),
        "cluster/partitioner.rs -> cluster/reconcile.rs -> cluster/partitioner.rs (all in the loop: a, b)"
    );
}

#[test]
fn src_has_no_import_loop_inside_a_module() {
    let mut loops = file_loops(&crate_sources());
    for (known, why) in KNOWN_LOOPS {
        let before = loops.len();
        loops.retain(|l| !without_line_numbers(l).starts_with(&format!("{known} (")));
        assert!(
            loops.len() < before,
            "{known} is listed in KNOWN_LOOPS ({why}) but no longer occurs: remove it"
        );
    }
    assert!(
        loops.is_empty(),
        "files of one module that import each other, round in a loop (move what they share into a file below both):\n{}",
        loops.join("\n")
    );
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

#[test]
fn the_crates_depend_only_downwards_and_are_re_exported_under_their_module_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(root.join("src/lib.rs")).expect("src/lib.rs");
    for (module, dir, name) in CRATES {
        let cargo_toml = fs::read_to_string(root.join(dir).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{dir}/Cargo.toml: {e}"));
        assert!(
            cargo_toml.contains(&format!("name = \"{}\"", name.replace('_', "-"))),
            "{dir}/Cargo.toml does not name the package {name}"
        );
        let violations = crate_dependency_violations(module, &cargo_toml);
        assert!(violations.is_empty(), "{dir}/Cargo.toml: {violations:?}");
        assert!(
            lib.contains(&format!("pub use {name} as {module};")),
            "src/lib.rs does not re-export {name} as {module}"
        );
        assert!(
            !root.join("src").join(module).exists()
                && !root.join("src").join(format!("{module}.rs")).exists(),
            "{module} is both a crate ({dir}) and a module under src/"
        );
        let crate_root = fs::read_to_string(root.join(dir).join("src/lib.rs"))
            .unwrap_or_else(|e| panic!("{dir}/src/lib.rs: {e}"));
        assert_eq!(
            crate_root.contains("#![forbid(unsafe_code)]"),
            UNSAFE_FREE.contains(module),
            "{dir}: #![forbid(unsafe_code)] must be there exactly when {module} is in UNSAFE_FREE"
        );
    }
}

// The checker itself, on fabricated sources.

#[test]
fn a_crate_s_own_paths_are_its_module_s_and_its_name_is_its_module() {
    let source = "use crate::reader::BoundedReader;\nuse gpu_operator_api::DeviceConfig;\npub(crate) fn f() {}\n";
    assert_eq!(
        as_module_source(Some("host"), source),
        "use crate::host::reader::BoundedReader;\nuse crate::api::DeviceConfig;\npub(crate) fn f() {}\n"
    );
    // Outside the crates, only the crate names are read as modules.
    assert_eq!(
        as_module_source(
            None,
            "use crate::agent::x;\nuse gpu_operator_host::HostRoot;\n"
        ),
        "use crate::agent::x;\nuse crate::host::HostRoot;\n"
    );
    // So host may use api; api may not use host, through either spelling.
    let upward = as_module_source(Some("api"), "use gpu_operator_host::HostRoot;\n");
    assert_eq!(violations_in("api/yaml.rs", &upward), ["1:api -> host"]);
    let downward = as_module_source(Some("host"), "use gpu_operator_api::DeviceConfig;\n");
    assert!(violations_in("host/lib.rs", &downward).is_empty());
}

#[test]
fn a_crate_depending_on_its_own_layer_or_above_fails() {
    let host_on_api =
        "[dependencies]\ngpu-operator-api = { path = \"../api\" }\nlibc.workspace = true\n";
    assert!(crate_dependency_violations("host", host_on_api).is_empty());
    let api_on_host = "[dev-dependencies]\ngpu-operator-host = { path = \"../host\" }\n";
    assert_eq!(
        crate_dependency_violations("api", api_on_host),
        ["api -> host: not in a lower layer"]
    );
    let on_the_package = "[dependencies]\ngpu-operator = { path = \"../..\" }\n";
    assert_eq!(
        crate_dependency_violations("host", on_the_package),
        ["host -> gpu_operator: not a crate below it"]
    );
}

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

fn loops_in(files: &[(&str, &str)]) -> Vec<String> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect();
    file_loops(&files)
}

#[test]
fn two_files_of_one_module_that_use_each_other_are_a_loop() {
    let reconcile = "use super::lease::LeaderGuard;\nuse super::upgrader::{self, Upgrades};\n";
    let upgrader = "use std::sync::Arc;\n\nuse super::reconcile::{Context, Error};\n";
    let lease = "pub struct LeaderGuard;\n";
    assert_eq!(
        loops_in(&[
            ("cluster/lease.rs", lease),
            ("cluster/reconcile.rs", reconcile),
            ("cluster/upgrader.rs", upgrader),
        ]),
        [
            "cluster/reconcile.rs:2 -> cluster/upgrader.rs:3 -> cluster/reconcile.rs \
          (all in the loop: cluster/reconcile.rs, cluster/upgrader.rs)"
        ]
    );
    // Inline `crate::` paths and longer loops count as much.
    let a = "fn f() {\n    crate::cluster::b::g();\n}\n";
    let b = "use crate::cluster::{\n    c::{self, H},\n};\n";
    let c = "fn h() {\n    super::a::f();\n}\n";
    assert_eq!(
        loops_in(&[
            ("cluster/a.rs", a),
            ("cluster/b.rs", b),
            ("cluster/c.rs", c)
        ]),
        [
            "cluster/a.rs:2 -> cluster/b.rs:2 -> cluster/c.rs:2 -> cluster/a.rs \
          (all in the loop: cluster/a.rs, cluster/b.rs, cluster/c.rs)"
        ]
    );
}

#[test]
fn a_child_may_use_its_parent_and_loops_among_children_count() {
    // `mod.rs` names its children without a prefix; a child using what its
    // parent defines is no loop.
    let parent = "pub mod upgrader;\nuse upgrader::Upgrades;\npub struct Context;\n";
    let child = "use super::Context;\n";
    assert_eq!(
        loops_in(&[("cluster/mod.rs", parent), ("cluster/upgrader.rs", child)]),
        Vec::<String>::new()
    );
    // Children of a non-`mod.rs` parent, one reached through `self::`.
    let parent = "mod tests;\npub mod plan;\nfn f() {\n    self::plan::g();\n}\n";
    let plan = "use super::Writer;\n\nuse super::apply::h;\n";
    let apply = "fn h() {\n    crate::writer::plan::g();\n}\n";
    assert_eq!(
        loops_in(&[
            ("writer.rs", parent),
            ("writer/apply.rs", apply),
            ("writer/plan.rs", plan),
        ]),
        ["writer/apply.rs:2 -> writer/plan.rs:3 -> writer/apply.rs \
          (all in the loop: writer/apply.rs, writer/plan.rs)"]
    );
}

#[test]
fn a_tree_of_files_test_modules_and_other_modules_loops_are_not_this_check_s() {
    let context = "use super::lease::LeaderGuard;\npub struct Context;\n";
    let upgrader = "use super::context::{Context, Error};\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n";
    let reconcile = "use super::context::Context;\nuse super::upgrader;\nuse kube::Api;\n";
    let parent = "mod context;\nmod upgrader;\nmod reconcile;\nuse reconcile::reconcile;\nfn f() {\n    kube::Api::all();\n}\n";
    // A `tests.rs` file uses its parent, which only declares it.
    let tests = "use super::*;\n";
    assert_eq!(
        loops_in(&[
            ("cluster/context.rs", context),
            ("cluster/lease.rs", "pub struct LeaderGuard;\n"),
            ("cluster/mod.rs", parent),
            ("cluster/reconcile.rs", reconcile),
            (
                "cluster/upgrader.rs",
                "mod tests;\nuse super::context::Context;\n"
            ),
            ("cluster/upgrader/tests.rs", tests),
            ("cluster/other.rs", upgrader),
        ]),
        Vec::<String>::new()
    );
    // Modules that use each other are the layer check's, not this one's.
    assert_eq!(
        loops_in(&[
            ("health/a.rs", "use crate::metrics::b;\n"),
            ("metrics/b.rs", "use crate::health::a;\n"),
        ]),
        Vec::<String>::new()
    );
}

/// The modules the README's module table lists, in its order: the first
/// cell of each row naming `src/…` or `crates/…` (`src/metrics/` is
/// `metrics`, `crates/host/` is `host`).
fn readme_table_modules(readme: &str) -> Vec<String> {
    readme
        .lines()
        .skip_while(|l| !l.starts_with("| module | owns |"))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            l.strip_prefix("| `src/")
                .or_else(|| l.strip_prefix("| `crates/"))
        })
        .map(|rest| {
            rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// How `table` (see [`readme_table_modules`]) disagrees with [`LAYERS`]:
/// `None` when it lists every module once, lowest first.
fn table_disagreement(table: &[String]) -> Option<String> {
    let layers: Vec<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    (table != layers).then(|| {
        format!("the README's module table lists {table:?}; LAYERS, lowest first, is {layers:?}")
    })
}

#[test]
fn the_readme_table_lists_the_modules_in_layers_order() {
    let readme = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let table = readme_table_modules(&readme);
    assert!(table.len() > 10, "found only {table:?}");
    if let Some(disagreement) = table_disagreement(&table) {
        panic!("{disagreement}");
    }
}

#[test]
fn a_readme_table_out_of_order_or_missing_a_module_disagrees() {
    let row = |m: &str| format!("| `src/{m}/` | x |\n");
    let table = |modules: &[&str]| -> String {
        let rows: String = modules.iter().map(|m| row(m)).collect();
        format!(
            "text\n\n| module | owns |\n|---|---|\n{rows}| `deploy/` | y |\n\n| module | owns |\n"
        )
    };
    let all: Vec<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    let mut host_rs = table(&all);
    host_rs = host_rs.replace("| `src/host/` |", "| `src/host.rs`, `src/host/` |");
    assert_eq!(readme_table_modules(&host_rs), all);
    assert_eq!(table_disagreement(&readme_table_modules(&host_rs)), None);
    let crates = table(&all).replace("| `src/api/` |", "| `crates/api/` |");
    assert_eq!(readme_table_modules(&crates), all);
    let mut swapped = all.clone();
    swapped.swap(0, 1);
    assert!(table_disagreement(&readme_table_modules(&table(&swapped))).is_some());
    let missing: Vec<&str> = all.iter().copied().filter(|m| *m != "command").collect();
    assert!(table_disagreement(&readme_table_modules(&table(&missing))).is_some());
}
