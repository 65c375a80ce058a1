//! Hung sysfs files (FIFOs that block `open`, made by the simulator) against
//! discovery: the library function, the `discover` binary and the change
//! stream all return in bounded time, name the hung file in that GPU's
//! problems, keep the other GPUs, and never publish a GPU as removed because
//! a file hung or a directory could not be read. Every hung file is released
//! at the end of its test, so that no thread stays blocked.
//!
//! The bounded reader beneath discovery (`host::reader`) against hung files
//! is tested here too, at the end: `host` is a crate of its own below the
//! simulator, so its own tests cannot make a hung file the simulator's way.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpu_operator::device::watch::{DeviceAction, DeviceEvent, DeviceWatch, WatchConfig};
use gpu_operator::device::{Inventory, Limits, discover, discover_bounded};
use gpu_operator::host::HostRoot;
use gpu_operator::host::reader::{Answer, BoundedReader, Op, ReadError, STALL};
use gpu_operator::simulate::{self, SimSpec};

const DRIVER: &str = "/sys/bus/pci/drivers/amdgpu";
const GPU0: &str = "0000:05:00.0";
const GPU1: &str = "0000:27:00.0";

fn simulated(gpus: usize) -> (tempfile::TempDir, HostRoot) {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let spec = SimSpec::new("mi300x", Some(gpus), None).unwrap();
    simulate::write_host(&host, &spec).unwrap();
    (dir, host)
}

/// Releases a hung file when dropped, so that a failing assertion does not
/// leave a thread blocked.
struct Hung<'a> {
    host: &'a HostRoot,
    path: String,
    value: String,
}

impl<'a> Hung<'a> {
    fn new(host: &'a HostRoot, path: &str) -> Self {
        let value = host.read_attr(path).unwrap_or_default();
        simulate::hang_file(host, path).unwrap();
        Self {
            host,
            path: path.to_owned(),
            value,
        }
    }
}

impl Drop for Hung<'_> {
    fn drop(&mut self) {
        let _ = simulate::release_hung_file(self.host, &self.path, &self.value);
    }
}

fn gpu<'a>(inventory: &'a Inventory, bdf: &str) -> &'a gpu_operator::device::Gpu {
    inventory
        .gpus
        .iter()
        .find(|g| g.bdf == bdf)
        .unwrap_or_else(|| panic!("{bdf} missing: {inventory:#?}"))
}

/// The KFD node that describes `bdf` (its `properties` name the PCI address).
fn kfd_node_of(inventory: &Inventory, bdf: &str) -> u32 {
    gpu(inventory, bdf).kfd_node.expect("GPU has a KFD node")
}

/// The files hung one at a time on GPU 0 of a simulated MI300X, and what
/// names them in the result. Kept in the README's reliability table.
fn gpu0_files(kfd_node: u32) -> Vec<String> {
    let mut files: Vec<String> = [
        "vendor",
        "device",
        "revision",
        "product_name",
        "serial_number",
        "vbios_version",
        "unique_id",
        "numa_node",
        "mem_info_vram_total",
        "current_compute_partition",
        "current_memory_partition",
        "available_compute_partition",
        "fw_version/mec_fw_version",
    ]
    .iter()
    .map(|name| format!("{DRIVER}/{GPU0}/{name}"))
    .collect();
    files.push(format!(
        "/sys/class/kfd/kfd/topology/nodes/{kfd_node}/properties"
    ));
    files
}

