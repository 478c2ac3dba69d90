//! The binary, run as a user runs it: output shape, exit codes, error messages.

use assert_cmd::Command;
use predicates::prelude::*;

fn ktune() -> Command {
    Command::cargo_bin("ktune").expect("binary built")
}

#[test]
fn list_devices_always_shows_the_cpu() {
    ktune().arg("list-devices").assert().success().stdout(predicate::str::contains("cpu"));
}

#[test]
fn list_devices_json_has_a_stable_fingerprint() {
    let run = || {
        let out = ktune().args(["list-devices", "--format", "json"]).output().expect("runs");
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
        v
    };
    let (a, b) = (run(), run());
    let fps = |v: &serde_json::Value| -> Vec<String> {
        v["devices"]
            .as_array()
            .expect("devices array")
            .iter()
            .map(|d| d["fingerprint"].as_str().expect("fingerprint").to_string())
            .collect()
    };
    let fa = fps(&a);
    assert!(!fa.is_empty());
    assert!(fa.iter().all(|f| f.len() == 64), "full sha256 in JSON: {fa:?}");
    assert_eq!(fa, fps(&b), "same machine, same fingerprints");
}

#[test]
fn unknown_device_selector_is_exit_2_listing_devices() {
    ktune()
        .args(["kernels", "--device", "no-such-device-xyz"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no-such-device-xyz"))
        .stderr(predicate::str::contains("cpu"));
}

#[test]
fn kernels_lists_every_registered_kernel() {
    let out = ktune().args(["kernels", "--device", "cpu", "--format", "json"]).output().expect("runs");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let ids: Vec<&str> = v["kernels"].as_array().expect("kernels").iter().map(|k| k["id"].as_str().expect("id")).collect();
    for k in ktune::kernels::registry() {
        assert!(ids.contains(&k.id), "{} missing from `ktune kernels`", k.id);
    }
}

#[test]
fn kernels_verify_on_cpu_passes() {
    ktune().args(["kernels", "--device", "cpu", "--verify", "--op", "gemv"]).assert().success();
}

#[test]
fn unknown_kernel_is_exit_2_naming_known_ones() {
    ktune()
        .args(["kernels", "--device", "cpu", "--kernel", "gemv_nonexistent"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("gemv_nonexistent"))
        .stderr(predicate::str::contains("gemv_rows_cpu"));
}
