//! All formatting: human tables (tabled), JSON, progress bars. Commands build
//! reports; only this module turns them into text.

use std::io::Write;

use tabled::settings::Style;
use tabled::{Table, Tabled};

use crate::Result;
use crate::cli::Format;
use crate::commands::kernels::KernelsReport;
use crate::commands::list_devices::DevicesReport;

/// Writes rendered output to stdout.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub fn progress(len: u64, what: &'static str) -> Option<indicatif::ProgressBar> {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(what);
    Some(pb)
}

fn short(fp: &str) -> String {
    fp.chars().take(12).collect()
}

fn bytes(b: u64) -> String {
    if b == 0 {
        "-".into()
    } else if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} KiB", b / 1024)
    }
}

#[derive(Tabled)]
struct DeviceRow {
    #[tabled(rename = "#")]
    index: String,
    name: String,
    backend: String,
    #[tabled(rename = "type")]
    device_type: String,
    ids: String,
    driver: String,
    features: String,
    limits: String,
    fingerprint: String,
}

pub fn devices(r: &DevicesReport, format: Format) -> Result<String> {
    if format == Format::Json {
        return Ok(serde_json::to_string_pretty(r)?);
    }
    let rows: Vec<DeviceRow> = r
        .devices
        .iter()
        .map(|d| {
            let mark = if d.index == r.default_index { "*" } else { "" };
            match (&d.gpu, &d.caps, &d.cpu) {
                (Some(g), Some(c), _) => {
                    let mut feats = Vec::new();
                    if c.shader_f16 {
                        feats.push("f16".to_string());
                    }
                    if c.subgroups {
                        feats.push(format!("subgroups {}-{}", c.subgroup_min_size, c.subgroup_max_size));
                    }
                    if c.timestamp_query {
                        feats.push("timestamps".into());
                    }
                    DeviceRow {
                        index: format!("{}{mark}", d.index),
                        name: g.name.clone(),
                        backend: g.backend.clone(),
                        device_type: format!("{}{}", g.device_type, if g.software { " (software)" } else { "" }),
                        ids: format!("{:04x}:{:04x}", g.vendor_id, g.device_id),
                        driver: format!("{} {}", g.driver, g.driver_info).trim().to_string(),
                        features: feats.join(", "),
                        limits: format!(
                            "wg mem {}, {} inv/wg, wg {}x{}x{}, binding {}, buffer {}",
                            bytes(c.max_workgroup_storage as u64),
                            c.max_invocations_per_workgroup,
                            c.max_workgroup_size[0],
                            c.max_workgroup_size[1],
                            c.max_workgroup_size[2],
                            bytes(c.max_storage_binding),
                            bytes(c.max_buffer_size)
                        ),
                        fingerprint: short(&d.fingerprint),
                    }
                }
                (_, _, Some(c)) => DeviceRow {
                    index: format!("{}{mark}", d.index),
                    name: c.model.clone(),
                    backend: "cpu".into(),
                    device_type: format!("Cpu ({})", c.arch),
                    ids: "-".into(),
                    driver: "-".into(),
                    features: c.features.join(" "),
                    limits: format!(
                        "{} threads, L1d {}, L2 {}, L3 {}",
                        c.threads,
                        bytes(c.cache_l1d),
                        bytes(c.cache_l2),
                        bytes(c.cache_l3)
                    ),
                    fingerprint: short(&d.fingerprint),
                },
                _ => DeviceRow {
                    index: d.index.to_string(),
                    name: d.name.clone(),
                    backend: d.backend.clone(),
                    device_type: d.device_type.clone(),
                    ids: "-".into(),
                    driver: "-".into(),
                    features: "-".into(),
                    limits: "-".into(),
                    fingerprint: short(&d.fingerprint),
                },
            }
        })
        .collect();
    let mut t = Table::new(rows);
    t.with(Style::sharp());
    Ok(format!("{t}\n* default device (--device picks another)"))
}

#[derive(Tabled)]
struct KernelLine {
    id: String,
    op: String,
    backend: String,
    dtypes: String,
    params: String,
    #[tabled(rename = "on this device")]
    valid: String,
    #[tabled(rename = "verify")]
    verify: String,
}

