//! The leader's Node watch: the events its Node cache (a kube reflector) is
//! made from, and what is kept beside the cache from the same events.
//!
//! - Which labels the cache keeps ([`KeptLabels`], see `node_cache`): the
//!   keys the DeviceConfigs' selectors name, known before the first list
//!   (the watch starts once the DeviceConfigs are listed). When a
//!   DeviceConfig names a key the cache does not hold,
//!   [`NodeWatch::holds_labels_of`] widens what is kept and restarts the
//!   watch; its list replaces the cache, and once it is in, every
//!   DeviceConfig is reconciled again ([`NodeWatch::label_lists`]). Until
//!   then that DeviceConfig's reconcile waits: deciding on a cache without
//!   its selector's key would select no node. Kept keys only grow within a
//!   term.
//! - The partition layouts DRA nodes report ([`LayoutIndex`]), so that the
//!   DeviceClasses are decided without reading every cached Node.
//!
//! It decides nothing about Nodes and writes nothing.

use std::sync::{Arc, Mutex, PoisonError};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use super::device_classes::LayoutIndex;
use super::node_cache::{KeptLabels, keep_decided};
use crate::api::DeviceConfig;

/// The state of the leader's Node watch, shared with the reconciler.
pub struct NodeWatch {
    state: Mutex<State>,
    /// Bumped to restart the watch (a wider label set to list with).
    relist: watch::Sender<u64>,
    /// Bumped when a list that kept more labels is in the cache.
    listed: watch::Sender<u64>,
    /// The DeviceConfigs have been listed.
    configs_listed: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    /// What events are filtered with now.
    wanted: KeptLabels,
    /// What the list under way was started with.
    listing: KeptLabels,
    /// What every Node in the cache was filtered with, at least.
    held: KeptLabels,
    layouts: LayoutIndex,
}

impl Default for NodeWatch {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            relist: watch::Sender::new(0),
            listed: watch::Sender::new(0),
            configs_listed: watch::Sender::new(false),
        }
    }
}

impl NodeWatch {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the cache holds every label `dc`'s selectors name. When it
    /// does not, the watch lists again keeping them (once per new key), and
    /// [`Self::label_lists`] fires when that list is in.
    pub fn holds_labels_of(&self, dc: &DeviceConfig) -> bool {
        let needed = KeptLabels::for_configs([dc]);
        let mut state = self.state();
        if state.held.covers(&needed) {
            return true;
        }
        self.want(&mut state, &needed);
        false
    }

    /// Keeps `needed` too, listing the Nodes again if that is more.
    fn want(&self, state: &mut State, needed: &KeptLabels) {
        if !state.wanted.covers(needed) {
            state.wanted.extend(needed);
            tracing::info!(
                keys = ?state.wanted.selector_keys().collect::<Vec<_>>(),
                "a DeviceConfig selects on a Node label the cache does not keep: listing the Nodes again"
            );
            self.relist.send_modify(|n| *n += 1);
        }
    }

    /// Follows the DeviceConfig cache (after it applied `event`): the Node
    /// watch starts once it is listed, and a DeviceConfig that names a new
    /// label key starts a new list at once, before its reconcile asks.
    pub fn follow_configs(&self, event: &watcher::Event<DeviceConfig>) {
        match event {
            watcher::Event::InitDone => {
                self.configs_listed.send_replace(true);
            }
            watcher::Event::Apply(dc) if *self.configs_listed.borrow() => {
                self.want(&mut self.state(), &KeptLabels::for_configs([dc]));
            }
            _ => {}
        }
    }

