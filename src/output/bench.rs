//! `bench` as a table of throughputs with their intervals.

use tabled::settings::Style;
use tabled::{Table, Tabled};

use super::Report;
use crate::report::{BenchReport, Estimate};

impl Report for BenchReport {
    fn table(&self) -> String {
        let r = self;
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
            #[tabled(rename = "decode % of read bound")]
            bound: String,
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
                bound: format!(
                    "{:.0}% ({:.0}–{:.0})",
                    e.decode_pct_of_bound.median, e.decode_pct_of_bound.ci[0], e.decode_pct_of_bound.ci[1]
                ),
            })
            .collect();
        let mut s = format!(
            "model:  {}\ndevice: {}\n{} rounds of a {}-token prefill and {} decode steps per entry, interleaved; changes are medians of per-round ratios against {first}\n",
            r.model, r.device, r.rounds, r.prefill_tokens, r.decode_tokens
        );
        s.push_str(&format!(
            "read bound: {:.1} GB/s ({:.1}–{:.1}; {}, once per round)\n",
            r.read_gbps.median, r.read_gbps.ci[0], r.read_gbps.ci[1], r.read_source
        ));
        s.push_str(&Table::new(rows).with(Style::sharp()).to_string());
        s
    }
}
