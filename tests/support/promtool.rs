//! The Prometheus text format in tests: `promtool check metrics` over a
//! scrape, the one exposition lint every test uses, and the one parser of a
//! series' labels ([`parse_labels`]). Without promtool the check is skipped with a notice, except in
//! CI (`CI=true`), where it must be installed (Debian package `prometheus`).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

/// promtool findings that the reference exporter's own metric names and
/// types force: a drop-in must keep the name, so these lints, and only these,
/// are accepted.
pub const REFERENCE_NAME_LINTS: &[&str] =
    &["gpu_violation_current_accumulated_counter metric name should not include type 'counter'"];

/// promtool's lint on a gauge whose name ends in a suffix it keeps for other
/// types, as `<name><what>`: the reference declares every family a gauge,
/// `gpu_nodes_total`, `gpu_ecc_*_total` and `pcie_*_count` included.
const REFERENCE_GAUGE_SUFFIX_LINTS: &[(&str, &str)] = &[
    (
        "_total",
        " non-counter metrics should not have \"_total\" suffix",
    ),
    (
        "_count",
        " non-histogram and non-summary metrics should not have \"_count\" suffix",
    ),
];

/// A finding the reference's names force.
fn forced_by_reference(finding: &str) -> bool {
    REFERENCE_NAME_LINTS.contains(&finding)
        || REFERENCE_GAUGE_SUFFIX_LINTS.iter().any(|(suffix, what)| {
            finding
                .strip_suffix(what)
                .is_some_and(|name| name.ends_with(suffix) && !name.contains(' '))
        })
}

/// Panics unless promtool accepts `text`: it parses, and its findings are
/// limited to those the reference's names force ([`REFERENCE_NAME_LINTS`]
/// and the suffix lints on gauges).
pub fn accepts(text: &str) {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool is required in CI (Debian package `prometheus`)"
            );
            eprintln!("NOTICE: promtool not installed; skipping the exposition lint");
            return;
        }
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool exits 3 for lint findings only (1 for text it cannot parse).
    let only_forced_lints = out.status.code() == Some(3)
        && report
            .lines()
            .filter(|l| !l.trim().is_empty())
            .all(|l| forced_by_reference(l.trim()));
    assert!(
        out.status.success() || only_forced_lints,
        "promtool check metrics failed:\n{report}"
    );
}

/// The labels of one series, `a="x",b="y"` (what stands between its braces),
/// with the format's escapes (`\\`, `\"`, `\n`) undone.
pub fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        rest = &after[end..];
    }
    labels
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_forced_lints_are_tolerated() {
        assert!(super::forced_by_reference(
            "gpu_nodes_total non-counter metrics should not have \"_total\" suffix"
        ));
        assert!(super::forced_by_reference(
            "pcie_nack_sent_count non-histogram and non-summary metrics should not have \"_count\" suffix"
        ));
        // The suffix must be the name's own.
        assert!(!super::forced_by_reference(
            "gpu_edge non-counter metrics should not have \"_total\" suffix"
        ));
        assert!(!super::forced_by_reference(
            "error while linting: text format parsing error in line 1"
        ));
    }

    #[test]
    fn text_promtool_cannot_parse_is_refused() {
        if std::process::Command::new("promtool")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("NOTICE: promtool not installed; skipping");
            return;
        }
        let refused = std::panic::catch_unwind(|| super::accepts("gpu_nodes_total{ 1\n")).is_err();
        assert!(refused, "a parse error must fail");
        super::accepts(
            "# HELP gpu_nodes_total n\n# TYPE gpu_nodes_total gauge\ngpu_nodes_total 1\n",
        );
    }
}
