//! Profile loading: every error names its line and column and what is allowed;
//! a written profile loads back unchanged (round trip); the example
//! (with this kernel set's ids) loads; diff-profiles tells regressions from noise.

use ktune::profile::doc::{Candidate, EndToEnd, Measurement, SlotTuning, Throughput, Tuning, VariantDoc};
use ktune::profile::{Profile, ProfileError, diff::diff, to_yaml};

const GOOD: &str = "\
name: smollm2-cpu
model: smollm2-135m
version: 1
device:
  backend: cpu
  vendor: amd
kernels:
  attention:
    prefill: attention_prefill_tiled_cpu
    decode: {kernel: attention_decode_splitkv_cpu, params: {chunk: 256}}
  matmul:
    default: gemm_blocked_cpu
    qkv_proj: gemv_dot4_cpu
    lm_head:
      prefill: gemv_rows_cpu
      decode: {kernel: gemv_dot4_cpu, params: {rows_per_task: 64}}
  norm: rms_norm_rows_cpu
  activation: gated_act_simd_cpu
  rope: rope_table_cpu
execution:
  batchCommands: true
  kvCacheDtype: f32
  fusedGateUp: true
parallel:
  ffn_projections: [matmul:gate_proj, matmul:up_proj]
layers:
  0-5:
    attention: attention_prefill_cpu
  6-7:
    norm: rms_norm_split_cpu
scheduling:
  maxParallelKernels: 2
  barriers:
    - after: ffn_projections
      before: activation
";

fn err(text: &str) -> (u64, u64, String) {
    match Profile::from_str(text, "p.yaml") {
        Err(ProfileError::At { line, column, message, .. }) => (line, column, message),
        Err(e) => panic!("expected a positioned error, got: {e}"),
        Ok(_) => panic!("expected an error for:\n{text}"),
    }
}

#[test]
fn the_seed_002_shape_loads() {
    let p = Profile::from_str(GOOD, "good.yaml").expect("loads");
    assert_eq!(p.doc.model, "smollm2-135m");
    assert_eq!(p.doc.layers.len(), 2);
    assert_eq!(p.doc.scheduling.max_parallel_kernels, 2);
}

#[test]
fn a_profile_of_another_kernel_set_keeps_what_still_validates() {
    // An id this build does not have (in a slot, in a layer override, a parameter
    // value out of range), as a newer or older ktune may have written.
    let other = GOOD
        .replace("norm: rms_norm_rows_cpu", "norm: rms_norm_fastest")
        .replace("attention: attention_prefill_cpu", "attention: attention_from_the_future_cpu")
        .replace("params: {chunk: 256}", "params: {chunk: 3}");
    assert!(Profile::from_str(&other, "other.yaml").is_err(), "strict loading refuses it");
    let (p, dropped) = Profile::from_str_salvaged(&other, "other.yaml").expect("salvaged");
    assert_eq!(dropped, vec!["kernels.attention", "kernels.norm", "layers.0-5.attention"]);
    assert!(p.doc.kernels.norm.is_none() && p.doc.kernels.attention.is_none());
    // What validates is kept as it was.
    assert_eq!(p.doc.kernels.rope, Profile::from_str(GOOD, "good.yaml").expect("loads").doc.kernels.rope);
    assert!(p.doc.kernels.matmul.is_some());
    // A good profile salvages to itself; a broken document is still an error.
    assert!(Profile::from_str_salvaged(GOOD, "good.yaml").expect("loads").1.is_empty());
    assert!(Profile::from_str_salvaged(&GOOD.replace("version: 1", "version: 9"), "v.yaml").is_err());
}

#[test]
fn unknown_kernel_names_its_position_and_the_valid_ones() {
    let bad = GOOD.replace("norm: rms_norm_rows_cpu", "norm: rms_norm_fastest");
    let (line, col, msg) = err(&bad);
    assert_eq!(line, 17, "{msg}");
    assert_eq!(col, 9, "{msg}");
    assert!(msg.contains("unknown kernel `rms_norm_fastest`"), "{msg}");
    // A CPU profile lists the CPU kernels of the slot.
    assert!(
        msg.contains("rms_norm_rows_cpu") && msg.contains("rms_norm_split_cpu") && !msg.contains("subgroup"),
        "lists the valid kernels: {msg}"
    );
}

#[test]
fn a_kernel_of_another_op_is_refused_with_the_slot_op() {
    let bad = GOOD.replace("rope: rope_table_cpu", "rope: rms_norm_rows_cpu");
    let (line, _, msg) = err(&bad);
    assert_eq!(line, 19);
    assert!(msg.contains("computes rms_norm") && msg.contains("rope"), "{msg}");
}

