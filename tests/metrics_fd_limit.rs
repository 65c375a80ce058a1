//! The metrics endpoint under a flood of idle connections, through the real
//! binary with a low descriptor limit (256, as in issue 11): the endpoint's
//! connection cap and descriptor reserve must keep discovery, sampling, the
//! probes, the device plugin (through a test kubelet) and new scrapers working.
//!
//! The limit is set in the child only (`pre_exec`), never in the test process.
//! Loopback only; every wait is bounded in count and time.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::kubelet::TestKubelet;
use support::logged::{self, Logged};
use support::wait;

/// The descriptor limit (soft and hard) of the agent under test.
const NOFILE: u64 = 256;
/// Idle connections opened: more than the limit itself, far more than the cap.
const IDLE_CONNECTIONS: usize = 300;

struct Agent {
    /// Killed on drop.
    _child: Logged,
    addr: String,
    /// The test kubelet the agent's device plugin registers with, and the
    /// runtime its servers run on.
    kubelet: TestKubelet,
    runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

/// Starts `standalone --simulate mi300x` with `RLIMIT_NOFILE` at [`NOFILE`] and
/// returns once the log names the metrics address.
fn start_agent() -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let kubelet_dir = dir.path().join("kubelet");
    std::fs::create_dir_all(kubelet_dir.join("device-plugins")).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let kubelet = runtime.block_on(TestKubelet::start(&kubelet_dir.join("device-plugins")));
    let mut command = logged::gpu_operator();
    command
        .args([
            "standalone",
            "--simulate",
            "mi300x",
            "--metrics-bind",
            "127.0.0.1:0",
            "--metrics-interval",
            "0.5",
        ])
        .arg("--events-file")
        .arg(dir.path().join("events.jsonl"))
        .arg("--kubelet-dir")
        .arg(&kubelet_dir);
    // SAFETY: the closure runs in the forked child before exec and only calls
    // `setrlimit`, which is async-signal-safe; it touches no memory shared with
    // the parent besides reading the `limit` it owns.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: NOFILE,
                rlim_max: NOFILE,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = Logged::start(&mut command);
    let addr = child.metrics_address();
    Agent {
        _child: child,
        addr,
        kubelet,
        runtime,
        _dir: dir,
    }
}

/// One request on a new connection, with every step bounded: the status line's
/// code and the body.
fn get(addr: &str, path: &str, within: Duration) -> Result<(u16, String), String> {
    let sock = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut stream =
        TcpStream::connect_timeout(&sock, within).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(within)).unwrap();
    stream.set_write_timeout(Some(within)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// The `/gpumetrics` document, if the endpoint serves one.
fn gpumetrics(addr: &str) -> Option<serde_json::Value> {
    match get(addr, "/gpumetrics", Duration::from_secs(2)) {
        Ok((200, body)) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// GPUs in a document that are healthy and have readings.
fn healthy_gpus(doc: &serde_json::Value) -> usize {
    doc["gpus"]
        .as_array()
        .map(|gpus| {
            gpus.iter()
                .filter(|g| g["healthy"] == serde_json::json!(true) && !g["readings"].is_null())
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn idle_connections_beyond_the_cap_starve_neither_scrapers_nor_discovery() {
    let agent = start_agent();
    wait::poll_until_blocking(
        "8 healthy GPUs before the flood",
        || gpumetrics(&agent.addr),
        |doc| doc.as_ref().is_some_and(|d| healthy_gpus(d) == 8),
    );

    let registered = agent
        .runtime
        .block_on(agent.kubelet.wait_for_registration("amd.com/gpu", 1));

    // The flood: connections that never send a byte. They all connect (the
    // kernel's backlog takes them), whatever the agent does with them.
    let flood_start = unix_now();
    let sock = agent.addr.parse().unwrap();
    let idle: Vec<TcpStream> = (0..IDLE_CONNECTIONS)
        .map_while(|_| TcpStream::connect_timeout(&sock, Duration::from_secs(2)).ok())
        .collect();
    assert!(
        idle.len() > NOFILE as usize,
        "opened {} idle connections",
        idle.len()
    );

    // A new scraper gets in quickly, with every idle connection still open on
    // our side.
    let started = Instant::now();
    let (code, body) = get(&agent.addr, "/metrics", Duration::from_secs(5))
        .expect("a scrape during the flood is answered within 5 s");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("gpu_edge_temperature{"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let (code, body) = get(&agent.addr, "/healthz", Duration::from_secs(5))
        .expect("/healthz answers during the flood");
    assert_eq!(code, 200, "{body}");

    // Discovery (every second) and sampling (every 0.5 s) keep working: a
    // sample taken at least 2 s into the flood still shows 8 healthy GPUs.
    let doc = wait::poll_until_blocking(
        "a sample taken 2 s into the flood",
        || gpumetrics(&agent.addr),
        |doc| {
            doc.as_ref().is_some_and(|d| {
                d["sample"]["taken_at_unix"].as_f64().unwrap_or(0.0) > flood_start + 2.0
            })
        },
    )
    .unwrap();
    assert_eq!(healthy_gpus(&doc), 8, "{doc}");

    // The agent's own metrics show the cap at work: a quarter of the limit at
    // most, never more open than that, and the flood displaced.
    let (code, scrape) = get(&agent.addr, "/metrics", Duration::from_secs(5)).unwrap();
    assert_eq!(code, 200);
    let value = |name: &str| {
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in the scrape"))
    };
    let cap = value("gpu_operator_metrics_connections_max");
    assert!(cap >= 1.0 && cap <= (NOFILE / 4) as f64, "cap {cap}");
    assert!(value("gpu_operator_metrics_connections") <= cap);
    let displaced = value("gpu_operator_metrics_connections_displaced_total");
    assert!(
        displaced >= (IDLE_CONNECTIONS as f64) - cap,
        "displaced {displaced} of {IDLE_CONNECTIONS} over a cap of {cap}"
    );

    // The device plugin still takes a new kubelet connection and lists every
    // GPU as healthy.
    let devices = agent.runtime.block_on(async {
        let mut stream = agent
            .kubelet
            .list_and_watch(&registered.request.endpoint)
            .await;
        stream.next().await
    });
    let healthy = devices.iter().filter(|d| d.health == "Healthy").count();
    assert_eq!(healthy, 8, "{devices:?}");
    drop(idle);
}
