//! The report: the modes' results files rendered as one Markdown section, headline figures first.

use super::*;

/// One mode's results file, read back.
#[derive(Default)]
pub(crate) struct ModeResults {
    pub(crate) mode: String,
    pub(crate) present: bool,
    pub(crate) meta: Vec<(String, String)>,
    pub(crate) rows: Vec<Row>,
    pub(crate) notes: Vec<String>,
    pub(crate) errors: Vec<String>,
    pub(crate) info: Vec<(String, String)>,
}

impl ModeResults {
    fn load(mode: &str, path: &str) -> ModeResults {
        let mut m = ModeResults { mode: mode.into(), ..Default::default() };
        let Ok(text) = std::fs::read_to_string(path) else { return m };
        m.present = true;
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            match f.as_slice() {
                ["meta", k, v] => m.meta.push((k.to_string(), v.to_string())),
                ["row", key, metric, short, value, baseline, ratio, target, verdict] => m.rows.push(Row {
                    key: key.to_string(),
                    metric: metric.to_string(),
                    short: short.to_string(),
                    value: value.to_string(),
                    baseline: baseline.to_string(),
                    ratio: ratio.parse().ok(),
                    target: target.to_string(),
                    verdict: verdict.to_string(),
                }),
                ["note", n] => m.notes.push(n.to_string()),
                ["error", e] => m.errors.push(e.to_string()),
                ["info", k, v] => m.info.push((k.to_string(), v.to_string())),
                _ => m.errors.push(format!("unreadable line in {path}: {}", md(line))),
            }
        }
        m
    }
    fn meta(&self, k: &str) -> Option<&str> {
        self.meta.iter().find(|(p, _)| p == k).map(|(_, v)| v.as_str())
    }
    fn row(&self, key: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.key == key)
    }
}

/// The figures of issue 9, point 9, in the order the issue lists them: key, figure, target.
pub(crate) const HEADLINE: [(&str, &str, &str); 13] = [
    ("gj_scan_5", "GpuJoin probe, fact 50 M x dim 5 M, 5 workers, vs a bare parallel count(*) of fact", "≤ 1.30x"),
    ("gj_scan_8", "the same, 8 workers", "≤ 1.30x"),
    ("gj_hash_5", "GpuJoin probe, 5 workers, vs PostgreSQL's parallel hash join", "≤ 0.25x"),
    ("gj_hash_8", "the same, 8 workers", "≤ 0.25x"),
    ("first_call", "first GPU call in a fresh connection (checksum of 1 MiB of a device segment)", "≤ 2 ms"),
    ("rt1_median", "round trip of an empty request, 1 session: median", "≤ 30 µs"),
    ("rt1_p99", "the same: p99", "≤ 200 µs"),
    ("rt32_median", "round trip, 32 concurrent sessions: median (bound: largest session's)", "≤ 30 µs"),
    ("rt32_p99", "the same: p99 (bound: largest session's)", "≤ 200 µs"),
    ("mem64", "GPU memory after 64 sessions each ran a GPU function, all 64 still open", "only the service's context + segments"),
    ("read8", "kernel read of an 8 GiB device segment vs a private cuMemAlloc", "≥ 0.97"),
    ("mig_dtoh", "tier migration end to end, device → host, vs the cuMemcpy ceiling", "≥ 0.90"),
    ("mig_htod", "tier migration end to end, host → device, vs the cuMemcpy ceiling", "≥ 0.90"),
];

pub(crate) fn cell(m: &ModeResults, key: &str) -> String {
    if !m.present {
        return "not run".into();
    }
    match m.row(key) {
        None => "not measured".into(),
        Some(r) => match r.verdict.as_str() {
            "error" => format!("error ({})", r.value.trim_start_matches("error: ")),
            "reference" => format!("{} (reference)", r.short),
            "n/a" => r.value.clone(),
            v => format!("{}, {v}", r.short),
        },
    }
}