#[test]
fn unknown_keys_are_reported_not_ignored() {
    let bad = GOOD.replace("  kvCacheDtype: f32", "  kvCacheDtype: f32\n  turbo: true");
    let (line, _, msg) = err(&bad);
    assert_eq!(line, 23, "{msg}");
    assert!(msg.starts_with("unknown field"), "no duplicated position prefix: {msg}");
    assert!(msg.contains("turbo"), "{msg}");
}

#[test]
fn parameters_out_of_range_are_refused() {
    let bad = GOOD.replace("params: {chunk: 256}", "params: {chunk: 300}");
    let (line, _, msg) = err(&bad);
    assert_eq!(line, 9, "the attention entry: {msg}");
    assert!(msg.contains("chunk") && msg.contains("300") && msg.contains("not one of"), "{msg}");
    let bad = GOOD.replace("params: {chunk: 256}", "params: {chonk: 256}");
    assert!(err(&bad).2.contains("unknown parameter `chonk`"));
}

#[test]
fn overlapping_or_backwards_layer_ranges_are_refused() {
    let bad = GOOD.replace("  6-7:", "  5-7:");
    let (_, _, msg) = err(&bad);
    assert!(msg.contains("overlaps"), "{msg}");
    let bad = GOOD.replace("  6-7:", "  7-6:");
    assert!(err(&bad).2.contains("backwards"));
    let bad = GOOD.replace("  6-7:", "  six:");
    assert!(err(&bad).2.contains("not `N` or `N-M`"));
}

#[test]
fn malformed_yaml_gives_a_position() {
    let (line, _, _) = err("name: x\nmodel: [unclosed\nversion: 1\n");
    assert!(line >= 2);
    let (line, _, msg) = err("name: x\nmodel: m\nversion: 7\n");
    assert_eq!(line, 3);
    assert!(msg.contains("version 7"), "{msg}");
}

#[test]
fn bad_parallel_groups_and_barriers_are_refused() {
    let bad = GOOD.replace("ffn_projections: [matmul:gate_proj, matmul:up_proj]", "ffn_projections: [matmul:gate_proj]");
    assert!(err(&bad).2.contains("must list exactly"));
    let bad = GOOD.replace("before: activation", "before: teleport");
    assert!(err(&bad).2.contains("not an op"));
}

fn thr(prefill_ms: f64, decode_ms: f64, noise: f64) -> Throughput {
    Throughput {
        prefill_tok_s: 128.0 / prefill_ms * 1e3,
        decode_tok_s: 1e3 / decode_ms,
        prefill_ms,
        prefill_ci_ms: [prefill_ms * (1.0 - noise), prefill_ms * (1.0 + noise)],
        decode_ms,
        decode_ci_ms: [decode_ms * (1.0 - noise), decode_ms * (1.0 + noise)],
    }
}

fn tuned(decode_ms: f64, noise: f64, gemv_us: f64) -> Profile {
    let mut p = Profile::from_str(GOOD, "x.yaml").expect("loads");
    let v = VariantDoc::id("gemv_dot4_cpu");
    p.doc.tuning = Some(Tuning {
        fingerprint: "f".repeat(64),
        measurement: Some(Measurement {
            method: "rotate".into(),
            cache_bytes: 50 << 20,
            cache_source: "estimate: nvidia hopper".into(),
            rotate_bytes: 100 << 20,
            max_copies: 12,
        }),
        slots: vec![SlotTuning {
            slot: "matmul.qkv_proj".into(),
            regime: "decode".into(),
            problem: "gemv 576x576".into(),
            count: 3,
            chosen: v.to_string(),
            copies: Some(12),
            candidates: vec![Candidate {
                variant: v,
                median_us: gemv_us,
                ci_us: [gemv_us * 0.99, gemv_us * 1.01],
                samples: 9,
                ..Default::default()
            }],
            rejected: vec![],
        }],
        end_to_end: EndToEnd {
            prefill_tokens: 128,
            decode_tokens: 128,
            tuned: thr(100.0, decode_ms, noise),
            default: thr(100.0, 20.0, noise),
            max_kld: None,
            timed_layers: None,
            combinations: vec![],
            decision: None,
            head_to_head: None,
            vision: None,
            batches: Vec::new(),
        },
        ..Default::default()
    });
    p
}

