//! The order between steps: `needs` naming steps of the stack, the order they run in (a cycle
//! named where it is made), and expand/migrate/contract phases in that order.

use std::collections::HashMap;

use rdeploy_adapters::suggest;
use rdeploy_adapters::yaml::{Span, Spanned};

use super::base::Checker;
use super::references::ImplicitNeeds;
use super::step::{Phase, Step};

/// `needs` must name steps of the stack, other than the step itself; `written` holds every
/// step name written (sorted), also of steps with problems. Whether every `needs` was fine.
pub(super) fn check_needs(
    checker: &mut Checker<'_>,
    steps: &[Step],
    needs_spans: &[Vec<Spanned<String>>],
    written: &[&str],
) -> bool {
    let mut fine = true;
    for (step, needs) in steps.iter().zip(needs_spans) {
        for need in needs {
            if need.as_str() == step.name {
                fine = false;
                checker.at(
                    need.span(),
                    format!("step `{}` needs itself", step.name),
                    Some("remove it from `needs`".into()),
                );
            } else if written.binary_search(&need.as_str()).is_err() {
                fine = false;
                let hint = suggest(need.as_str(), written).map(|s| format!("did you mean `{s}`?"));
                checker.at(
                    need.span(),
                    format!("step `{}` needs `{}`, which is not a step of this stack", step.name, need.as_str()),
                    hint,
                );
            }
        }
    }
    fine
}

/// Names a cycle from the step that comes first in the file, at the reference that made one
/// of its edges if `needs` did not.
pub(super) fn report_cycle(
    checker: &mut Checker<'_>,
    steps: &[Step],
    mut cycle: Vec<usize>,
    implicit: &ImplicitNeeds,
    needs_spans: &[Vec<Spanned<String>>],
    name_spans: &[(String, Span)],
) {
    let min = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
    cycle.rotate_left(min);
    let first = cycle[0];
    let path: Vec<&str> = cycle.iter().chain(std::iter::once(&first)).map(|&i| steps[i].name.as_str()).collect();
    // `cycle[k]` needs `cycle[k + 1]`...: an edge that only a reference made is named.
    let by_reference = (0..cycle.len()).find_map(|k| {
        let (a, b) = (cycle[k], cycle[(k + 1) % cycle.len()]);
        let pair = [(a, b), (b, a)].into_iter().find(|p| implicit.contains_key(p))?;
        let explicit = needs_spans[pair.0].iter().any(|n| n.as_str() == steps[pair.1].name);
        (!explicit).then(|| implicit[&pair])
    });
    match by_reference {
        Some(span) => checker.at(
            &span,
            format!("this output reference makes a cycle between steps: {}", path.join(" -> ")),
            Some(
                "a step can only use the outputs of steps that run before it; remove the reference or a `needs`".into(),
            ),
        ),
        None => checker.at(
            &name_spans[first].1,
            format!("the steps' `needs` form a cycle: {}", path.join(" -> ")),
            Some("remove one of these `needs` so the steps can run in order".into()),
        ),
    }
}