    /// Fires each time a list that holds more labels than before is in the
    /// cache: DeviceConfigs that waited for it can be decided.
    pub fn label_lists(&self) -> impl Stream<Item = ()> + Send + 'static {
        tokio_stream::wrappers::WatchStream::from_changes(self.listed.subscribe()).map(|_| ())
    }

    /// The partition layouts the Nodes' agents report.
    pub fn layouts_present(&self) -> std::collections::BTreeSet<String> {
        self.state().layouts.present()
    }

    /// What one watched Node becomes in the cache.
    fn keep(&self, node: &mut Node) {
        keep_decided(node, &self.state().wanted);
    }

    /// Before the reflector: a list starts with what is wanted now.
    fn before_cache(&self, event: &watcher::Event<Node>) {
        if matches!(event, watcher::Event::Init) {
            let mut state = self.state();
            state.listing = state.wanted.clone();
        }
    }

    /// After the reflector: the layouts follow the cache, and a list that is
    /// in makes what it kept held.
    fn after_cache(&self, event: &watcher::Event<Node>) {
        let mut state = self.state();
        state.layouts.apply(event);
        if matches!(event, watcher::Event::InitDone) && !state.held.covers(&state.listing) {
            state.held = state.listing.clone();
            drop(state);
            self.listed.send_modify(|n| *n += 1);
        }
    }

    /// The Node cache's events: the watch of `nodes`, started once
    /// `configs` has listed the DeviceConfigs ([`Self::follow_configs`]; so
    /// that its first list keeps their selectors' keys), restarted when a DeviceConfig needs more
    /// labels, each event put into the cache `writer` feeds.
    pub fn events(
        self: &Arc<Self>,
        nodes: Api<Node>,
        configs: Store<DeviceConfig>,
        writer: reflector::store::Writer<Node>,
    ) -> impl Stream<Item = Result<watcher::Event<Node>, watcher::Error>> + Send + 'static {
        let this = self.clone();
        let started = async move {
            // Not `configs.wait_until_ready()`: its one waker is the
            // controller's, which would then never wake this stream.
            if this
                .configs_listed
                .subscribe()
                .wait_for(|l| *l)
                .await
                .is_ok()
            {
                let kept = KeptLabels::for_configs(configs.state().iter().map(AsRef::as_ref));
                this.state().wanted.extend(&kept);
            }
            this
        };
        let watched = futures::stream::once(started)
            .flat_map(move |this| restarting(this, nodes.clone()))
            .inspect({
                let this = self.clone();
                move |event| {
                    if let Ok(event) = event {
                        this.before_cache(event);
                    }
                }
            });
        let this = self.clone();
        reflector::reflector(writer, watched).inspect(move |event| {
            if let Ok(event) = event {
                this.after_cache(event);
            }
        })
    }
}

type Events = BoxStream<'static, Result<watcher::Event<Node>, watcher::Error>>;