pub fn kernels(r: &KernelsReport, format: Format) -> Result<String> {
    if format == Format::Json {
        return Ok(serde_json::to_string_pretty(r)?);
    }
    let rows: Vec<KernelLine> = r
        .kernels
        .iter()
        .map(|k| KernelLine {
            id: k.id.to_string(),
            op: k.op.to_string(),
            backend: k.backend.to_string(),
            dtypes: k.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(","),
            params: k.params.iter().map(|p| format!("{}={:?}", p.name, p.values).replace(' ', "")).collect::<Vec<_>>().join("\n"),
            valid: k
                .validity
                .iter()
                .map(|v| match &v.reason {
                    None => format!("{}: yes", v.dtype),
                    Some(r) => format!("{}: no ({r})", v.dtype),
                })
                .collect::<Vec<_>>()
                .join("\n"),
            verify: match &k.verify {
                None => "-".into(),
                Some(v) if v.checks == 0 => format!("not run: {}", v.not_run.clone().unwrap_or_default()),
                Some(v) if v.failed == 0 => format!("ok {} checks, max rel err {:.1e}", v.checks, v.worst_rel_err),
                Some(v) => {
                    let first = &v.failures[0];
                    format!(
                        "FAIL {}/{} (rel err {:.1e} > {:.0e}; {} {}{})",
                        v.failed,
                        v.checks,
                        first.rel_err,
                        first.tolerance,
                        first.problem,
                        first.dtype,
                        first.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
                    )
                }
            },
        })
        .collect();
    let mut t = Table::new(rows);
    t.with(Style::sharp());
    let mut s = format!("device: {} [{}] {}\n{t}", r.device, r.backend, short(&r.fingerprint));
    if r.verified {
        let (checks, failed) = r.checks();
        s.push_str(&format!("\n{} passed, {} failed", checks - failed, failed));
    }
    Ok(s)
}

/// `ktune run`: throughput, generated ids, kernels and time per slot.
pub fn run(r: &crate::commands::run::RunReport, format: Format) -> Result<String> {
    if format == Format::Json {
        return Ok(serde_json::to_string_pretty(r)?);
    }
    let mut s = String::new();
    s.push_str(&format!("device:   {} [{}] {}\n", r.device, r.backend, short(&r.fingerprint)));
    s.push_str(&format!("model:    {} ({} layers, weights: {})\n", r.model, r.layers, r.weights));
    s.push_str(&format!(
        "profile:  {} | weights {} | kv cache {} | batchCommands {}\n",
        r.profile.as_deref().unwrap_or("(runtime defaults)"),
        r.weight_dtype,
        r.kv_dtype,
        r.batch_commands
    ));
    let f = &r.fusion;
    s.push_str(&format!(
        "fusion:   qkv {} | gate_up {} | qk_norm_rope {} | residual_norm {}\n",
        f.qkv, f.gate_up, f.qk_norm_rope, f.residual_norm
    ));
    s.push_str(&format!(
        "prefill:  {} tokens in {:.2} ms = {:.1} tokens/s\n",
        r.prompt_tokens,
        r.prefill_seconds * 1e3,
        r.prefill_tokens_per_sec
    ));
    s.push_str(&format!(
        "decode:   {} tokens in {:.2} ms = {:.2} tokens/s ({} of weights per token = {:.1} GB/s)\n",
        r.decode_tokens,
        r.decode_seconds * 1e3,
        r.decode_tokens_per_sec,
        bytes(r.weight_bytes),
        r.decode_gbps
    ));
    s.push_str(&format!("dispatches per layer (decode): {}\n", r.dispatches_per_layer));
    if let Some(p) = &r.prompt {
        s.push_str(&format!("prompt:   {p:?} = {:?}\n", r.prompt_ids));
    }
    s.push_str(&format!("generated: {:?}\n", r.generated));
    if let Some(t) = &r.text {
        s.push_str(&format!("text:     {t:?}\n"));
    }
    for w in &r.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    #[derive(Tabled)]
    struct K<'a> {
        slot: &'a str,
        kernel: &'a str,
    }
    let ks: Vec<K<'_>> = r.kernels.iter().map(|(a, b)| K { slot: a, kernel: b }).collect();
    s.push_str(&Table::new(ks).with(Style::sharp()).to_string());
    s.push('\n');
    #[derive(Tabled)]
    struct T {
        slot: String,
        #[tabled(rename = "prefill ms")]
        prefill: String,
        #[tabled(rename = "decode ms/token")]
        decode: String,
    }
    let ts: Vec<T> = r
        .slots
        .iter()
        .map(|x| T { slot: x.slot.to_string(), prefill: format!("{:.3}", x.prefill_ms), decode: format!("{:.3}", x.decode_ms_per_token) })
        .collect();
    s.push_str(&Table::new(ts).with(Style::sharp()).to_string());
    Ok(s)
}
