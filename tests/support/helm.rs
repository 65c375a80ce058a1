//! The `helm` binary the chart's tests run: $HELM, else `helm` on PATH.
//! .ci/run installs Helm v4.1.4 and sets REQUIRE_HELM=1, which turns a
//! missing helm from a printed skip into a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// $HELM, else `helm` on PATH.
pub fn helm_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HELM") {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("helm"))
        .find(|p| p.is_file())
}

/// The helm binary, or None after saying why `test` is skipped.
pub fn helm_present(test: &str) -> Option<PathBuf> {
    match helm_path().filter(|p| p.is_file()) {
        Some(path) => Some(path),
        None => {
            // .ci/run installs helm and sets this, so that a missing helm
            // fails the run instead of skipping the chart's checks unseen.
            assert!(
                std::env::var_os("REQUIRE_HELM").is_none(),
                "{test}: REQUIRE_HELM is set but there is no helm ($HELM, or on PATH)"
            );
            println!("SKIPPED {test}: no helm ($HELM, or on PATH); the chart was not rendered");
            None
        }
    }
}

/// Runs helm in the repository with its own empty home (no repositories)
/// and `kubeconfig` (a path that does not exist: no cluster).
pub fn helm_with(helm: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    Command::new(helm)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("HOME", home.path())
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("helm runs")
}
