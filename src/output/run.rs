//! `run` as text: throughput, generated ids, the host's cost per decode token
//! and the GPU's time for it, kernels and time per slot (and how a GPU's were
//! taken); the cells of that cost `bench` shares.

use tabled::Tabled;

use super::{Report, bytes, sharp_table, short};
use crate::report::RunReport;
use crate::runtime::StepTiming;
use crate::runtime::counters::DecodeCounters;

/// Host µs, GPU ms (timestamps) and bytes read back per decode token, as three
/// cells (`-` where not measured; the CPU has no GPU time and reads nothing back).
pub(super) fn decode_cost_cells(c: Option<&DecodeCounters>) -> [String; 3] {
    match c {
        None => ["-".into(), "-".into(), "-".into()],
        Some(c) => [
            format!("{:.0}", c.host_us.total),
            c.gpu_ms.map_or("-".into(), |ms| format!("{ms:.3}")),
            c.gpu.as_ref().map_or("-".into(), |g| format!("{:.0} B", g.read_back_bytes)),
        ],
    }
}

/// The host's cost of a decode token: a line of its phases and, on a GPU, a line
/// of what the device's context did.
fn decode_cost(c: &DecodeCounters) -> String {
    let h = &c.host_us;
    let phases: Vec<String> = [
        ("prepare", Some(h.prepare)),
        ("encode", h.encode),
        ("submit", h.submit),
        ("wait", h.wait),
        ("compute", h.compute),
        ("post", Some(h.post)),
    ]
    .iter()
    .filter_map(|(n, v)| v.map(|v| format!("{n} {v:.0}")))
    .collect();
    let [total, gpu_ms, read] = decode_cost_cells(Some(c));
    let gpu_time = if c.gpu_ms.is_some() { format!("; GPU {gpu_ms} ms per decode token (timestamps)") } else { String::new() };
    let mut s = format!("host:     {total} µs per decode token ({}; mean of {} tokens){gpu_time}\n", phases.join(", "), c.tokens);
    if let Some(g) = &c.gpu {
        s.push_str(&format!(
            "gpu:      per decode token {:.1} dispatches, {:.1} passes, {:.3} submits, {:.3} write_buffer ({:.0} B), {:.1} objects created, {:.3} host waits, {read} read back, embedding on the {}\n",
            g.dispatches,
            g.compute_passes,
            g.submits,
            g.write_buffer_calls,
            g.write_buffer_bytes,
            g.objects_created,
            g.host_waits,
            if g.embedding_on_gpu { "GPU" } else { "host" }
        ));
    }
    s
}

impl Report for RunReport {
    fn table(&self) -> String {
        let r = self;
        let mut s = String::new();
        s.push_str(&format!("device:   {} [{}] {}\n", r.device, r.backend, short(&r.fingerprint)));
        s.push_str(&format!("model:    {} ({} layers, weights: {})\n", r.model, r.layers, r.weights));
        s.push_str(&format!(
            "profile:  {} | weights {} | kv cache {} | batchCommands {}{}\n",
            r.profile.as_deref().unwrap_or("(runtime defaults)"),
            {
                let main = match &r.weight_storage {
                    Some(st) if st != r.weight_dtype.name() => format!("{} (stored {st})", r.weight_dtype),
                    _ => r.weight_dtype.to_string(),
                };
                let others: Vec<String> = r.other_formats.iter().map(|(d, n)| format!("{n} {d}")).collect();
                if others.is_empty() { main } else { format!("{main} + matrices in {}", others.join(", ")) }
            },
            r.kv_dtype,
            r.batch_commands,
            r.decode_chain.map(|k| format!(" | decodeChain {k}")).unwrap_or_default()
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
        if let Some(c) = &r.decode_counters {
            s.push_str(&decode_cost(c));
        }
        if let Some(p) = &r.prompt {
            let chat = if r.chat { " (chat template)" } else { "" };
            s.push_str(&format!("prompt:   {p:?}{chat} = {:?}\n", r.prompt_ids));
        }
        let p = &r.sampling;
        if p.is_greedy() {
            s.push_str("sampling: greedy");
        } else {
            s.push_str(&format!(
                "sampling: temperature {} | top-k {} | top-p {} | min-p {} | seed {}",
                p.temperature, p.top_k, p.top_p, p.min_p, p.seed
            ));
        }
        if p.repeat_penalty != 1.0 && p.repeat_last_n > 0 {
            s.push_str(&format!(" | repeat penalty {} over the last {}", p.repeat_penalty, p.repeat_last_n));
        }
        s.push('\n');
        s.push_str(&format!("generated: {:?} (stopped: {})\n", r.generated, r.stop_reason));
        if let Some(t) = &r.text {
            s.push_str(&format!("text:     {t:?}\n"));
        }
        #[derive(Tabled)]
        struct K<'a> {
            slot: &'a str,
            kernel: &'a str,
        }
        s.push_str(&sharp_table(r.kernels.iter().map(|(a, b)| K { slot: a, kernel: b })));
        s.push('\n');
        #[derive(Tabled)]
        struct T {
            slot: String,
            #[tabled(rename = "prefill ms")]
            prefill: String,
            #[tabled(rename = "decode ms/token")]
            decode: String,
        }
        let ts = r.slots.iter().map(|x| T {
            slot: x.slot.to_string(),
            prefill: format!("{:.3}", x.prefill_ms),
            decode: format!("{:.3}", x.decode_ms_per_token),
        });
        s.push_str(&sharp_table(ts));
        if let Some(t) = r.step_timing {
            s.push_str(match t {
                StepTiming::InsidePass => {
                    "\nslot times: timestamps between the dispatches of one profiled pass of each kind (the unprofiled passes)"
                }
                StepTiming::PassPerStep => {
                    "\nslot times: timestamps around each step in a pass of its own (one profiled pass of each kind)"
                }
            });
            if let Some(ms) = r.profiled_step_gpu_ms {
                s.push_str(&format!("; the profiled decode step took {ms:.3} ms on the GPU"));
            }
        }
        s
    }
}
