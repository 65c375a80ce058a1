//! Bad input from outside, as a reliability review would throw it: random
//! corruption of a simulated host's sysfs, and hostile configuration files.
//! The figures in README's reliability table come from these tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpu_operator::device;
use gpu_operator::host::HostRoot;
use gpu_operator::host::reader::BoundedReader;
use gpu_operator::simulate::{self, SimSpec};
use gpu_operator::telemetry::sample::{Sampler, Scope};

/// Seed of the mutation run; a failure names it, so it can be replayed.
const SEED: u64 = 0x5eed_2026_1201;
/// Simulated hosts, and mutations applied to each, one after another.
const HOSTS: [(&str, Option<&str>); 4] = [
    ("mi300x", Some("cpx_nps4")),
    ("mi300x", None),
    ("mi210", None),
    ("radeon-w7900", None),
];
const MUTATIONS_PER_HOST: usize = 175;

/// xorshift64*: a small, seeded generator, so the run is the same every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Every regular file under `dir`, not following links.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

/// One random corruption of `file`; returns what was done, for the failure message.
fn mutate(rng: &mut Rng, file: &Path) -> String {
    let garbage: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
    let (what, result) = match rng.below(9) {
        0 => ("emptied", std::fs::write(file, b"")),
        1 => ("random bytes", std::fs::write(file, &garbage)),
        2 => ("not UTF-8", std::fs::write(file, [0xff, 0xfe, b'\n'])),
        3 => (
            "a huge number",
            std::fs::write(file, "184467440737095516161844674407370955161\n"),
        ),
        4 => ("a negative number", std::fs::write(file, "-1\n")),
        5 => ("a 1 MiB value", std::fs::write(file, "9".repeat(1 << 20))),
        6 => ("removed", std::fs::remove_file(file)),
        7 => (
            "made a directory",
            std::fs::remove_file(file).and_then(|()| std::fs::create_dir(file)),
        ),
        _ => (
            "truncated",
            std::fs::read(file).and_then(|bytes| std::fs::write(file, &bytes[..bytes.len() / 2])),
        ),
    };
    format!("{} {what} ({result:?})", file.display())
}

/// 700 seeded random corruptions of four simulated hosts: discovery, the
/// metrics sampler and the health check each finish after every one, and
/// never panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_random_corruption_of_sysfs_never_panics_or_hangs() {
    let mut rng = Rng(SEED);
    let mut applied = 0;
    for (profile, partition) in HOSTS {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        simulate::write_host(&host, &SimSpec::new(profile, None, partition).unwrap()).unwrap();
        let tree = files(&dir.path().join("sys"));
        assert!(tree.len() > 50, "{profile}: {} files", tree.len());
        let mut sampler = Sampler::new(
            BoundedReader::new(host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
            Duration::from_millis(500),
        );
        for step in 0..MUTATIONS_PER_HOST {
            let file = &tree[rng.below(tree.len())];
            let done = mutate(&mut rng, file);
            let context = format!("seed {SEED:#x}, {profile} step {step}: {done}");
            let inventory = tokio::time::timeout(Duration::from_secs(10), {
                let host = host.clone();
                async move { tokio::task::spawn_blocking(move || device::discover(&host)).await }
            })
            .await
            .unwrap_or_else(|_| panic!("discovery hung: {context}"))
            .unwrap_or_else(|e| panic!("discovery panicked: {e}: {context}"));
            tokio::time::timeout(
                Duration::from_secs(10),
                sampler.sample(&inventory, Scope::Full),
            )
            .await
            .unwrap_or_else(|_| panic!("sampling hung: {context}"));
            tokio::time::timeout(
                Duration::from_secs(10),
                gpu_operator::health::check_once(
                    &host,
                    &inventory,
                    None,
                    Duration::from_millis(500),
                ),
            )
            .await
            .unwrap_or_else(|_| panic!("health check hung: {context}"))
            .unwrap_or_else(|e| panic!("health check failed: {e}: {context}"));
            applied += 1;
        }
    }
    assert_eq!(applied, HOSTS.len() * MUTATIONS_PER_HOST);
}

/// Runs `gpu-operator ARGS`, returning its exit code and peak resident memory.
fn run_measured(args: &[&std::ffi::OsStr]) -> (Option<i32>, u64) {
    let child = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, with valid out-pointers; it reaps the
    // child, which `child` is then forgotten about.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    std::mem::forget(child);
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    // ru_maxrss is in KiB on Linux.
    (code, u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024)
}

/// Memory a rejected file may cost at most (the agent's pod limit is 256 MiB).
const HOSTILE_PEAK: u64 = 200 << 20;

/// Configuration files built to exhaust the parser: exponential aliases
/// (billion laughs), deep nesting, a 50 MB document, binary junk. `validate`
/// and `standalone --config` refuse each with a clear error, in bounded memory.
#[test]
fn hostile_config_files_are_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut laughs = String::from(
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata: {name: lol}\nspec:\n  \
         selector: &l0 {a: lol, b: lol, c: lol, d: lol, e: lol, f: lol, g: lol, h: lol, i: lol}\n",
    );
    for level in 1..=9 {
        let prev = format!("*l{}", level - 1);
        laughs.push_str(&format!(
            "  x{level}: &l{level} [{}]\n",
            vec![prev; 9].join(", ")
        ));
    }
    let deep = format!(
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata: {{name: deep}}\nspec: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let mut big = String::from(
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata: {name: big}\nspec:\n  selector:\n",
    );
    let mut i = 0;
    while big.len() < 50 << 20 {
        big.push_str(&format!("    k{i}: v{i}\n"));
        i += 1;
    }
    let junk: Vec<u8> = {
        let mut rng = Rng(SEED);
        (0..1 << 20).map(|_| rng.next() as u8).collect()
    };
    let cases: [(&str, &[u8]); 4] = [
        ("laughs.yaml", laughs.as_bytes()),
        ("deep.yaml", deep.as_bytes()),
        ("big.yaml", big.as_bytes()),
        ("junk.yaml", &junk),
    ];
    for (name, text) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let (code, peak) = run_measured(&["validate".as_ref(), path.as_os_str()]);
        assert!(
            matches!(code, Some(1 | 2)),
            "validate {name}: exit {code:?}"
        );
        assert!(
            peak < HOSTILE_PEAK,
            "validate {name}: peak {} MiB",
            peak >> 20
        );
        let (code, peak) = run_measured(&[
            "standalone".as_ref(),
            "--config".as_ref(),
            path.as_os_str(),
            "--host-root".as_ref(),
            dir.path().as_os_str(),
        ]);
        assert_eq!(code, Some(2), "standalone --config {name}");
        assert!(
            peak < HOSTILE_PEAK,
            "standalone {name}: peak {} MiB",
            peak >> 20
        );
    }
}