#[test]
fn a_written_profile_loads_back_identical() {
    let p = tuned(10.0, 0.01, 50.0);
    let text = to_yaml(&p.doc).expect("writes");
    let q = Profile::from_str(&text, "rt.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(to_yaml(&q.doc).expect("writes"), text);
    let d = diff(&p, &q, 5.0).expect("diffs");
    assert!(!d.changed && !d.regressed, "{d:?}");
}

#[test]
fn diff_flags_a_regression_beyond_threshold_and_noise_only() {
    let a = tuned(10.0, 0.01, 50.0);
    // 20% slower decode with 1% noise: a regression.
    let d = diff(&a, &tuned(12.0, 0.01, 50.0), 5.0).expect("diffs");
    assert!(d.regressed, "{d:?}");
    // 3% slower: under the threshold.
    assert!(!diff(&a, &tuned(10.3, 0.01, 50.0), 5.0).expect("diffs").regressed);
    // 20% slower but the intervals are ±25%: noise.
    assert!(!diff(&tuned(10.0, 0.25, 50.0), &tuned(12.0, 0.25, 50.0), 5.0).expect("diffs").regressed);
    // A slot time regression alone also counts.
    assert!(diff(&a, &tuned(10.0, 0.01, 80.0), 5.0).expect("diffs").regressed);
    // A changed choice is a change, not a regression.
    let mut b = tuned(10.0, 0.01, 50.0);
    b.doc.execution.fused_qkv = true;
    let d = diff(&a, &b, 5.0).expect("diffs");
    assert!(d.changed && !d.regressed);
    assert!(d.changes.iter().any(|c| c.what == "execution.fusedQkv" && c.old == "false" && c.new == "true"));
}

/// `diff-profiles` names a change of the CPU's execution settings and of a
/// server's (the layouts a lone decode and a server load, the pool's
/// threads, `serve.minBatch`), each with both values, a setting left to the
/// runtime said as such.
#[test]
fn diff_names_the_layouts_and_the_servers_settings() {
    let a = tuned(10.0, 0.01, 50.0);
    let mut b = tuned(10.0, 0.01, 50.0);
    b.doc.execution.cpu_repack = vec!["q4_k".into()];
    b.doc.execution.cpu_threads = 2;
    b.doc.serve.cpu_repack = Some(vec!["q4_k".into(), "q8_0".into()]);
    b.doc.serve.min_batch = Some(3);
    let d = diff(&a, &b, 5.0).expect("diffs");
    assert!(d.changed && !d.regressed, "{d:?}");
    let change = |what: &str| d.changes.iter().find(|c| c.what == what).map(|c| (c.old.as_str(), c.new.as_str()));
    assert_eq!(change("execution.cpuRepack"), Some(("none", "q4_k")), "{:?}", d.changes);
    assert_eq!(change("execution.cpuThreads"), Some(("0", "2")));
    assert_eq!(change("serve.cpuRepack"), Some(("the runtime's default", "q4_k, q8_0")));
    assert_eq!(change("serve.minBatch"), Some(("the runtime's default", "3")));
    assert_eq!(d.changes.len(), 4, "{:?}", d.changes);
}

/// Every profile shipped in profiles/ loads, names a built-in model, carries its
/// provenance, and resolves on a device of its backend.
#[test]
fn shipped_profiles_load_and_resolve() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("profiles/ exists") {
        let path = e.expect("entry").path();
        if path.extension().is_none_or(|x| x != "yaml") {
            continue;
        }
        let p = Profile::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(ktune::model::builtin_names().contains(&p.doc.model.as_str()), "{}: model {}", path.display(), p.doc.model);
        let t = p.doc.tuning.as_ref().unwrap_or_else(|| panic!("{} has no tuning section", path.display()));
        assert_eq!(t.fingerprint.len(), 64);
        assert!(t.end_to_end.tuned.decode_tok_s > 0.0 && t.end_to_end.default.decode_tok_s > 0.0);
        if p.doc.device.backend.as_ref().is_some_and(|b| b.value == "cpu") {
            let cfg = ktune::model::builtin(&p.doc.model).expect("built-in");
            let dev = ktune::device::Device::Cpu(ktune::device::CpuCaps::detect());
            p.resolve(&dev, &p.doc.model, cfg.dims.num_layers).unwrap_or_else(|e| panic!("{e}"));
        }
        n += 1;
    }
    assert!(n >= 4, "expected the four shipped CPU profiles, found {n}");
}

