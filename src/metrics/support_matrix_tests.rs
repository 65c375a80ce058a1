//! The reference's metric support matrix against a simulated host: every
//! family the reference lists for the profile's platform on bare metal must
//! be served, unless it comes only from amd-smi or rocprofiler (the matrix
//! already leaves out rocprofiler's `GPU_PROF_*`) or a row of [`GAPS`] says
//! why this host cannot have it. Each test prints what it found.
//!
//! The matrix is `tests/fixtures/reference/metrics-support-matrix.tsv`,
//! derived from the reference's machine-readable
//! `docs/configuration/metrics-support-matrix.yaml`; its platforms are
//! families (`MI2xx`, `MI3xx`), so an MI300X is checked against `MI3xx` and
//! an MI210 or MI250X against `MI2xx`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::compat_tests::names_with_series;
use super::render::{Family, RenderInput, families};
use crate::health::{Damping, MonitorState, Thresholds};
use crate::host::HostRoot;
use crate::host::reader::BoundedReader;
use crate::simulate::{self, SimSpec};
use crate::telemetry::config::ExporterConfig;
use crate::telemetry::sample::{Sampler, Scope};

const MATRIX: &str = include_str!("../../tests/fixtures/reference/metrics-support-matrix.tsv");

/// Families the reference gets from amd-smi only, from no sysfs attribute
/// and not from the metrics table: its source, printed beside them.
const ONLY_FROM_AMD_SMI: &[(&str, &str)] = &[
    (
        "GPU_XGMI_NBR_*",
        "amd-smi's XGMI counters: perf events of the amdgpu XGMI/DF PMU, opened with \
         perf_event_open, not a sysfs attribute or the metrics table",
    ),
    (
        "GPU_AFID_ERRORS",
        "AMD field IDs of CPER records, which amd-smi decodes from the kernel's CPER \
         ring (debugfs), not from sysfs",
    ),
];

const NO_RAS_BLOCK_MI300: &str = "no such RAS block on MI300 (GC 9.4.3): no IP of the ASIC \
    registers it with amdgpu_ras_register_ras_block, so there is no ras/<block>_err_count";
const NO_RAS_BLOCK_MI200: &str = "no such RAS block on MI200 (aldebaran): no IP of the ASIC \
    registers it, so there is no ras/<block>_err_count (its MP0, MP1 and MPIO errors are the \
    mca.* blocks)";
const DEFERRED_UMC_ONLY: &str = "amdgpu_ras_sysfs_read writes the de: line for UMC only; \
    other blocks' files have ue: and ce:";
const HBM_TEMPERATURE: &str = "MI300's metrics table (v1.4 to v1.8) has no temperature_hbm \
    and its hwmon only the mem sensor; the reference's matrix marks it class N (deprecated \
    from the 6.14.14 driver)";
const V1_3_NO_MAX_BANDWIDTH: &str = "aldebaran's metrics table is v1.3, which has no \
    mem_max_bandwidth, and no sysfs attribute gives it (the reference's metricslist.md lists \
    it [MI3xx] only)";
const V1_3_NO_XGMI_DATA: &str = "aldebaran's v1.3 metrics table has no xgmi_read_data_acc/\
    xgmi_write_data_acc, where amd-smi's link metrics read them too; no sysfs attribute \
    counts XGMI traffic";

const MI300: &[&str] = &["mi300x"];
const MI200: &[&str] = &["mi210", "mi250x"];
const ALL: &[&str] = &["mi300x", "mi210", "mi250x"];

/// Families of the matrix a simulated host of these profiles does not
/// serve, each with why a real one cannot serve it either: (profiles,
/// patterns, reason). A pattern's one `*` stands for any text. A row that
/// no longer explains any gap fails the test, so the table stays true.
const GAPS: &[(&[&str], &[&str], &str)] = &[
    (MI300, &["GPU_HBM_TEMPERATURE"], HBM_TEMPERATURE),
    (
        MI300,
        &[
            "GPU_ECC_*_ATHUB",
            "GPU_ECC_*_DF",
            "GPU_ECC_*_SMN",
            "GPU_ECC_*_SEM",
            "GPU_ECC_*_MP0",
            "GPU_ECC_*_MP1",
            "GPU_ECC_*_FUSE",
            "GPU_ECC_*_MCA",
            "GPU_ECC_*_IH",
            "GPU_ECC_*_MPIO",
        ],
        NO_RAS_BLOCK_MI300,
    ),
    (
        MI200,
        &[
            "GPU_ECC_*_ATHUB",
            "GPU_ECC_*_DF",
            "GPU_ECC_*_SMN",
            "GPU_ECC_*_SEM",
            "GPU_ECC_*_FUSE",
            "GPU_ECC_*_MCA",
            "GPU_ECC_*_IH",
        ],
        NO_RAS_BLOCK_MI200,
    ),
    (ALL, &["GPU_ECC_DEFERRED_*"], DEFERRED_UMC_ONLY),
    (MI200, &["GPU_VRAM_MAX_BANDWIDTH"], V1_3_NO_MAX_BANDWIDTH),
    (MI200, &["GPU_XGMI_LINK_*"], V1_3_NO_XGMI_DATA),
];

fn matches(pattern: &str, field: &str) -> bool {
    match pattern.split_once('*') {
        Some((head, tail)) => {
            field.len() >= head.len() + tail.len()
                && field.starts_with(head)
                && field.ends_with(tail)
        }
        None => pattern == field,
    }
}

