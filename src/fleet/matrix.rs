//! The version matrix: per component, each version with the clusters running it, the
//! stragglers named with why, versions outside the support window as incidents, and the SLO.
//! Built once as data (the `--json` document), then rendered as a terminal table or markdown.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use super::analysis::{absent_why, judge, rfc3339, versions_of, ClusterStanding, Filter, Standing};
use super::model::{Inventory, Presence};
use super::slo::{self, ObjectiveState, SloReport};

#[derive(Debug, Serialize)]
pub struct Report {
    pub taken_at: String,
    pub clusters: usize,
    pub answered: usize,
    pub absent: Vec<AbsentCluster>,
    pub components: Vec<ComponentReport>,
    pub incidents: Vec<Incident>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slo: Vec<SloReport>,
}

#[derive(Debug, Serialize)]
pub struct AbsentCluster {
    pub cluster: String,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    pub error: String,
}

#[derive(Debug, Serialize)]
pub struct ComponentReport {
    pub component: String,
    /// The version clusters are judged against: the newest, or the one asked for.
    pub wanted: String,
    /// Clusters running only `wanted` with no unfinished rollout.
    pub done: usize,
    /// Clusters running the component, plus the absent ones (they may run it).
    pub in_scope: usize,
    pub versions: Vec<VersionRow>,
    /// Clusters that run the component and are not done (absent ones are listed once, above).
    pub stragglers: Vec<ClusterStanding>,
    #[serde(skip)]
    pub standings: Vec<ClusterStanding>,
}

#[derive(Debug, Serialize)]
pub struct VersionRow {
    pub version: String,
    pub clusters: Vec<String>,
    /// `false` when `--supported N` leaves it out of the support window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supported: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct Incident {
    pub component: String,
    pub version: String,
    pub clusters: Vec<String>,
    pub message: String,
}

/// What to put in the matrix.
#[derive(Debug, Default)]
pub struct MatrixOptions {
    /// Only this component; with `:TAG`, judged against that version instead of the newest.
    pub component: Option<(String, Option<String>)>,
    pub supported: Option<usize>,
    pub filter: Filter,
}

pub fn build(inventory: &Inventory, options: &MatrixOptions) -> Report {
    let absent: Vec<AbsentCluster> = inventory
        .clusters
        .iter()
        .filter_map(|c| match &c.presence {
            Presence::Absent { error, last_seen } => Some(AbsentCluster {
                cluster: c.name.clone(),
                labels: c.labels.clone(),
                last_seen: last_seen.map(rfc3339),
                error: error.clone(),
            }),
            Presence::Present => None,
        })
        .collect();
    let names: BTreeSet<String> = match &options.component {
        Some((c, _)) => [super::model::normalize_repo(c)].into(),
        None => inventory
            .clusters
            .iter()
            .flat_map(|c| &c.workloads)
            .filter(|w| w.is_live())
            .flat_map(|w| &w.containers)
            .map(|x| x.component.clone())
            .collect(),
    };
    let mut components = Vec::new();
    let mut incidents = Vec::new();
    for name in names {
        let versions = versions_of(inventory, &name, &options.filter);
        let wanted = match &options.component {
            Some((_, Some(v))) => v.clone(),
            _ => match versions.first() {
                Some(v) => v.clone(),
                None => continue,
            },
        };
        let standings = judge(inventory, &name, &wanted, &options.filter);
        let rows: Vec<VersionRow> = versions
            .iter()
            .enumerate()
            .map(|(i, v)| VersionRow {
                version: v.clone(),
                clusters: standings
                    .iter()
                    .filter(|s| match &s.standing {
                        Standing::Done => v == &wanted,
                        Standing::Behind { versions, .. } => versions.contains(v),
                        _ => false,
                    })
                    .map(|s| s.cluster.clone())
                    .collect(),
                supported: options.supported.map(|n| i < n),
            })
            .collect();
        for row in rows.iter().filter(|r| r.supported == Some(false) && !r.clusters.is_empty()) {
            let window: Vec<&str> = versions.iter().take(options.supported.unwrap_or(0)).map(String::as_str).collect();
            incidents.push(Incident {
                component: name.clone(),
                version: row.version.clone(),
                clusters: row.clusters.clone(),
                message: format!(
                    "{name} {} is older than the supported versions ({}) on {}",
                    row.version,
                    window.join(", "),
                    row.clusters.join(", ")
                ),
            });
        }
        let in_scope = standings.iter().filter(|s| s.standing != Standing::Missing).count();
        components.push(ComponentReport {
            component: name,
            done: standings.iter().filter(|s| s.standing == Standing::Done).count(),
            in_scope,
            wanted,
            versions: rows,
            stragglers: standings.iter().filter(|s| matches!(s.standing, Standing::Behind { .. })).cloned().collect(),
            standings,
        });
    }
    Report {
        taken_at: rfc3339(inventory.taken_at),
        clusters: inventory.clusters.len(),
        answered: inventory.clusters.iter().filter(|c| !c.is_absent()).count(),
        absent,
        components,
        incidents,
        slo: Vec::new(),
    }
}

