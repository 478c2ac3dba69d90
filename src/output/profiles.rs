//! `profiles` as a table of the cached profiles, or the action's text.

use tabled::settings::Style;
use tabled::{Table, Tabled};

use super::{Report, short};
use crate::report::ProfilesReport;

impl Report for ProfilesReport {
    fn table(&self) -> String {
        let rows = match self {
            ProfilesReport::List(rows) => rows,
            ProfilesReport::Text(t) => return t.clone(),
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
