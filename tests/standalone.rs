//! The bare-metal commands through the real binary: `standalone` (metrics that
//! promtool accepts, systemd readiness, clean SIGTERM) and `check`.

#[path = "fixtures/testrunner/fake_rvs.rs"]
mod fake_rvs;
mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};
use support::logged::{Logged, Notify};
use support::wait;

fn bin() -> Command {
    support::logged::gpu_operator()
}

fn promtool_accepts(text: &str) {
    support::promtool::accepts(text);
}

#[test]
fn standalone_on_a_simulated_mi300x_serves_metrics_promtool_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let systemd = Notify::bind(&dir.path().join("notify.sock"));
    let mut agent = Logged::start(
        bin()
            .args([
                "standalone",
                "--simulate",
                "mi300x",
                "--metrics-bind",
                "127.0.0.1:0",
            ])
            .arg("--events-file")
            .arg(dir.path().join("events.jsonl"))
            .env("NOTIFY_SOCKET", systemd.path()),
    );

    // systemd readiness (Type=notify) arrives once the endpoint listens.
    systemd.wait_ready();

    // The log names the address it listens on.
    let addr = agent.metrics_address();
    let scrape = wait::poll_until_blocking(
        "GPU metrics",
        || support::http::get(&addr, "/metrics"),
        |scrape| scrape.contains("gpu_edge_temperature{"),
    );
    let series = scrape
        .lines()
        .filter(|l| l.starts_with("gpu_edge_temperature{"))
        .count();
    assert_eq!(series, 8, "one edge temperature per GPU");
    promtool_accepts(&scrape);
    assert!(support::http::get(&addr, "/healthz").len() < 100);

    // SIGTERM: out within 5 s.
    let status = agent.terminate_within(Duration::from_secs(5));
    assert!(status.success(), "{status}");
    let events = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
    assert!(
        events.contains("\"Started\"") && events.contains("\"Stopping\""),
        "{events}"
    );
}

#[test]
fn standalone_refuses_an_invalid_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "spec:\n  metricsExporter: {serviceType: Sideways}\n",
    )
    .unwrap();
    let out = bin()
        .args(["standalone", "--host-root"])
        .arg(dir.path())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("serviceType"), "{stderr}");
}

#[test]
fn check_fails_when_no_gpu_is_bound() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    let mut spec = SimSpec::new("mi210", Some(2), None).unwrap();
    spec.driver_loaded = false;
    simulate::write_host(&host, &spec).unwrap();
    let out = bin()
        .args(["check", "--host-root"])
        .arg(host.root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("driver is not loaded"), "{stderr}");
    assert!(
        stderr.contains("2 AMD GPU(s) not bound to amdgpu") && stderr.contains("0000:26:00.0"),
        "the GPUs it can see are named: {stderr}"
    );
}

#[test]
fn discover_names_gfx_targets_and_the_gpus_no_driver_serves() {
    let dir = tempfile::tempdir().unwrap();
    let bound = HostRoot::new(dir.path().join("bound"));
    simulate::write_host(&bound, &SimSpec::new("mi210", Some(2), None).unwrap()).unwrap();
    let out = bin()
        .args(["discover", "--host-root"])
        .arg(bound.root())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains("2 GPU(s)") && table.contains(" gfx90a "),
        "{table}"
    );
    assert!(!table.contains("not bound"), "{table}");

    let unbound = HostRoot::new(dir.path().join("unbound"));
    let mut spec = SimSpec::new("mi210", Some(2), None).unwrap();
    spec.driver_loaded = false;
    simulate::write_host(&unbound, &spec).unwrap();
    let out = bin()
        .args(["discover", "--host-root"])
        .arg(unbound.root())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("0 GPU(s)"), "{table}");
    assert!(
        table.contains("2 AMD GPU(s) not bound to amdgpu")
            && table.contains("0000:03:00.0 (device 0x740f) bound to no driver"),
        "{table}"
    );
    let out = bin()
        .args(["discover", "--output", "json", "--host-root"])
        .arg(unbound.root())
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["unbound"].as_array().map(Vec::len), Some(2), "{json}");
}

