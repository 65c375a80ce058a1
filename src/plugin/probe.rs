//! The host facts the plugins (the device plugin and the DRA plugin) read
//! themselves, beyond the inventory: whether the device nodes they hand to
//! containers exist.
//!
//! Device nodes come and go only when devtmpfs, udev or an administrator
//! creates or removes them, and inotify watchers of `/dev` and `/dev/dri` hear
//! of each. So [`NodeProbe`] stats them (an MI300X in CPX mode has 128) only
//! when their answer may have changed: at the first look, after an event in
//! `/dev` or `/dev/dri` (or lost events), when the nodes asked about or the
//! driver's state change, and at least every [`NodeProbe::SAFETY_INTERVAL`];
//! without inotify, at every look, as before. A change is thus seen at the
//! plugin's next look, as when every look stats. A plugin that looks only
//! when something may have changed awaits [`NodeProbe::changed`], which
//! returns when the watches have events queued (the next look reads them).
//!
//! All reads go through [`HostRoot`]. This module must not decide anything; the
//! pure modules turn these facts into device IDs and health.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::host::HostRoot;
use crate::host::inotify::{DevWatch, Readiness};

use super::devices::PluginDevice;
use super::health::NodeChecks;
use super::state::KFD_PATH;

/// The DRM nodes of `devices`, each once.
pub(crate) fn dri_nodes<'a>(
    devices: impl IntoIterator<Item = &'a PluginDevice>,
) -> BTreeSet<String> {
    devices
        .into_iter()
        .flat_map(PluginDevice::dri_nodes)
        .collect()
}

/// Presence of `/dev/kfd` and of every DRM node of `devices`, stat'ed now.
#[cfg(test)]
fn node_checks<'a>(
    host: &HostRoot,
    driver_loaded: bool,
    devices: impl IntoIterator<Item = &'a PluginDevice>,
) -> NodeChecks {
    stat_nodes(host, driver_loaded, &dri_nodes(devices))
}

/// Presence of `/dev/kfd` and of every node in `nodes`.
fn stat_nodes(host: &HostRoot, driver_loaded: bool, nodes: &BTreeSet<String>) -> NodeChecks {
    NodeChecks {
        driver_loaded,
        kfd_present: host.exists(KFD_PATH),
        missing_nodes: nodes
            .iter()
            .filter(|node| !host.exists(node))
            .cloned()
            .collect(),
    }
}

/// Whether the nodes must be stat'ed again (see the module doc). Pure.
pub(super) fn due(
    last: Option<&Checked>,
    host: &HostRoot,
    driver_loaded: bool,
    nodes: &BTreeSet<String>,
    watched_and_quiet: bool,
    now: Instant,
) -> bool {
    match last {
        None => true,
        Some(last) => {
            !watched_and_quiet
                || last.host != *host
                || last.checks.driver_loaded != driver_loaded
                || last.nodes != *nodes
                || now.saturating_duration_since(last.at) >= NodeProbe::SAFETY_INTERVAL
        }
    }
}

/// One look's question and answer.
#[derive(Debug)]
pub(super) struct Checked {
    host: HostRoot,
    nodes: BTreeSet<String>,
    checks: NodeChecks,
    at: Instant,
}

/// Presence of `/dev/kfd` and of DRM nodes, stat'ed again only when the
/// answer may have changed (see the module doc): the one way the device
/// plugin and the DRA plugin (`dra::service`) look at device nodes.
#[derive(Debug, Default)]
pub(crate) struct NodeProbe {
    /// The host the watch was set up (or given up) for.
    watched_host: Option<HostRoot>,
    /// `None` without inotify.
    watch: Option<DevWatch>,
    /// Wakes [`NodeProbe::changed`]; `None` without a watch or outside a
    /// tokio runtime.
    ready: Option<Readiness>,
    last: Option<Checked>,
    /// Looks that stat'ed the nodes (for tests).
    pub(crate) checks_run: u64,
}

impl NodeProbe {
    /// The nodes are stat'ed at least this often, whatever inotify says: a
    /// safety net for a `/dev` whose filesystem does not report changes.
    pub const SAFETY_INTERVAL: Duration = Duration::from_secs(10);

    /// Whether [`NodeProbe::changed`] wakes for changes: the watches are set
    /// up (at the first look) and registered with the runtime. Until then, and
    /// without inotify, a plugin must look on a timer.
    pub(crate) fn event_driven(&self) -> bool {
        self.ready.is_some()
    }

    /// Returns when `/dev` or `/dev/dri` has events queued, which the next
    /// look reads; never while not [`NodeProbe::event_driven`]. Cancel-safe.
    pub(crate) async fn changed(&self) {
        Readiness::queued_or_never(self.ready.as_ref()).await;
    }

