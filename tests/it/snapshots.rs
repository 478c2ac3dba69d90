//! Snapshots (insta, `tests/snapshots/`) of what the CLI prints: `list-devices`,
//! `kernels`, `diff-profiles` and `profiles`, in each output format. They pin
//! today's bytes, so a change of the output layer shows up as a snapshot diff.
//!
//! What differs between machines is taken out, each time only after checking its
//! shape, so that a snapshot passes on a 2-core CI machine with lavapipe, on a
//! machine with a hardware GPU and on one with no GPU at all:
//! - the CPU (model name, arch, thread count, SIMD features, cache sizes) and every
//!   fingerprint become placeholders; so do device indices (the CPU comes after
//!   the GPUs) and the kernel set hash (it changes with every shader edit);
//! - GPU entries are dropped from the `list-devices` snapshots; the first one, when
//!   there is one, is checked on its own with every value replaced by its type;
//! - the CPU kernels' validity on the device (it depends on the CPU) becomes a
//!   placeholder (the WGSL kernels' "not on the CPU" is kept);
//! - table padding is taken out (column widths follow the widest cell, which is
//!   machine-specific): a run of `─` becomes one, each cell is padded by one space.
//!
//! The profiles are the hand-written `tests/fixtures/profiles/{a,b}.yaml`, so their
//! outputs are pinned byte for byte, with no tune (paths to the temporary cache
//! become `[cache]`).
//!
//! The `kernels` snapshots take one op each (`rms_norm`, `layer_norm`): they pin the
//! format, and a kernel added to another family does not move them.
//!
//! Update after an intended change: `INSTA_UPDATE=always cargo test --test snapshots`
//! (or `cargo insta review`), then review the `.snap` diffs. Under `CI=true` insta
//! never writes: a mismatch fails.

use std::path::Path;

use crate::common::{ktune_in, tempdir};
use regex::Regex;

/// Runs the binary from the repository root with its cache in `cache`: (stdout, exit code).
fn run(cache: &Path, args: &[&str]) -> (String, i32) {
    let o = ktune_in(cache).current_dir(env!("CARGO_MANIFEST_DIR")).args(args).output().expect("runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let code = o.status.code().unwrap_or_else(|| panic!("ktune {args:?} was killed: {stderr}"));
    (String::from_utf8(o.stdout).expect("utf-8 output"), code)
}

/// [`run`], which must exit 0.
fn ok(cache: &Path, args: &[&str]) -> String {
    let (out, code) = run(cache, args);
    assert_eq!(code, 0, "ktune {args:?}");
    out
}

/// Asserts the snapshot `name` of `text` with the regex `filters` applied.
fn snapshot(name: &str, text: &str, filters: &[(&str, &str)]) {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(true);
    settings.set_omit_expression(true);
    for (re, with) in filters {
        settings.add_filter(re, *with);
    }
    settings.bind(|| insta::assert_snapshot!(name, text));
}

/// Takes the padding out of tables (sharp style): each run of `─` in a border line
/// becomes one, each cell of a content line is trimmed and padded by one space.
/// Other lines are kept as they are.
fn normalize_table(text: &str) -> String {
    let run = Regex::new("─+").expect("regex");
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with('│') && line.ends_with('│') {
            let cells: Vec<&str> = line.split('│').collect();
            let inner: Vec<String> = cells[1..cells.len() - 1].iter().map(|c| format!(" {} ", c.trim())).collect();
            out.push(format!("│{}│", inner.join("│")));
        } else if line.starts_with(['┌', '├', '└']) {
            out.push(run.replace_all(line, "─").into_owned());
        } else {
            out.push(line.to_string());
        }
    }
    let mut s = out.join("\n");
    if text.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// The cells of a table's content line.
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.strip_prefix('│')?.strip_suffix('│')?;
    Some(inner.split('│').map(str::trim).collect())
}

/// What `list-devices --format json` says about the CPU.
struct CpuFacts {
    model: String,
    features: Vec<String>,
    devices: serde_json::Value,
}

