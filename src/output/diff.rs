//! `diff-profiles` as a table or as markdown (for a pull-request comment).

use tabled::settings::Style;

use super::Report;
use crate::profile::diff::{DiffOut, DiffReport, SetDiff};

impl Report for DiffOut {
    fn table(&self) -> String {
        match self {
            DiffOut::One(d) => d.table(),
            DiffOut::Sets(s) => sets(s, false),
        }
    }
    fn markdown(&self) -> String {
        match self {
            DiffOut::One(d) => d.markdown(),
            DiffOut::Sets(s) => sets(s, true),
        }
    }
}

/// The counts first (as a pull-request comment leads with them), then one row per
/// (model, device class), then each changed pair's own diff.
fn sets(r: &SetDiff, md: bool) -> String {
    let counts = format!(
        "{} regressed · {} improved · {} changed · {} unchanged · {} added · {} removed",
        r.regressions, r.improvements, r.changed, r.unchanged, r.added, r.removed
    );
    let verdict = if r.regressed {
        "❌"
    } else if r.any_change {
        "⚠️"
    } else {
        "✅"
    };
    let mut s = if md {
        format!("### ktune profiles diff: {verdict} {counts}\n\n`{}` → `{}` (threshold {}%)\n\n", r.a, r.b, r.threshold_pct)
    } else {
        format!("{} → {}\n{verdict} {counts}\n\n", r.a, r.b)
    };
    let mut b = tabled::builder::Builder::default();
    b.push_record(["model", "device class", "status", "decode (per token)", "prefill"]);
    for p in &r.pairs {
        let change = |name: &str| -> String {
            p.diff
                .as_ref()
                .and_then(|d| d.end_to_end.iter().find(|t| t.what.starts_with(name)))
                .map(|t| format!("{:.2} → {:.2} ms ({:+.1}%)", t.old, t.new, t.delta_pct))
                .unwrap_or_default()
        };
        let mark = match p.status {
            "regressed" => "❌ regressed",
            "improved" => "✅ improved",
            "changed" => "⚠️ changed",
            other => other,
        };
        b.push_record([p.model.clone(), p.device.clone(), mark.to_string(), change("decode"), change("prefill")]);
    }
    let mut t = b.build();
    if md {
        t.with(Style::markdown());
    } else {
        t.with(Style::sharp());
    }
    s.push_str(&t.to_string());
    s.push('\n');
    for p in &r.pairs {
        let Some(d) = &p.diff else { continue };
        if p.status == "unchanged" {
            continue;
        }
        if md {
            s.push_str(&format!(
                "\n<details><summary>{} on {}: {}</summary>\n\n{}\n</details>\n",
                p.model,
                p.device,
                p.status,
                diff(d, true)
            ));
        } else {
            s.push_str(&format!("\n{} on {}:\n{}", p.model, p.device, diff(d, false)));
        }
    }
    s
}

impl Report for DiffReport {
    fn table(&self) -> String {
        diff(self, false)
    }
    fn markdown(&self) -> String {
        diff(self, true)
    }
}

fn diff(r: &DiffReport, md: bool) -> String {
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
    s
}
