//! Whole-agent figures, against the API emulator, a simulated host and the test
//! kubelet:
//! - time from agent start to the device plugin being registered with the
//!   kubelet (the agent is already selected by a DeviceConfig), p50 and p99;
//! - time from SIGTERM-equivalent shutdown to exit;
//! - idle RSS of the real `gpu-operator agent` process on a simulated MI300X in
//!   cpx_nps4 mode (8 GPUs, 64 partitions), with every service of its
//!   DeviceConfig running (goal: under 25 MiB);
//! - idle CPU of that agent, and of `gpu-operator standalone --simulate mi300x
//!   --partition cpx_nps4` at the default intervals (goal: under 0.2 % of a
//!   core), from the child's threads' `/proc/<pid>/task/*/schedstat` over 60 s
//!   (and, coarser, its utime+stime).
//!
//!   The same with `--host-root` on a tree simulated once (no moving telemetry:
//!   the operator's own cost, as on a real node, without the simulator's writes).
//!
//!   And this machine's floor for that work: the files the health monitor
//!   reads each sample (PCIe link, RAS counts, temperatures), read at its
//!   default interval by one thread through kept descriptors, with no
//!   hand-off at all. No design that reads the same files at the same rate costs less.
//!
//! - `gpu-operator detect` (the NFD-free node labeller, on every node) on a
//!   node without a GPU and on a simulated MI300X: its RSS and idle CPU once
//!   it has labelled the Node.
//!
//! `AGENT_BENCH=idle` runs only the standalone idle-CPU figures,
//! `AGENT_BENCH=agent` only the agent's idle figures, `AGENT_BENCH=detect`
//! only the detect figures. Each idle-CPU figure is followed by its split
//! by thread name (CPU and times scheduled per second), to say where it goes.
//!
//! Run with `cargo bench --bench agent`. Prints figures; asserts nothing.

#[path = "support/figures.rs"]
mod figures;

#[path = "../tests/support/mod.rs"]
mod support;

use figures::{percentile, rss_mib};

use std::time::{Duration, Instant};

use gpu_operator::health::HealthConfig;
use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::json;
use support::cluster::TestCluster;
use support::fixtures::DeviceConfigBuilder;
use support::logged::{self, Logged};
use support::node_rig::NodeRig;

const NODE: &str = "bench-node";

/// How long idle CPU is measured, after the process settled.
const IDLE_WINDOW: Duration = Duration::from_secs(60);
const SETTLE: Duration = Duration::from_secs(5);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var("AGENT_BENCH").as_deref() == Ok("idle") {
        standalone_idle_cpu();
        return;
    }
    if std::env::var("AGENT_BENCH").as_deref() == Ok("detect") {
        detect_idle().await;
        return;
    }
    let emulator = TestCluster::start_for(EmulatorConfig::default(), &[NODE])
        .await
        .emulator;
    emulator
        .create(
            DeviceConfigBuilder::new("kube-amd-gpu", "gpus")
                .spec("metricsExporter", json!({"enable": true, "port": 0}))
                .spec("devicePlugin", json!({}))
                .json(),
        )
        .unwrap();
    if std::env::var("AGENT_BENCH").as_deref() == Ok("agent") {
        agent_idle(&emulator).await;
        return;
    }

    let runs = 20;
    let mut to_registration = Vec::new();
    let mut to_exit = Vec::new();
    for _ in 0..runs {
        let mut rig = NodeRig::builder(NODE)
            .join(emulator.client())
            .profile("mi300x", None, Some("cpx_nps4"))
            .kubelet()
            .start()
            .await;
        let config = rig
            .agent_config()
            .cdi_dir(rig.dir().join("cdi"))
            .rescan_interval(Duration::from_secs(5))
            .build();
        let started = Instant::now();
        rig.start_agent(config);
        rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
        to_registration.push(started.elapsed());
        let (_, stopping) = rig.stop_agent().await.expect("the agent ran");
        to_exit.push(stopping);
    }
    println!(
        "agent start -> device plugin registered (mi300x cpx_nps4, 64 devices): p50 {:.1?} p99 {:.1?} (n={runs})",
        percentile(&mut to_registration, 0.5),
        percentile(&mut to_registration, 0.99)
    );
    println!(
        "agent shutdown -> exit:                                     p50 {:.1?} p99 {:.1?} (n={runs})",
        percentile(&mut to_exit, 0.5),
        percentile(&mut to_exit, 0.99)
    );

    agent_idle(&emulator).await;
    tokio::task::spawn_blocking(standalone_idle_cpu)
        .await
        .unwrap();
}