/// A file's other matrix formats get their own choices under `kernels.formats`:
/// they resolve into the selection by format, and a name that is not a weight
/// format, or a kernel of the wrong op there, is refused.
#[test]
fn per_format_choices_resolve_and_bad_ones_are_refused() {
    use ktune::kernels::DType;
    use ktune::plan::{Regime, Slot};
    let text = GOOD.replace(
        "  rope: rope_table_cpu\n",
        "  rope: rope_table_cpu\n  formats:\n    q6_k:\n      matmul:\n        down_proj: {kernel: gemv_q_cpu, params: {act_bits: 8}}\n",
    );
    let p = Profile::from_str(&text, "f.yaml").expect("loads");
    let dev = ktune::device::Device::Cpu(ktune::device::CpuCaps::detect());
    let (sel, _, _) = p.resolve(&dev, "smollm2-135m", 30).expect("resolves");
    let c = sel.formats.get(&(DType::Q6_K, (Slot::MatmulDown, Regime::Decode))).expect("a q6_k choice for down_proj decode");
    assert_eq!((c.kernel.id, c.params.get("act_bits")), ("gemv_q_cpu", Some(&8)));
    assert!(!sel.formats.keys().any(|(d, _)| *d != DType::Q6_K));
    // Not a storage format.
    let bad = text.replace("    q6_k:\n", "    q9_z:\n");
    let e = Profile::from_str(&bad, "f.yaml").expect_err("unknown format").to_string();
    assert!(e.contains("q9_z") && e.contains("q6_k"), "{e}");
    // A kernel of another op under a format.
    let bad = text.replace("down_proj: {kernel: gemv_q_cpu", "down_proj: {kernel: rms_norm_rows_cpu");
    assert!(Profile::from_str(&bad, "f.yaml").is_err());
}

/// The tuned CPU thread count (`execution.cpuThreads`) resolves into the execution
/// settings; a profile without it (every profile written before it existed) runs
/// on all threads; a negative count is refused.
/// A profile text loaded and resolved on this CPU for the fixture's model.
fn load_and_resolve(text: &str) -> (Profile, ktune::profile::ExecSettings) {
    let dev = ktune::device::Device::Cpu(ktune::device::CpuCaps::detect());
    let p = Profile::from_str(text, "f.yaml").expect("loads");
    let (_, exec, _) = p.resolve(&dev, "smollm2-135m", 30).expect("resolves");
    (p, exec)
}

#[test]
fn cpu_threads_resolve_and_old_profiles_default_to_all() {
    assert_eq!(load_and_resolve(GOOD).1.threads, 0, "no cpuThreads: all threads");
    let text = GOOD.replace("execution:\n", "execution:\n  cpuThreads: 1\n");
    assert_ne!(text, GOOD, "the fixture has an execution section");
    let (p, exec) = load_and_resolve(&text);
    assert_eq!(exec.threads, 1);
    // Written back, the count stays.
    let again = Profile::from_str(&to_yaml(&p.doc).expect("yaml"), "g.yaml").expect("loads back");
    assert_eq!(again.doc.execution.cpu_threads, 1);
    assert!(Profile::from_str(&GOOD.replace("execution:\n", "execution:\n  cpuThreads: -2\n"), "f.yaml").is_err());
}

/// The tuned idle spin of the CPU pool's workers (`execution.cpuSpinUs`) resolves
/// into the execution settings and survives a write; absent (older profiles) it is
/// 0, the pool's default; a negative or fractional value is refused.
#[test]
fn cpu_spin_resolves_and_old_profiles_keep_the_default() {
    assert_eq!(load_and_resolve(GOOD).1.spin_us, 0, "no cpuSpinUs: the pool's default");
    let (p, exec) = load_and_resolve(&GOOD.replace("execution:\n", "execution:\n  cpuSpinUs: 20000\n"));
    assert_eq!(exec.spin_us, 20_000);
    let again = Profile::from_str(&to_yaml(&p.doc).expect("yaml"), "g.yaml").expect("loads back");
    assert_eq!(again.doc.execution.cpu_spin_us, 20_000);
    for bad in ["-5", "1.5", "lots"] {
        let e = Profile::from_str(&GOOD.replace("execution:\n", &format!("execution:\n  cpuSpinUs: {bad}\n")), "f.yaml");
        assert!(e.is_err(), "cpuSpinUs: {bad} accepted");
    }
}