impl Report {
    pub fn slo_breached(&self) -> bool {
        self.slo.iter().any(|s| s.breached)
    }

    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "fleet inventory at {}: {} clusters, {} answered, {} absent",
            self.taken_at,
            self.clusters,
            self.answered,
            self.absent.len()
        );
        for c in &self.components {
            let _ = writeln!(out, "\n{}  {}/{} clusters done on {}", c.component, c.done, c.in_scope, c.wanted);
            let mut rows = vec![["VERSION".to_string(), "CLUSTERS".to_string(), "WHERE".to_string(), String::new()]];
            for v in &c.versions {
                let note = match v.supported {
                    Some(false) => "UNSUPPORTED",
                    _ if v.version == c.wanted => "wanted",
                    _ => "",
                };
                rows.push([v.version.clone(), v.clusters.len().to_string(), list(&v.clusters, 6), note.to_string()]);
            }
            out += &table(&rows, "  ");
            for s in &c.stragglers {
                let _ = writeln!(out, "  straggler {}{}: {}", s.cluster, labels(&s.labels), s.why(&c.component));
            }
        }
        if !self.absent.is_empty() {
            let _ = writeln!(out, "\nabsent clusters (they count as not done for every component):");
            for a in &self.absent {
                let _ = writeln!(
                    out,
                    "  {}{}: {}",
                    a.cluster,
                    labels(&a.labels),
                    absent_why(&a.error, a.last_seen.as_deref().and_then(parse_time))
                );
            }
        }
        if !self.incidents.is_empty() {
            let _ = writeln!(out, "\nincidents:");
            for i in &self.incidents {
                let _ = writeln!(out, "  {}", i.message);
            }
        }
        for s in &self.slo {
            out += &slo_text(s, "");
        }
        out
    }

    pub fn render_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Fleet inventory\n\nTaken at {}: {} clusters, {} answered, {} absent.",
            self.taken_at,
            self.clusters,
            self.answered,
            self.absent.len()
        );
        for c in &self.components {
            let _ = writeln!(out, "\n## `{}`\n\n{}/{} clusters done on `{}`.\n\n| version | clusters | where | |\n| --- | ---: | --- | --- |", c.component, c.done, c.in_scope, c.wanted);
            for v in &c.versions {
                let note = match v.supported {
                    Some(false) => "**unsupported**",
                    _ if v.version == c.wanted => "wanted",
                    _ => "",
                };
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {note} |",
                    v.version,
                    v.clusters.len(),
                    md(&list(&v.clusters, 12))
                );
            }
            if !c.stragglers.is_empty() {
                let _ = writeln!(out, "\nStragglers:\n");
                for s in &c.stragglers {
                    let _ = writeln!(out, "- **{}**{}: {}", s.cluster, labels(&s.labels), md(&s.why(&c.component)));
                }
            }
        }
        if !self.absent.is_empty() {
            let _ = writeln!(out, "\n## Absent clusters\n\nThey count as not done for every component.\n");
            for a in &self.absent {
                let _ = writeln!(
                    out,
                    "- **{}**{}: {}",
                    a.cluster,
                    labels(&a.labels),
                    md(&absent_why(&a.error, a.last_seen.as_deref().and_then(parse_time)))
                );
            }
        }
        if !self.incidents.is_empty() {
            let _ = writeln!(out, "\n## Incidents\n");
            for i in &self.incidents {
                let _ = writeln!(out, "- {}", md(&i.message));
            }
        }
        if !self.slo.is_empty() {
            let _ = writeln!(out, "\n## Rollout-completion SLO\n");
            for s in &self.slo {
                out += &slo_text(s, "- ");
            }
        }
        out
    }
}

