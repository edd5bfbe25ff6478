//! Parsers for ansible-playbook's human output: the PLAY RECAP lines (a fallback when the
//! callback wrote no stats) and `--list-hosts` (the hosts a run will touch, for `Planned`).

use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::OnceLock;

use regex::Regex;

/// One host's line of the PLAY RECAP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecapLine {
    pub host: String,
    pub ok: u64,
    pub changed: u64,
    pub unreachable: u64,
    pub failed: u64,
    pub skipped: u64,
    pub rescued: u64,
    pub ignored: u64,
}

fn recap_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // Field order is fixed by the default callback (ansible-core 2.19, captured/*.stdout).
    RE.get_or_init(|| {
        Regex::new(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)")
            .expect("recap regex")
    })
}

/// Parses one recap line; anything else is `None`.
pub fn parse_recap_line(line: &str) -> Option<RecapLine> {
    let caps = recap_regex().captures(line.trim_start())?;
    let n = |i: usize| caps[i].parse::<u64>().ok();
    Some(RecapLine {
        host: caps[1].to_string(),
        ok: n(2)?,
        changed: n(3)?,
        unreachable: n(4)?,
        failed: n(5)?,
        skipped: n(6)?,
        rescued: n(7)?,
        ignored: n(8)?,
    })
}

/// Every recap line in a run's output.
pub fn parse_recap(output: &str) -> Vec<RecapLine> {
    output.lines().filter_map(parse_recap_line).collect()
}

/// The hosts `ansible-playbook --list-hosts` prints, over all plays, each once, in natural
/// order (web2 before web10). A play's list follows its `hosts (N):` line, indented deeper.
pub fn parse_list_hosts(output: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut hosts = Vec::new();
    let mut header_indent: Option<usize> = None;
    for line in output.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if let Some(at) = header_indent {
            if !text.is_empty() && indent > at {
                if seen.insert(text.to_string()) {
                    hosts.push(text.to_string());
                }
                continue;
            }
            header_indent = None;
        }
        if text.starts_with("hosts (") && text.ends_with("):") {
            header_indent = Some(indent);
        }
    }
    hosts.sort_by(|a, b| natural_cmp(a, b));
    hosts
}

/// Compares names with digit runs as numbers, so host lists read web1, web2, web10.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, _) => return Ordering::Less,
            (_, None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (na, nb) = (trim_zeros(&a[..da]), trim_zeros(&b[..db]));
                let order = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb)).then_with(|| da.cmp(&db));
                if order != Ordering::Equal {
                    return order;
                }
                a = &a[da..];
                b = &b[db..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let start = digits.iter().position(|&d| d != b'0').unwrap_or(digits.len());
    &digits[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ansible/captured").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn parses_the_recap_of_a_real_run() {
        let recap = parse_recap(&captured("site-web3-fails.stdout"));
        assert_eq!(recap.len(), 5);
        assert_eq!(
            recap[2],
            RecapLine {
                host: "web3".into(),
                ok: 1,
                changed: 1,
                unreachable: 0,
                failed: 1,
                skipped: 0,
                rescued: 0,
                ignored: 0
            }
        );
        let unreachable = parse_recap(&captured("unreachable-and-failed.stdout"));
        let db1 = unreachable.iter().find(|r| r.host == "db1").unwrap();
        assert_eq!((db1.unreachable, db1.failed), (1, 0));
    }

    #[test]
    fn other_lines_are_not_recap_lines() {
        assert_eq!(parse_recap_line("PLAY RECAP ****"), None);
        assert_eq!(parse_recap_line("changed: [web1]"), None);
        assert_eq!(parse_recap_line("web1 : ok=x"), None);
    }

    #[test]
    fn lists_hosts_once_over_all_plays_in_natural_order() {
        assert_eq!(parse_list_hosts(&captured("list-hosts.stdout")), vec!["web1", "web2", "web3", "web4", "web5"]);
        assert_eq!(parse_list_hosts(&captured("list-hosts-two-plays.stdout")), vec!["db1", "web1", "web3", "web4"]);
        assert!(parse_list_hosts(
            "playbook: x.yml\n\n  play #1 (none): p\tTAGS: []\n    pattern: ['none']\n    hosts (0):\n"
        )
        .is_empty());
    }

    #[test]
    fn natural_order_reads_numbers_as_numbers() {
        let mut names = vec!["web10", "web2", "db1", "web1", "web02"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, vec!["db1", "web1", "web2", "web02", "web10"]);
    }
}