#[test]
fn each_hung_file_is_a_problem_of_its_gpu_and_the_other_gpu_is_intact() {
    let (_dir, host) = simulated(2);
    let baseline = discover(&host);
    let other = gpu(&baseline, GPU1).clone();
    let node = kfd_node_of(&baseline, GPU0);
    let limits = Limits {
        file_timeout: Duration::from_millis(200),
        scan_deadline: Duration::from_secs(5),
    };
    let files = gpu0_files(node);
    for file in &files {
        let _hung = Hung::new(&host, file);
        let reader = BoundedReader::new(host.clone(), BoundedReader::DEFAULT_MAX_THREADS);
        let started = Instant::now();
        let scan = discover_bounded(&reader, limits);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{file}: took {:?}",
            started.elapsed()
        );
        assert!(scan.incomplete.is_empty(), "{file}: {:?}", scan.incomplete);
        let inventory = scan.inventory;
        let name = file.rsplit_once("/sys/").unwrap().1;
        let hung = gpu(&inventory, GPU0);
        assert!(
            hung.problems
                .iter()
                .any(|p| p.contains(name) && p.contains("hung: no answer")),
            "{file} not named in {GPU0}'s problems: {:?}",
            hung.problems
        );
        let mut now = gpu(&inventory, GPU1).clone();
        let mut expected = other.clone();
        if file.contains("/kfd/") {
            // Its peer's KFD node is unread: the link to it cannot be named.
            (now.links, expected.links) = (vec![], vec![]);
        }
        assert_eq!(now, expected, "{file} changed {GPU1}");
    }
}

#[test]
fn the_library_discover_and_a_hung_driver_version_return_in_bounded_time() {
    let (_dir, host) = simulated(2);
    let _version = Hung::new(&host, "/sys/module/amdgpu/version");
    let _name = Hung::new(&host, &format!("{DRIVER}/{GPU1}/product_name"));
    let started = Instant::now();
    let inventory = discover(&host);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(inventory.gpus.len(), 2);
    assert!(
        inventory
            .warnings
            .iter()
            .any(|w| w.contains("module/amdgpu/version")),
        "{:?}",
        inventory.warnings
    );
    assert!(
        gpu(&inventory, GPU1)
            .problems
            .iter()
            .any(|p| p.contains("product_name")),
        "{:?}",
        gpu(&inventory, GPU1).problems
    );
    assert_eq!(gpu(&inventory, GPU1).product_name, None);
    assert!(gpu(&inventory, GPU0).problems.is_empty());
}

