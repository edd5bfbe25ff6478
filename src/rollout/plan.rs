//! The pure half of a rollout: the stable order of the clusters, the cumulative waves cut from
//! it, and the stop rule. No cluster is asked anything here, so tests pick every number.

use std::cmp::Ordering;
use std::ops::Range;

use crate::stack::WaveSize;

/// Compares context names as people sort them: digit runs by their value (`edge-2` before
/// `edge-10`), everything else as text.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.chars().next(), b.chars().next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.len() - a.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let db = b.len() - b.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let (na, nb) = (a[..da].trim_start_matches('0'), b[..db].trim_start_matches('0'));
                let by_value = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if by_value != Ordering::Equal {
                    return by_value;
                }
                (a, b) = (&a[da..], &b[db..]);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(&y);
                }
                (a, b) = (&a[x.len_utf8()..], &b[y.len_utf8()..]);
            }
        }
    }
}

/// The waves over `total` clusters in their stable order: each entry of `sizes` is cumulative
/// (a count, or a share rounded up), a wave that adds nothing is dropped, and the last wave takes
/// every cluster left, so no cluster in scope is forgotten.
pub fn waves(total: usize, sizes: &[WaveSize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut reached = 0;
    for size in sizes {
        let upto = match *size {
            WaveSize::Count(n) => n,
            WaveSize::Percent(p) => ((p / 100.0) * total as f64).ceil() as usize,
        }
        .min(total);
        if upto > reached {
            out.push(reached..upto);
            reached = upto;
        }
    }
    if reached < total {
        match out.last_mut() {
            // The shares rounded short of the whole fleet: the last wave takes the rest.
            Some(last) if sizes.last().is_some_and(|s| matches!(s, WaveSize::Percent(p) if *p >= 100.0)) => {
                last.end = total
            }
            _ => out.push(reached..total),
        }
    }
    out
}

/// Whether the rollout must stop: more failed clusters than it tolerates.
pub fn must_stop(failed: usize, tolerated: usize) -> bool {
    failed > tolerated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::MaxFailures;

    #[test]
    fn clusters_sort_by_the_numbers_in_their_names() {
        let mut names = vec!["edge-10", "edge-2", "core", "edge-1", "edge-002a", "edge-2b"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["core", "edge-1", "edge-2", "edge-002a", "edge-2b", "edge-10"]);
    }

    #[test]
    fn waves_are_cumulative_and_cover_every_cluster() {
        let sizes = [WaveSize::Count(1), WaveSize::Percent(10.0), WaveSize::Percent(50.0), WaveSize::Percent(100.0)];
        // 10% of 10 is the one cluster the first wave already has: that wave adds nothing.
        assert_eq!(waves(10, &sizes), vec![0..1, 1..5, 5..10]);
        assert_eq!(waves(400, &sizes), vec![0..1, 1..40, 40..200, 200..400]);
        assert_eq!(waves(3, &[WaveSize::Count(1), WaveSize::Count(2)]), vec![0..1, 1..2, 2..3]);
        assert_eq!(waves(2, &[WaveSize::Count(5)]), vec![0..2]);
        assert_eq!(waves(0, &sizes), Vec::<Range<usize>>::new());
    }

    #[test]
    fn the_stop_rule_counts_or_takes_a_share() {
        assert!(must_stop(1, MaxFailures::Count(0).of(10)));
        assert!(!must_stop(1, MaxFailures::Count(1).of(10)));
        assert_eq!(MaxFailures::Percent(5.0).of(400), 20);
        assert_eq!(MaxFailures::Percent(5.0).of(10), 0);
    }
}
