//! `rdeploy inventory --html FILE`: the fleet dashboard as one self-contained page. Inline CSS
//! and inline SVG only, no script and nothing fetched at view time, so it can be attached to a
//! ticket, opened offline or printed. Built from the same `Report` as the terminal table, so
//! the page and `--json` never disagree.
//!
//! Top to bottom: the snapshot time and headline counts; rollout completion per component as
//! a bar chart with the SLO objectives marked; a cluster x component grid (for fleets small
//! enough to read one, with stragglers and absent clusters coloured); per component the
//! version rows with the clusters named; then stragglers with why, absent clusters, incidents.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::analysis::{absent_why, Standing};
use super::matrix::{ComponentReport, Report};
use super::slo::{ObjectiveState, SloReport};

/// Above this many clusters the grid is left out: the per-component rows stay readable.
const GRID_MAX_CLUSTERS: usize = 60;

const CSS: &str = r#"
:root { --ink:#1d2330; --muted:#5b6474; --line:#dfe3ea; --bg:#f6f7f9; --ok:#1f8a4c; --ok-bg:#e3f4ea; --warn:#a15c00; --warn-bg:#fff1d6; --bad:#b42318; --bad-bg:#fde7e4; --none:#8a93a3; --none-bg:#eef0f3; --accent:#2f5bd3; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink); font: 14px/1.45 "DejaVu Sans", "Liberation Sans", system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; -webkit-print-color-adjust: exact; print-color-adjust: exact; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 40px; }
header { display: flex; justify-content: space-between; align-items: flex-end; gap: 16px; border-bottom: 2px solid var(--ink); padding-bottom: 10px; }
h1 { font-size: 24px; margin: 0; letter-spacing: -0.01em; }
h2 { font-size: 17px; margin: 28px 0 10px; }
h3 { font-size: 15px; margin: 0; font-family: "DejaVu Sans Mono", "Liberation Mono", ui-monospace, monospace; word-break: break-all; }
.meta { color: var(--muted); text-align: right; font-size: 13px; }
.meta time { display: block; color: var(--ink); font-size: 16px; font-weight: 600; }
.tiles { display: grid; grid-template-columns: repeat(5, 1fr); gap: 10px; margin-top: 16px; }
.tile { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; }
.tile b { display: block; font-size: 26px; line-height: 1.1; }
.tile span { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.tile.bad { border-color: var(--bad); background: var(--bad-bg); } .tile.bad b { color: var(--bad); }
.tile.warn { border-color: #e7b45c; background: var(--warn-bg); } .tile.warn b { color: var(--warn); }
.tile.ok b { color: var(--ok); }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; margin-bottom: 12px; break-inside: avoid; }
.card-head { display: flex; justify-content: space-between; align-items: baseline; gap: 12px; margin-bottom: 8px; }
.card-head .sum { color: var(--muted); white-space: nowrap; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; text-transform: uppercase; letter-spacing: .03em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; width: 4em; }
td.ver { font-family: "DejaVu Sans Mono", "Liberation Mono", ui-monospace, monospace; white-space: nowrap; width: 9em; }
.chip { display: inline-block; padding: 0 7px; margin: 1px 2px; border-radius: 10px; font-size: 12px; border: 1px solid transparent; white-space: nowrap; }
.chip.done { background: var(--ok-bg); color: var(--ok); }
.chip.behind { background: var(--warn-bg); color: var(--warn); border-color: #e7b45c; font-weight: 600; }
.chip.absent { background: var(--bad-bg); color: var(--bad); border-color: var(--bad); font-weight: 600; }
.badge { display: inline-block; font-size: 11px; padding: 0 6px; border-radius: 4px; font-weight: 700; letter-spacing: .03em; }
.badge.wanted { background: var(--ok-bg); color: var(--ok); }
.badge.unsupported { background: var(--bad); color: #fff; }
.bar { height: 8px; background: var(--none-bg); border-radius: 4px; overflow: hidden; min-width: 80px; }
.bar i { display: block; height: 100%; background: var(--accent); }
.grid td, .grid th { text-align: center; font-size: 12px; padding: 4px 6px; }
.grid th.cl, .grid td.cl { text-align: left; font-weight: 600; white-space: nowrap; width: 180px; }
.grid th.comp { font-family: "DejaVu Sans Mono", "Liberation Mono", ui-monospace, monospace; text-transform: none; letter-spacing: 0; }
.grid td.done { background: var(--ok-bg); color: var(--ok); }
.grid td.behind { background: var(--warn-bg); color: var(--warn); font-weight: 700; }
.grid td.absent { background: var(--bad-bg); color: var(--bad); font-weight: 700; }
.grid td.missing { color: var(--none); }
.grid tr.absent-row td.cl { color: var(--bad); }
ul.why { margin: 6px 0 0; padding-left: 18px; } ul.why li { margin: 3px 0; }
ul.why b { font-weight: 700; }
.straggler b { color: var(--warn); } .absent-li b { color: var(--bad); }
.legend { color: var(--muted); font-size: 12px; margin: 6px 0 0; }
.legend .chip { margin-left: 8px; }
.note { color: var(--muted); font-size: 12px; }
svg text { font-family: "DejaVu Sans", "Liberation Sans", system-ui, sans-serif; }
footer { margin-top: 26px; color: var(--muted); font-size: 12px; border-top: 1px solid var(--line); padding-top: 8px; }
@media print {
  body { background: #fff; font-size: 12px; }
  main { max-width: none; padding: 0; }
  .card, .tile { border-color: #bbb; }
  h2 { break-after: avoid; }
  tr { break-inside: avoid; }
}
"#;

/// The page. `source` says where the snapshot came from (shown under the time).
pub fn render(report: &Report, source: &str) -> String {
    let mut h = String::new();
    let stragglers: usize = report.components.iter().map(|c| c.stragglers.len()).sum();
    let breached = report.slo.iter().filter(|s| s.breached).count();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>Fleet inventory {}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n",
        esc(&report.taken_at)
    );
    let _ = writeln!(
        h,
        "<header><div><h1>Fleet inventory</h1><div class=\"note\">component &times; version &times; cluster, from {}</div></div><div class=\"meta\">snapshot taken<time datetime=\"{t}\" id=\"snapshot\">{t}</time></div></header>",
        esc(source),
        t = esc(&report.taken_at)
    );
    // Headline counts: what needs attention is coloured, the rest stays quiet.
    let tile =
        |class: &str, n: usize, what: &str| format!("<div class=\"tile {class}\"><b>{n}</b><span>{what}</span></div>");
    let _ = writeln!(
        h,
        "<section class=\"tiles\">{}{}{}{}{}</section>",
        tile("", report.clusters, "clusters"),
        tile(if report.answered == report.clusters { "ok" } else { "" }, report.answered, "answered"),
        tile(if report.absent.is_empty() { "" } else { "bad" }, report.absent.len(), "absent"),
        tile(if stragglers == 0 { "" } else { "warn" }, stragglers, "stragglers"),
        if report.slo.is_empty() {
            tile(if report.incidents.is_empty() { "" } else { "bad" }, report.incidents.len(), "incidents")
        } else {
            tile(if breached == 0 { "ok" } else { "bad" }, breached, "SLO breached")
        },
    );
    if report.components.is_empty() {
        let _ = writeln!(h, "<p class=\"note\">No component runs in the clusters that answered.</p>");
    } else {
        let _ = write!(h, "<h2>Rollout completion</h2>\n<div class=\"card\">{}</div>\n", chart(report));
        if report.clusters <= GRID_MAX_CLUSTERS {
            let _ = write!(h, "<h2>Clusters</h2>\n<div class=\"card\">{}</div>\n", grid(report));
        }
        let _ = writeln!(h, "<h2>Versions</h2>");
        for c in &report.components {
            h += &component_card(c, report.slo.iter().find(|s| s.component == c.component));
        }
    }
    if !report.absent.is_empty() {
        let _ = write!(h, "<h2>Absent clusters</h2>\n<div class=\"card\"><p class=\"note\">They did not answer: each counts as not done for every component.</p><ul class=\"why\">");
        for a in &report.absent {
            let when = a
                .last_seen
                .as_deref()
                .and_then(|s| time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok());
            let _ = write!(
                h,
                "<li class=\"absent-li\"><b>{}</b>{}: {}</li>",
                esc(&a.cluster),
                labels(&a.labels),
                esc(&absent_why(&a.error, when))
            );
        }
        h += "</ul></div>\n";
    }
    if !report.incidents.is_empty() {
        let _ = write!(h, "<h2>Incidents</h2>\n<div class=\"card\"><ul class=\"why\">");
        for i in &report.incidents {
            let _ = write!(
                h,
                "<li class=\"absent-li\"><b>{} {}</b>: {}</li>",
                esc(&i.component),
                esc(&i.version),
                esc(&i.message)
            );
        }
        h += "</ul></div>\n";
    }
    let _ = write!(h, "<footer>Written by <code>rdeploy inventory --html</code> at {}. Self-contained: no script, nothing loaded from the network.</footer>\n</main>\n</body>\n</html>\n", esc(&report.taken_at));
    h
}

/// One bar per component: the share of in-scope clusters done, the objectives as ticks.
fn chart(report: &Report) -> String {
    let (label_w, bar_x, bar_w, row_h, top) = (300.0, 310.0, 480.0, 44.0, 24.0);
    let width = 1100.0;
    let height = top + row_h * report.components.len() as f64 + 8.0;
    let mut s = format!("<svg role=\"img\" aria-label=\"rollout completion per component\" viewBox=\"0 0 {width} {height}\" width=\"100%\" xmlns=\"http://www.w3.org/2000/svg\">");
    // The percentage axis.
    for pct in [0, 25, 50, 75, 100] {
        let x = bar_x + bar_w * pct as f64 / 100.0;
        let _ = write!(
            s,
            "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"#dfe3ea\" stroke-width=\"1\"/>",
            top - 6.0,
            height - 4.0
        );
        let _ = write!(
            s,
            "<text x=\"{x}\" y=\"{}\" font-size=\"11\" fill=\"#5b6474\" text-anchor=\"middle\">{pct}%</text>",
            top - 10.0
        );
    }
    for (i, c) in report.components.iter().enumerate() {
        let y = top + row_h * i as f64 + 8.0;
        let slo = report.slo.iter().find(|s| s.component == c.component);
        let pct = if c.in_scope == 0 { 100.0 } else { c.done as f64 * 100.0 / c.in_scope as f64 };
        let color = match slo {
            Some(s) if s.breached => "#b42318",
            Some(s) if s.objectives.iter().any(|o| o.state == ObjectiveState::Pending) => "#d08a10",
            _ if pct >= 100.0 => "#1f8a4c",
            _ => "#2f5bd3",
        };
        let name = shorten(&c.component, 40);
        let _ = write!(s, "<text x=\"{}\" y=\"{}\" font-size=\"13\" text-anchor=\"end\" fill=\"#1d2330\" font-family=\"DejaVu Sans Mono, monospace\">{}</text>", label_w, y + 11.0, esc(&name));
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\" fill=\"#5b6474\">wanted {}</text>",
            label_w,
            y + 25.0,
            esc(&c.wanted)
        );
        let _ = write!(s, "<rect x=\"{bar_x}\" y=\"{y}\" width=\"{bar_w}\" height=\"18\" rx=\"4\" fill=\"#eef0f3\"/>");
        let _ = write!(s, "<rect x=\"{bar_x}\" y=\"{y}\" width=\"{:.1}\" height=\"18\" rx=\"4\" fill=\"{color}\"><title>{} of {} clusters done</title></rect>", bar_w * pct / 100.0, c.done, c.in_scope);
        let note = format!("{}/{} clusters · {:.0}%", c.done, c.in_scope, pct);
        let mut verdict = String::new();
        if let Some(slo) = slo {
            for o in &slo.objectives {
                let Some(target) = o.objective.split('%').next().and_then(|p| p.trim().parse::<f64>().ok()) else {
                    continue;
                };
                let x = bar_x + bar_w * target / 100.0;
                let tick = match o.state {
                    ObjectiveState::Met => "#1f8a4c",
                    ObjectiveState::Pending => "#a15c00",
                    ObjectiveState::Breached => "#b42318",
                    ObjectiveState::Unknown => "#5b6474",
                };
                let _ = write!(s, "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"{tick}\" stroke-width=\"3\"><title>{}</title></line>", y - 4.0, y + 22.0, esc(&o.objective));
                let _ = write!(
                    s,
                    "<text x=\"{x}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\" fill=\"{tick}\">{}</text>",
                    y + 33.0,
                    esc(&o.objective)
                );
            }
            verdict = slo_verdict(slo);
        }
        let ink = if color == "#2f5bd3" { "#1d2330" } else { color };
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"{ink}\" font-weight=\"600\">{}</text>",
            bar_x + bar_w + 36.0,
            y + 13.0,
            esc(&note)
        );
        if !verdict.is_empty() {
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{ink}\">{}</text>",
                bar_x + bar_w + 36.0,
                y + 27.0,
                esc(&verdict)
            );
        }
    }
    s += "</svg>";
    if report.slo.is_empty() {
        s += "<p class=\"legend\">Share of in-scope clusters (running the component, or absent) that run only the wanted version. Pass <code>--slo</code> to mark the objectives.</p>";
    } else {
        s += "<p class=\"legend\">Ticks are the SLO objectives: green met, amber not due yet, red breached.</p>";
    }
    s
}

fn slo_verdict(s: &SloReport) -> String {
    if s.breached {
        let which: Vec<&str> =
            s.objectives.iter().filter(|o| o.state == ObjectiveState::Breached).map(|o| o.objective.as_str()).collect();
        return format!("SLO breached ({})", which.join(", "));
    }
    if let Some(o) = s.objectives.iter().find(|o| o.state == ObjectiveState::Pending) {
        return format!("{} due in {}", o.objective, super::slo::human(o.seconds.unwrap_or(0)));
    }
    if s.objectives.iter().all(|o| o.state == ObjectiveState::Met) {
        return "SLO met".into();
    }
    "no recorded start".into()
}

/// Clusters down, components across; each cell the version there.
fn grid(report: &Report) -> String {
    let mut by_cluster: BTreeMap<&str, (usize, bool)> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for c in &report.components {
        for s in &c.standings {
            if !by_cluster.contains_key(s.cluster.as_str()) {
                order.push(&s.cluster);
                by_cluster.insert(&s.cluster, (order.len(), matches!(s.standing, Standing::Absent { .. })));
            }
        }
    }
    let mut t = String::from("<table class=\"grid\"><thead><tr><th class=\"cl\">cluster</th>");
    for c in &report.components {
        let _ = write!(
            t,
            "<th class=\"comp\" title=\"{}\">{}</th>",
            esc(&c.component),
            esc(&shorten(c.component.rsplit('/').next().unwrap_or(&c.component), 24))
        );
    }
    t += "</tr></thead><tbody>";
    for cluster in &order {
        let absent = by_cluster.get(cluster).is_some_and(|(_, a)| *a);
        let _ = write!(
            t,
            "<tr{}><td class=\"cl\">{}</td>",
            if absent { " class=\"absent-row\"" } else { "" },
            esc(cluster)
        );
        for c in &report.components {
            let cell = match c.standings.iter().find(|s| s.cluster == *cluster).map(|s| &s.standing) {
                Some(Standing::Done) => format!("<td class=\"done\">{}</td>", esc(&c.wanted)),
                Some(Standing::Behind { versions, .. }) => {
                    format!("<td class=\"behind\" title=\"straggler\">{} &#9888;</td>", esc(&versions.join(", ")))
                }
                Some(Standing::Absent { .. }) => "<td class=\"absent\">absent</td>".to_string(),
                Some(Standing::Missing) | None => "<td class=\"missing\">&mdash;</td>".to_string(),
            };
            t += &cell;
        }
        t += "</tr>";
    }
    t += "</tbody></table><p class=\"legend\">Legend:<span class=\"chip done\">wanted version</span><span class=\"chip behind\">straggler &#9888;</span><span class=\"chip absent\">absent</span> &mdash; not running it</p>";
    t
}

fn component_card(c: &ComponentReport, slo: Option<&SloReport>) -> String {
    let mut h = String::from("<section class=\"card\">");
    let pct = if c.in_scope == 0 { 100.0 } else { c.done as f64 * 100.0 / c.in_scope as f64 };
    let _ = write!(
        h,
        "<div class=\"card-head\"><h3>{}</h3><span class=\"sum\">{}/{} clusters done on <b>{}</b> ({:.0}%){}</span></div>",
        esc(&c.component),
        c.done,
        c.in_scope,
        esc(&c.wanted),
        pct,
        slo.map(|s| format!(" &middot; {}", esc(&slo_verdict(s)))).unwrap_or_default()
    );
    let behind: std::collections::BTreeSet<&str> = c.stragglers.iter().map(|s| s.cluster.as_str()).collect();
    let total = c.in_scope.max(1) as f64;
    h += "<table><thead><tr><th>version</th><th class=\"num\">clusters</th><th style=\"width:16%\"></th><th>where</th></tr></thead><tbody>";
    for v in &c.versions {
        let badge = match v.supported {
            Some(false) => " <span class=\"badge unsupported\">UNSUPPORTED</span>",
            _ if v.version == c.wanted => " <span class=\"badge wanted\">wanted</span>",
            _ => "",
        };
        let chips: String = v
            .clusters
            .iter()
            .map(|cl| {
                let class = if behind.contains(cl.as_str()) { "behind" } else { "done" };
                format!("<span class=\"chip {class}\">{}</span>", esc(cl))
            })
            .collect();
        let _ = write!(
            h,
            "<tr><td class=\"ver\">{}{badge}</td><td class=\"num\">{}</td><td><div class=\"bar\"><i style=\"width:{:.1}%\"></i></div></td><td>{chips}</td></tr>",
            esc(&v.version),
            v.clusters.len(),
            v.clusters.len() as f64 * 100.0 / total
        );
    }
    let absent: Vec<&str> = c
        .standings
        .iter()
        .filter(|s| matches!(s.standing, Standing::Absent { .. }))
        .map(|s| s.cluster.as_str())
        .collect();
    if !absent.is_empty() {
        let chips: String = absent.iter().map(|cl| format!("<span class=\"chip absent\">{}</span>", esc(cl))).collect();
        let _ = write!(
            h,
            "<tr><td class=\"ver\">absent</td><td class=\"num\">{}</td><td><div class=\"bar\"><i style=\"width:{:.1}%;background:#b42318\"></i></div></td><td>{chips}</td></tr>",
            absent.len(),
            absent.len() as f64 * 100.0 / total
        );
    }
    h += "</tbody></table>";
    if !c.stragglers.is_empty() {
        h += "<ul class=\"why\">";
        for s in &c.stragglers {
            let _ = write!(
                h,
                "<li class=\"straggler\">straggler <b>{}</b>{}: {}</li>",
                esc(&s.cluster),
                labels(&s.labels),
                esc(&s.why(&c.component))
            );
        }
        h += "</ul>";
    }
    h += "</section>\n";
    h
}

fn labels(l: &BTreeMap<String, String>) -> String {
    if l.is_empty() {
        return String::new();
    }
    format!(
        " <span class=\"note\">{}</span>",
        esc(&l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
    )
}

/// Long registry paths keep their end, which names the component.
fn shorten(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    format!("…{}", s.chars().skip(n - max + 1).collect::<String>())
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::matrix::{build, MatrixOptions};
    use crate::fleet::model::{ClusterInventory, Inventory, Kind};

    fn cluster(name: &str, version: &str) -> ClusterInventory {
        ClusterInventory::running(name, Kind::DaemonSet, "mon", &format!("reg/agent:{version}"))
    }

    #[test]
    fn the_page_names_stragglers_and_absent_clusters_and_needs_nothing_external() {
        let inv = Inventory {
            taken_at: time::OffsetDateTime::UNIX_EPOCH,
            clusters: vec![
                cluster("a", "2.0"),
                cluster("b<x>", "1.9"),
                ClusterInventory::absent("gone", "no answer".into(), None),
            ],
        };
        let report = build(&inv, &MatrixOptions { supported: Some(1), ..Default::default() });
        let page = render(&report, "the Kubernetes API (test)");
        assert!(
            page.contains("straggler <b>b&lt;x&gt;</b>: old version 1.9 (wanted 2.0) in DaemonSet mon/agent"),
            "{page}"
        );
        assert!(page.contains("<td class=\"absent\">absent</td>"));
        assert!(page.contains("<b>gone</b>: absent, never seen by rdeploy: no answer"));
        assert!(page.contains("UNSUPPORTED"));
        assert!(page.contains("1970-01-01T00:00:00Z"));
        for external in ["<script", "http://", "https://", "@import", "url("] {
            let hits: Vec<&str> = page.matches(external).collect();
            // The SVG namespace is an identifier, not a fetch.
            assert!(hits.iter().all(|_| external == "http://") || hits.is_empty(), "{external}");
        }
        assert_eq!(page.matches("http://").count(), 1, "only the SVG namespace");
    }
}
