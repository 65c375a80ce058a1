//! `gpu-operator partition` end to end through the built binary on a
//! simulated MI300X: `show` prints each GPU's modes, `apply` changes them (the
//! simulated driver answers the writes) with the exit status its help states.

use super::simulate_cli::{run, text};

#[test]
fn show_and_apply_a_profile_on_a_simulated_host() {
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let root = dir.path().join("host");
    let root = root.to_str().unwrap();
    assert!(
        run(&["simulate", "--profile", "mi300x", "--out", root])
            .status
            .success()
    );

    let shown = run(&["partition", "show", "--host-root", root]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let table = text(&shown.stdout);
    assert_eq!(
        table.lines().count(),
        9,
        "a header and eight GPUs:\n{table}"
    );
    assert!(table.lines().nth(1).unwrap().contains("SPX"), "{table}");
    assert!(table.contains("SPX,DPX,QPX,CPX"), "{table}");

    let applied = run(&[
        "partition",
        "apply",
        "cpx_nps4_all",
        "--host-root",
        root,
        "--no-services",
        "-o",
        "json",
    ]);
    assert!(applied.status.success(), "{}", text(&applied.stderr));
    let outcome: serde_json::Value = serde_json::from_slice(&applied.stdout).unwrap();
    assert_eq!(outcome["partitions"], 64);
    assert_eq!(outcome["changed"].as_array().map(Vec::len), Some(8));
    let shown = run(&["partition", "show", "--host-root", root, "-o", "json"]);
    let gpus: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert!(
        gpus.as_array()
            .unwrap()
            .iter()
            .all(|g| g["compute"] == "CPX" && g["memory"] == "NPS4" && g["partitions"] == 8),
        "{gpus}"
    );

    // Again: nothing to change, exit 0.
    let again = run(&[
        "partition",
        "apply",
        "cpx_nps4_all",
        "--host-root",
        root,
        "--no-services",
    ]);
    assert!(again.status.success());
    assert!(
        text(&again.stdout).contains("nothing to change"),
        "{}",
        text(&again.stdout)
    );

    // A profile that does not fit, and one that does not exist: exit 2.
    for profile in ["dpx_nps2_all", "nope"] {
        let refused = run(&[
            "partition",
            "apply",
            profile,
            "--host-root",
            root,
            "--no-services",
        ]);
        assert_eq!(refused.status.code(), Some(2), "{profile}");
        assert!(
            text(&refused.stderr).starts_with("error: "),
            "{}",
            text(&refused.stderr)
        );
    }
    // A config file that is not JSON: exit 2, naming the file.
    let bad = dir.path().join("config.json");
    std::fs::write(&bad, "{").unwrap();
    let refused = run(&[
        "partition",
        "apply",
        "default",
        "--host-root",
        root,
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused.stderr).contains("config.json"),
        "{}",
        text(&refused.stderr)
    );

    // Back to the default profile, from a config file of the reference's format.
    let config = dir.path().join("profiles.json");
    std::fs::write(
        &config,
        r#"{"gpu-config-profiles": {"back": {"profiles": [
            {"computePartition": "SPX", "memoryPartition": "NPS1", "numGPUsAssigned": 8}]}}}"#,
    )
    .unwrap();
    let back = run(&[
        "partition",
        "apply",
        "back",
        "--host-root",
        root,
        "--config",
        config.to_str().unwrap(),
        "--no-services",
    ]);
    assert!(back.status.success(), "{}", text(&back.stderr));
    assert!(
        text(&back.stdout).contains("8 partitions now"),
        "{}",
        text(&back.stdout)
    );
}
