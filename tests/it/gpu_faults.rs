//! GPU faults on the test GPU (lavapipe in CI; skipped loudly without one),
//! provoked through wgpu's real API by the hidden `KTUNE_FAULT` injection
//! (`ktune_kernels::gpu::faults`): a buffer over the device's limit, the device
//! destroyed mid-run, a shader the driver rejects. Each run of the binary ends
//! with exit 2 and a message naming the problem and the fix, never a panic, and
//! within a kill-after guard (never a hang); a tune ruling a rejected kernel out
//! goes on, and a fault leaves the cache's profiles as they were.

use std::path::Path;
use std::time::Duration;

use crate::common::{fixture, gpu_index, ktune_in, tempdir};

/// Kills a run that takes longer: a fault must end it, not hang it.
const GUARD: Duration = Duration::from_secs(120);

/// `ktune ARGS` on the fixture model on GPU `gpu` with `fault` injected (None:
/// none): (exit code, stdout, stderr).
fn ktune_with(cache: &Path, fault: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut c = ktune_in(cache);
    c.env_remove("KTUNE_FAULT");
    if let Some(f) = fault {
        c.env("KTUNE_FAULT", f);
    }
    let o = c.args(args).timeout(GUARD).output().expect("runs");
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    // None: killed by the guard (or a signal: an abort is no clean error either).
    let code = o.status.code().unwrap_or_else(|| panic!("no exit code (killed after {GUARD:?}, or by a signal): {err}"));
    assert!(!err.contains("panicked"), "a panic: {err}");
    (code, out, err)
}

/// `run` of the fixture on `gpu`, greedy, 8 tokens one decode step a submit.
fn run_args(gpu: &str, dir: &Path) -> Vec<String> {
    let d = dir.to_str().expect("utf-8");
    ["run", "--device", gpu, "--model-dir", d, "--tokens", "1,2,3", "--max-tokens", "8", "--decode-chain", "1", "--no-profile"]
        .map(String::from)
        .to_vec()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_buffer_over_the_device_limit_is_refused_with_the_size_the_limit_and_the_fix() {
    let tmp = tempdir();
    let Some(gpu) = gpu_index(tmp.path(), "buffer limit") else { return };
    let args = run_args(&gpu, &fixture("llama3-tiny"));
    let (code, _, err) = ktune_with(tmp.path(), Some("limit:4096"), &refs(&args));
    assert_eq!(code, 2, "{err}");
    for want in ["needs", "bytes, over the device's max buffer size of 4096 bytes", "--context", "--weight-dtype", "--device cpu"] {
        assert!(err.contains(want), "no `{want}` in: {err}");
    }
}

#[test]
fn a_device_lost_mid_run_ends_it_with_exit_2_and_no_hang() {
    let tmp = tempdir();
    let Some(gpu) = gpu_index(tmp.path(), "device lost") else { return };
    let args = run_args(&gpu, &fixture("llama3-tiny"));
    // The prefill, then decode steps: lost before the first, mid-prefill and mid-decode.
    for at in [1, 2, 5] {
        let (code, _, err) = ktune_with(tmp.path(), Some(&format!("device-lost@submit:{at}")), &refs(&args));
        assert_eq!(code, 2, "lost at submit {at}: {err}");
        assert!(err.contains("the GPU device was lost") && err.contains("--device cpu"), "lost at submit {at}: {err}");
    }
    // The same run without the fault succeeds (the fault, not the run, failed it).
    let (code, _, err) = ktune_with(tmp.path(), None, &refs(&args));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_rejected_shader_fails_run_and_is_ruled_out_by_tune_with_the_cache_intact() {
    let tmp = tempdir();
    let cache = tmp.path().join("cache");
    let Some(gpu) = gpu_index(&cache, "rejected shader") else { return };
    let dir = fixture("llama3-tiny");
    // `run`: the kernel its plan needs is rejected: an error naming the shader.
    let (code, _, err) = ktune_with(&cache, Some("bad-shader:gemv_subgroup"), &refs(&run_args(&gpu, &dir)));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the GPU driver rejected shader `gemv_subgroup.wgsl") && err.contains("--device cpu"), "{err}");
    assert!(!err.contains('┌'), "one line, not naga's source excerpt: {err}");

    // `tune`: a raced variant's shader rejected: ruled out with the reason, the tune goes on.
    let out = tmp.path().join("tuned.yaml");
    let tune = |fault: &str, extra: &[&str]| {
        let mut a = vec!["tune", "--device", &gpu, "--model-dir", dir.to_str().expect("utf-8"), "--budget", "5s"];
        a.extend(["--prefill-tokens", "8", "--context", "32", "--decode-tokens", "16", "--format", "json"]);
        a.extend(["-o", out.to_str().expect("utf-8")]);
        a.extend(extra);
        ktune_with(&cache, Some(fault), &a)
    };
    let (code, stdout, err) = tune("bad-shader:norm_rms_vec4", &[]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let rejected: Vec<String> = v["profile"]["tuning"]["slots"]
        .as_array()
        .expect("slots")
        .iter()
        .flat_map(|s| s["rejected"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["variant"].as_str().is_some_and(|n| n.starts_with("rms_norm_vec4")))
        .map(|r| r["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    // Every variant of the shader is ruled out: those the race reached for the
    // driver's reason, with its message; the rest not reached within the budget
    // (on a loaded machine the norm races may reach none of them).
    assert!(!rejected.is_empty(), "the shader's variants are listed");
    let driver = |r: &String| r.contains("the GPU driver rejected shader `norm_rms_vec4.wgsl") && r.contains("--device cpu");
    assert!(rejected.iter().all(|r| driver(r) || r.starts_with("not reached within the budget")), "{rejected:?}");

    // A device lost mid-tune: exit 2, and the cached profile is as it was.
    let profiles = cache.join("profiles");
    let before = snapshot(&profiles);
    assert!(before.iter().any(|(n, _)| n.ends_with(".yaml")), "the tune cached its profile: {before:?}");
    let (code, _, err) = tune("device-lost@submit:40", &["--force"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the GPU device was lost"), "{err}");
    assert_eq!(snapshot(&profiles), before, "a lost device changed the cached profiles");
}

/// Every file of `dir` (name, bytes), sorted; lock files left out.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("profiles dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_none_or(|e| e != "lock"))
        .map(|p| (p.file_name().expect("name").to_string_lossy().into_owned(), std::fs::read(&p).expect("reads")))
        .collect();
    v.sort();
    v
}
