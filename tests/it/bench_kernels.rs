//! `ktune bench-kernels` as a user runs it, on the test GPU (lavapipe in CI) in a
//! much reduced form: one model, three ops, default parameters, short shapes.

use crate::common::{gpu_index, ktune_in as ktune, tempdir};
use predicates::prelude::*;

fn positive(v: &serde_json::Value, what: &str) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what} missing or not a number: {v}"));
    assert!(x > 0.0 && x.is_finite(), "{what} = {x}");
    x
}

#[test]
fn bench_kernels_reports_each_shape_against_measured_limits() {
    let tmp = tempdir();
    let Some(dev) = gpu_index(tmp.path(), "BENCH-KERNELS") else { return };
    let o = ktune(tmp.path())
        .args(["bench-kernels", "--device", &dev, "--quick", "--models", "llama-3.2-1b"])
        .args(["--op", "gemv,rms_norm,attention_decode", "--prefill-tokens", "8", "--context", "64", "--budget", "5s"])
        .args(["--gpu-l2-bytes", "4M", "--format", "json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let copy = positive(&v["limits"]["copy_gbps"], "limits.copy_gbps");
    let peak = positive(&v["limits"]["fma_gflops"], "limits.fma_gflops");
    positive(&v["limits"]["copy_bytes"], "limits.copy_bytes");
    let m = &v["measurement"];
    assert_eq!(
        (m["method"].as_str(), m["cache_bytes"].as_u64(), m["rotate_bytes"].as_u64()),
        (Some("rotate"), Some(4 << 20), Some(8 << 20))
    );
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(0), "{}", v["errors"]);
    let rows = v["rows"].as_array().expect("rows");
    // Llama 3.2 1B: GEMV gate/up in f16, q8_0, q4_0, q4_k, q5_0 and down in f16, q6_k; the norm; decode attention.
    assert_eq!(rows.len(), 9, "{rows:?}");
    for op in ["gemv", "rms_norm", "attention_decode"] {
        assert!(rows.iter().any(|r| r["op"] == op), "no {op} row");
    }
    for r in rows {
        let what = format!("{} {} {}", r["what"], r["dtype"], r["kernel"]);
        let us = positive(&r["median_us"], &format!("{what}: median_us"));
        let gbps = positive(&r["gbps"], &format!("{what}: gbps"));
        positive(&r["gflops"], &format!("{what}: gflops"));
        let pct = positive(&r["pct_of_bandwidth"], &format!("{what}: pct_of_bandwidth"));
        positive(&r["pct_of_peak_flops"], &format!("{what}: pct_of_peak_flops"));
        assert!((pct - gbps / copy * 100.0).abs() < 1e-6 * pct.max(1.0), "{what}: % of bandwidth");
        assert!(positive(&r["gflops"], "gflops") / peak * 100.0 > 0.0);
        assert!(r["candidates"].as_u64().is_some_and(|c| c >= 1) && r["copies"].as_u64().is_some_and(|c| c >= 1), "{what}");
        assert_eq!(r["check"], "passed", "{what}");
        assert!(r["kernel"].as_str().is_some_and(|k| !k.is_empty()));
        assert!(us < 1e7, "{what}: {us} µs");
        // Every raced variant with its time, fastest first, the winner among them.
        let vs = r["variants"].as_array().expect("variants");
        assert!(!vs.is_empty() && vs.len() as u64 <= r["candidates"].as_u64().unwrap_or(0), "{what}: {vs:?}");
        let times: Vec<f64> = vs.iter().map(|v| positive(&v["median_us"], &format!("{what}: variant time"))).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{what}: variants not fastest first: {times:?}");
        assert!(vs.iter().any(|v| v["kernel"] == r["kernel"] && v["median_us"] == r["median_us"]), "{what}: winner not listed");
    }
    // The 8192 x 2048 f16 GEMV (32 MiB) is one copy; the 2048-wide norm many.
    let gemv = rows.iter().find(|r| r["op"] == "gemv" && r["dtype"] == "f16" && r["what"] == "decode gate/up").expect("f16 gemv");
    assert!(gemv["problem"].as_str().is_some_and(|p| p.contains("8192") && p.contains("2048")), "{gemv}");
    assert_eq!(gemv["copies"], 1);
    let norm = rows.iter().find(|r| r["op"] == "rms_norm").expect("norm row");
    assert!(norm["copies"].as_u64().is_some_and(|c| c > 1), "{norm}");
}

#[test]
fn bench_kernels_refuses_bad_flags_with_exit_2() {
    let tmp = tempdir();
    for (args, says) in [
        (vec!["--op", "telepathy"], "telepathy"),
        (vec!["--kernel", "attention_prefill_psychic"], "attention_prefill_psychic"),
        (vec!["--kernel", "attention_prefill_cpu"], "CPU kernel"),
        (vec!["--gpu-l2-bytes=-1"], "size"),
        (vec!["--models", "gpt-9"], "gpt-9"),
        (vec!["--budget", "soon"], "duration"),
        (vec!["--device", "cpu"], "GPU"),
    ] {
        ktune(tmp.path()).arg("bench-kernels").args(&args).assert().code(2).stderr(predicate::str::contains(says));
    }
}