/// Idle RSS and CPU of the real `gpu-operator agent` process, with every
/// service of the DeviceConfig running.
async fn agent_idle(emulator: &Emulator) {
    let rig = NodeRig::builder(NODE)
        .profile("mi300x", None, Some("cpx_nps4"))
        .kubelet()
        .start()
        .await;
    let (host_dir, kubelet_dir) = (rig.host.root().to_path_buf(), rig.kubelet_dir());
    let kubeconfig = rig.dir().join("kubeconfig");
    emulator.write_kubeconfig(&kubeconfig).unwrap();
    let mut child = figures::spawn_agent(NODE, &host_dir, &kubelet_dir, &kubeconfig, &[]);
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let idle = rss_mib(child.id());
    println!(
        "idle RSS of `gpu-operator agent` (mi300x cpx_nps4, all services running): {idle:.1} MiB"
    );
    let pid = child.id();
    let cpu = tokio::task::spawn_blocking(move || idle_cpu(pid, IDLE_WINDOW))
        .await
        .unwrap();
    println!(
        "idle CPU of `gpu-operator agent` (mi300x cpx_nps4, all services running): {}",
        cpu.describe()
    );
    println!("{}", cpu.by_thread());
    let _ = child.kill();
    let _ = child.wait();
    drop(rig);
}

/// Idle CPU of `gpu-operator standalone` at the default intervals on a
/// simulated MI300X in cpx_nps4, no scrapes, no kubelet: with `--simulate`
/// (telemetry moving every second), then with `--host-root` on a tree written
/// once.
fn standalone_idle_cpu() {
    let dir = figures::scratch();
    let host_dir = dir.path().join("host");
    simulate::write_host(
        &HostRoot::new(&host_dir),
        &SimSpec::new("mi300x", None, Some("cpx_nps4")).unwrap(),
    )
    .unwrap();
    let simulated: Vec<std::ffi::OsString> = ["--simulate", "mi300x", "--partition", "cpx_nps4"]
        .map(Into::into)
        .into();
    let host_root = vec!["--host-root".into(), host_dir.clone().into_os_string()];
    for (what, args) in [
        ("--simulate mi300x --partition cpx_nps4", simulated),
        ("--host-root <mi300x cpx_nps4 written once>", host_root),
    ] {
        let cpu = standalone_idle(dir.path(), &args);
        println!(
            "idle CPU of `gpu-operator standalone {what}`: {}",
            cpu.describe()
        );
        println!("{}", cpu.by_thread());
    }
    let (files, floor) = read_floor(&host_dir.join("sys/devices"));
    println!(
        "floor on this machine: {files} health files read every {:?} by one thread, \
         inline, no hand-off: {}",
        HealthConfig::DEFAULT_INTERVAL,
        floor.describe()
    );
}

/// The health monitor's per-sample files on a simulated tree: each GPU
/// function's PCIe link, RAS counts and hwmon temperatures.
fn health_files(devices: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![devices.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && path.join("ras").is_dir() {
                found.push(path.join("current_link_speed"));
                found.push(path.join("current_link_width"));
                for name in ["ras", "hwmon/hwmon0"] {
                    let Ok(files) = std::fs::read_dir(path.join(name)) else {
                        continue;
                    };
                    found.extend(files.flatten().map(|f| f.path()).filter(|f| {
                        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
                        name.ends_with("_err_count") || name == "temp2_input"
                    }));
                }
            } else if is_dir {
                dirs.push(path);
            }
        }
    }
    found
}

