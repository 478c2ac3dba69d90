//! `bench-kernels` as a table: the limits measured, then one row per shape with
//! its best variant and how close it comes to them.

use tabled::Tabled;

use super::{Report, sharp_table};
use crate::report::KernelBenchReport;

impl Report for KernelBenchReport {
    fn table(&self) -> String {
        let r = self;
        #[derive(Tabled)]
        struct Row {
            model: String,
            shape: String,
            dtype: String,
            #[tabled(rename = "best variant")]
            kernel: String,
            #[tabled(rename = "raced")]
            candidates: usize,
            #[tabled(rename = "µs")]
            us: String,
            #[tabled(rename = "GB/s (% copy)")]
            gbps: String,
            #[tabled(rename = "GFLOP/s (% FMA peak)")]
            gflops: String,
            check: String,
        }
        let rows = r.rows.iter().map(|x| Row {
            model: x.model.clone(),
            shape: format!("{}\n{}", x.what, x.problem),
            dtype: x.dtype.to_string(),
            kernel: x.kernel.clone(),
            candidates: x.candidates,
            us: format!("{:.1}", x.median_us),
            gbps: format!("{:.1} ({:.0}%)", x.gbps, x.pct_of_bandwidth),
            gflops: format!("{:.1} ({:.0}%)", x.gflops, x.pct_of_peak_flops),
            check: x.check.clone(),
        });
        let m = &r.measurement;
        let mut s = format!(
            "device: {} ({})\nwarm-up: {:.0} ms of FMA load, {:.1} -> {:.1} GFLOP/s ({})\n\
             limits: copy {:.1} GB/s (read + write of {} MiB), f32 FMA peak {:.1} GFLOP/s\n\
             timing: {}; inputs rotated over {} MiB of copies (L2 {} MiB, {}){}\n\
             shapes: {} prompt tokens, {} context{}\n",
            r.device,
            r.backend,
            r.warm_up.ms,
            r.warm_up.first_gflops,
            r.warm_up.last_gflops,
            match (r.warm_up.until_settled, r.warm_up.settled) {
                (false, _) => "a fixed time: a software adapter runs at the host CPU's clocks",
                (true, true) => "settled",
                (true, false) => "still changing when its time ran out",
            },
            r.limits.copy_gbps,
            r.limits.copy_bytes >> 20,
            r.limits.fma_gflops,
            r.timing,
            m.rotate_bytes >> 20,
            m.cache_bytes >> 20,
            m.cache_source,
            if r.trusted_shaders { "; trusted shader modules" } else { "" },
            r.prefill_tokens,
            r.context,
            if r.quick { "; --quick: default parameters only" } else { "" },
        );
        s.push_str(&sharp_table(rows));
        for x in &r.skipped {
            s.push_str(&format!("\nno WGSL variant for {x}"));
        }
        for x in &r.errors {
            s.push_str(&format!("\nfailed: {x}"));
        }
        s
    }
}