fn cpu_facts(json: &str) -> CpuFacts {
    let v: serde_json::Value = serde_json::from_str(json).expect("list-devices JSON");
    let cpu = v["devices"].as_array().expect("devices").iter().find(|d| d["kind"] == "cpu").expect("a CPU entry").clone();
    let model = cpu["cpu"]["model"].as_str().expect("cpu.model").to_string();
    assert_eq!(cpu["name"].as_str(), Some(model.as_str()), "the CPU entry is named after its model");
    let features = cpu["cpu"]["features"].as_array().expect("features").iter().map(|f| f.as_str().expect("feature").to_string()).collect();
    CpuFacts { model, features, devices: v }
}

/// `text` with the CPU model name (also as a JSON string) replaced.
fn without_cpu_model(text: &str, cpu: &CpuFacts) -> String {
    assert!(!cpu.model.trim().is_empty(), "the CPU has a model name");
    let quoted = serde_json::to_string(&cpu.model).expect("json string");
    text.replace(&quoted, "\"[cpu model]\"").replace(&cpu.model, "[cpu model]")
}

/// The `devices` entries of the pretty-printed `list-devices` JSON, each as its
/// lines (an entry opens with `    {` and closes with `    }` or `    },`), with the
/// text before and after them.
fn split_device_entries(json: &str) -> (Vec<&str>, Vec<Vec<&str>>, Vec<&str>) {
    let lines: Vec<&str> = json.lines().collect();
    let open = lines.iter().position(|l| *l == "  \"devices\": [").expect("a devices array");
    let close = lines.iter().position(|l| *l == "  ],").expect("the end of the devices array");
    let mut entries: Vec<Vec<&str>> = Vec::new();
    for l in &lines[open + 1..close] {
        if *l == "    {" {
            entries.push(Vec::new());
        }
        entries.last_mut().expect("an entry opens with `    {`").push(l);
    }
    (lines[..=open].to_vec(), entries, lines[close..].to_vec())
}

const SIZE: &str = r"(?:-|\d+ KiB|\d+\.\d MiB|\d+\.\d GiB)";

