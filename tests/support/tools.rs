//! Third-party tools some tests run (the node exporter, Prometheus): found at
//! the path an environment variable names or at the Debian package's path;
//! when absent the test skips with a notice, unless its `REQUIRE_*`
//! variable is set (`.ci/run` sets them), in which case it fails.

use std::path::PathBuf;

/// A tool a test needs.
pub struct Tool {
    /// What it is, for the messages ("the node exporter").
    pub what: &'static str,
    /// The variable that names another binary (`NODE_EXPORTER`).
    pub path_var: &'static str,
    pub default: &'static str,
    /// The variable that makes its absence a failure (`REQUIRE_NODE_EXPORTER`).
    pub require_var: &'static str,
    /// How to get it ("install Debian's prometheus-node-exporter").
    pub install: &'static str,
}

impl Tool {
    /// The binary, or `None` (after saying why) when the test should skip.
    /// Panics when it is absent and the require variable is set.
    pub fn find(&self) -> Option<PathBuf> {
        let binary = std::env::var_os(self.path_var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(self.default));
        if binary.is_file() {
            return Some(binary);
        }
        let required = std::env::var(self.require_var)
            .is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"));
        let (what, install, path_var) = (self.what, self.install, self.path_var);
        assert!(
            !required,
            "{} is set but {what} is not at {} ({install}, or set {path_var})",
            self.require_var,
            binary.display()
        );
        eprintln!(
            "SKIPPED: {what} is not at {} ({install}, or set {path_var}); set {}=1 to make \
             this a failure",
            binary.display(),
            self.require_var
        );
        None
    }
}