/// Runs the binary with a bound, killing it when it overstays.
fn run_bounded(mut command: Command, bound: Duration) -> std::process::Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {bound:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_discover_binary_names_the_hung_file_and_lists_both_gpus() {
    let (dir, host) = simulated(2);
    let _hung = Hung::new(&host, &format!("{DRIVER}/{GPU0}/vendor"));
    let _name = Hung::new(&host, &format!("{DRIVER}/{GPU1}/current_compute_partition"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-operator"));
    command.args(["discover", "--output", "json", "--host-root"]);
    command.arg(dir.path());
    let out = run_bounded(command, Duration::from_secs(15));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpus = json["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2, "{json:#}");
    let problems = |i: usize| gpus[i]["problems"].to_string();
    assert!(problems(0).contains("vendor"), "{}", problems(0));
    assert!(
        problems(1).contains("current_compute_partition"),
        "{}",
        problems(1)
    );
}

#[test]
fn the_check_binary_returns_with_a_hung_file() {
    let (dir, host) = simulated(2);
    let _hung = Hung::new(&host, &format!("{DRIVER}/{GPU0}/product_name"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-operator"));
    command.args(["check", "--host-root"]);
    command.arg(dir.path());
    // The verdict is the health checks'; what matters is that it comes.
    let out = run_bounded(command, Duration::from_secs(30));
    assert!(out.status.code().is_some(), "{out:?}");
}

// ---- the change stream ----------------------------------------------------------

async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<DeviceEvent>,
    seen: &mut Vec<DeviceEvent>,
    wanted: impl Fn(&DeviceEvent) -> bool,
) -> DeviceEvent {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let event = events.recv().await.expect("stream open");
            seen.push(event.clone());
            if wanted(&event) {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no such event within 10 s; seen {seen:?}"))
}

fn fast_watch() -> WatchConfig {
    WatchConfig {
        rescan_interval: Duration::from_millis(50),
        use_udev: false,
        limits: Limits {
            file_timeout: Duration::from_millis(200),
            scan_deadline: Duration::from_secs(5),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_hung_after_start_does_not_freeze_the_watch_or_remove_its_gpu() {
    let (_dir, host) = simulated(3);
    // GPU 2 starts unbound, to be bound (hot-added) while a file hangs.
    let gpu2 = "0000:47:00.0";
    let link = format!("{DRIVER}/{gpu2}");
    let target = std::fs::read_link(host.path(&link)).unwrap();
    host.remove_all(&link).unwrap();

    let watch = DeviceWatch::start(host.clone(), fast_watch()).await;
    assert_eq!(watch.inventory().borrow().gpus.len(), 2);
    let mut events = watch.subscribe();
    let mut seen = Vec::new();

    // The fingerprint's own file, so that every tick meets it.
    let _hung = Hung::new(&host, &format!("{DRIVER}/{GPU1}/current_compute_partition"));
    let mut inventory = watch.inventory();
    tokio::time::timeout(
        Duration::from_secs(10),
        inventory.wait_for(|inv| {
            inv.gpus.iter().any(|g| {
                g.bdf == GPU1
                    && g.problems
                        .iter()
                        .any(|p| p.contains("current_compute_partition: hung"))
            })
        }),
    )
    .await
    .expect("the hung file becomes a problem of its GPU")
    .unwrap();

    // Unbinding GPU 0 and binding GPU 2 are still seen.
    host.remove_all(format!("{DRIVER}/{GPU0}")).unwrap();
    next_event(&mut events, &mut seen, |e| {
        e.bdf == GPU0 && e.action == DeviceAction::Removed
    })
    .await;
    std::os::unix::fs::symlink(&target, host.path(&link)).unwrap();
    next_event(&mut events, &mut seen, |e| {
        e.bdf == gpu2 && e.action == DeviceAction::Added
    })
    .await;
    assert!(
        !seen
            .iter()
            .any(|e| e.bdf == GPU1 && e.action == DeviceAction::Removed),
        "the GPU with the hung file was published as removed: {seen:?}"
    );
    assert!(watch.state().borrow().discovered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_driver_directory_keeps_the_last_inventory() {
    let (_dir, host) = simulated(2);
    let watch = DeviceWatch::start(host.clone(), fast_watch()).await;
    let mut events = watch.subscribe();
    let mut state = watch.state();
    let before = gpu_operator::device::watch::incomplete_scans();
    // The driver directory turns into something that cannot be listed
    // (ENOTDIR; as root, EACCES cannot be provoked), in one step: a rename
    // and then a write would leave a moment without the directory, an
    // absent driver whose empty inventory is true.
    let saved = "/sys/bus/pci/drivers/amdgpu.saved";
    host.write(saved, "not a directory").unwrap();
    host.exchange(saved, DRIVER).unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| s.last_incomplete.is_some()),
    )
    .await
    .expect("the scan is reported incomplete")
    .unwrap();
    let reason = state.borrow().last_incomplete.clone().unwrap();
    assert!(reason.contains("amdgpu"), "{reason}");
    assert!(gpu_operator::device::watch::incomplete_scans() > before);
    assert_eq!(
        watch.inventory().borrow().gpus.len(),
        2,
        "last inventory kept"
    );
    // Several more ticks: still nothing removed.
    let attempts = state.borrow().attempts;
    tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| s.attempts >= attempts + 3),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(
        events.try_recv(),
        Err(tokio::sync::broadcast::error::TryRecvError::Empty)
    ));
    assert_eq!(watch.inventory().borrow().gpus.len(), 2);
    // Restored, the watch trusts its scans again.
    host.exchange(saved, DRIVER).unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| s.last_incomplete.is_none()),
    )
    .await
    .unwrap()
    .unwrap();
}

#[test]
fn check_gives_up_at_its_deadline_with_a_clear_message() {
    let (dir, host) = simulated(2);
    let _a = Hung::new(&host, &format!("{DRIVER}/{GPU0}/product_name"));
    let _b = Hung::new(&host, &format!("{DRIVER}/{GPU1}/product_name"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-operator"));
    command.args(["check", "--deadline", "1", "--host-root"]);
    command.arg(dir.path());
    // Discovery alone waits 1 s on each hung file: past the deadline.
    let out = run_bounded(command, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("did not finish within"), "{stderr}");
}

// The bounded reader (`host::reader`) against hung files.

/// The reader tests' deadline.
const SHORT: Duration = Duration::from_millis(100);

/// A host with `/sys/a` = 1 and `/sys/b` = 2.
fn host() -> (tempfile::TempDir, HostRoot) {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    host.write("/sys/a", "1\n").unwrap();
    host.write("/sys/b", "2\n").unwrap();
    (dir, host)
}

/// No runtime here: the calling thread keeps its request's time itself.
#[test]
fn a_blocking_caller_keeps_its_own_deadline_and_a_hung_file_costs_its_value() {
    let (_dir, host) = host();
    simulate::hang_file(&host, "/sys/a").unwrap();
    let reader = BoundedReader::new(host.clone(), 2);
    let started = Instant::now();
    let answers = reader.batch_blocking(
        vec![(Op::Read, "/sys/a".into()), (Op::Read, "/sys/b".into())],
        SHORT,
    );
    let waited = started.elapsed();
    assert!(
        matches!(answers[0], Err(ReadError::TimedOut { .. })),
        "{answers:?}"
    );
    // Behind the hung file: a second thread, started at the stall check,
    // read it.
    assert_eq!(answers[1].as_ref().unwrap(), &Answer::Text("2".into()));
    assert!(waited >= SHORT, "returned before the deadline: {waited:?}");
    assert_eq!(reader.stats().threads, 2);
    simulate::release_hung_file(&host, "/sys/a", "1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match reader.one_blocking(Op::Read, "/sys/a", SHORT) {
            Ok(answer) => break assert_eq!(answer, Answer::Text("1".into())),
            Err(_) if Instant::now() < deadline => std::thread::sleep(STALL),
            Err(e) => panic!("the released file is not read again: {e}"),
        }
    }
}

#[tokio::test]
async fn a_hung_file_costs_one_value_and_parks_one_thread() {
    let (_dir, host) = host();
    simulate::hang_file(&host, "/sys/a").unwrap();
    let reader = BoundedReader::new(host.clone(), 2);
    let err = reader.read_attr("/sys/a", SHORT).await.unwrap_err();
    assert!(matches!(err, ReadError::TimedOut { .. }), "{err}");
    // The next read of the same file is refused at once; others still work.
    let started = Instant::now();
    let err = reader.read_attr("/sys/a", SHORT).await.unwrap_err();
    assert!(matches!(err, ReadError::Stuck { .. }), "{err}");
    assert!(started.elapsed() < SHORT);
    for _ in 0..20 {
        assert_eq!(reader.read_attr("/sys/b", SHORT).await.unwrap(), "2");
    }
    let stats = reader.stats();
    assert_eq!(stats.threads, 2, "one parked, one serving: {stats:?}");
    assert_eq!((stats.timeouts, stats.skipped_stuck), (1, 1));
    // Releasing the file frees the thread and the path.
    simulate::release_hung_file(&host, "/sys/a", "3").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !reader.in_flight().is_empty() {
        assert!(Instant::now() < deadline, "released read did not return");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(reader.read_attr("/sys/a", SHORT).await.unwrap(), "3");
}

#[tokio::test]
async fn a_hung_file_in_a_burst_costs_only_its_own_value() {
    let (_dir, host) = host();
    let paths: Vec<String> = (0..50).map(|i| format!("/sys/f{i}")).collect();
    for (i, path) in paths.iter().enumerate() {
        host.write(path, format!("{i}\n")).unwrap();
    }
    simulate::hang_file(&host, &paths[10]).unwrap();
    let reader = BoundedReader::new(host.clone(), 2);
    // Queued at once, as a sample queues its reads: the thread that reads
    // the first ten then hangs on the eleventh still holds their answers.
    let timeout = Duration::from_millis(500);
    let answers =
        futures::future::join_all(paths.iter().map(|p| reader.read_attr(p, timeout))).await;
    for (i, answer) in answers.iter().enumerate() {
        match answer {
            Ok(text) => assert_eq!(*text, i.to_string()),
            Err(ReadError::TimedOut { path, .. }) if i == 10 => assert_eq!(*path, paths[10]),
            Err(e) => panic!("file {i}: {e}"),
        }
    }
    assert_eq!(reader.stats().threads, 2);
    simulate::release_hung_file(&host, &paths[10], "10").unwrap();
}

#[tokio::test]
async fn a_batch_answers_in_order_and_a_hung_file_costs_only_its_own_value() {
    let (_dir, host) = host();
    let paths: Vec<String> = (0..30).map(|i| format!("/sys/f{i}")).collect();
    for (i, path) in paths.iter().enumerate() {
        host.write(path, format!("{i}\n")).unwrap();
    }
    simulate::hang_file(&host, &paths[7]).unwrap();
    let reader = BoundedReader::new(host.clone(), 2);
    let mut requests: Vec<(Op, String)> = paths.iter().map(|p| (Op::Read, p.clone())).collect();
    requests.push((Op::Exists, "/sys/a".into()));
    requests.push((Op::Exists, "/sys/nope".into()));
    requests.push((Op::List, "/nope".into()));
    requests.push((Op::Read, "/sys/gone".into()));
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let answers = reader.batch(requests.clone(), timeout).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(answers.len(), requests.len());
    for (i, answer) in answers.iter().take(30).enumerate() {
        match answer {
            Ok(Answer::Text(text)) => assert_eq!(*text, i.to_string()),
            Err(ReadError::TimedOut { path, .. }) if i == 7 => assert_eq!(*path, paths[7]),
            other => panic!("file {i}: {other:?}"),
        }
    }
    assert_eq!(answers[30].as_ref().unwrap(), &Answer::Exists(true));
    assert_eq!(answers[31].as_ref().unwrap(), &Answer::Exists(false));
    assert_eq!(answers[32].as_ref().unwrap(), &Answer::Names(vec![]));
    assert!(
        answers[33].as_ref().is_err_and(ReadError::is_not_found),
        "{:?}",
        answers[33]
    );
    // While it hangs, the next batch refuses that file at once and reads
    // the rest.
    let answers = reader.batch(requests, timeout).await;
    assert!(
        matches!(answers[7], Err(ReadError::Stuck { .. })),
        "{:?}",
        answers[7]
    );
    assert_eq!(answers[8].as_ref().unwrap(), &Answer::Text("8".into()));
    assert_eq!(reader.stats().skipped_stuck, 1);
    simulate::release_hung_file(&host, &paths[7], "7").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !reader.in_flight().is_empty() {
        assert!(Instant::now() < deadline, "released read did not return");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let answers = reader
        .batch(vec![(Op::Read, paths[7].clone())], timeout)
        .await;
    assert_eq!(answers[0].as_ref().unwrap(), &Answer::Text("7".into()));
}

#[tokio::test]
async fn when_every_thread_is_parked_reads_time_out_instead_of_blocking() {
    let (_dir, host) = host();
    simulate::hang_file(&host, "/sys/a").unwrap();
    let reader = BoundedReader::new(host.clone(), 1);
    assert!(reader.read_attr("/sys/a", SHORT).await.is_err());
    let err = reader.read_attr("/sys/b", SHORT).await.unwrap_err();
    assert!(matches!(err, ReadError::TimedOut { .. }), "{err}");
    assert_eq!(reader.stats().threads, 1);
    simulate::release_hung_file(&host, "/sys/a", "1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match reader.read_attr("/sys/b", SHORT).await {
            Ok(v) => break assert_eq!(v, "2"),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("reader did not recover: {e}"),
        }
    }
}
