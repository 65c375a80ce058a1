//! Helpers shared by the integration tests: a test kubelet speaking the device
//! plugin API on unix sockets, and simulated hosts.
//!
//! Each test binary uses a different subset, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod hosts;
pub mod kubelet;
pub mod rig;

/// Polls `condition` every 20 ms until it holds; panics after `kubelet::WAIT`.
pub async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + kubelet::WAIT;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