/// The matrix's fields listed for `platform` on bare metal.
fn listed(platform: &str) -> Vec<&'static str> {
    MATRIX
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut cols = l.split('\t');
            let (field, platforms, baremetal) = (cols.next()?, cols.next()?, cols.next()?);
            (baremetal == "true" && platforms.split(',').any(|p| p == platform)).then_some(field)
        })
        .collect()
}

/// What a simulated host serves after two samples (the residency
/// percentages need a table before), with a KFD process that has waves on
/// the first GPU, its health monitor beside the exporter and the default
/// config (every field).
async fn served(spec: &SimSpec) -> Vec<Family> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let host = HostRoot::new(dir.path());
    simulate::write_host(&host, spec).expect("simulated host");
    let inventory = crate::device::discover(&host);
    let node = inventory.gpus[0].kfd_node.expect("a KFD node");
    simulate::add_kfd_process(&host, 4242, &[(node, 19)]).expect("a KFD process");
    let mut sampler = Sampler::new(BoundedReader::new(host.clone(), 2), Duration::from_secs(1));
    sampler.set_processes(true);
    sampler.sample(&inventory, Scope::Full).await;
    simulate::advance_telemetry(&host, spec, 1).expect("advance");
    let sample = sampler.sample(&inventory, Scope::Full).await;
    let health = MonitorState::default()
        .step(
            &inventory,
            &sample,
            &Thresholds::default(),
            &Damping::default(),
        )
        .0;
    families(&RenderInput {
        inventory: &inventory,
        sample: &sample,
        pods: &BTreeMap::new(),
        health: Some(&health),
        config: &ExporterConfig::default(),
        hostname: "node-1",
        shared_gpus: false,
    })
}

/// Checks one profile against the matrix's `platform` column and prints
/// the gaps with their reasons.
async fn check(profile: &str, partition: Option<&str>, platform: &str) {
    let spec = SimSpec::new(profile, None, partition).expect("profile");
    let families = served(&spec).await;
    let exported = names_with_series(&families);
    let listed = listed(platform);
    let mut excluded = Vec::new();
    let mut gaps: Vec<(&str, Option<&str>)> = Vec::new();
    for field in &listed {
        if let Some((_, source)) = ONLY_FROM_AMD_SMI.iter().find(|(p, _)| matches(p, field)) {
            excluded.push((*field, *source));
        } else if !exported.contains(field.to_ascii_lowercase().as_str()) {
            let reason = GAPS
                .iter()
                .filter(|(profiles, _, _)| profiles.contains(&profile))
                .find(|(_, patterns, _)| patterns.iter().any(|p| matches(p, field)))
                .map(|(_, _, reason)| *reason);
            gaps.push((field, reason));
        }
    }
    println!(
        "{profile} {}: {} families listed for {platform} on bare metal; {} served, {} from \
         amd-smi only, {} missing",
        partition.unwrap_or("(default mode)"),
        listed.len(),
        listed.len() - excluded.len() - gaps.len(),
        excluded.len(),
        gaps.len()
    );
    // One paragraph per source or reason, with the families it covers.
    let mut by_why: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for (field, source) in &excluded {
        by_why
            .entry(("amd-smi only", source))
            .or_default()
            .push(field);
    }
    for (field, reason) in &gaps {
        let why = reason.unwrap_or("NO REASON");
        by_why.entry(("missing", why)).or_default().push(field);
    }
    for ((kind, why), fields) in &by_why {
        println!(
            "  {kind} ({}): {}\n    {why}",
            fields.len(),
            fields.join(" ")
        );
    }
    let unexplained: Vec<&str> = gaps
        .iter()
        .filter(|(_, r)| r.is_none())
        .map(|(f, _)| *f)
        .collect();
    assert_eq!(
        unexplained,
        Vec::<&str>::new(),
        "{profile}: families of the matrix missing without a reason"
    );
    for (profiles, patterns, reason) in GAPS.iter().filter(|(p, _, _)| p.contains(&profile)) {
        for pattern in *patterns {
            assert!(
                gaps.iter().any(|(f, _)| matches(pattern, f)),
                "{profile}: {pattern} is served now; take it off GAPS ({profiles:?}: {reason})"
            );
        }
    }
}

#[tokio::test]
async fn support_matrix_families_on_a_simulated_mi300x() {
    check("mi300x", None, "MI3xx").await;
}

#[tokio::test]
async fn support_matrix_families_on_a_simulated_mi300x_in_cpx_nps4() {
    check("mi300x", Some("cpx_nps4"), "MI3xx").await;
}

#[tokio::test]
async fn support_matrix_families_on_a_simulated_mi210() {
    check("mi210", None, "MI2xx").await;
}

#[tokio::test]
async fn support_matrix_families_on_a_simulated_mi250x() {
    check("mi250x", None, "MI2xx").await;
}

#[test]
fn the_matrix_fixture_is_read_whole() {
    // 142 fields in the reference's matrix at the fixture's commit.
    let rows = MATRIX
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .count();
    assert_eq!(rows, 142);
    assert!(listed("MI3xx").contains(&"GPU_PROCESS_CU_OCCUPANCY"));
    assert!(!listed("MI3xx").contains(&"GPU_EDGE_TEMPERATURE"));
    assert!(listed("MI2xx").contains(&"GPU_EDGE_TEMPERATURE"));
    assert!(matches("GPU_ECC_*_MP0", "GPU_ECC_DEFERRED_MP0"));
    assert!(!matches("GPU_ECC_*_MP0", "GPU_ECC_DEFERRED_MP1"));
}