#[test]
fn check_reports_unhealthy_gpus_and_runs_a_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    simulate::write_host(&host, &SimSpec::new("mi210", Some(2), None).unwrap()).unwrap();
    let healthy = bin()
        .args(["check", "--output", "json", "--host-root"])
        .arg(host.root())
        .output()
        .unwrap();
    assert_eq!(
        healthy.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&healthy.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&healthy.stdout).unwrap();
    assert_eq!(report["unhealthy"], 0);
    assert_eq!(report["gpus"].as_array().unwrap().len(), 2);

    simulate::set_ecc_counts(&host, "0000:26:00.0", "umc", 3, 0).unwrap();
    let sick = bin()
        .args(["check", "--output", "json", "--host-root"])
        .arg(host.root())
        .output()
        .unwrap();
    assert_eq!(sick.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&sick.stdout).unwrap();
    let gpu = report["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["bdf"] == "0000:26:00.0")
        .unwrap();
    assert_eq!(gpu["healthy"], false);
    assert!(
        gpu["reasons"].to_string().to_lowercase().contains("ecc"),
        "{gpu}"
    );

    // With a recipe, the test runs through the (stand-in) tool.
    simulate::set_ecc_counts(&host, "0000:26:00.0", "umc", 0, 0).unwrap();
    let rvs = fake_rvs::FakeRvs::new();
    rvs.modes(&["fail:1"]);
    let commands = rvs.commands();
    let tested = bin()
        .args(["check", "--recipe", "gst_single", "--host-root"])
        .arg(host.root())
        .arg("--logs-dir")
        .arg(dir.path().join("logs"))
        .arg("--rvs")
        .arg(&commands.rvs)
        .arg("--rvs-conf-dir")
        .arg(&commands.rvs_conf_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&tested.stdout);
    assert_eq!(
        tested.status.code(),
        Some(1),
        "a failing test fails the check: {stdout}"
    );
    assert!(stdout.contains("test gst_single"), "{stdout}");
    assert_eq!(rvs.invocations().len(), 1, "{:?}", rvs.invocations());
}

