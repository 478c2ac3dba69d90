//! `ktune report` (and `tune --report`), `ktune completions` and `ktune man`, run as
//! a user runs them. The HTML page is checked structurally: one inline `<svg>` per
//! chart with a positive size, the winner marked, rejections with their reason, the
//! diff of two profiles, a hand-written profile's choices, and nothing loaded from
//! the network. (tools/render_report.py checks a page in a real browser.)

use std::path::Path;

use crate::common::{fixture, ktune_in as ktune, tempdir};
use predicates::prelude::*;

fn report(cache: &Path, out: &Path, profiles: &[&Path]) -> String {
    let mut args = vec!["report".to_string()];
    args.extend(profiles.iter().map(|p| p.display().to_string()));
    args.extend(["-o".to_string(), out.display().to_string()]);
    let o = ktune(cache).args(&args).output().expect("runs");
    assert!(o.status.success(), "report failed: {}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&out.display().to_string()), "stdout names the file");
    std::fs::read_to_string(out).expect("the page was written")
}

/// `(width, height)` of every `<svg ...>` start tag.
fn svg_sizes(html: &str) -> Vec<(u32, u32)> {
    let attr = |tag: &str, name: &str| -> u32 {
        let key = format!(" {name}=\"");
        let at = tag.find(&key).unwrap_or_else(|| panic!("<svg> without {name}: {tag}")) + key.len();
        tag[at..].split('"').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad {name} in {tag}"))
    };
    html.match_indices("<svg")
        .map(|(i, _)| {
            let tag = &html[i..i + html[i..].find('>').expect("closed tag")];
            (attr(tag, "width"), attr(tag, "height"))
        })
        .collect()
}

/// Well-formed enough: the document frame, and every container element closed as
/// often as opened.
fn assert_well_formed(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"), "doctype");
    assert!(html.trim_end().ends_with("</html>"), "ends with </html>");
    for tag in ["html", "head", "body", "svg", "table", "tr", "figure", "details", "ul", "h2", "h3", "p", "style", "title", "g", "text"] {
        let open = html.matches(&format!("<{tag}>")).count() + html.matches(&format!("<{tag} ")).count();
        let close = html.matches(&format!("</{tag}>")).count();
        assert_eq!(open, close, "<{tag}> opened {open} times, closed {close} times");
    }
}

/// Self-contained: nothing fetched, nothing run.
fn assert_self_contained(html: &str) {
    for bad in ["http://", "https://", "<script", "<link", "<img", "<iframe", " src=", "@import", "url(", "@font-face"] {
        assert!(!html.contains(bad), "the page contains `{bad}`");
    }
}

#[test]
fn two_profiles_give_charts_the_winner_the_rejections_and_the_diff() {
    let tmp = tempdir();
    // A folder of its own, made here: -o never creates one (issue 45).
    let out = tmp.path().join("sub").join("ab.html");
    std::fs::create_dir(tmp.path().join("sub")).expect("mkdir");
    let (a, b) = (fixture("profiles/a.yaml"), fixture("profiles/b.yaml"));
    let html = report(&tmp.path().join("cache"), &out, &[&a, &b]);
    assert_well_formed(&html);
    assert_self_contained(&html);
    // Two profiles of two devices, two slots each, one diff: an end-to-end chart
    // and a roofline per profile, a chart per slot, the diff's time changes.
    let sizes = svg_sizes(&html);
    assert_eq!(sizes.len(), 2 + 2 + 4 + 1, "{sizes:?}");
    assert!(sizes.iter().all(|&(w, h)| w > 100 && h > 50), "{sizes:?}");
    // The winner, in the chart (a label) and in the numbers (a marked row).
    assert!(html.contains("✓ gemv_dot4_cpu(rows_per_task=64)"), "winner label in the chart");
    assert!(html.contains("<tr class=\"winner\"><td>✓ gemv_dot4_cpu(rows_per_task=64)</td>"), "winner row");
    assert!(html.contains("dropped@2"), "the dropped candidate is shown as dropped");
    // Rejected with the reason.
    assert!(html.contains("more rows per task than the problem has"));
    assert!(html.contains("gemv_dot4_cpu(rows_per_task=4096)"));
    // Roofline against the measured bandwidth, saying there is no compute roof.
    assert!(html.contains("read bandwidth 20 GB/s") || html.contains("read bandwidth 20.0 GB/s"), "the roof");
    assert!(html.contains("no compute peak"));
    // End to end against the default.
    assert!(html.contains("runtime default") && html.contains("(+25.0%)"), "tuned vs default decode");
    // The diff: b changed the norm kernel.
    assert!(html.contains("Diff: a.yaml → b.yaml"));
    assert!(html.contains("<td>norm</td><td>rms_norm_rows_cpu</td><td>rms_norm_split_cpu</td>"), "changed choice");
    assert!(html.contains("decode (per token)"), "end-to-end time deltas");
}

#[test]
fn a_hand_written_profile_shows_its_choices_and_says_it_has_no_measurements() {
    let tmp = tempdir();
    let text = std::fs::read_to_string(fixture("profiles/a.yaml")).expect("fixture");
    let hand = text.split("\ntuning:").next().expect("before tuning").to_string() + "\n";
    let p = tmp.path().join("hand.yaml");
    std::fs::write(&p, hand).expect("write");
    let out = tmp.path().join("hand.html");
    let html = report(&tmp.path().join("cache"), &out, &[&p]);
    assert_well_formed(&html);
    assert_self_contained(&html);
    assert!(html.contains("No measurements"), "says so");
    assert!(html.contains("<td>attention (decode)</td><td><code>attention_decode_splitkv_cpu(chunk=256)</code></td>"), "choices listed");
    assert_eq!(svg_sizes(&html).len(), 0, "nothing to chart");
}

#[test]
fn bad_input_is_exit_2_and_writes_nothing() {
    let tmp = tempdir();
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("r.html");
    ktune(&cache)
        .args(["report", "no/such/profile.yaml", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("does not exist"));
    ktune(&cache).args(["report", "deadbeef", "-o"]).arg(&out).assert().code(2).stderr(predicate::str::contains("profiles list"));
    ktune(&cache)
        .arg("report")
        .arg(fixture("profiles/a.yaml"))
        .arg("-o")
        .arg(tmp.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is a directory"));
    ktune(&cache)
        .arg("report")
        .arg(fixture("profiles/a.yaml"))
        .args(["--threshold", "lots", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--threshold"));
    assert!(!out.exists(), "no page after a failed run");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("ls").flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "no temporary left: {left:?}");
}

#[test]
fn tune_report_writes_a_page_beside_each_profile_and_report_finds_cached_keys() {
    let tmp = tempdir();
    let cache = tmp.path().join("cache");
    let yaml = tmp.path().join("p.yaml");
    let dir = fixture("llama3-tiny");
    let o = ktune(&cache)
        .args(["tune", "--device", "cpu", "--model-dir"])
        .arg(&dir)
        .args(["--budget", "4s", "--prefill-tokens", "8", "--context", "32", "--decode-tokens", "8", "--format", "json", "--report", "-o"])
        .arg(&yaml)
        .output()
        .expect("runs");
    assert!(o.status.success(), "tune failed: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    let cached = Path::new(v["path"].as_str().expect("path")).to_path_buf();
    let pages: Vec<String> = v["reports"].as_array().expect("reports").iter().map(|p| p.as_str().expect("str").to_string()).collect();
    assert_eq!(pages, [cached.with_extension("html").display().to_string(), tmp.path().join("p.html").display().to_string()]);
    for page in &pages {
        let html = std::fs::read_to_string(page).expect("page written");
        assert_well_formed(&html);
        assert_self_contained(&html);
        assert!(svg_sizes(&html).len() >= 3, "end to end, roofline and slot charts");
    }
    // `report` by cached key prefix.
    let key = v["key"].as_str().expect("key");
    let out = tmp.path().join("by-key.html");
    let html = report(&cache, &out, &[Path::new(&key[..10])]);
    assert!(html.contains(&cached.display().to_string()), "the cached profile is the one shown");
}

#[test]
fn completions_name_every_subcommand() {
    let tmp = tempdir();
    for shell in ["bash", "zsh", "fish"] {
        let o = ktune(tmp.path()).args(["completions", shell]).output().expect("runs");
        assert!(o.status.success(), "{shell}: {}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8(o.stdout).expect("utf-8");
        for sub in ["tune", "run", "report", "diff-profiles", "completions", "man"] {
            assert!(text.contains(sub), "{shell} completion lacks `{sub}`");
        }
    }
    ktune(tmp.path()).args(["completions", "tcsh"]).assert().code(2).stderr(predicate::str::contains("possible values"));
}

#[test]
fn man_prints_the_page_or_writes_one_per_subcommand() {
    let tmp = tempdir();
    let o = ktune(tmp.path()).arg("man").output().expect("runs");
    assert!(o.status.success());
    let page = String::from_utf8(o.stdout).expect("utf-8");
    assert!(page.starts_with(".ie") || page.contains(".TH ktune"), "roff");
    for sub in ["tune", "report", "completions", "diff\\-profiles"] {
        assert!(page.contains(sub), "man page lacks `{sub}`");
    }
    let dir = tmp.path().join("man1");
    ktune(tmp.path()).arg("man").arg("-o").arg(&dir).assert().success().stdout(predicate::str::contains("ktune-report.1"));
    for f in ["ktune.1", "ktune-tune.1", "ktune-report.1", "ktune-profiles-show.1"] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(text.contains(".TH"), "{f} is a man page");
    }
}