/// Reads [`health_files`] through kept descriptors at the health monitor's
/// default interval on one thread for [`IDLE_WINDOW`], and measures that
/// thread's CPU time.
fn read_floor(devices: &std::path::Path) -> (usize, IdleCpu) {
    use std::os::unix::fs::FileExt;
    let files: Vec<std::fs::File> = health_files(devices)
        .iter()
        .filter_map(|p| std::fs::File::open(p).ok())
        .collect();
    let count = files.len();
    let cpu = std::thread::spawn(move || {
        let thread_cpu = || {
            let mut now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime only writes the timespec it is given.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
            Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
        };
        let mut page = vec![0u8; 4096];
        let (before, started) = (thread_cpu(), Instant::now());
        while started.elapsed() < IDLE_WINDOW {
            for file in &files {
                let len = file.read_at(&mut page, 0).unwrap_or(0);
                let text = String::from_utf8_lossy(&page[..len]).trim().to_owned();
                std::hint::black_box(text);
            }
            std::thread::sleep(HealthConfig::DEFAULT_INTERVAL);
        }
        IdleCpu {
            cpu: thread_cpu().saturating_sub(before),
            ticks: None,
            main_thread: Duration::ZERO,
            threads: Default::default(),
            window: started.elapsed(),
        }
    })
    .join()
    .expect("floor thread");
    (count, cpu)
}

/// `gpu-operator detect` against the emulator, on a node without a GPU and
/// on a simulated MI300X: RSS and idle CPU once its label write is done (its
/// log line says so).
async fn detect_idle() {
    let emulator = Emulator::start(EmulatorConfig::default())
        .await
        .expect("emulator");
    for (node, profile) in [("no-gpu", None), ("mi300x", Some("mi300x"))] {
        emulator
            .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
            .unwrap();
        let mut rig = NodeRig::builder(node).in_memory().join(emulator.client());
        if let Some(profile) = profile {
            rig = rig.profile(profile, None, None);
        }
        let rig = rig.start().await;
        // A node without a GPU has an empty host root, not none.
        std::fs::create_dir_all(rig.host.root()).unwrap();
        let kubeconfig = emulator.kubeconfig_path().to_path_buf();
        let root = rig.host.root().to_path_buf();
        let (rss, cpu) = tokio::task::spawn_blocking(move || {
            let detect = Logged::start(
                logged::gpu_operator()
                    .args(["detect", "--node-name", node, "--host-root"])
                    .arg(&root)
                    .env("KUBECONFIG", &kubeconfig),
            );
            // Its one log line: the labels are on the Node.
            detect.wait_line("of the labels", |line| line.contains("node labels"));
            std::thread::sleep(SETTLE);
            let rss = rss_mib(detect.child.id());
            (rss, idle_cpu(detect.child.id(), IDLE_WINDOW))
        })
        .await
        .expect("detect measured");
        println!(
            "`gpu-operator detect` on a node {}: RSS {rss:.1} MiB, idle CPU {}",
            if profile.is_some() {
                "with a simulated MI300X"
            } else {
                "without a GPU"
            },
            cpu.describe()
        );
    }
}

fn standalone_idle(scratch: &std::path::Path, host_args: &[std::ffi::OsString]) -> IdleCpu {
    let standalone = Logged::start(
        logged::gpu_operator()
            .arg("standalone")
            .args(host_args)
            .args(["--metrics-bind", "127.0.0.1:0", "--kubelet-dir"])
            .arg(scratch.join("no-kubelet"))
            .arg("--events-file")
            .arg(scratch.join("events.jsonl"))
            .env("TMPDIR", scratch),
    );
    // The first log line is the evidence that the process is up.
    standalone.wait_line("of any kind", |_| true);
    std::thread::sleep(SETTLE);
    idle_cpu(standalone.child.id(), IDLE_WINDOW)
}