    /// Presence of `/dev/kfd` and of `nodes` on `host`, now.
    pub(crate) fn checks(
        &mut self,
        host: &HostRoot,
        driver_loaded: bool,
        nodes: &BTreeSet<String>,
    ) -> NodeChecks {
        if self.watched_host.as_ref() != Some(host) {
            // Set up before the first stat, so that no change between the
            // stat and the start of watching goes unseen.
            self.watch = match DevWatch::open(&host.path("/dev"), &host.path("/dev/dri")) {
                Ok(watch) => Some(watch),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch /dev; device nodes are stat'ed at every look");
                    None
                }
            };
            self.ready = self
                .watch
                .as_ref()
                .and_then(|watch| Readiness::new(watch.inotify()).ok());
            self.watched_host = Some(host.clone());
            self.last = None;
        }
        let quiet = match self.watch.as_mut().map(DevWatch::drain) {
            Some(Ok(changed)) => !changed,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "inotify failed; device nodes are stat'ed at every look");
                self.watch = None;
                self.ready = None;
                false
            }
            None => false,
        };
        let now = Instant::now();
        if let Some(last) = &self.last
            && !due(Some(last), host, driver_loaded, nodes, quiet, now)
        {
            return last.checks.clone();
        }
        // /dev/dri made again after it was removed: watched again first.
        if let Some(watch) = self.watch.as_mut()
            && !watch.watching_dri()
            && let Ok(wd) = watch.dri_rewatch().run()
        {
            watch.dri_watched(wd);
        }
        let checks = stat_nodes(host, driver_loaded, nodes);
        self.checks_run += 1;
        self.last = Some(Checked {
            host: host.clone(),
            nodes: nodes.clone(),
            checks: checks.clone(),
            at: now,
        });
        checks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_presence_of_kfd_and_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/dev/kfd", "").unwrap();
        host.write("/dev/dri/card0", "").unwrap();
        let device = PluginDevice {
            id: "0000:05:00.0".into(),
            gpu_bdf: "0000:05:00.0".into(),
            partition: None,
            numa_node: None,
            card: Some(0),
            render_minor: Some(128),
        };
        let checks = node_checks(&host, true, [&device]);
        assert!(checks.kfd_present && checks.driver_loaded);
        assert_eq!(
            checks.missing_nodes.into_iter().collect::<Vec<_>>(),
            ["/dev/dri/renderD128"]
        );
    }

    fn rig() -> (tempfile::TempDir, HostRoot, BTreeSet<String>) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/dev/kfd", "").unwrap();
        for node in ["/dev/dri/card0", "/dev/dri/renderD128"] {
            host.write(node, "").unwrap();
        }
        let nodes = BTreeSet::from([
            "/dev/dri/card0".to_owned(),
            "/dev/dri/renderD128".to_owned(),
        ]);
        (dir, host, nodes)
    }

    #[test]
    fn nodes_are_stated_again_only_after_a_change_in_dev() {
        let (_dir, host, nodes) = rig();
        let mut probe = NodeProbe::default();
        let first = probe.checks(&host, true, &nodes);
        assert!(first.kfd_present && first.missing_nodes.is_empty());
        assert_eq!(probe.checks_run, 1);
        for _ in 0..3 {
            assert_eq!(probe.checks(&host, true, &nodes), first);
        }
        assert_eq!(probe.checks_run, 1, "nothing changed: nothing stat'ed");

        // A node removed is seen at the next look.
        host.remove_all("/dev/dri/renderD128").unwrap();
        let checks = probe.checks(&host, true, &nodes);
        assert_eq!(
            checks.missing_nodes.into_iter().collect::<Vec<_>>(),
            ["/dev/dri/renderD128"]
        );
        host.write("/dev/dri/renderD128", "").unwrap();
        assert!(probe.checks(&host, true, &nodes).missing_nodes.is_empty());
        host.remove_all("/dev/kfd").unwrap();
        assert!(!probe.checks(&host, true, &nodes).kfd_present);

        // /dev/dri removed and made again: watched again.
        host.remove_all("/dev/dri").unwrap();
        assert_eq!(probe.checks(&host, true, &nodes).missing_nodes.len(), 2);
        host.write("/dev/dri/card0", "").unwrap();
        host.write("/dev/dri/renderD128", "").unwrap();
        assert!(probe.checks(&host, true, &nodes).missing_nodes.is_empty());
        probe.checks(&host, true, &nodes);
        host.remove_all("/dev/dri/card0").unwrap();
        assert_eq!(
            probe
                .checks(&host, true, &nodes)
                .missing_nodes
                .into_iter()
                .collect::<Vec<_>>(),
            ["/dev/dri/card0"]
        );
    }

    #[test]
    fn other_nodes_a_driver_change_or_the_safety_interval_make_a_look_due() {
        let (_dir, host, nodes) = rig();
        let mut probe = NodeProbe::default();
        probe.checks(&host, true, &nodes);
        let last = probe.last.as_ref().unwrap();
        let now = last.at;
        assert!(!due(Some(last), &host, true, &nodes, true, now));
        assert!(due(None, &host, true, &nodes, true, now), "first look");
        assert!(
            due(Some(last), &host, true, &nodes, false, now),
            "an event, or no watch"
        );
        assert!(
            due(Some(last), &host, false, &nodes, true, now),
            "the driver went"
        );
        let fewer = BTreeSet::from(["/dev/dri/card0".to_owned()]);
        assert!(
            due(Some(last), &host, true, &fewer, true, now),
            "other nodes"
        );
        let other = HostRoot::new("/elsewhere");
        assert!(
            due(Some(last), &other, true, &nodes, true, now),
            "another host"
        );
        let later = now + NodeProbe::SAFETY_INTERVAL;
        assert!(
            due(Some(last), &host, true, &nodes, true, later),
            "safety net"
        );
    }

    #[test]
    fn without_a_dev_directory_every_look_stats() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let nodes = BTreeSet::from(["/dev/dri/card0".to_owned()]);
        let mut probe = NodeProbe::default();
        for _ in 0..3 {
            assert_eq!(probe.checks(&host, true, &nodes).missing_nodes, nodes);
        }
        assert_eq!(probe.checks_run, 3);
    }
}