/// `list-devices --format json`: the CPU entry (GPU entries dropped) with the
/// machine's values replaced, then the first GPU entry's keys and value types.
#[test]
fn list_devices_json() {
    let tmp = tempdir();
    let json = ok(tmp.path(), &["list-devices", "--format", "json"]);
    let cpu = cpu_facts(&json);
    let (head, entries, tail) = split_device_entries(&json);
    let is_gpu = |e: &Vec<&str>| e.iter().any(|l| l.trim() == "\"kind\": \"gpu\",");
    let n_gpus = cpu.devices["devices"].as_array().expect("devices").iter().filter(|d| d["kind"] == "gpu").count();
    assert_eq!(entries.iter().filter(|e| is_gpu(e)).count(), n_gpus, "every GPU entry found in the text");
    let kept: Vec<String> = entries.iter().filter(|e| !is_gpu(e)).map(|e| e.join("\n").trim_end_matches(',').to_string()).collect();
    let text = format!("{}\n{}\n{}\n", head.join("\n"), kept.join(",\n"), tail.join("\n"));
    snapshot(
        "list_devices_json",
        &without_cpu_model(&text, &cpu),
        &[
            (r#""(default_)?index": \d+"#, r#""${1}index": [index]"#),
            (r#""fingerprint": "[0-9a-f]{64}""#, r#""fingerprint": "[fingerprint]""#),
            (r#""arch": "[a-z0-9_]+""#, r#""arch": "[arch]""#),
            (r#""threads": [1-9]\d*"#, r#""threads": [threads]"#),
            (r#""cache_(l1d|l2|l3)": \d+"#, r#""cache_$1": [bytes]"#),
            (r#""features": (\[\]|\[\n( *"[a-z0-9._-]+",?\n)+ *\])"#, r#""features": [cpu features]"#),
        ],
    );

    let Some(gpu) = entries.iter().find(|e| is_gpu(e)) else {
        assert!(!ktune::testing::gpu_required(), "a GPU adapter is required (CI / KTUNE_REQUIRE_GPU=1) but list-devices shows none");
        eprintln!("\n!!!! list_devices_json: no GPU adapter, the GPU entry's shape is not checked !!!!\n");
        return;
    };
    snapshot(
        "list_devices_json_gpu_entry_shape",
        &format!("{}\n", gpu.join("\n").trim_end_matches(',')),
        &[
            (r#": "(?:[^"\\]|\\.)*""#, r#": "[string]""#),
            (r": -?\d+(?:\.\d+)?(?:e-?\d+)?", ": [number]"),
            (r": (?:true|false)", ": [bool]"),
            (r"(?m)^( +)\d+(,?)$", "$1[number]$2"),
        ],
    );
}

/// `list-devices` as a table: the header, the CPU row with the machine's values
/// replaced, the footer. GPU rows are dropped; each is checked against the row format.
#[test]
fn list_devices_table() {
    let tmp = tempdir();
    let cpu = cpu_facts(&ok(tmp.path(), &["list-devices", "--format", "json"]));
    let table = normalize_table(&ok(tmp.path(), &["list-devices"]));
    let header = table.lines().find_map(cells).expect("a header row");
    let backend = header.iter().position(|c| *c == "backend").expect("a backend column");
    let gpu_row = Regex::new(&format!(
        r"^│ \d+\*? │ .+ │ \S+ │ \S+( \(software\))? │ [0-9a-f]{{4,}}:[0-9a-f]{{4,}} │ .* │ (f16|subgroups \d+-\d+|timestamps( in passes)?|, )* │ wg mem {SIZE}, \d+ inv/wg, wg \d+x\d+x\d+, binding {SIZE}, buffer {SIZE} │ [0-9a-f]{{12}} │$"
    ))
    .expect("regex");
    let column = |name: &str| header.iter().position(|c| *c == name).unwrap_or_else(|| panic!("a {name} column"));
    let (name_col, features_col) = (column("name"), column("features"));
    let mut kept = Vec::new();
    let mut gpus = 0;
    for line in table.lines() {
        match cells(line) {
            Some(c) if c[backend] != "cpu" && c[backend] != "backend" => {
                assert!(gpu_row.is_match(line), "a GPU row of another format:\n{line}");
                gpus += 1;
            }
            Some(mut c) if c[backend] == "cpu" => {
                assert_eq!(c[name_col], cpu.model, "the CPU row is named after its model");
                assert_eq!(c[features_col], cpu.features.join(" "), "the CPU row lists its features");
                c[name_col] = "[cpu model]";
                c[features_col] = "[cpu features]";
                kept.push(format!("│ {} │", c.join(" │ ")));
            }
            _ => kept.push(line.to_string()),
        }
    }
    let n_gpus = cpu.devices["devices"].as_array().expect("devices").iter().filter(|d| d["kind"] == "gpu").count();
    assert_eq!(gpus, n_gpus, "one row per GPU");
    snapshot(
        "list_devices_table",
        &(kept.join("\n") + "\n"),
        &[
            (r"(?m)^│ \d+\*? │ \[cpu model\] │ cpu │ Cpu \([a-z0-9_]+\) │", "│ [index] │ [cpu model] │ cpu │ Cpu ([arch]) │"),
            (
                &format!(r"│ [1-9]\d* threads, L1d {SIZE}, L2 {SIZE}, L3 {SIZE} │"),
                "│ [threads] threads, L1d [size], L2 [size], L3 [size] │",
            ),
            (r"(?m)│ [0-9a-f]{12} │$", "│ [fingerprint] │"),
        ],
    );
}

/// Filters of the `kernels` outputs on the CPU: device fingerprint, kernel set hash.
const KERNEL_FILTERS: &[(&str, &str)] = &[
    (r"(?m)^device: \[cpu model\] \[cpu\] [0-9a-f]{12}$", "device: [cpu model] [cpu] [fingerprint]"),
    (r#""fingerprint": "[0-9a-f]{64}""#, r#""fingerprint": "[fingerprint]""#),
    (r#""kernel_set_hash": "[0-9a-f]{64}""#, r#""kernel_set_hash": "[kernel set hash]""#),
];

/// Why a WGSL kernel is not valid on the CPU: the same on every machine, so kept.
const WGSL_ON_CPU: &str = "WGSL kernel; select a GPU adapter";

/// The kernels' validity on this CPU (`yes` or `no (why)`, which depends on the
/// CPU) replaced, but for the WGSL kernels' [`WGSL_ON_CPU`], in a table or in JSON.
fn without_cpu_validity(text: &str) -> String {
    let cell = Regex::new(r"│ (f32|f16|q8_0|q4_0|q4_1): (?:yes|no \(([^│]*)\)) │").expect("regex");
    let text = cell.replace_all(text, |c: &regex::Captures<'_>| match c.get(2) {
        Some(why) if why.as_str() == WGSL_ON_CPU => c[0].to_string(),
        _ => format!("│ {}: [validity] │", &c[1]),
    });
    let json = Regex::new(r#""valid": (?:true|false,\n *"reason": "((?:[^"\\]|\\.)*)")\n"#).expect("regex");
    json.replace_all(&text, |c: &regex::Captures<'_>| match c.get(1) {
        Some(why) if why.as_str() == WGSL_ON_CPU => c[0].to_string(),
        _ => "\"valid\": [validity]\n".to_string(),
    })
    .into_owned()
}

fn kernels_snapshot(name: &str, args: &[&str]) {
    let tmp = tempdir();
    let cpu = cpu_facts(&ok(tmp.path(), &["list-devices", "--format", "json"]));
    let mut all = vec!["kernels", "--device", "cpu"];
    all.extend(args);
    let out = ok(tmp.path(), &all);
    let text = if args.contains(&"json") { out } else { normalize_table(&out) };
    snapshot(name, &without_cpu_validity(&without_cpu_model(&text, &cpu)), KERNEL_FILTERS);
}

#[test]
fn kernels_table_one_op() {
    kernels_snapshot("kernels_table_op_rms_norm", &["--op", "rms_norm"]);
}

#[test]
fn kernels_json_one_op() {
    kernels_snapshot("kernels_json_op_layer_norm", &["--op", "layer_norm", "--format", "json"]);
}

const A: &str = "tests/fixtures/profiles/a.yaml";
const B: &str = "tests/fixtures/profiles/b.yaml";

/// b.yaml changes a kernel and regresses decode (exit 1), in every format.
#[test]
fn diff_profiles_outputs() {
    let tmp = tempdir();
    for (format, name) in [("table", "diff_profiles_table"), ("markdown", "diff_profiles_markdown"), ("json", "diff_profiles_json")] {
        let (out, code) = run(tmp.path(), &["diff-profiles", A, B, "--format", format]);
        assert_eq!(code, 1, "a regression is exit 1");
        snapshot(name, &out, &[]);
    }
    let (out, code) = run(tmp.path(), &["diff-profiles", A, A]);
    assert_eq!(code, 0);
    snapshot("diff_profiles_table_identical", &out, &[]);
}

/// A profile in an isolated cache: `profiles list` (table and JSON), `show` (by key
/// prefix, by name and by file: the same text), `path`.
#[test]
fn profiles_outputs() {
    let tmp = tempdir();
    let cache = tmp.path().join("cache");
    let key = "5eed5eed0123456789abcdef0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(cache.join("profiles")).expect("mkdir");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(A), cache.join("profiles").join(format!("{key}.yaml"))).expect("copy");
    let root = cache.display().to_string();
    let paths = [(root.as_str(), "[cache]")];
    let redact = |s: String| paths.iter().fold(s, |s, (from, to)| s.replace(from, to));

    snapshot("profiles_list_table", &redact(ok(&cache, &["profiles", "list"])), &[]);
    snapshot("profiles_list_json", &redact(ok(&cache, &["profiles", "list", "--format", "json"])), &[]);
    let show = ok(&cache, &["profiles", "show", &key[..8]]);
    assert_eq!(ok(&cache, &["profiles", "show", "snapshot-a"]), show, "by name");
    assert_eq!(ok(&cache, &["profiles", "show", A]), show, "a file");
    snapshot("profiles_show", &show, &[]);
    snapshot("profiles_path", &redact(ok(&cache, &["profiles", "path", &key[..8]])), &[]);
    snapshot("profiles_path_root", &redact(ok(&cache, &["profiles", "path"])), &[]);
}