#[test]
fn check_tells_a_missing_test_tool_from_a_gpu_failure() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    simulate::write_host(&host, &SimSpec::new("mi210", Some(2), None).unwrap()).unwrap();
    let missing = dir.path().join("no-such-rvs");
    let out = bin()
        .args([
            "check",
            "--recipe",
            "gst_single",
            "--output",
            "json",
            "--host-root",
        ])
        .arg(host.root())
        .arg("--logs-dir")
        .arg(dir.path().join("logs"))
        .arg("--rvs")
        .arg(&missing)
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["unhealthy"], 0, "the GPUs themselves are fine");
    assert_eq!(report["test"]["result"], "not-run");
    let reason = report["test"]["reason"].as_str().unwrap();
    assert!(reason.contains(&missing.display().to_string()), "{reason}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("one clear error line: {stderr}"));
    assert!(
        line.contains("RVS test tool") && line.contains("--rvs"),
        "{line}"
    );

    // A relative --rvs names a file relative to the current directory, not to
    // the logs directory the test runs in.
    let rvs = fake_rvs::FakeRvs::new();
    let commands = rvs.commands();
    let out = bin()
        .current_dir(commands.rvs.parent().unwrap())
        .args(["check", "--recipe", "gst_single", "--host-root"])
        .arg(host.root())
        .arg("--logs-dir")
        .arg(dir.path().join("logs"))
        .args(["--rvs", "rvs"])
        .arg("--rvs-conf-dir")
        .arg(&commands.rvs_conf_dir)
        .arg("--rvs-results-dir")
        .arg(&commands.rvs_results_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(rvs.invocations().len(), 1);
    // Logs on a pipe are plain text: no colour codes.
    assert!(stderr.contains(" INFO "), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

#[test]
fn standalone_fails_at_start_when_the_metrics_port_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut child = bin()
        .args(["standalone", "--simulate", "mi210", "--metrics-bind"])
        .arg(addr.to_string())
        .arg("--events-file")
        .arg(dir.path().join("events.jsonl"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait::poll_until_blocking(
        "the exit with its port taken",
        || child.try_wait().unwrap(),
        Option::is_some,
    )
    .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("an error line: {stderr}"));
    assert!(
        line.contains(&addr.to_string()) && line.contains("--metrics-bind"),
        "{line}"
    );
    drop(taken);
}

#[test]
fn a_signal_while_a_service_is_restarting_still_stops_cleanly_within_5_s() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    simulate::write_host(&host, &SimSpec::new("mi210", Some(2), None).unwrap()).unwrap();
    // A file where the test logs directory should be: the test runner fails
    // to start, and its slot waits to restart it.
    std::fs::create_dir_all(host.path("/var/log")).unwrap();
    std::fs::write(host.path("/var/log/amd-test-runner"), "not a directory").unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "metricsExporter: {enable: true}\ntestRunner: {enable: true}\n",
    )
    .unwrap();
    let mut agent = Logged::start(
        bin()
            .args(["standalone", "--metrics-bind", "127.0.0.1:0", "--host-root"])
            .arg(host.root())
            .arg("--config")
            .arg(&config)
            .arg("--kubelet-dir")
            .arg(dir.path().join("no-kubelet"))
            .arg("--events-file")
            .arg(dir.path().join("events.jsonl")),
    );
    agent.wait_line("of the test runner failing and waiting to restart", |l| {
        l.contains("restarting after backoff") && l.contains("testRunner")
    });
    // Within the 5 s promise, and well under the 3 s a slot waits before it
    // aborts a service that ignores its stop: the backoff wait itself must
    // end on the signal.
    let status = agent.terminate_within(Duration::from_secs(2));
    assert!(
        status.success(),
        "a clean stop, not a forced exit: {status}"
    );
}

/// `--show-metrics` prints a frame per sample with one row per GPU, read from
/// the exporter in process: it works even when the endpoint refuses plain
/// clients (`rbacConfig` in standalone mode, with no API to review tokens).
#[test]
fn show_metrics_prints_frames_from_the_exporter_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "metricsExporter:\n  enable: true\n  rbacConfig: {enable: true, disableHttps: true}\n",
    )
    .unwrap();
    let mut child = bin()
        .args(["standalone", "--simulate", "mi300x", "--show-metrics"])
        .args(["--metrics-bind", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + wait::WAIT;
    let mut rows = Vec::new();
    let mut in_frame = false;
    while rows.len() < 8 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                panic!(
                    "no full frame within {:?} ({e}); rows so far: {rows:?}",
                    wait::WAIT
                );
            }
        };
        if line.starts_with("-- ") && line.ends_with(" --") {
            in_frame = true;
            rows.clear();
        } else if in_frame && line.contains("0000:") {
            rows.push(line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(rows.len(), 8, "{rows:?}");
}

/// Bare metal loads its driver too: with `driver.enable` in the config, the
/// standalone services load the bundle for the running kernel from the
/// store, and the events file says so.
#[test]
fn standalone_loads_the_driver_its_config_asks_for_from_the_bundle_store() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    simulate::write_host(&host, &SimSpec::new("mi210", Some(1), None).unwrap()).unwrap();
    simulate::unload_module(&host).unwrap();
    let bundle =
        support::bundles::write_bundle(&host, "6.4.1", simulate::SIM_KERNEL_RELEASE, false);
    let tools = dir.path().join("tools");
    let modprobe = support::bundles::modprobe_recorder_of_bundles(&tools, host.root());
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "driver:\n  enable: true\n  version: \"6.4.1\"\nmetricsExporter:\n  enable: true\n",
    )
    .unwrap();
    let events = dir.path().join("events.jsonl");
    let mut child = bin()
        .arg("standalone")
        .arg("--config")
        .arg(&config)
        .arg("--host-root")
        .arg(host.root())
        .arg("--modprobe")
        .arg(&modprobe)
        .args(["--metrics-bind", "127.0.0.1:0"])
        .arg("--events-file")
        .arg(&events)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait::eventually_blocking("the bundle's driver loaded", || {
        host.read_attr("/sys/module/amdgpu/version").ok().as_deref() == Some("6.4.1")
            && std::fs::read_to_string(&events).is_ok_and(|e| e.contains("\"DriverLoaded\""))
    });
    assert_eq!(
        support::bundles::modprobe_runs(&tools),
        [format!("--dirname {} amdgpu", host.path(&bundle).display())]
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait::poll_until_blocking(
        "the standalone services stop",
        || child.try_wait().unwrap(),
        Option::is_some,
    );
    assert!(status.is_some_and(|s| s.success()));
}