/// The watch of `nodes`, filtered as `this` says, started again (a new
/// list) each time `this` is told to.
fn restarting(
    this: Arc<NodeWatch>,
    nodes: Api<Node>,
) -> impl Stream<Item = Result<watcher::Event<Node>, watcher::Error>> + Send + 'static {
    let mut relist = this.relist.subscribe();
    relist.mark_unchanged();
    let start = move |this: &Arc<NodeWatch>| -> Events {
        let this = this.clone();
        watcher::watcher(nodes.clone(), watcher::Config::default())
            .modify(move |node| this.keep(node))
            .boxed()
    };
    let first = start(&this);
    futures::stream::unfold(
        (this, relist, first, start),
        |(this, mut relist, mut current, start)| async move {
            loop {
                tokio::select! {
                    biased;
                    changed = relist.changed() => {
                        if changed.is_err() {
                            return None;
                        }
                        current = start(&this);
                    }
                    event = current.next() => {
                        return event.map(|e| (e, (this, relist, current, start)));
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeviceConfigSpec;
    use watcher::Event::*;

    fn selecting(key: &str) -> DeviceConfig {
        DeviceConfig::new(
            "dc",
            DeviceConfigSpec {
                selector: [(key.to_owned(), "x".to_owned())].into(),
                ..DeviceConfigSpec::default()
            },
        )
    }

    fn labelled(keys: &[&str]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n".into());
        node.metadata.labels = Some(
            keys.iter()
                .map(|k| ((*k).to_owned(), "x".to_owned()))
                .collect(),
        );
        node
    }

    /// `watch` sees a list of `nodes` start, filtered as its events would
    /// be; `Init` and the Nodes only, not `InitDone`.
    fn list_starts(watch: &NodeWatch, nodes: &[Node]) -> Vec<Node> {
        watch.before_cache(&Init);
        watch.after_cache(&Init);
        nodes
            .iter()
            .map(|n| {
                let mut n = n.clone();
                watch.keep(&mut n);
                let event = InitApply(n.clone());
                watch.before_cache(&event);
                watch.after_cache(&event);
                n
            })
            .collect()
    }

    #[test]
    fn a_device_config_waits_for_a_list_that_keeps_its_selectors_keys() {
        let watch = NodeWatch::default();
        let mut relists = watch.relist.subscribe();
        let lists = watch.listed.subscribe();
        let pool = selecting("pool");
        // The first list, before any DeviceConfig: the label is dropped.
        let kept = list_starts(&watch, &[labelled(&["pool", "zone"])]);
        assert!(kept[0].metadata.labels.is_none());
        watch.after_cache(&InitDone);
        assert!(
            !lists.has_changed().unwrap(),
            "it holds no more than before"
        );
        // A DeviceConfig selecting by it: not held; the watch lists again.
        assert!(!relists.has_changed().unwrap());
        assert!(!watch.holds_labels_of(&pool));
        assert!(relists.has_changed().unwrap(), "a relist is asked for");
        relists.mark_unchanged();
        // Asking again while the list is under way asks no second one.
        assert!(!watch.holds_labels_of(&pool));
        assert!(!relists.has_changed().unwrap());
        // The new list keeps the label; until it is in, it is not held.
        let kept = list_starts(&watch, &[labelled(&["pool", "zone"])]);
        assert_eq!(
            kept[0].metadata.labels,
            Some([("pool".to_owned(), "x".to_owned())].into())
        );
        assert!(!watch.holds_labels_of(&pool));
        watch.after_cache(&InitDone);
        assert!(watch.holds_labels_of(&pool));
        assert!(
            lists.has_changed().unwrap(),
            "waiting DeviceConfigs are woken"
        );
        assert!(!relists.has_changed().unwrap());
    }

    #[test]
    fn a_list_started_before_a_key_was_wanted_does_not_hold_it() {
        let watch = NodeWatch::default();
        let zone = selecting("zone");
        list_starts(&watch, &[labelled(&["zone"])]);
        // Wanted while that list is under way: its Nodes so far lack it.
        assert!(!watch.holds_labels_of(&zone));
        watch.after_cache(&InitDone);
        assert!(!watch.holds_labels_of(&zone));
        // The list it asked for does.
        list_starts(&watch, &[labelled(&["zone"])]);
        watch.after_cache(&InitDone);
        assert!(watch.holds_labels_of(&zone));
    }

    #[test]
    fn device_configs_listed_before_the_first_node_list_need_no_second() {
        let watch = NodeWatch::default();
        let relists = watch.relist.subscribe();
        let rack = selecting("rack");
        // Before the DeviceConfigs are listed, an applied one asks nothing.
        watch.follow_configs(&Apply(rack.clone()));
        assert!(!relists.has_changed().unwrap());
        watch.follow_configs(&InitDone);
        assert!(*watch.configs_listed.borrow());
        // What `events` does with them before its first list.
        watch
            .state()
            .wanted
            .extend(&KeptLabels::for_configs([&rack]));
        list_starts(&watch, &[labelled(&["rack"])]);
        watch.after_cache(&InitDone);
        assert!(watch.holds_labels_of(&rack));
        assert!(!relists.has_changed().unwrap());
        // Once listed, one naming a new key starts a list at once.
        watch.follow_configs(&Apply(selecting("row")));
        assert!(relists.has_changed().unwrap());
    }
}
