//! `eval` as text: the run, the text's chunks, perplexity, and the divergence from
//! the reference as one table.

use tabled::settings::Style;

use super::Report;
use crate::eval::Divergence;
use crate::report::EvalReport;

/// The divergence figures as table rows (`eval`, and `bench --kld` per entry).
pub fn divergence_cells(d: &Divergence) -> [String; 5] {
    [
        format!("{:.6}", d.kld_mean),
        format!("{:.6}", d.kld_median),
        format!("{:.6}", d.kld_p99),
        format!("{:.2}%", d.top1_agreement_pct),
        format!("{:.4}", d.rel_rms_logit_error),
    ]
}

/// The headers of [`divergence_cells`].
pub const DIVERGENCE_HEAD: [&str; 5] = ["KLD mean", "KLD median", "KLD p99", "top-1 same", "rel RMS logit err"];

impl Report for EvalReport {
    fn table(&self) -> String {
        let r = self;
        let mut s = format!("model:     {}\ndevice:    {}\nevaluated: {}\n", r.model, r.device, r.evaluated);
        let bos = r.bos.map_or("no BOS".to_string(), |b| format!("BOS {b} first in each"));
        s.push_str(&format!(
            "text:      {} ({} tokens): {} chunks of {} ({bos}), positions {}..{} of each scored, {} in all, {:.1} s\n",
            r.file,
            r.text_tokens,
            r.chunks,
            r.ctx,
            r.first_scored,
            r.ctx.saturating_sub(2),
            r.perplexity.positions,
            r.seconds
        ));
        if let Some(saved) = &r.saved_logits {
            s.push_str(&format!("saved:     {saved}\n"));
        }
        let mut b = tabled::builder::Builder::default();
        let mut head = vec!["perplexity", "mean NLL"];
        let mut row = vec![format!("{:.4} ± {:.4}", r.perplexity.ppl, r.perplexity.ppl_stderr), format!("{:.5}", r.perplexity.nll_mean)];
        if let Some(d) = &r.divergence {
            head.extend(DIVERGENCE_HEAD);
            head.push("KLD max");
            row.extend(divergence_cells(d));
            row.push(format!("{:.6}", d.kld_max));
        }
        b.push_record(head);
        b.push_record(row);
        let mut t = b.build();
        t.with(Style::sharp());
        if let Some(reference) = &r.reference {
            s.push_str(&format!("reference: {reference}\n"));
        }
        s.push_str(&t.to_string());
        s
    }
}
