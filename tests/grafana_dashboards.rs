//! AMD's Grafana dashboards over our exporter, through a real Prometheus
//! (Debian's `prometheus`): `standalone` serves a simulated MI300X host, a
//! Prometheus on loopback scrapes it every second for a few seconds, and
//! every node-level panel query of the reference's GPU dashboards must return
//! data. The queries and the template variables they use are in
//! `tests/fixtures/reference/dashboard-queries.tsv`; the variables are
//! resolved as Grafana resolves them, through Prometheus' label values API.
//!
//! Queries that return nothing are allowed only by a rule of
//! [`exception`], each with its reason: rocprofiler's `gpu_prof_*`
//! counters, panels counting a workload's GPUs, a query for the other board
//! family beside its MI300 twin, and HBM temperatures (MI300 has no HBM
//! sensor). Everything else must answer.
//!
//! Without the binary the test skips, unless `REQUIRE_PROMETHEUS` is set (CI
//! sets it), in which case it fails. `PROMETHEUS` names another binary.

mod support;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};
use support::tools::Tool;
use support::wait;

const QUERIES: &str = include_str!("fixtures/reference/dashboard-queries.tsv");

/// The MI300 part numbers the dashboards select MI300 boards by; the
/// simulated MI300X carries the first.
const MI300X_PART: &str = "102-G30211-00";

/// What `$__interval` stands for: Grafana sets it from the time range; a
/// window that holds several of the test's one-second scrapes.
const INTERVAL: &str = "1m";

/// Scrapes Prometheus must have taken before the queries run.
const SCRAPES: usize = 4;

/// The exporter config the reference's example ships, as far as the
/// dashboards read it: `gpu_uuid` (the GPU dashboard's variable) and a
/// `cluster_name` (every dashboard's first variable).
const EXPORTER_CONFIG: &str = r#"{"GPUConfig": {
    "Labels": ["GPU_UUID", "VBIOS_VERSION", "DRIVER_VERSION", "CARD_SERIES", "CARD_VENDOR"],
    "CustomLabels": {"CLUSTER_NAME": "lab"}}}"#;

const PROMETHEUS: Tool = Tool {
    what: "Prometheus",
    path_var: "PROMETHEUS",
    default: "/usr/bin/prometheus",
    require_var: "REQUIRE_PROMETHEUS",
    install: "install Debian's prometheus",
};

/// A child process, killed and reaped on drop, with its log.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(command: &mut Command, log: PathBuf) -> Self {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// `standalone` on the simulated host under `root`: metrics every second,
/// no device plugin, no health socket. Returns it and its metrics address.
fn start_exporter(root: &Path, scratch: &Path) -> (Process, String) {
    let config = scratch.join("config.json");
    std::fs::write(&config, EXPORTER_CONFIG).unwrap();
    let kubelet = scratch.join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let exporter = Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .arg("standalone")
            .arg("--host-root")
            .arg(root)
            .arg("--metrics-config")
            .arg(&config)
            .arg("--kubelet-dir")
            .arg(&kubelet)
            .arg("--events-file")
            .arg(scratch.join("events.jsonl"))
            .args([
                "--metrics-bind",
                "127.0.0.1:0",
                "--metrics-interval",
                "1",
                "--node-name",
                "node-1",
                "--no-health-socket",
            ])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1"),
        scratch.join("exporter.log"),
    );
    let addr = wait::poll_until_blocking(
        "the exporter's address in its log",
        || {
            exporter
                .log()
                .split("metrics on http://")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .map(str::to_owned)
        },
        Option::is_some,
    )
    .expect("an address");
    (exporter, addr)
}

