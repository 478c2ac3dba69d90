//! `profiles` as a table of the cached profiles, or the action's text.

use tabled::builder::Builder;
use tabled::settings::Style;

use super::{Report, short};
use crate::report::{BundleReport, ProfilesReport};

/// A sharp-style table of `head` over `rows`.
fn grid<const N: usize>(head: [&str; N], rows: impl Iterator<Item = [String; N]>) -> String {
    let mut b = Builder::default();
    b.push_record(head);
    rows.for_each(|r| b.push_record(r));
    b.build().with(Style::sharp()).to_string()
}

fn bundle_table(b: &BundleReport) -> String {
    let mut text = if b.profiles.is_empty() {
        String::new()
    } else {
        let rows = b
            .profiles
            .iter()
            .map(|o| [short(&o.key), o.model.clone(), o.device.clone(), o.action.clone(), o.origin.clone(), o.reason.clone()]);
        grid(["key", "model", "device", "action", "from", "reason"], rows) + "\n"
    };
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
        let cells = |x: &crate::report::ProfileRow| {
            let (prefill, decode) = (format!("{:.1}", x.prefill_tok_s), format!("{:.2}", x.decode_tok_s));
            [short(&x.key), x.model.clone(), x.device.clone(), x.date.clone(), x.strategy.clone(), prefill, decode]
        };
        grid(["key", "model", "device", "date", "strategy", "prefill tok/s", "decode tok/s"], rows.iter().map(cells))
    }
}
