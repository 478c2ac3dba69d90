//! `diff-profiles` as a table or as markdown (for a pull-request comment).

use tabled::settings::Style;

use super::Report;
use crate::profile::diff::DiffReport;

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