/// Prometheus scraping `target` every second, on a loopback port of its
/// own, its data in `scratch`. Returns it and its address once ready.
fn start_prometheus(binary: &Path, target: &str, scratch: &Path) -> (Process, String) {
    let config = scratch.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: gpu\n    static_configs:\n      \
             - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let mut last_log = String::new();
    for attempt in 0..3 {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut server = Process::spawn(
            Command::new(binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    scratch.join(format!("data-{attempt}")).display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn"),
            scratch.join(format!("prometheus-{attempt}.log")),
        );
        let state = wait::poll_until_blocking(
            &format!("Prometheus ready on {addr}"),
            || match server.child.try_wait() {
                Ok(Some(status)) => Some(Err(status.to_string())),
                _ => get(&addr, "/-/ready").0.contains(" 200").then_some(Ok(())),
            },
            Option::is_some,
        );
        if state == Some(Ok(())) {
            return (server, addr);
        }
        // It exited: its port was taken between our look and its bind.
        last_log = server.log();
    }
    panic!("Prometheus exited before serving, three times; its log:\n{last_log}");
}

/// `GET path`: (status line, body); empty when the server does not answer.
fn get(addr: &str, path: &str) -> (String, String) {
    support::http::try_get_with_status(addr, path, Duration::from_secs(10)).unwrap_or_default()
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus API answer's `data`, or the error it gave.
fn api(addr: &str, path: &str) -> Result<serde_json::Value, String> {
    let (status, body) = get(addr, path);
    let json: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if json["status"] == "success" {
        Ok(json["data"].clone())
    } else {
        Err(format!("{status}: {body}"))
    }
}

/// The result of an instant query: how many samples it returned.
fn query(addr: &str, expr: &str) -> Result<usize, String> {
    let data = api(addr, &format!("/api/v1/query?query={}", encode(expr)))?;
    Ok(match &data["result"] {
        serde_json::Value::Array(samples) => samples.len(),
        // A scalar or string result is one value.
        serde_json::Value::Null => 0,
        _ => 1,
    })
}

/// Grafana's `label_values(label)` and `label_values({selector}, label)`.
fn label_values(addr: &str, call: &str) -> Result<Vec<String>, String> {
    let inner = call
        .strip_prefix("label_values(")
        .and_then(|c| c.strip_suffix(')'))
        .ok_or_else(|| format!("not a label_values call: {call}"))?;
    let (selector, label) = match inner.rsplit_once(',') {
        Some((selector, label)) => (Some(selector.trim()), label.trim()),
        None => (None, inner.trim()),
    };
    let mut path = format!("/api/v1/label/{label}/values");
    if let Some(selector) = selector {
        path.push_str(&format!("?match[]={}", encode(&prometheus2(selector))));
    }
    let data = api(addr, &path)?;
    Ok(data
        .as_array()
        .map(|values| {
            values
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// A regex-escaped value, as Grafana writes a variable into `=~`.
fn regex_escape(value: &str) -> String {
    value
        .chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// The dashboards' text with each `$variable` replaced, longest name first.
fn substitute(text: &str, variables: &BTreeMap<String, String>) -> String {
    let mut names: Vec<&String> = variables.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = text
        .replace("${g_metrics_prefix}", "")
        .replace("$__interval", INTERVAL);
    for name in names {
        out = out.replace(&format!("${name}"), &variables[name]);
    }
    out
}

/// Prometheus 3 accepts a quoted metric name inside the braces
/// (`{"gpu_health", hostname=~"x"}`), which the system dashboard writes;
/// Debian's Prometheus 2 reads the same selector as `{__name__="gpu_health", ...}`.
fn prometheus2(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find("{\"") {
        out.push_str(&rest[..at]);
        out.push_str("{__name__=\"");
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
    out
}

/// Each dashboard's variables, resolved in dependency order: single-value
/// variables take the first value, as Grafana selects by default;
/// multi-value ones (with "All") all values, as a regex alternation.
fn resolve_variables(addr: &str, rows: &[Vec<&str>]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut by_board: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let vars: Vec<&Vec<&str>> = rows.iter().filter(|r| r[0] == "var").collect();
    for _ in 0..vars.len() {
        for row in &vars {
            let (board, name, multi, call) = (row[1], row[2], row[3] == "yes", row[4]);
            let resolved = by_board.entry(board.to_owned()).or_default();
            if resolved.contains_key(name) {
                continue;
            }
            let call = substitute(call, resolved);
            if call.contains('$') {
                continue; // waits for a variable it uses
            }
            let values = label_values(addr, &call).unwrap_or_else(|e| panic!("{board}: {e}"));
            assert!(
                !values.is_empty(),
                "{board}: ${name} ({call}) has no values"
            );
            let value = if multi {
                let all: Vec<String> = values.iter().map(|v| regex_escape(v)).collect();
                format!("({})", all.join("|"))
            } else {
                values[0].clone()
            };
            resolved.insert(name.to_owned(), value);
        }
    }
    by_board
}

/// Why a query may return nothing on a simulated MI300X, if it may.
fn exception(expr: &str) -> Option<&'static str> {
    if expr.contains("gpu_prof_") {
        return Some(
            "rocprofiler counters (GPU_PROF_*): read from the GPU's performance counters \
             through rocprofiler-sdk, which neither sysfs nor the metrics table exposes",
        );
    }
    if expr.contains("job_id!=\"\"") || expr.contains("pod!=\"\"") {
        return Some(
            "counts the GPUs a workload holds (a pod, through the kubelet's PodResources, or a \
             Slurm job): the standalone exporter on a simulated host runs none",
        );
    }
    if selects_other_boards(expr) {
        return Some(
            "selects the other board family by card_model; the panel's twin query selects \
             the MI300 part numbers and must answer",
        );
    }
    if expr.contains("gpu_hbm_temperature") {
        return Some(
            "MI300 has no HBM temperature sensor: its metrics table has no temperature_hbm \
             (the reference exports it on MI200 only)",
        );
    }
    None
}

/// Whether a query's `card_model` matcher leaves the simulated MI300X out.
fn selects_other_boards(expr: &str) -> bool {
    let list = |op: &str| {
        expr.split(&format!("card_model{op}\""))
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(|list| list.split('|').any(|p| p == MI300X_PART))
    };
    list("=~") == Some(false) || list("!~") == Some(true)
}

#[test]
fn every_node_level_dashboard_query_answers_on_a_simulated_mi300x() {
    let Some(binary) = PROMETHEUS.find() else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("host");
    let host = HostRoot::new(&root);
    let spec = SimSpec::new("mi300x", None, None).unwrap();
    simulate::write_host(&host, &spec).unwrap();
    // An uncorrectable ECC error on GPU 0, so that the panels counting
    // unhealthy GPUs have one to count.
    simulate::set_ecc_counts(&host, "0000:05:00.0", "umc", 1, 0).unwrap();
    let (exporter, target) = start_exporter(&root, scratch.path());
    let (server, addr) = start_prometheus(&binary, &target, scratch.path());

    // A few seconds of scraping, until every GPU's health is in.
    let started = Instant::now();
    wait::eventually_blocking_explained(
        &format!("{SCRAPES} scrapes of the exporter, with GPU 0 unhealthy"),
        || {
            let scrapes = query(
                &addr,
                &format!("count_over_time(gpu_nodes_total[1m]) >= {SCRAPES}"),
            );
            let unhealthy = query(&addr, "gpu_health{gpu_id=\"0\"} == 0");
            scrapes == Ok(1) && unhealthy == Ok(1)
        },
        || {
            format!(
                "exporter:\n{}\nprometheus:\n{}",
                exporter.log(),
                server.log()
            )
        },
    );
    println!(
        "scraped for {:.1} s before querying",
        started.elapsed().as_secs_f64()
    );

    let rows: Vec<Vec<&str>> = QUERIES
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split('\t').collect())
        .collect();
    let variables = resolve_variables(&addr, &rows);
    let mut answered_panels: BTreeMap<(&str, &str), bool> = BTreeMap::new();
    let mut excused: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut queries = 0;
    for row in rows.iter().filter(|r| r[0] == "query") {
        let (board, panel, expr) = (row[1], row[2], row[3]);
        queries += 1;
        let sent = prometheus2(&substitute(expr, &variables[board]));
        let answer = query(&addr, &sent);
        let answered = matches!(answer, Ok(n) if n > 0);
        *answered_panels.entry((board, panel)).or_default() |= answered;
        match (answered, exception(expr), answer) {
            (true, _, _) => {}
            (false, _, Err(e)) => failures.push(format!("{board} / {panel}: {sent}\n    {e}")),
            (false, Some(why), Ok(_)) => excused
                .entry(why)
                .or_default()
                .push(format!("{board} / {panel}")),
            (false, None, Ok(_)) => {
                failures.push(format!("{board} / {panel}: no data from {sent}"))
            }
        }
    }
    let excused_count: usize = excused.values().map(Vec::len).sum();
    println!(
        "{queries} node-level dashboard queries: {} answered, {excused_count} empty by an \
         exception, {} failed",
        queries - excused_count - failures.len(),
        failures.len()
    );
    for (why, panels) in &excused {
        println!(
            "  empty ({}): {why}\n    {}",
            panels.len(),
            panels.join("; ")
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A query for the other board family is excused only beside a twin
    // that answers in the same panel.
    for row in rows.iter().filter(|r| r[0] == "query") {
        let (board, panel, expr) = (row[1], row[2], row[3]);
        if selects_other_boards(expr) && !expr.contains("job_id!=") && !expr.contains("pod!=") {
            assert!(
                answered_panels[&(board, panel)],
                "{board} / {panel}: no query of the panel answers for MI300X"
            );
        }
    }
}

#[test]
fn the_helpers_read_the_dashboards_as_grafana_does() {
    assert!(selects_other_boards(
        r#"gpu_gfx_activity{card_model=~"102-D65208-0C|102-D67305-00"}"#
    ));
    assert!(!selects_other_boards(
        r#"gpu_gfx_busy_instantaneous{card_model!~"102-D65208-0C|102-D67305-00"}"#
    ));
    assert!(selects_other_boards(
        r#"gpu_edge_temperature{card_model!~"102-G30211-00|102-G30211-0C"}"#
    ));
    assert!(!selects_other_boards(r#"gpu_health{hostname="x"}"#));
    assert_eq!(
        prometheus2(r#"sum({"gpu_used_vram", hostname=~"(a|b)"})"#),
        r#"sum({__name__="gpu_used_vram", hostname=~"(a|b)"})"#
    );
    let vars = BTreeMap::from([
        ("g_gpu_id".to_owned(), "0".to_owned()),
        ("g_gpu_id_x".to_owned(), "9".to_owned()),
    ]);
    assert_eq!(
        substitute(
            "${g_metrics_prefix}x{a=\"$g_gpu_id_x\", b=\"$g_gpu_id\"}[$__interval]",
            &vars
        ),
        "x{a=\"9\", b=\"0\"}[1m]"
    );
    assert_eq!(regex_escape("node-1.lab"), "node-1\\.lab");
    assert_eq!(encode("a b{\"c\"}"), "a%20b%7B%22c%22%7D");
}
