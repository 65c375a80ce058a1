//! What the bench binaries share for measuring and printing: scratch space,
//! percentiles and resident memory. Included with `#[path]`; each binary uses a
//! subset.
#![allow(dead_code)]

use std::time::Duration;

/// The bench setting `name` from the environment (`NODES=10000`), or
/// `default` when it is unset or not a `T`.
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A temporary directory, in memory where possible: deleting a simulated
/// cpx_nps4 host from a `discard`-mounted disk takes seconds.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("temp dir")
}

/// The `q` quantile (0..=1) of `samples`, nearest rank.
pub fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * q).round() as usize]
}

/// p50, p99 and max of `samples`, in milliseconds.
pub fn summary(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        ms(percentile(&mut samples, 0.5)),
        ms(percentile(&mut samples, 0.99)),
        ms(percentile(&mut samples, 1.0)),
    )
}

/// Resident memory of process `pid`, in MiB (NaN when it cannot be read).
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// utime + stime of process `pid`, in seconds (0 when it cannot be read).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the whole line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

/// Starts the real `gpu-operator agent` binary for node `node` on the
/// simulated host at `host_dir`, against the API server `kubeconfig` names,
/// logging warnings only, with `extra` arguments; its stdout is discarded.
pub fn spawn_agent(
    node: &str,
    host_dir: &std::path::Path,
    kubelet_dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    extra: &[&std::ffi::OsStr],
) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(["agent", "--node-name", node, "--host-root"])
        .arg(host_dir)
        .arg("--kubelet-dir")
        .arg(kubelet_dir)
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .env_remove("POD_NAMESPACE")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start agent")
}
