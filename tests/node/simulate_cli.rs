//! `gpu-operator simulate` end to end through the built binary: what it says it
//! wrote matches what is on disk, and bad GPU counts are range errors.

use std::process::{Command, Output};

use gpu_operator::host::HostRoot;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-operator");

pub(crate) fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {BIN} {args:?}: {e}"))
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn kfd_gpu_nodes(host: &HostRoot) -> usize {
    let nodes = "/sys/class/kfd/kfd/topology/nodes";
    host.list_dir_or_empty(nodes)
        .unwrap()
        .iter()
        .filter(|n| {
            host.read_string(format!("{nodes}/{n}/properties"))
                .is_ok_and(|p| !p.contains("\nsimd_count 0\n"))
        })
        .count()
}

#[test]
fn no_driver_says_it_wrote_no_kfd_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("host");
    let output = run(&[
        "simulate",
        "--profile",
        "mi300x",
        "--gpus",
        "2",
        "--no-driver",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let host = HostRoot::new(&out);
    assert_eq!(kfd_gpu_nodes(&host), 0, "no KFD topology without a driver");
    assert!(
        !stdout.contains("KFD GPU node"),
        "no KFD node count when none were written: {stdout}"
    );
    assert!(stdout.contains("no driver bound"), "{stdout}");
    assert!(stdout.contains("2 GPU(s)"), "{stdout}");
}

#[test]
fn with_a_driver_the_kfd_node_count_is_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("host");
    let output = run(&[
        "simulate",
        "--profile",
        "mi300x",
        "--gpus",
        "2",
        "--partition",
        "cpx_nps4",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let written = kfd_gpu_nodes(&HostRoot::new(&out));
    assert_eq!(written, 16);
    assert!(
        stdout.contains(&format!("{written} KFD GPU node(s)")),
        "{stdout}"
    );
}

#[test]
fn gpu_counts_out_of_range_are_range_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("host");
    let max = gpu_operator::simulate::MAX_GPUS;
    for bad in ["-1", "0", &(max + 1).to_string()] {
        let output = run(&[
            "simulate",
            "--profile",
            "mi210",
            "--gpus",
            bad,
            "--out",
            out.to_str().unwrap(),
        ]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "--gpus {bad}: {stderr}");
        assert!(
            !stderr.contains("unexpected argument"),
            "--gpus {bad} is a value, not an argument: {stderr}"
        );
        assert!(
            stderr.contains(&format!("1..={max}")),
            "--gpus {bad}: the error names the valid range: {stderr}"
        );
        assert!(!out.exists(), "nothing written for --gpus {bad}");
    }
    // Within the global range but above the profile's own maximum.
    let output = run(&[
        "simulate",
        "--profile",
        "radeon-w7900",
        "--gpus",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("1 to 4 GPUs"), "{stderr}");
}