/// The tuned prefetch distance of the int8 decode dots (`execution.cpuPrefetchBytes`)
/// resolves and survives a write; absent (older profiles) it is None, the runtime's
/// default; 0 (no prefetch) is a value of its own; past the largest distance, or
/// not a whole number, it is refused with the field's name.
#[test]
fn cpu_prefetch_resolves_and_old_profiles_keep_the_default() {
    assert_eq!(load_and_resolve(GOOD).1.prefetch, None, "no cpuPrefetchBytes: the default");
    for v in [0u32, 4096] {
        let (p, exec) = load_and_resolve(&GOOD.replace("execution:\n", &format!("execution:\n  cpuPrefetchBytes: {v}\n")));
        assert_eq!(exec.prefetch, Some(v));
        let again = Profile::from_str(&to_yaml(&p.doc).expect("yaml"), "g.yaml").expect("loads back");
        assert_eq!(again.doc.execution.cpu_prefetch_bytes, Some(v));
    }
    let e = Profile::from_str(&GOOD.replace("execution:\n", "execution:\n  cpuPrefetchBytes: 1000000\n"), "f.yaml").expect_err("too far");
    assert!(e.to_string().contains("cpuPrefetchBytes"), "{e}");
    for bad in ["-5", "1.5", "far"] {
        let e = Profile::from_str(&GOOD.replace("execution:\n", &format!("execution:\n  cpuPrefetchBytes: {bad}\n")), "f.yaml");
        assert!(e.is_err(), "cpuPrefetchBytes: {bad} accepted");
    }
}

