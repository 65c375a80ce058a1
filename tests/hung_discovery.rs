//! Hung sysfs files (FIFOs that block `open`, made by the simulator) against
//! discovery: the library function, the `discover` binary and the change
//! stream all return in bounded time, name the hung file in that GPU's
//! problems, keep the other GPUs, and never publish a GPU as removed because
//! a file hung or a directory could not be read. Every hung file is released
//! at the end of its test, so that no thread stays blocked.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpu_operator::device::watch::{DeviceAction, DeviceEvent, DeviceWatch, WatchConfig};
use gpu_operator::device::{Inventory, Limits, discover, discover_bounded};
use gpu_operator::host::HostRoot;
use gpu_operator::host::reader::BoundedReader;
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
    // (ENOTDIR; as root, EACCES cannot be provoked).
    let saved = host.path("/sys/bus/pci/drivers/amdgpu.saved");
    std::fs::rename(host.path(DRIVER), &saved).unwrap();
    host.write(DRIVER, "not a directory").unwrap();
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
    host.remove_all(DRIVER).unwrap();
    std::fs::rename(&saved, host.path(DRIVER)).unwrap();
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
