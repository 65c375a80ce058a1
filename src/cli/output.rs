//! What the subcommands print for a person: the `error:` line, the inventory
//! table, the GPUs amdgpu does not serve, and the `--show-metrics` frames.
//!
//! Every function here formats what it is given, or prints it. It must not
//! discover, sample or decide anything: what to show is the caller's.

use std::fmt::Write as _;
use std::process::ExitCode;

use crate::device::{self, Inventory};

/// Prints `error: <message>` and returns the given exit code.
pub fn fail(message: impl std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(code)
}

/// The AMD GPUs that amdgpu does not serve, one line each, for a person.
pub fn unbound_lines(unbound: &[device::unbound::UnboundGpu]) -> String {
    let mut out = String::new();
    if !unbound.is_empty() {
        let _ = writeln!(
            out,
            "{} AMD GPU(s) not bound to amdgpu, so not listed above:",
            unbound.len()
        );
    }
    for gpu in unbound {
        let _ = writeln!(out, "  {gpu}");
    }
    out
}

/// One row per GPU, its partitions beneath, then problems.
pub fn inventory_table(inventory: &Inventory) -> String {
    let mut out = String::new();
    let driver = &inventory.driver;
    let _ = writeln!(
        out,
        "driver: {} (version {}, /dev/kfd {})",
        if driver.loaded {
            "loaded"
        } else {
            "not loaded"
        },
        driver.version.as_deref().unwrap_or("inbox/unknown"),
        if driver.kfd_present {
            "present"
        } else {
            "absent"
        },
    );
    let _ = writeln!(out, "{} GPU(s)", inventory.gpus.len());
    if inventory.gpus.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<13} {:<24} {:<6} {:>4} {:>5} {:>7} {:>4} {:>7} {:>5} {:<8} {:<10} {:<20}",
        "BDF",
        "PRODUCT",
        "DEVICE",
        "NUMA",
        "CARD",
        "RENDER",
        "KFD",
        "VRAM",
        "CUS",
        "PARTS",
        "GFX",
        "HIVE"
    );
    let opt = |v: Option<u32>| v.map_or("-".to_owned(), |v| v.to_string());
    for gpu in &inventory.gpus {
        let _ = writeln!(
            out,
            "{:<13} {:<24} {:<6} {:>4} {:>5} {:>7} {:>4} {:>7} {:>5} {:<8} {:<10} {:<20}",
            gpu.bdf,
            gpu.product_name.as_deref().unwrap_or("-"),
            format!("{:04x}", gpu.device_id),
            gpu.numa_node.map_or("-".to_owned(), |n| n.to_string()),
            opt(gpu.card),
            opt(gpu.render_minor),
            opt(gpu.kfd_node),
            gpu.vram_bytes
                .map_or("-".to_owned(), |b| format!("{}G", b >> 30)),
            opt(gpu.cu_count),
            gpu.partition_profile().unwrap_or_else(|| "-".into()),
            gpu.gfx_target_version
                .map_or("-".to_owned(), device::gfx_target_name),
            gpu.hive_id.map_or("-".to_owned(), |h| h.to_string()),
        );
        for part in &gpu.partitions {
            let _ = writeln!(
                out,
                "  partition {:<2} card {:>3}  render {:>3}  kfd {:>3}",
                part.id,
                opt(part.card),
                opt(part.render_minor),
                opt(part.kfd_node),
            );
        }
        if !gpu.links.is_empty() {
            let xgmi = gpu
                .links
                .iter()
                .filter(|l| l.kind == device::LinkKind::Xgmi)
                .count();
            let _ = writeln!(
                out,
                "  links: {} xgmi, {} other",
                xgmi,
                gpu.links.len() - xgmi
            );
        }
        for problem in &gpu.problems {
            let _ = writeln!(out, "  problem: {problem}");
        }
    }
    for warning in &inventory.warnings {
        let _ = writeln!(out, "warning: {warning}");
    }
    out
}

/// Prints a table of every GPU's readings every 5 s, from what `/gpumetrics`
/// serves, read in process (so it works whatever the endpoint's access
/// control).
pub(super) async fn show_live_metrics(
    published: tokio::sync::watch::Receiver<std::sync::Arc<crate::metrics::server::Published>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut ticker = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let latest = published.borrow().clone();
        if !latest.ready {
            eprintln!("waiting for the first sample…");
            continue;
        }
        match serde_json::from_slice::<serde_json::Value>(&latest.json()) {
            Ok(view) => {
                // Each frame says when it was taken, to the second, in UTC.
                let now = k8s_openapi::jiff::Timestamp::now();
                let now = now.round(k8s_openapi::jiff::Unit::Second).unwrap_or(now);
                print!("{}", live_frame(&now.to_string(), &view));
            }
            Err(e) => eprintln!("cannot read the exporter's GPU view: {e}"),
        }
    }
}

/// A `--show-metrics` frame: the time it was taken, then the table.
pub fn live_frame(time: &str, view: &serde_json::Value) -> String {
    format!("-- {time} --\n{}", live_table(view))
}

/// One line per GPU (partition 0 of partitioned GPUs) from a `/gpumetrics` view.
pub fn live_table(view: &serde_json::Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4} {:<13} {:<8} {:>7} {:>8} {:>7} {:>6} {:>13}",
        "GPU", "BDF", "HEALTH", "EDGE°C", "JUNCT°C", "POWER W", "GFX %", "VRAM USED GiB"
    );
    let number = |v: &serde_json::Value| v.as_f64().map_or("-".to_owned(), |n| format!("{n:.1}"));
    for gpu in view["gpus"].as_array().into_iter().flatten() {
        if gpu["partition_id"].as_u64().unwrap_or(0) != 0 {
            continue;
        }
        let r = &gpu["readings"];
        let vram = r["memory"]["vram_used"]
            .as_f64()
            .map_or("-".to_owned(), |b| {
                format!("{:.1}", b / f64::from(1u32 << 30))
            });
        let _ = writeln!(
            out,
            "{:>4} {:<13} {:<8} {:>7} {:>8} {:>7} {:>6} {:>13}",
            gpu["gpu_id"]
                .as_u64()
                .map_or("-".to_owned(), |id| id.to_string()),
            gpu["bdf"].as_str().unwrap_or("-"),
            if gpu["healthy"].as_bool().unwrap_or(false) {
                "healthy"
            } else {
                "UNHEALTHY"
            },
            number(&r["temperature"]["edge_c"]),
            number(&r["temperature"]["junction_c"]),
            number(&r["power"]["average_w"]),
            number(&r["gfx_activity_pct"]),
            vram,
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_frames_carry_their_time_and_one_row_per_gpu() {
        let view = serde_json::json!({"gpus": [
            {"gpu_id": 0, "bdf": "0000:05:00.0", "healthy": true, "partition_id": 0,
             "readings": {"temperature": {"edge_c": 40.0}}},
            {"gpu_id": 0, "bdf": "0000:05:00.0", "healthy": true, "partition_id": 1,
             "readings": {}},
        ]});
        let frame = live_frame("2026-12-01T09:30:00Z", &view);
        let lines: Vec<&str> = frame.lines().collect();
        assert_eq!(lines[0], "-- 2026-12-01T09:30:00Z --");
        assert!(lines[1].starts_with(" GPU BDF"), "{frame}");
        assert!(
            lines[2].contains("0000:05:00.0") && lines[2].contains("40.0"),
            "{frame}"
        );
        // The frame ends with a blank line, to set it off from the next.
        assert_eq!(lines[3], "", "{frame}");
        assert_eq!(lines.len(), 4, "{frame}");
    }
}