/// CPU time a process used over a window: to the nanosecond from its
/// threads' scheduler statistics, and from utime+stime in clock ticks
/// (coarse: one tick in 60 s is 0.017 %, but it counts threads that exited).
struct IdleCpu {
    cpu: Duration,
    ticks: Option<Duration>,
    /// Of `cpu`, the main thread's: where `standalone --simulate` runs the
    /// simulator's writes (the services run on the runtime's threads).
    main_thread: Duration,
    /// Of `cpu`, by thread name: CPU time and times scheduled.
    threads: std::collections::BTreeMap<String, (Duration, u64)>,
    window: Duration,
}

impl IdleCpu {
    fn describe(&self) -> String {
        let per_cent = |cpu: Duration| cpu.as_secs_f64() / self.window.as_secs_f64() * 100.0;
        let ticks = self
            .ticks
            .map(|t| {
                format!(
                    "; utime+stime {:.3} %; main thread {:.3} %",
                    per_cent(t),
                    per_cent(self.main_thread)
                )
            })
            .unwrap_or_default();
        format!(
            "{:.3} % of a core ({:.2} ms CPU per s; {:.1} ms in {:.0?}{ticks})",
            per_cent(self.cpu),
            per_cent(self.cpu) * 10.0,
            self.cpu.as_secs_f64() * 1000.0,
            self.window
        )
    }

    /// The split by thread name, busiest first: ms of CPU and times
    /// scheduled per second.
    fn by_thread(&self) -> String {
        let seconds = self.window.as_secs_f64();
        let mut threads: Vec<_> = self.threads.iter().collect();
        threads.sort_by_key(|(_, (cpu, _))| std::cmp::Reverse(*cpu));
        let parts: Vec<String> = threads
            .iter()
            .filter(|(_, (cpu, _))| !cpu.is_zero())
            .map(|(name, (cpu, runs))| {
                format!(
                    "{name} {:.2} ms/s {:.1}/s",
                    cpu.as_secs_f64() * 1000.0 / seconds,
                    *runs as f64 / seconds
                )
            })
            .collect();
        format!("  by thread: {}", parts.join(", "))
    }
}

/// Measures the CPU time of `pid`'s threads over `window`.
fn idle_cpu(pid: u32, window: Duration) -> IdleCpu {
    let (before, ticks_before) = (threads_cpu_time(pid), cpu_time(pid));
    let started = Instant::now();
    std::thread::sleep(window);
    let (after, ticks_after) = (threads_cpu_time(pid), cpu_time(pid));
    let mut threads = std::collections::BTreeMap::<String, (Duration, u64)>::new();
    let mut main_thread = Duration::ZERO;
    for (tid, now) in &after {
        let then = before.get(tid);
        let cpu = now
            .cpu
            .saturating_sub(then.map_or(Duration::ZERO, |t| t.cpu));
        let runs = now.runs.saturating_sub(then.map_or(0, |t| t.runs));
        if *tid == pid.to_string() {
            main_thread = cpu;
        }
        let entry = threads.entry(now.name.clone()).or_default();
        entry.0 += cpu;
        entry.1 += runs;
    }
    IdleCpu {
        cpu: threads.values().map(|(cpu, _)| *cpu).sum(),
        ticks: Some(ticks_after.saturating_sub(ticks_before)),
        main_thread,
        threads,
        window: started.elapsed(),
    }
}

/// One thread's scheduler statistics.
struct ThreadTime {
    name: String,
    cpu: Duration,
    /// Times it was scheduled (each wake-up is at least one).
    runs: u64,
}

/// Each live thread's name, time on a CPU and times scheduled, from
/// `/proc/<pid>/task/*/{comm,schedstat}` (its first and third fields).
fn threads_cpu_time(pid: u32) -> std::collections::BTreeMap<String, ThreadTime> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let text = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let fields: Vec<u64> = text
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            Some((
                task.file_name().to_string_lossy().into_owned(),
                ThreadTime {
                    name: name.trim().to_owned(),
                    cpu: Duration::from_nanos(*fields.first()?),
                    runs: fields.get(2).copied().unwrap_or(0),
                },
            ))
        })
        .collect()
}

/// utime+stime from `/proc/<pid>/stat` (fields 14 and 15, in clock ticks).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("child's stat");
    // The command name may hold spaces; fields are counted after its ')'.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / per_second)
}