/// The order steps run in: `needs` first, file order otherwise. `Err` holds a cycle.
pub(super) fn run_order(steps: &[Step]) -> Result<Vec<usize>, Vec<usize>> {
    let index: HashMap<&str, usize> = steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let mut indegree = vec![0usize; steps.len()];
    let mut dependents = vec![Vec::new(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        // A `needs` naming no parsed step is reported apart; the order is of the rest.
        for &j in step.needs.iter().filter_map(|n| index.get(n.as_str())) {
            indegree[i] += 1;
            dependents[j].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..steps.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(steps.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &d in &dependents[i] {
            indegree[d] -= 1;
            if indegree[d] == 0 {
                ready.insert(d);
            }
        }
    }
    if order.len() == steps.len() {
        return Ok(order);
    }
    // Walk `needs` from a step left over until a step repeats: that is the cycle.
    let start = (0..steps.len()).find(|&i| indegree[i] > 0).expect("a step is left over");
    let mut path = vec![start];
    // Where each step sits on the path, so finding the repeat is not a scan of the path.
    let mut on_path = vec![usize::MAX; steps.len()];
    on_path[start] = 0;
    let mut current = start;
    loop {
        let next = steps[current]
            .needs
            .iter()
            .filter_map(|n| index.get(n.as_str()).copied())
            .find(|&j| indegree[j] > 0)
            .expect("a left-over step needs another left-over step");
        if on_path[next] != usize::MAX {
            let mut cycle = path.split_off(on_path[next]);
            cycle.reverse();
            return Err(cycle);
        }
        on_path[next] = path.len();
        path.push(next);
        current = next;
    }
}

/// Expand/migrate/contract: a contract step needs a gate and must run after every expand step.
/// The order is `None` when it is not known (a cycle, a `needs` naming no step): then only the
/// gates are checked, so that no problem is reported that another one caused.
pub(super) fn check_phases(
    checker: &mut Checker<'_>,
    steps: &[Step],
    order: Option<&[usize]>,
    phase_spans: &[Option<Span>],
) {
    let position: Option<Vec<usize>> = order.map(|order| {
        let mut pos = vec![0; steps.len()];
        for (p, &i) in order.iter().enumerate() {
            pos[i] = p;
        }
        pos
    });
    let expand: Vec<usize> = (0..steps.len()).filter(|&j| steps[j].phase == Some(Phase::Expand)).collect();
    for (i, step) in steps.iter().enumerate() {
        if step.phase != Some(Phase::Contract) {
            continue;
        }
        let span = phase_spans[i].unwrap_or_else(Span::new_blank);
        if step.gate.is_none() {
            checker.at(
                &span,
                format!("contract step `{}` has no `gate`", step.name),
                Some("a contract step assumes every cluster upgraded: add `gate: { inventory: ... }` so rdeploy can check".into()),
            );
        }
        let Some(position) = &position else { continue };
        for &j in &expand {
            let other = &steps[j];
            if position[j] > position[i] {
                checker.at(
                    &span,
                    format!("contract step `{}` runs before expand step `{}`", step.name, other.name),
                    Some(format!("add `needs: [{}]` to `{}`", other.name, step.name)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::stack::{parse, problems};

    #[test]
    fn duplicate_names_bad_needs_and_cycles() {
        let p = problems(
            "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n  - name: a\n    tool: shell\n    run: y\n",
        );
        assert_eq!(p[0].line, 6);
        assert!(p[0].message.contains("used twice (first on line 3)"));

        let p = problems("name: s\nsteps:\n  - name: net\n    tool: shell\n    run: x\n  - name: b\n    tool: shell\n    needs: [nett]\n    run: y\n");
        assert_eq!((p[0].line, p[0].column), (8, 13));
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `net`?"));

        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    needs: [b]\n    run: x\n  - name: b\n    tool: shell\n    needs: [a]\n    run: y\n");
        assert_eq!(p.len(), 1);
        assert!(p[0].message.contains("cycle"), "{}", p[0].message);
        assert!(p[0].message.contains("a -> b -> a") || p[0].message.contains("b -> a -> b"));
    }

    #[test]
    fn contract_steps_need_a_gate_and_come_after_expand() {
        let p = problems("name: s\nsteps:\n  - name: drop\n    tool: shell\n    phase: contract\n    run: x\n  - name: add\n    tool: shell\n    phase: expand\n    run: y\n");
        assert_eq!(p.len(), 2);
        assert!(p[0].message.contains("has no `gate`"));
        assert!(p[1].message.contains("runs before expand step `add`"));
    }

    /// A step with a bad value still counts as a step: `needs: [base]` is not reported, the
    /// misspelt `needs: [bsae]` gets a did-you-mean, and `wait` says which values it takes.
    #[test]
    fn a_step_with_a_bad_value_still_counts_as_a_step() {
        let p = problems("name: s\nsteps:\n  - name: base\n    tool: helm\n    release: base\n    chart: repo/web\n    wait: yes please\n  - name: web\n    tool: shell\n    needs: [base, bsae]\n    run: ${{ steps.bas.outputs.host }}\n");
        assert_eq!(p.len(), 3, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (7, 11));
        assert_eq!(p[0].message, "step `base`: `wait`: value was not a boolean");
        assert_eq!(
            p[0].hint.as_deref(),
            Some("write `true` or `false` (`yes`, `no`, `on` and `off` are strings in YAML 1.2)")
        );
        assert_eq!(p[1].message, "step `web` needs `bsae`, which is not a step of this stack");
        assert_eq!(p[1].hint.as_deref(), Some("did you mean `base`?"));
        assert!(p[2].message.contains("`bas` is not a step of this stack"), "{}", p[2].message);
        assert_eq!(p[2].hint.as_deref(), Some("did you mean `base`?"));
    }

    fn chain(n: usize, cycle: bool) -> String {
        let mut text = String::from("name: s\nsteps:\n");
        for i in 0..n {
            let need = if i > 0 {
                format!("s{}", i - 1)
            } else if cycle {
                format!("s{}", n - 1)
            } else {
                String::new()
            };
            text += &format!("  - name: s{i}\n    tool: shell\n    run: x\n    revert: y\n    needs: [{need}]\n");
        }
        text
    }

    #[test]
    fn a_long_chain_is_ordered_and_a_long_cycle_named() {
        // The name, `needs` and cycle checks look names up in maps, not in lists (linear, not
        // quadratic, in the steps): 20,000 steps in a chain, then 5,000 closed into a cycle.
        let stack = parse(Path::new("s.yaml"), &chain(20_000, false)).unwrap();
        assert_eq!(stack.order, (0..20_000).collect::<Vec<_>>());
        let p = problems(&chain(5_000, true));
        assert_eq!(p.len(), 1, "{:?}", &p[..p.len().min(3)]);
        assert!(
            p[0].message.starts_with("the steps' `needs` form a cycle: s0 -> s1 -> s2 ->"),
            "{}",
            &p[0].message[..80]
        );
        assert!(p[0].message.ends_with("s4998 -> s4999 -> s0"));
    }
}