pub(crate) fn report(outfile: &str, specs: &[String]) -> i32 {
    let mut modes: Vec<ModeResults> = Vec::new();
    for s in specs {
        let Some((mode, path)) = s.split_once('=') else {
            eprintln!("uvm_gpu_bench report: expected MODE=RESULTS, got {s:?}");
            return 2;
        };
        modes.push(ModeResults::load(mode, path));
    }
    let mut out = String::new();
    let _ = writeln!(out, "## GPU benchmark\n");
    let _ = writeln!(
        out,
        "Both execution modes of one suite run: the same cluster restarted with `pg_uvm_share.gpu_execution` set to each, \
         the same GpuJoin tables. Ratio = value / baseline; each baseline is measured in that mode's run unless marked \
         *probe* (a figure from shared/notes/gpu-facts.md) or *budget*. A target marked (service) is issue 9's and binds the \
         service mode: process mode's figure is its reference. GB/s = 10^9 bytes/s.\n"
    );
    let _ = writeln!(out, "| | {} |", modes.iter().map(|m| m.mode.as_str()).collect::<Vec<_>>().join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(modes.len()));
    let line = |f: &dyn Fn(&ModeResults) -> String| modes.iter().map(|m| md(&f(m))).collect::<Vec<_>>().join(" | ");
    let _ = writeln!(out, "| commit | {} |", line(&|m| m.meta("commit").unwrap_or("–").to_string()));
    let _ = writeln!(
        out,
        "| run | {} |",
        line(&|m| if m.present {
            format!(
                "{} s, PostgreSQL {}, provider {}, {} failed measurement(s)",
                m.meta("seconds").unwrap_or("?"),
                m.meta("server_version").unwrap_or("?"),
                m.meta("provider").unwrap_or("?"),
                m.meta("failed").unwrap_or("?")
            )
        } else {
            "not run (no results)".into()
        })
    );

    let _ = writeln!(out, "\n### Issue 9, point 9: both modes side by side\n");
    let _ = writeln!(out, "| figure | target | {} |", modes.iter().map(|m| m.mode.as_str()).collect::<Vec<_>>().join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---|".repeat(modes.len()));
    for (key, figure, target) in HEADLINE {
        let _ = writeln!(out, "| {figure} | {target} | {} |", line(&|m| cell(m, key)));
    }

    let _ = writeln!(out, "\n### Every measurement\n");
    let _ = writeln!(out, "| metric | mode | value | baseline | ratio | target | verdict |");
    let _ = writeln!(out, "|---|---|---|---|---:|---|---|");
    let mut keys: Vec<(String, String)> = Vec::new();
    for m in &modes {
        for r in &m.rows {
            if !keys.iter().any(|(k, _)| *k == r.key) {
                keys.push((r.key.clone(), r.metric.clone()));
            }
        }
    }
    for (key, metric) in &keys {
        for m in &modes {
            if let Some(r) = m.row(key) {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    md(metric),
                    m.mode,
                    md(&r.value),
                    md(&r.baseline),
                    r.ratio.map(|x| format!("{x:.2}")).unwrap_or_else(|| "–".into()),
                    md(&r.target),
                    md(&r.verdict)
                );
            }
        }
    }
    for m in &modes {
        if !m.present {
            continue;
        }
        if !m.notes.is_empty() {
            let _ = writeln!(out, "\n#### Notes, {} mode\n", m.mode);
            for n in &m.notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        if !m.errors.is_empty() {
            let _ = writeln!(out, "\n**Errors, {} mode:**\n", m.mode);
            for e in &m.errors {
                let _ = writeln!(out, "- {e}");
            }
        }
    }
    let _ = writeln!(out, "\n<details><summary>uvm.device_info() at the end of each mode's run</summary>\n");
    let _ = writeln!(out, "| property | {} |", modes.iter().map(|m| m.mode.as_str()).collect::<Vec<_>>().join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(modes.len()));
    let mut props: Vec<String> = Vec::new();
    for m in &modes {
        for (k, _) in &m.info {
            if !props.contains(k) {
                props.push(k.clone());
            }
        }
    }
    for p in &props {
        let _ = writeln!(
            out,
            "| {p} | {} |",
            line(&|m| m.info.iter().find(|(k, _)| k == p).map(|(_, v)| v.clone()).unwrap_or_else(|| "–".into()))
        );
    }
    let _ = writeln!(out, "\n</details>");
    if let Some(parent) = std::path::Path::new(outfile).parent() {
        if !parent.as_os_str().is_empty() {
            let _ = std::fs::create_dir_all(parent);
        }
    }
    if let Err(e) = std::fs::write(outfile, &out) {
        eprintln!("uvm_gpu_bench report: write {outfile}: {e}");
        return 1;
    }
    print!("{out}");
    0
}
