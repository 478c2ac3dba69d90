//! `bench` as a table of throughputs with their intervals (and, with `--image`,
//! each entry's milliseconds per image through the vision tower; with `--kld`,
//! each entry's divergence from the f32 reference), with the host's µs, the GPU's
//! ms (timestamps), the bytes read back and (on a GPU) the dispatches per layer of
//! a decode token.

use tabled::settings::Style;

use super::Report;
use super::eval::{DIVERGENCE_HEAD, divergence_cells};
use super::run::decode_cost_cells;
use crate::report::{BenchReport, Estimate};

impl Report for BenchReport {
    fn table(&self) -> String {
        let r = self;
        let est = |e: &Estimate, d: usize| format!("{:.d$} ({:.d$}–{:.d$})", e.median, e.ci[0], e.ci[1]);
        let pct = |e: &Estimate| format!("{:+.1}% ({:+.1}…{:+.1})", e.median, e.ci[0], e.ci[1]);
        let first = r.entries.first().map(|e| e.name.as_str()).unwrap_or("");
        let mut b = tabled::builder::Builder::default();
        let mut head = vec![
            "entry",
            "prefill tok/s (95% CI)",
            "decode tok/s (95% CI)",
            "prefill vs first",
            "decode vs first",
            "decode % of read bound",
            "host µs/token",
            "GPU ms/token",
            "read back/token",
            "dispatches/layer",
        ];
        if r.image.is_some() {
            head.extend(["vision ms/image (95% CI)", "vision time / first"]);
        }
        let kld = r.entries.iter().any(|e| e.accuracy.is_some());
        if kld {
            head.extend(DIVERGENCE_HEAD);
        }
        b.push_record(head);
        for (i, e) in r.entries.iter().enumerate() {
            let mut row = vec![
                e.name.clone(),
                est(&e.prefill_tok_s, 1),
                est(&e.decode_tok_s, 2),
                if i == 0 { "-".into() } else { pct(&e.prefill_vs_first_pct) },
                if i == 0 { "-".into() } else { pct(&e.decode_vs_first_pct) },
                format!("{:.0}% ({:.0}–{:.0})", e.decode_pct_of_bound.median, e.decode_pct_of_bound.ci[0], e.decode_pct_of_bound.ci[1]),
            ];
            row.extend(decode_cost_cells(e.decode_counters.as_ref()));
            // A decode token's dispatches (the LM head's and the pick's included) over the layers.
            let gpu = e.decode_counters.as_ref().and_then(|c| c.gpu.as_ref());
            row.push(gpu.map_or("-".into(), |g| format!("{:.2}", g.dispatches / r.layers.max(1) as f64)));
            if r.image.is_some() {
                match &e.vision {
                    Some(v) => {
                        row.push(est(&v.ms, 2));
                        row.push(if i == 0 {
                            "-".into()
                        } else {
                            format!("{:.2}× ({:.2}…{:.2})", v.ratio_to_first.median, v.ratio_to_first.ci[0], v.ratio_to_first.ci[1])
                        });
                    }
                    None => row.extend(["-".to_string(), "-".to_string()]),
                }
            }
            if kld {
                match &e.accuracy {
                    Some(d) => row.extend(divergence_cells(d)),
                    None => row.extend(std::iter::repeat_n("-".to_string(), DIVERGENCE_HEAD.len())),
                }
            }
            b.push_record(row);
        }
        let mut s = format!(
            "model:  {}\ndevice: {}\n{} rounds of a {}-token prefill and {} decode steps per entry, interleaved; changes are medians of per-round ratios against {first}\n",
            r.model, r.device, r.rounds, r.prefill_tokens, r.decode_tokens
        );
        if kld {
            s.push_str(&format!(
                "accuracy: against the CPU's f32 reference (f32 activations, plain layouts) on the {}-token prompt\n",
                r.prefill_tokens
            ));
        }
        if let Some(img) = &r.image {
            s.push_str(&format!("image:  {img}, through the vision tower and projector once per entry each round\n"));
        }
        s.push_str(&format!(
            "read bound: {:.1} GB/s ({:.1}–{:.1}; {}, once per round)\n",
            r.read_gbps.median, r.read_gbps.ci[0], r.read_gbps.ci[1], r.read_source
        ));
        let mut t = b.build();
        t.with(Style::sharp());
        s.push_str(&t.to_string());
        for e in r.entries.iter().filter(|e| e.vision.is_some()) {
            if let Some(v) = &e.vision {
                s.push_str(&format!("\n{} vision kernels: {}", e.name, v.kernels.join(", ")));
            }
        }
        s
    }
}
