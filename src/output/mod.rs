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
        match &r.weight_storage {
            Some(st) if st != r.weight_dtype.name() => format!("{} (stored {st})", r.weight_dtype),
            _ => r.weight_dtype.to_string(),
        },
        r.kv_dtype,
        r.batch_commands
    ));
    let f = &r.fusion;
    s.push_str(&format!(
        "fusion:   qkv {} | gate_up {} | qk_norm_rope {} | residual_norm {} | norm_matmul {}\n",
        f.qkv, f.gate_up, f.qk_norm_rope, f.residual_norm, f.norm_matmul
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

/// Generated text on stdout as it is produced (`ktune run`, table format),
/// ended by a newline once something was written.
pub struct TextStream {
    wrote: bool,
}

impl TextStream {
    pub fn new() -> TextStream {
        TextStream { wrote: false }
    }

    /// Writes `piece` and flushes (a closed stdout is not an error here: the report says it again).
    pub fn piece(&mut self, piece: &str) {
        let mut out = std::io::stdout().lock();
        if !self.wrote {
            let _ = out.write_all(b"output:   ");
        }
        let _ = out.write_all(piece.as_bytes());
        let _ = out.flush();
        self.wrote = true;
    }

    pub fn finish(self) {
        if self.wrote {
            let _ = std::io::stdout().lock().write_all(b"\n");
        }
    }
}

impl Default for TextStream {
    fn default() -> Self {
        TextStream::new()
    }
}

/// A warning on stderr.
pub fn warn(msg: &str) {
    eprintln!("ktune: warning: {msg}");
}

/// The tuner's progress on stderr: one bar per phase (indicatif), notes above it.
pub struct TuneProgress {
    bar: std::sync::Mutex<Option<indicatif::ProgressBar>>,
    start: std::time::Instant,
}

impl TuneProgress {
    pub fn new() -> TuneProgress {
        TuneProgress { bar: std::sync::Mutex::new(None), start: std::time::Instant::now() }
    }
}

impl Default for TuneProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl crate::tuner::Progress for TuneProgress {
    fn phase(&self, msg: &str, len: u64) {
        if let Ok(mut b) = self.bar.lock() {
            if let Some(old) = b.take() {
                old.finish_and_clear();
            }
            let pb = indicatif::ProgressBar::new(len);
            pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] [{bar:30}] {pos}/{len} {msg}") {
                pb.set_style(style.progress_chars("=> "));
            }
            pb.set_message(msg.to_string());
            // Without a terminal the bar is hidden: log the phase with its start time.
            if pb.is_hidden() {
                eprintln!("ktune: [{:7.1} s] {msg}", self.start.elapsed().as_secs_f64());
            }
            *b = Some(pb);
        }
    }
    fn tick(&self) {
        if let Ok(b) = self.bar.lock()
            && let Some(pb) = b.as_ref()
        {
            pb.inc(1);
        }
    }
    fn note(&self, msg: &str) {
        match self.bar.lock().ok().and_then(|b| b.clone()) {
            Some(pb) => pb.println(format!("ktune: {msg}")),
            None => eprintln!("ktune: {msg}"),
        }
    }
    fn done(&self) {
        if let Ok(mut b) = self.bar.lock()
            && let Some(pb) = b.take()
        {
            pb.finish_and_clear();
        }
    }
}

