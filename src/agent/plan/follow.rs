//! Step 1 of a pass ([`follow`]): from the selection, what the agent
//! follows (the line to log when that changed) and which ConfigMaps and
//! `rbacConfig` objects to watch. Pure: it must not watch anything itself.

use super::super::configmaps::ConfigMapRef;
use super::super::select::Selection;
use super::LoopState;
use crate::api::KubeRbacConfig;

/// Step 1: what the selection has the agent follow.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Following {
    /// What the agent follows now, to log, when that changed.
    pub log: Option<String>,
    /// The ConfigMap of `metricsExporter.config`.
    pub metrics_config: Option<ConfigMapRef>,
    /// The ConfigMap of `testRunner.config`.
    pub test_config: Option<ConfigMapRef>,
    /// The namespace and `metricsExporter.rbacConfig` whose objects to follow.
    pub access: Option<(String, KubeRbacConfig)>,
    /// The ConfigMap of `configManager.config` (the reference's
    /// `default-dcm-config` when it names none), while configManager is on.
    pub partition_config: Option<ConfigMapRef>,
}

/// Step 1 (see the module doc).
pub fn follow(state: &mut LoopState, selection: &Selection) -> Following {
    let now_following = match selection {
        Selection::One(selected) => format!("following DeviceConfig {}", selected.key),
        Selection::Conflict(keys) => format!(
            "DeviceConfigs {} all select this node; running only the metrics endpoint",
            keys.join(", ")
        ),
        Selection::None => {
            "no DeviceConfig selects this node; running only the metrics endpoint".into()
        }
    };
    let log = (state.followed.as_ref() != Some(&now_following)).then(|| {
        state.followed = Some(now_following.clone());
        now_following
    });
    let Selection::One(selected) = selection else {
        return Following {
            log,
            ..Following::default()
        };
    };
    let namespace = &selected.key.namespace;
    let spec = &selected.spec;
    Following {
        log,
        metrics_config: spec
            .metrics_exporter
            .config
            .name
            .clone()
            .map(|n| (namespace.clone(), n)),
        test_config: spec
            .test_runner
            .config
            .as_ref()
            .map(|c| (namespace.clone(), c.name.clone())),
        access: Some((namespace.clone(), spec.metrics_exporter.rbac_config.clone())),
        partition_config: spec.config_manager.is_enabled().then(|| {
            (
                namespace.clone(),
                spec.config_manager.config_map().to_owned(),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::plan::one;
    use crate::api::DeviceConfigSpec;

    #[test]
    fn what_is_followed_is_logged_once_and_watched_in_the_configs_namespace() {
        let mut spec = DeviceConfigSpec::default();
        spec.metrics_exporter.config.name = Some("metrics-cm".into());
        let selected = one("kube-amd-gpu", "gpus", spec);
        let conflict = Selection::Conflict(vec!["ns/a".into(), "ns/b".into()]);
        // (selection, line logged, metrics ConfigMap, test ConfigMap, access followed)
        type Row<'a> = (
            &'a Selection,
            Option<&'a str>,
            Option<(&'a str, &'a str)>,
            bool,
        );
        let table: &[Row] = &[
            (
                &selected,
                Some("following DeviceConfig kube-amd-gpu/gpus"),
                Some(("kube-amd-gpu", "metrics-cm")),
                true,
            ),
            // The same again: nothing new to log, the same to follow.
            (&selected, None, Some(("kube-amd-gpu", "metrics-cm")), true),
            (
                &conflict,
                Some(
                    "DeviceConfigs ns/a, ns/b all select this node; running only the metrics endpoint",
                ),
                None,
                false,
            ),
            (
                &Selection::None,
                Some("no DeviceConfig selects this node; running only the metrics endpoint"),
                None,
                false,
            ),
            (&Selection::None, None, None, false),
        ];
        let mut state = LoopState::default();
        for (i, (selection, log, metrics, access)) in table.iter().enumerate() {
            let following = follow(&mut state, selection);
            assert_eq!(following.log.as_deref(), *log, "row {i}");
            assert_eq!(
                following.metrics_config,
                metrics.map(|(ns, n)| (ns.to_owned(), n.to_owned())),
                "row {i}"
            );
            assert_eq!(following.test_config, None, "row {i}");
            assert_eq!(
                following.access.as_ref().map(|(ns, _)| ns.as_str()),
                access.then_some("kube-amd-gpu"),
                "row {i}"
            );
        }
    }
}