fn slo_text(s: &SloReport, bullet: &str) -> String {
    let mut out = String::new();
    let since = match (&s.started, &s.started_by) {
        (Some(t), Some(by)) => format!("rollout started {t} ({by})"),
        _ => "no recorded rollout start: run `rdeploy inventory` when it begins, or pass `--since`".into(),
    };
    let verdict = if s.breached { "BREACHED" } else { "ok" };
    let _ = writeln!(
        out,
        "\n{bullet}slo {verdict}: {} {}: {}/{} clusters done ({}%), {since}",
        s.component, s.version, s.done, s.in_scope, s.percent
    );
    for o in &s.objectives {
        let line = match o.state {
            ObjectiveState::Met => "met".to_string(),
            ObjectiveState::Pending => format!(
                "not yet: due in {}, {} more cluster(s) needed ({} points short)",
                slo::human(o.seconds.unwrap_or(0)),
                o.clusters_short,
                o.points_short
            ),
            ObjectiveState::Breached => format!(
                "BREACHED {} ago: {} more cluster(s) needed ({} points short)",
                slo::human(o.seconds.unwrap_or(0)),
                o.clusters_short,
                o.points_short
            ),
            ObjectiveState::Unknown => format!("unknown: {} more cluster(s) needed", o.clusters_short),
        };
        let _ = writeln!(out, "{}  {}: {line}", if bullet.is_empty() { "" } else { "  " }, o.objective);
    }
    if !s.breaching.is_empty() {
        let _ = writeln!(out, "{}  breaching: {}", if bullet.is_empty() { "" } else { "  " }, s.breaching.join(", "));
    }
    out
}

fn parse_time(s: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
}

fn labels(l: &std::collections::BTreeMap<String, String>) -> String {
    if l.is_empty() {
        return String::new();
    }
    format!(" [{}]", l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
}

fn list(names: &[String], max: usize) -> String {
    if names.len() <= max {
        names.join(", ")
    } else {
        format!("{}, and {} more", names[..max].join(", "), names.len() - max)
    }
}

fn md(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
fn table(rows: &[[String; 4]], indent: &str) -> String {
    let mut widths = [0usize; 4];
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = indent.to_string();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line += cell;
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::model::{ClusterInventory, Kind};
    use time::OffsetDateTime;

    fn cluster(name: &str, version: &str) -> ClusterInventory {
        ClusterInventory::running(name, Kind::Deployment, "n", &format!("reg/agent:{version}"))
    }

    #[test]
    fn matrix_counts_versions_names_stragglers_and_flags_unsupported() {
        let inv = Inventory {
            taken_at: OffsetDateTime::UNIX_EPOCH,
            clusters: vec![
                cluster("a", "2.0"),
                cluster("b", "2.0"),
                cluster("c", "1.9"),
                cluster("d", "1.8"),
                ClusterInventory::absent("e", "timeout".into(), None),
            ],
        };
        let r = build(&inv, &MatrixOptions { supported: Some(2), ..Default::default() });
        let c = &r.components[0];
        assert_eq!((c.component.as_str(), c.wanted.as_str(), c.done, c.in_scope), ("reg/agent", "2.0", 2, 5));
        let rows: Vec<(&str, usize)> = c.versions.iter().map(|v| (v.version.as_str(), v.clusters.len())).collect();
        assert_eq!(rows, [("2.0", 2), ("1.9", 1), ("1.8", 1)]);
        assert_eq!(r.incidents.len(), 1);
        assert_eq!(r.incidents[0].message, "reg/agent 1.8 is older than the supported versions (2.0, 1.9) on d");
        let text = r.render_text();
        assert!(text.contains("straggler c: old version 1.9 (wanted 2.0) in Deployment n/agent"), "{text}");
        assert!(text.contains("  e: absent, never seen by rdeploy: timeout"), "{text}");
        assert!(text.contains("  1.8      1         d      UNSUPPORTED"), "{text}");
        let md = r.render_markdown();
        assert!(md.contains("| `1.8` | 1 | d | **unsupported** |"), "{md}");
    }
}