pub fn tune(r: &crate::commands::tune::TuneReport, format: Format) -> Result<String> {
    if format == Format::Json {
        return Ok(serde_json::to_string_pretty(r)?);
    }
    let mut s = String::new();
    s.push_str(&format!("model:    {}\ndevice:   {}\n", r.model, r.device));
    s.push_str(&format!("profile:  {}{}\n", r.path.display(), if r.cached { " (cached; --force re-tunes)" } else { "" }));
    if let Some(o) = &r.output {
        s.push_str(&format!("written:  {}\n", o.display()));
    }
    let Some(t) = &r.profile.tuning else { return Ok(s) };
    s.push_str(&format!(
        "tuned:    {} strategy, {:.1} s of {:.0} s budget, timing {}{}\n",
        t.strategy,
        t.used_s,
        t.budget_s,
        t.timing,
        if r.resumed_slots > 0 { format!(", {} slot races resumed from the cache", r.resumed_slots) } else { String::new() }
    ));
    s.push_str(&format!(
        "space:    {} valid variants, {} ruled out, {} complete combinations over {} fusion choices\n",
        t.space.variants,
        t.space.ruled_out.values().sum::<usize>(),
        t.space.combinations,
        t.space.fusion_choices
    ));
    s.push_str(&format!("limit:    {:.1} GB/s read ({})\n", t.limits.read_gbps, t.limits.read_source));
    #[derive(Tabled)]
    struct Row {
        slot: String,
        regime: String,
        chosen: String,
        #[tabled(rename = "median µs")]
        median: String,
        #[tabled(rename = "95% CI µs")]
        ci: String,
        #[tabled(rename = "GB/s")]
        gbps: String,
        #[tabled(rename = "% BW")]
        pct: String,
        #[tabled(rename = "GFLOP/s")]
        gflops: String,
        cands: String,
    }
    let rows: Vec<Row> = t
        .slots
        .iter()
        .map(|x| {
            let c = x.candidates.iter().find(|c| c.variant.to_string() == x.chosen);
            Row {
                slot: x.slot.clone(),
                regime: x.regime.clone(),
                chosen: x.chosen.clone(),
                median: c.map(|c| format!("{:.1}", c.median_us)).unwrap_or_default(),
                ci: c.map(|c| format!("{:.1}–{:.1}", c.ci_us[0], c.ci_us[1])).unwrap_or_default(),
                gbps: c.map(|c| format!("{:.1}", c.gbps)).unwrap_or_default(),
                pct: c.map(|c| format!("{:.0}%", c.pct_of_bandwidth)).unwrap_or_default(),
                gflops: c.map(|c| format!("{:.1}", c.gflops)).unwrap_or_default(),
                cands: format!("{} timed, {} rejected", x.candidates.len(), x.rejected.len()),
            }
        })
        .collect();
    s.push_str(&Table::new(rows).with(Style::sharp()).to_string());
    s.push('\n');
    let e = &t.end_to_end;
    #[derive(Tabled)]
    struct E {
        combination: String,
        #[tabled(rename = "prefill tok/s")]
        prefill: String,
        #[tabled(rename = "decode tok/s")]
        decode: String,
        #[tabled(rename = "predicted ms")]
        predicted: String,
        chosen: String,
    }
    let es: Vec<E> = e
        .combinations
        .iter()
        .map(|c| E {
            combination: c.label.clone(),
            prefill: format!("{:.1}", c.result.prefill_tok_s),
            decode: format!("{:.2}", c.result.decode_tok_s),
            predicted: if c.predicted_ms > 0.0 { format!("{:.1}", c.predicted_ms) } else { "-".into() },
            chosen: if c.chosen { "✓".into() } else { String::new() },
        })
        .collect();
    s.push_str(&Table::new(es).with(Style::sharp()).to_string());
    s.push('\n');
    s.push_str(&format!(
        "end to end ({} prompt tokens): tuned {:.1} prefill tok/s, {:.2} decode tok/s; runtime default {:.1} / {:.2} ({:+.1}% / {:+.1}%)\n",
        e.prefill_tokens,
        e.tuned.prefill_tok_s,
        e.tuned.decode_tok_s,
        e.default.prefill_tok_s,
        e.default.decode_tok_s,
        (e.tuned.prefill_tok_s / e.default.prefill_tok_s - 1.0) * 100.0,
        (e.tuned.decode_tok_s / e.default.decode_tok_s - 1.0) * 100.0
    ));
    Ok(s)
}

pub fn bench(r: &crate::commands::bench::BenchReport, format: Format) -> Result<String> {
    if format == Format::Json {
        return Ok(serde_json::to_string_pretty(r)?);
    }
    use crate::commands::bench::Estimate;
    let est = |e: &Estimate, d: usize| format!("{:.d$} ({:.d$}–{:.d$})", e.median, e.ci[0], e.ci[1]);
    let pct = |e: &Estimate| format!("{:+.1}% ({:+.1}…{:+.1})", e.median, e.ci[0], e.ci[1]);
    let first = r.entries.first().map(|e| e.name.as_str()).unwrap_or("");
    #[derive(Tabled)]
    struct Row {
        entry: String,
        #[tabled(rename = "prefill tok/s (95% CI)")]
        prefill: String,
        #[tabled(rename = "decode tok/s (95% CI)")]
        decode: String,
        #[tabled(rename = "prefill vs first")]
        prefill_vs: String,
        #[tabled(rename = "decode vs first")]
        decode_vs: String,
    }
    let rows: Vec<Row> = r
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| Row {
            entry: e.name.clone(),
            prefill: est(&e.prefill_tok_s, 1),
            decode: est(&e.decode_tok_s, 2),
            prefill_vs: if i == 0 { "-".into() } else { pct(&e.prefill_vs_first_pct) },
            decode_vs: if i == 0 { "-".into() } else { pct(&e.decode_vs_first_pct) },
        })
        .collect();
    let mut s = format!(
        "model:  {}\ndevice: {}\n{} rounds of a {}-token prefill and {} decode steps per entry, interleaved; changes are medians of per-round ratios against {first}\n",
        r.model, r.device, r.rounds, r.prefill_tokens, r.decode_tokens
    );
    s.push_str(&Table::new(rows).with(Style::sharp()).to_string());
    Ok(s)
}

