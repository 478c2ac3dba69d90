//! `profiles` as a table of the cached profiles, or the action's text.

use tabled::settings::Style;
use tabled::{Table, Tabled};

use super::{Report, short};
use crate::report::{BundleReport, ProfilesReport};

fn bundle_table(b: &BundleReport) -> String {
    #[derive(Tabled)]
    struct Row {
        key: String,
        model: String,
        device: String,
        action: String,
        from: String,
        reason: String,
    }
    let rows: Vec<Row> = b
        .profiles
        .iter()
        .map(|o| Row {
            key: short(&o.key),
            model: o.model.clone(),
            device: o.device.clone(),
            action: o.action.clone(),
            from: o.origin.clone(),
            reason: o.reason.clone(),
        })
        .collect();
    let mut text = if rows.is_empty() { String::new() } else { Table::new(rows).with(Style::sharp()).to_string() + "\n" };
    text += &match (&b.written, b.action) {
        (Some(p), _) => format!("wrote {} profiles to {}", b.count, p.display()),
        (None, _) => format!("{} profiles added to or replaced in the cache", b.count),
    };
    text
}

impl Report for ProfilesReport {
    fn table(&self) -> String {
        let rows = match self {
            ProfilesReport::List(rows) => rows,
            ProfilesReport::Text(t) => return t.clone(),
            ProfilesReport::Bundle(b) => return bundle_table(b),
        };
        if rows.is_empty() {
            return "no cached profiles (`ktune tune` makes them)".into();
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
        Table::new(r).with(Style::sharp()).to_string()
    }
}
