//! Checks of a step's input files that need no cluster, host or state: errors knowable before
//! anything runs, so `validate` and the start of `up` refuse them (exit 2, nothing recorded)
//! instead of a recorded deploy stopped part-way. Each check says what it costs.

use std::path::Path;

use crate::AdapterError;

/// A local chart whose `dependencies` (Chart.yaml, or requirements.yaml for apiVersion v1) are not
/// all in its `charts/` directory, as a directory or a `NAME-VERSION.tgz`: helm would refuse it
/// at install ("found in Chart.yaml, but missing in charts/ directory"). Cost: reading
/// Chart.yaml and listing `charts/`, no helm call.
pub fn chart_dependencies(dir: &Path) -> Result<(), AdapterError> {
    let chart_yaml = dir.join("Chart.yaml");
    let Ok(text) = std::fs::read_to_string(&chart_yaml) else {
        return Ok(()); // a repository or OCI chart: helm resolves it
    };
    let mut deps = dependency_names(&text);
    if let Ok(requirements) = std::fs::read_to_string(dir.join("requirements.yaml")) {
        deps.extend(dependency_names(&requirements));
    }
    let listing: Vec<String> = std::fs::read_dir(dir.join("charts"))
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let present = |name: &str| {
        listing.iter().any(|f| {
            f == name
                || f.strip_suffix(".tgz")
                    .and_then(|stem| stem.strip_prefix(name))
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit() || c == 'v'))
        })
    };
    let missing: Vec<String> = deps.into_iter().filter(|d| !present(d)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(AdapterError::BadInput {
        what: format!(
            "{}: the chart's dependencies are not built: {} missing from {}",
            chart_yaml.display(),
            missing.join(", "),
            dir.join("charts").display()
        ),
        hint: format!(
            "run `helm dependency build {}` (it fetches them into charts/), then run rdeploy again",
            crate::shell_quote(&dir.to_string_lossy())
        ),
    })
}

/// The `name` of every entry of a Chart.yaml's (or requirements.yaml's) `dependencies`.
fn dependency_names(text: &str) -> Vec<String> {
    let Ok(doc) = crate::kubectl::manifest::parse_yaml(text) else { return Vec::new() };
    doc.get("dependencies")
        .and_then(|d| d.as_array())
        .map(|deps| deps.iter().filter_map(|d| d.get("name")?.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// `ansible-playbook --syntax-check`'s last error line when it failed, as a refusal naming the
/// playbook. Cost: one more ansible-playbook start (about a second).
pub fn playbook_syntax(playbook: &Path, command: &str, detail: Option<String>) -> AdapterError {
    AdapterError::BadInput {
        what: format!(
            "{}: the playbook does not parse (`{command}`): {}",
            playbook.display(),
            detail.unwrap_or_else(|| "ansible printed no reason".into())
        ),
        hint: format!("fix the playbook; `{command}` checks it without running anything"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_with_unbuilt_dependencies_is_refused_with_the_build_command() {
        let dir = tempfile::tempdir().unwrap();
        let chart = dir.path();
        std::fs::write(
            chart.join("Chart.yaml"),
            "apiVersion: v2\nname: shop\nversion: 1.0.0\ndependencies:\n  - name: redis\n    version: 19.x\n    repository: oci://registry-1.docker.io/bitnamicharts\n  - name: common\n    version: 2.x.x\n    repository: file://../common\n",
        )
        .unwrap();
        let err = chart_dependencies(chart).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("redis, common missing"), "{text}");
        assert!(err.hint().unwrap().contains("helm dependency build"), "{err:?}");

        std::fs::create_dir_all(chart.join("charts/common")).unwrap();
        std::fs::write(chart.join("charts/redis-19.6.4.tgz"), "").unwrap();
        chart_dependencies(chart).unwrap();
        // A file that only starts with the name is not the dependency.
        std::fs::remove_file(chart.join("charts/redis-19.6.4.tgz")).unwrap();
        std::fs::write(chart.join("charts/redis-cluster-9.0.0.tgz"), "").unwrap();
        assert!(chart_dependencies(chart).unwrap_err().to_string().contains("redis missing"));
    }

    #[test]
    fn a_chart_without_dependencies_or_not_local_passes() {
        let dir = tempfile::tempdir().unwrap();
        chart_dependencies(&dir.path().join("nowhere")).unwrap();
        std::fs::write(dir.path().join("Chart.yaml"), "apiVersion: v2\nname: a\nversion: 0.1.0\n").unwrap();
        chart_dependencies(dir.path()).unwrap();
    }
}