pub fn profiles(rows: &[crate::commands::profiles::ProfileRow], format: Format) -> Result<String> {
    if format == Format::Json {
        return Ok(serde_json::to_string_pretty(rows)?);
    }
    if rows.is_empty() {
        return Ok("no cached profiles (`ktune tune` makes them)".into());
    }
    #[derive(Tabled)]
    struct Row {
        key: String,
        model: String,
        device: String,
        date: String,
        strategy: String,
        #[tabled(rename = "prefill tok/s")]
        prefill: String,
        #[tabled(rename = "decode tok/s")]
        decode: String,
    }
    let r: Vec<Row> = rows
        .iter()
        .map(|x| Row {
            key: short(&x.key),
            model: x.model.clone(),
            device: x.device.clone(),
            date: x.date.clone(),
            strategy: x.strategy.clone(),
            prefill: format!("{:.1}", x.prefill_tok_s),
            decode: format!("{:.2}", x.decode_tok_s),
        })
        .collect();
    Ok(Table::new(r).with(Style::sharp()).to_string())
}

pub fn diff(r: &crate::profile::diff::DiffReport, format: crate::cli::DiffFormat) -> Result<String> {
    use crate::cli::DiffFormat;
    if format == DiffFormat::Json {
        return Ok(serde_json::to_string_pretty(r)?);
    }
    let md = format == DiffFormat::Markdown;
    let verdict = if r.regressed {
        format!("❌ regression beyond {}% and the noise", r.threshold_pct)
    } else if r.changed {
        "⚠️ choices changed, no regression".to_string()
    } else {
        "✅ no change".to_string()
    };
    let mut s = String::new();
    if md {
        s.push_str(&format!("### ktune profile diff: {verdict}\n\n`{}` → `{}`\n\n", r.a, r.b));
    } else {
        s.push_str(&format!("{} → {}\n{verdict}\n", r.a, r.b));
    }
    for n in &r.notes {
        s.push_str(&format!("{}note: {n}\n", if md { "> " } else { "" }));
    }
    let table = |rows: Vec<[String; 3]>, head: [&str; 3]| -> String {
        let mut b = tabled::builder::Builder::default();
        b.push_record(head);
        for r in rows {
            b.push_record(r);
        }
        let mut t = b.build();
        if md {
            t.with(Style::markdown());
        } else {
            t.with(Style::sharp());
        }
        t.to_string()
    };
    if !r.changes.is_empty() {
        s.push_str(if md { "\n#### Choices\n\n" } else { "\nchoices:\n" });
        s.push_str(&table(r.changes.iter().map(|c| [c.what.clone(), c.old.clone(), c.new.clone()]).collect(), ["what", "old", "new"]));
        s.push('\n');
    }
    let timing = |ds: &[crate::profile::diff::TimeDelta]| -> Vec<[String; 3]> {
        ds.iter()
            .map(|d| {
                let mark = if d.regressed {
                    " ❌"
                } else if d.improved {
                    " ✅"
                } else {
                    ""
                };
                [
                    d.what.clone(),
                    format!("{:.2} → {:.2} {}", d.old, d.new, d.unit),
                    format!("{:+.1}% (noise ±{:.1}%){mark}", d.delta_pct, d.noise_pct),
                ]
            })
            .collect()
    };
    if !r.end_to_end.is_empty() {
        s.push_str(if md { "\n#### End to end\n\n" } else { "\nend to end:\n" });
        s.push_str(&table(timing(&r.end_to_end), ["pass", "time", "change"]));
        s.push('\n');
    }
    if !r.slots.is_empty() {
        s.push_str(if md { "\n#### Slots\n\n" } else { "\nslots:\n" });
        s.push_str(&table(timing(&r.slots), ["slot", "time", "change"]));
        s.push('\n');
    }
    Ok(s)
}