/// `--partition-profile` applies the profile before the services start (the
/// simulated driver answers the writes); a profile that does not fit is
/// logged and the services start on the GPUs as they are.
#[test]
fn standalone_applies_a_partition_profile_before_it_serves() {
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let host = gpu_operator::host::HostRoot::new(dir.path().join("host"));
    gpu_operator::simulate::write_host(
        &host,
        &gpu_operator::simulate::SimSpec::new("mi300x", None, None).unwrap(),
    )
    .unwrap();
    let modes = || {
        gpu_operator::device::discover(&host)
            .gpus
            .iter()
            .map(|g| g.compute_partition.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    for (profile, expected, logged) in [
        ("cpx_nps4_all", "cpx", "partition profile applied"),
        ("dpx_nps2_all", "cpx", "partition profile not applied"),
    ] {
        let systemd = Notify::bind(&dir.path().join(format!("notify-{profile}.sock")));
        let mut agent = Logged::start(
            bin()
                .args(["standalone", "--metrics-bind", "127.0.0.1:0"])
                .arg("--host-root")
                .arg(host.root())
                .args(["--partition-profile", profile, "--systemctl", "none"])
                .arg("--events-file")
                .arg(dir.path().join("events.jsonl"))
                .env("NOTIFY_SOCKET", systemd.path()),
        );
        systemd.wait_ready();
        // The change came before readiness.
        assert!(
            modes().iter().all(|m| m == expected),
            "{profile}: {:?}",
            modes()
        );
        agent.wait_line(logged, |l| l.contains(logged));
        let status = agent.terminate_within(Duration::from_secs(5));
        assert!(status.success(), "{profile}: {status}");
    }
}

/// Standalone mode serves the reference exporter's health socket too (AMD's
/// device plugin and test runner read it on bare metal as well), at its host
/// path under the host root, owner-only even under umask 0. A client
/// compiled from our copy of the wire contract fails plainly before the
/// socket is there, then lists every partition under its GPU index with the
/// ID AMD's device plugin gives it (its PCI address, or its `amdgpu_xcp_N`
/// platform device), follows an ECC error and its recovery, and finds no
/// workloads (no kubelet). `SetError` is not implemented.
#[test]
fn standalone_serves_the_reference_exporters_health_socket() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;

    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    simulate::write_host(
        &host,
        &SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap(),
    )
    .unwrap();
    let socket = host.path(gpu_operator::metricssvc::DEFAULT_SOCKET);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let absent = rt.block_on(support::metricssvc::list(&socket)).unwrap_err();
    assert!(absent.starts_with("connect:"), "{absent}");

    let mut command = bin();
    command
        .args(["standalone", "--metrics-bind", "127.0.0.1:0", "--host-root"])
        .arg(host.root())
        .arg("--kubelet-dir")
        .arg(dir.path().join("no-kubelet"))
        .arg("--events-file")
        .arg(dir.path().join("events.jsonl"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: umask(2) in the child between fork and exec; it cannot fail.
    // Under umask 0 a socket bound in place would be open to everyone.
    unsafe {
        command.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let mut child = KillOnPanic(command.spawn().unwrap());
    let states = rt
        .block_on(wait::poll_until(
            "16 healthy GPUs on the health socket",
            || support::metricssvc::list(&socket),
            |r| {
                r.as_ref()
                    .is_ok_and(|s| s.len() == 16 && s.iter().all(|g| g.health == "healthy"))
            },
        ))
        .unwrap();
    let mode = std::fs::symlink_metadata(&socket).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    let dir_mode = std::fs::metadata(socket.parent().unwrap()).unwrap().mode() & 0o7777;
    assert_eq!(
        dir_mode, 0o755,
        "its directory, made under umask 0: {dir_mode:o}"
    );

    // The device IDs AMD's device plugin finds on this host: the PCI
    // functions amdgpu drives, and the partitions' platform devices.
    let listed = |path: &str, keep: &dyn Fn(&str) -> bool| -> Vec<String> {
        std::fs::read_dir(host.path(path))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| keep(n))
            .collect()
    };
    let mut plugin_ids = listed("/sys/module/amdgpu/drivers/pci:amdgpu", &|n| {
        n.len() > 5 && n.as_bytes()[4] == b':'
    });
    plugin_ids.extend(listed("/sys/devices/platform", &|n| {
        n.starts_with("amdgpu_xcp_")
    }));
    plugin_ids.sort();
    let mut on_socket: Vec<String> = states.iter().map(|s| s.device.clone()).collect();
    on_socket.sort();
    assert_eq!(on_socket, plugin_ids);
    let ids: Vec<String> = states.iter().map(|s| s.id.clone()).collect();
    let want: Vec<String> = (0..16).map(|i| i.to_string()).collect();
    assert_eq!(ids, want);
    let uuids: std::collections::BTreeSet<&str> = states.iter().map(|s| s.uuid.as_str()).collect();
    assert!(uuids.len() == 16 && !uuids.contains(""), "{states:?}");
    assert!(states.iter().all(|s| s.associated_workload.is_empty()));

    let set_error = rt.block_on(async {
        let mut client = support::metricssvc::connect(&socket).await.unwrap();
        client
            .set_error(support::metricssvc::metricssvc::GpuErrorRequest {
                id: "0".into(),
                fields: vec!["GPU_ECC_UNCORRECT_UMC".into()],
                counts: vec![1],
            })
            .await
    });
    assert_eq!(set_error.unwrap_err().code(), tonic::Code::Unimplemented);

    // The second GPU (partitions 8-15) turns unhealthy, all of it, and recovers.
    let mut bdfs: Vec<String> = gpu_operator::device::discover(&host)
        .gpus
        .into_iter()
        .map(|g| g.bdf)
        .collect();
    bdfs.sort();
    let second = bdfs[1].clone();
    simulate::set_ecc_counts(&host, &second, "umc", 2, 0).unwrap();
    let unhealthy = |s: &[support::metricssvc::GpuState]| -> Vec<String> {
        s.iter()
            .filter(|g| g.health == "unhealthy")
            .map(|g| g.id.clone())
            .collect()
    };
    let states = rt
        .block_on(wait::poll_until(
            "the second GPU's partitions unhealthy",
            || support::metricssvc::list(&socket),
            |r| r.as_ref().is_ok_and(|s| !unhealthy(s).is_empty()),
        ))
        .unwrap();
    let want: Vec<String> = (8..16).map(|i| i.to_string()).collect();
    assert_eq!(unhealthy(&states), want);
    let got = rt
        .block_on(support::metricssvc::get(&socket, &["9", "3"]))
        .unwrap();
    assert_eq!(
        support::metricssvc::health_by_id(&got),
        [
            ("9".into(), "unhealthy".into()),
            ("3".into(), "healthy".into())
        ]
    );
    simulate::set_ecc_counts(&host, &second, "umc", 0, 0).unwrap();
    rt.block_on(wait::poll_until(
        "every GPU healthy again",
        || support::metricssvc::list(&socket),
        |r| {
            r.as_ref()
                .is_ok_and(|s| s.len() == 16 && unhealthy(s).is_empty())
        },
    ))
    .unwrap();

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let status = wait::poll_until_blocking(
        "the standalone services stop",
        || child.0.try_wait().unwrap(),
        Option::is_some,
    );
    assert!(status.is_some_and(|s| s.success()));
    assert!(!socket.exists(), "the socket is removed on stop");
}

/// Kills the child when the test fails before it stops it.
struct KillOnPanic(std::process::Child);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