/// `execution.cpuRepack` (the formats a CPU engine repacks at load) resolves and
/// survives a write; absent (every older profile) nothing is repacked and the key
/// is not written; a format without a repacked layout is refused with the field
/// and the allowed values named.
#[test]
fn cpu_repack_resolves_and_old_profiles_repack_nothing() {
    use ktune::kernels::quant::QFormat;
    let (p0, exec0) = load_and_resolve(GOOD);
    assert!(exec0.repack.is_empty(), "no cpuRepack: every matrix as stored");
    assert!(!to_yaml(&p0.doc).expect("yaml").contains("cpuRepack"));
    let (p, exec) = load_and_resolve(&GOOD.replace("execution:\n", "execution:\n  cpuRepack: [q4_k]\n"));
    assert_eq!(exec.repack, vec![QFormat::Q4_K]);
    let text = to_yaml(&p.doc).expect("yaml");
    let again = Profile::from_str(&text, "g.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(again.doc.execution.cpu_repack, vec!["q4_k".to_string()]);
    // Every format with a repacked layout, in the order listed.
    let (p, exec) = load_and_resolve(&GOOD.replace("execution:\n", "execution:\n  cpuRepack: [q4_k, q4_0, q8_0, iq4_nl, q6_k]\n"));
    assert_eq!(exec.repack, vec![QFormat::Q4_K, QFormat::Q4_0, QFormat::Q8_0, QFormat::IQ4_NL, QFormat::Q6_K]);
    let text = to_yaml(&p.doc).expect("yaml");
    let again = Profile::from_str(&text, "g.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(again.doc.execution.cpu_repack, ["q4_k", "q4_0", "q8_0", "iq4_nl", "q6_k"].map(String::from).to_vec());
    for bad in ["[q5_k]", "[q4_k, f16]", "[q4_0, q4_1]", "q4_k"] {
        let e = Profile::from_str(&GOOD.replace("execution:\n", &format!("execution:\n  cpuRepack: {bad}\n")), "f.yaml");
        let e = e.expect_err(bad).to_string();
        assert!(e.contains("cpuRepack") || e.contains("sequence"), "{bad}: {e}");
    }
    let e = Profile::from_str(&GOOD.replace("execution:\n", "execution:\n  cpuRepack: [q5_k]\n"), "f.yaml").expect_err("q5_k");
    for allowed in ["q4_k", "q4_0", "q8_0", "iq4_nl", "q6_k"] {
        assert!(e.to_string().contains(allowed), "names what is allowed ({allowed}): {e}");
    }
}

/// `serve.cpuRepack` (the layouts a server of several sequences loads, which
/// `tune --serve-batches` checked its tables over) resolves apart from
/// `execution.cpuRepack` and survives a write, an empty list too (every matrix
/// as stored); absent (every older profile) the runtime's default serves; a
/// format without a repacked layout is refused naming the field.
#[test]
fn a_servers_repack_resolves_apart_from_the_lone_decodes() {
    use ktune::kernels::quant::QFormat;
    let (_, exec0) = load_and_resolve(GOOD);
    assert_eq!(exec0.batch_repack, None, "absent: the runtime's default for a server");
    let with = |serve: &str| GOOD.replace("execution:\n", "execution:\n  cpuRepack: [q4_k]\n") + serve;
    for (serve, want) in
        [("serve:\n  cpuRepack: [q4_0, q8_0]\n", vec![QFormat::Q4_0, QFormat::Q8_0]), ("serve:\n  cpuRepack: []\n", vec![])]
    {
        let (p, exec) = load_and_resolve(&with(serve));
        assert_eq!(exec.repack, vec![QFormat::Q4_K], "{serve}");
        assert_eq!(exec.batch_repack.as_deref(), Some(&want[..]), "{serve}");
        let text = to_yaml(&p.doc).expect("yaml");
        let again = Profile::from_str(&text, "g.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(again.doc.serve.cpu_repack, Some(want.iter().map(|f| f.name().to_string()).collect()), "{text}");
    }
    let e = Profile::from_str(&with("serve:\n  cpuRepack: [q5_k]\n"), "f.yaml").expect_err("q5_k").to_string();
    assert!(e.contains("serve.cpuRepack") && e.contains("q5_k") && e.contains("q6_k"), "{e}");
}

/// `execution.trustedShaders` (tuned with `--trusted-shaders`) resolves and
/// survives a write; absent (every older profile) the modules stay checked; a
/// value that is not a boolean is refused.
#[test]
fn trusted_shaders_resolve_and_old_profiles_stay_checked() {
    assert!(!load_and_resolve(GOOD).1.trusted_shaders, "no trustedShaders: checked modules");
    let (p, exec) = load_and_resolve(&GOOD.replace("execution:\n", "execution:\n  trustedShaders: true\n"));
    assert!(exec.trusted_shaders);
    let text = to_yaml(&p.doc).expect("yaml");
    assert!(text.contains("trustedShaders: true"), "{text}");
    assert!(Profile::from_str(&text, "g.yaml").expect("loads back").doc.execution.trusted_shaders);
    // Written without it, the key is left out (older readers see what they know).
    assert!(!to_yaml(&load_and_resolve(GOOD).0.doc).expect("yaml").contains("trustedShaders"));
    assert!(Profile::from_str(&GOOD.replace("execution:\n", "execution:\n  trustedShaders: maybe\n"), "f.yaml").is_err());
}

/// `tuning.measurement` (how the slot races rotated their inputs past the cache)
/// and each slot's `copies` survive a write; a tuning section without them (every
/// profile written before they were recorded, the shipped ones included) loads
/// with none, and the profile's JSON Schema accepts both.
#[test]
fn measurement_round_trips_and_old_tuning_sections_load_without_it() {
    let p = tuned(10.0, 0.01, 50.0);
    let text = to_yaml(&p.doc).expect("writes");
    assert!(text.contains("method: rotate") && text.contains("copies: 12"), "{text}");
    let q = Profile::from_str(&text, "m.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let m = q.doc.tuning.as_ref().and_then(|t| t.measurement.clone()).expect("measurement kept");
    assert_eq!((m.method.as_str(), m.cache_bytes, m.rotate_bytes, m.max_copies), ("rotate", 50 << 20, 100 << 20, 12));
    assert_eq!(q.doc.tuning.as_ref().map(|t| t.slots[0].copies), Some(Some(12)));
    // The same profile without the new keys: an older ktune's output.
    let old: String = text
        .lines()
        .scan(false, |skip, l| {
            if l.trim_start().starts_with("measurement:") {
                *skip = true;
                return Some(None);
            }
            if *skip && l.starts_with("    ") {
                return Some(None);
            }
            *skip = false;
            Some(if l.trim_start().starts_with("copies:") { None } else { Some(l) })
        })
        .flatten()
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!old.contains("measurement") && !old.contains("copies:"), "{old}");
    let o = Profile::from_str(&old, "old.yaml").unwrap_or_else(|e| panic!("{e}\n{old}"));
    let t = o.doc.tuning.as_ref().expect("tuning kept");
    assert!(t.measurement.is_none() && t.slots[0].copies.is_none());
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/gemma3-1b-cpu-epyc-2core.yaml");
    let s = Profile::load(&shipped).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.doc.tuning.as_ref().is_some_and(|t| t.measurement.is_none()), "the shipped profile predates the field");
    // The schema `ktune schema` prints knows the new keys and requires none of them.
    let schema = ktune::profile::json_schema();
    let defs = &schema["$defs"];
    for (def, key) in [("Tuning", "measurement"), ("SlotTuning", "copies"), ("ExecutionDoc", "trustedShaders")] {
        assert!(defs[def]["properties"][key].is_object(), "{def} lacks `{key}` in the schema");
        let required = defs[def]["required"].as_array().cloned().unwrap_or_default();
        assert!(!required.iter().any(|r| r == key), "{def}.{key} is required: old profiles would not validate");
    }
    assert!(defs["Measurement"]["properties"]["rotate_bytes"].is_object());
}

/// `kernels.vision.residual_norm` (issue 16: the tower's residual adds fused with
/// the LayerNorm after each): a residual_layer_norm kernel resolves under the
/// `vision` regime and writes back; a profile without the key (every one
/// written before it) still loads, `vision.norm` keeping its layer_norm kernels;
/// a plain layer_norm kernel there is refused; the schema knows the key and does
/// not require it.
#[test]
fn vision_residual_norm_slot_takes_the_fused_op() {
    use ktune::plan::{Regime, Slot};
    let dev = ktune::device::Device::Cpu(ktune::device::CpuCaps::detect());
    let with = |entries: &str| GOOD.replace("  rope: rope_table_cpu\n", &format!("  rope: rope_table_cpu\n  vision:\n{entries}"));
    let text = with("    norm: layer_norm_split_cpu\n    residual_norm: {kernel: residual_layer_norm_split_cpu, params: {chunk: 256}}\n");
    let p = Profile::from_str(&text, "v.yaml").unwrap_or_else(|e| panic!("{e}"));
    let (sel, _, _) = p.resolve(&dev, "smollm2-135m", 30).expect("resolves");
    let c = sel.slots.get(&(Slot::VisionResidualNorm, Regime::Vision)).expect("vision.residual_norm chosen");
    assert_eq!((c.kernel.id, c.params.get("chunk").copied()), ("residual_layer_norm_split_cpu", Some(256)));
    assert_eq!(sel.slots.get(&(Slot::VisionNorm, Regime::Vision)).map(|c| c.kernel.id), Some("layer_norm_split_cpu"));
    let again = Profile::from_str(&to_yaml(&p.doc).expect("yaml"), "again.yaml").expect("loads back");
    let entries = |p: &Profile| {
        let v = p.doc.kernels.vision.clone().expect("a vision section");
        [v.norm, v.residual_norm].map(|e| e.map(|a| a.value))
    };
    assert_eq!(entries(&again), entries(&p));
    // Without the key: loads, nothing chosen for the fused slot.
    let old = Profile::from_str(&with("    norm: layer_norm_split_cpu\n"), "old.yaml").expect("an old profile loads");
    let (sel, _, _) = old.resolve(&dev, "smollm2-135m", 30).expect("resolves");
    assert!(!sel.slots.contains_key(&(Slot::VisionResidualNorm, Regime::Vision)));
    assert!(sel.slots.contains_key(&(Slot::VisionNorm, Regime::Vision)));
    // The unfused op's kernel is not the slot's.
    let (_, _, msg) = err(&with("    residual_norm: layer_norm_split_cpu\n"));
    assert!(msg.contains("vision.residual_norm") && msg.contains("computes layer_norm") && msg.contains("residual_layer_norm"), "{msg}");
    let schema = ktune::profile::json_schema();
    let vd = &schema["$defs"]["VisionDoc"];
    assert!(vd["properties"]["residual_norm"].is_object(), "{vd}");
    assert!(!vd["required"].as_array().cloned().unwrap_or_default().iter().any(|r| r == "residual_norm"), "{vd}");
}

/// The vision slots (`kernels.vision`): they resolve into the selection under the
/// `vision` regime; a profile without them (every profile written before they
/// existed) leaves the tower its defaults; an unknown kernel, one of another op
/// or of another backend than the profile's (the tower runs on the profile's
/// device), per-regime entries and vision entries in a layer override or a
/// format are refused with the reason.
#[test]
fn vision_slots_resolve_and_bad_ones_are_refused() {
    use ktune::plan::{Regime, Slot};
    let dev = ktune::device::Device::Cpu(ktune::device::CpuCaps::detect());
    let text = GOOD.replace(
        "  rope: rope_table_cpu\n",
        "  rope: rope_table_cpu\n  vision:\n    patch_embed: patch_embed_direct_cpu\n    attention: attention_full_rows_cpu\n    \
         mlp: linear_dot_cpu\n    norm: layer_norm_split_cpu\n    pool: avg_pool_separable_cpu\n    projector: gemm_crate_cpu\n",
    );
    let p = Profile::from_str(&text, "v.yaml").expect("loads");
    let (sel, _, _) = p.resolve(&dev, "smollm2-135m", 30).expect("resolves");
    let got: Vec<(Slot, &str)> =
        Slot::VISION.iter().filter_map(|&s| sel.slots.get(&(s, Regime::Vision)).map(|c| (s, c.kernel.id))).collect();
    assert_eq!(
        got,
        [
            (Slot::VisionPatchEmbed, "patch_embed_direct_cpu"),
            (Slot::VisionAttention, "attention_full_rows_cpu"),
            (Slot::VisionMlp, "linear_dot_cpu"),
            (Slot::VisionNorm, "layer_norm_split_cpu"),
            (Slot::VisionPool, "avg_pool_separable_cpu"),
            (Slot::Projector, "gemm_crate_cpu"),
        ]
    );
    // Written back, the section reads the same.
    let again = Profile::from_str(&to_yaml(&p.doc).expect("yaml"), "again.yaml").expect("loads back");
    let entries = |p: &Profile| {
        let v = p.doc.kernels.vision.clone().expect("a vision section");
        [v.patch_embed, v.attention, v.mlp, v.norm, v.pool, v.projector].map(|e| e.map(|a| a.value))
    };
    assert_eq!(entries(&again), entries(&p));
    // No vision section: nothing chosen for the tower.
    let (sel, _, _) = Profile::from_str(GOOD, "g.yaml").expect("loads").resolve(&dev, "smollm2-135m", 30).expect("resolves");
    assert!(sel.slots.keys().all(|(s, r)| !s.is_vision() && *r != Regime::Vision));
    // An unknown kernel: its position and the slot's kernels.
    let (line, _, msg) = err(&text.replace("mlp: linear_dot_cpu", "mlp: linear_turbo_cpu"));
    assert_eq!(line, 23, "{msg}");
    assert!(msg.contains("vision.mlp") && msg.contains("unknown kernel `linear_turbo_cpu`"), "{msg}");
    assert!(msg.contains("linear_blocked_cpu") && msg.contains("linear_dot_cpu"), "lists the valid kernels: {msg}");
    // A kernel of another op.
    let (_, _, msg) = err(&text.replace("pool: avg_pool_separable_cpu", "pool: layer_norm_split_cpu"));
    assert!(msg.contains("vision.pool") && msg.contains("computes layer_norm") && msg.contains("avg_pool"), "{msg}");
    // A WGSL kernel in a CPU profile.
    let (_, _, msg) = err(&text.replace("attention: attention_full_rows_cpu", "attention: attention_full_rows"));
    assert!(msg.contains("vision.attention") && msg.contains("`attention_full_rows` is a wgsl kernel"), "{msg}");
    let flash = |m: &str| (m.matches("attention_full_flash").count(), m.matches("attention_full_flash_cpu").count());
    assert!(flash(&msg).1 == 1 && flash(&msg).0 == 1, "lists the CPU kernels only: {msg}");
    // One kernel per vision slot: no prefill/decode entries.
    let (_, _, msg) = err(&text.replace("norm: layer_norm_split_cpu", "norm: {prefill: layer_norm_split_cpu}"));
    assert!(msg.contains("vision.norm") && msg.contains("no prefill or decode"), "{msg}");
    // Not per layer, not per format.
    let bad = GOOD.replace("  6-7:\n    norm: rms_norm_split_cpu\n", "  6-7:\n    vision:\n      norm: layer_norm_split_cpu\n");
    let (_, _, msg) = err(&bad);
    assert!(msg.contains("layers.6-7") && msg.contains("vision"), "{msg}");
    let bad = GOOD.replace(
        "  rope: rope_table_cpu\n",
        "  rope: rope_table_cpu\n  formats:\n    q6_k:\n      vision:\n        norm: layer_norm_split_cpu\n",
    );
    let e = Profile::from_str(&bad, "f.yaml").expect_err("vision under a format").to_string();
    assert!(e.contains("formats.q6_k") && e.contains("vision"), "{e}");
}

/// The profile's storage dtype names are the format list's: the schema's
/// `StorageDtype` enum is exactly `DType::ALL`'s names in order, each loads as
/// `execution.weightDtype` and writes back the same.
#[test]
fn schema_lists_the_storage_dtypes_of_the_format_list() {
    let schema = ktune::profile::json_schema();
    let names: Vec<String> = schema["$defs"]["StorageDtype"]["enum"]
        .as_array()
        .expect("an enum")
        .iter()
        .map(|v| v.as_str().expect("a name").to_string())
        .collect();
    assert_eq!(names, ktune::kernels::DType::ALL.map(|d| d.name().to_string()).to_vec());
    for d in ktune::kernels::DType::ALL {
        let text = GOOD.replace("execution:\n", &format!("execution:\n  weightDtype: {d}\n"));
        let p = Profile::from_str(&text, "d.yaml").unwrap_or_else(|e| panic!("{d}: {e}\n{text}"));
        assert_eq!(p.doc.execution.weight_dtype.dtype(), d);
        assert!(to_yaml(&p.doc).expect("yaml").contains(&format!("weightDtype: {d}\n")), "{d}");
    }
    let (_, _, msg) = err(&GOOD.replace("execution:\n", "execution:\n  weightDtype: Q4_K\n"));
    assert!(msg.contains("Q4_K") && msg.contains("q4_k"), "{msg}");
}
