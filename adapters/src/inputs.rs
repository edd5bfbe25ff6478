//! Checks of a step's input files that need no cluster, host or state: errors knowable before
//! anything runs, so `validate` and the start of `up` refuse them (exit 2, nothing recorded)
//! instead of a recorded deploy stopped part-way. Each check says what it costs.

use std::path::Path;

use crate::AdapterError;

/// A local chart whose `dependencies` (Chart.yaml, or requirements.yaml for apiVersion v1) are not
/// all in its `charts/` directory: helm would refuse it at install ("found in Chart.yaml, but
/// missing in charts/ directory"). As helm's `CheckDependencies` does, a dependency is present
/// when a subchart in `charts/` (a directory or an archive) has its name in its own Chart.yaml,
/// whatever the directory or file is called (`charts/bitnami-redis/` of `name: redis`). Cost:
/// reading Chart.yaml, listing `charts/` and each subchart's Chart.yaml (an archive's first
/// entries), no helm call.
pub fn chart_dependencies(dir: &Path) -> Result<(), AdapterError> {
    let chart_yaml = dir.join("Chart.yaml");
    let Ok(text) = std::fs::read_to_string(&chart_yaml) else {
        return Ok(()); // a repository or OCI chart: helm resolves it
    };
    let mut deps = dependency_names(&text);
    if let Ok(requirements) = std::fs::read_to_string(dir.join("requirements.yaml")) {
        deps.extend(dependency_names(&requirements));
    }
    if deps.is_empty() {
        return Ok(());
    }
    let present = subchart_names(&dir.join("charts"));
    let missing: Vec<String> = deps.into_iter().filter(|d| !present.contains(d)).collect();
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

/// The names of the subcharts in a chart's `charts/` directory, each from its own Chart.yaml as
/// helm's loader reads it: a directory's `Chart.yaml`, an archive's `TOP/Chart.yaml`. A subchart
/// rdeploy cannot read (no Chart.yaml, a damaged archive) counts by its file name (`NAME` or
/// `NAME-VERSION.tgz`): helm then reports what is wrong with it, in its own words.
fn subchart_names(charts: &Path) -> std::collections::HashSet<String> {
    let Ok(entries) = std::fs::read_dir(charts) else { return Default::default() };
    let mut names = std::collections::HashSet::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let file = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            match std::fs::read_to_string(path.join("Chart.yaml")).ok().and_then(|t| chart_name(&t)) {
                Some(name) => names.insert(name),
                None => names.insert(file),
            };
        } else if let Some(stem) = file.strip_suffix(".tgz").or_else(|| file.strip_suffix(".tar.gz")) {
            match archive_chart_name(&path) {
                Some(name) => names.insert(name),
                // `redis-19.6.4`: the name is what comes before the version.
                None => names.insert(name_before_version(stem).to_string()),
            };
        }
    }
    names
}

/// `redis` of `redis-19.6.4`, `redis-cluster` of `redis-cluster-9.0.0`.
fn name_before_version(stem: &str) -> &str {
    stem.match_indices('-')
        .find(|(at, _)| stem[at + 1..].starts_with(|c: char| c.is_ascii_digit() || c == 'v'))
        .map(|(at, _)| &stem[..at])
        .unwrap_or(stem)
}

/// The `name` in a Chart.yaml's text.
fn chart_name(text: &str) -> Option<String> {
    crate::kubectl::manifest::parse_yaml(text).ok()?.get("name")?.as_str().map(str::to_string)
}

/// The `name` in the Chart.yaml at the top directory of a chart archive (`redis/Chart.yaml`), as
/// `helm package` writes it; `None` when the archive cannot be read.
fn archive_chart_name(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    for entry in archive.entries().ok()? {
        let mut entry = entry.ok()?;
        let entry_path = entry.path().ok()?.into_owned();
        let parts: Vec<_> = entry_path.components().collect();
        if parts.len() == 2 && parts[1].as_os_str() == "Chart.yaml" {
            let mut text = String::new();
            entry.read_to_string(&mut text).ok()?;
            return chart_name(&text);
        }
    }
    None
}

/// The `name` of every entry of a Chart.yaml's (or requirements.yaml's) `dependencies`.
fn dependency_names(text: &str) -> Vec<String> {
    let Ok(doc) = crate::kubectl::manifest::parse_yaml(text) else { return Vec::new() };
    doc.get("dependencies")
        .and_then(|d| d.as_array())
        .map(|deps| deps.iter().filter_map(|d| d.get("name")?.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// A kubectl step's manifest files that rdeploy could not split into objects: YAML that does
/// not parse, a document without `apiVersion`, `kind` or `metadata.name`, a list (`*List`)
/// whose `items` is not a list of objects. Each is named by file and line. Only the text is
/// read: whether a kind is namespaced is the API's answer, asked when the step runs.
/// `paths` are (as written in the stack, as read); a directory is read as `kubectl apply -f
/// DIR` reads it; a kustomize directory is left to the run (`kubectl kustomize` builds it).
/// Cost: reading and parsing each file once, no kubectl call.
pub fn kubectl_manifests(paths: &[(std::path::PathBuf, std::path::PathBuf)]) -> Result<(), AdapterError> {
    use crate::kubectl::manifest;
    let mut files = Vec::new();
    for (shown, path) in paths {
        if path.is_dir() {
            if manifest::is_kustomization(path) {
                continue;
            }
            for file in manifest::files_in(path).unwrap_or_default() {
                files.push((shown.join(file.file_name().unwrap_or_default()), file));
            }
        } else {
            files.push((shown.clone(), path.clone()));
        }
    }
    let mut problems = Vec::new();
    for (shown, path) in &files {
        // A file that cannot be read is the stack check's to report (`manifests[0]` not found).
        let Ok(text) = std::fs::read_to_string(path) else { continue };
        match crate::yaml::documents_located(&text) {
            Err(e) => problems.push(match e.at {
                Some(at) => {
                    format!("{}:{}:{}: the YAML does not parse: {}", shown.display(), at.line, at.column, e.message)
                }
                None => format!("{}: the YAML does not parse: {}", shown.display(), e.message),
            }),
            Ok(docs) => {
                for (n, (line, doc)) in docs.iter().enumerate() {
                    let at = match line {
                        Some(line) => format!("{}:{line}", shown.display()),
                        None => shown.display().to_string(),
                    };
                    for problem in manifest::split_problems(doc) {
                        problems.push(format!("{at}: document {}: {problem}", n + 1));
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(AdapterError::BadInput {
        what: format!("a manifest rdeploy cannot split into objects:\n  {}", problems.join("\n  ")),
        hint: "every object needs `apiVersion`, `kind` and `metadata.name` (rdeploy checkpoints each object by kind, namespace and name, so `generateName` cannot be used), and a `*List` needs `items:` with a list of them; fix the file, then `rdeploy validate`".into(),
    })
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

    /// A `tar.gz` holding `TOP/Chart.yaml` with `name`, as `helm package` writes it.
    fn chart_archive(path: &Path, top: &str, name: &str) {
        let file = std::fs::File::create(path).unwrap();
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(file, flate2::Compression::default()));
        for (file, text) in [
            ("Chart.yaml", format!("apiVersion: v2\nname: {name}\nversion: 17.1.0\n")),
            ("values.yaml", "{}\n".to_string()),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, format!("{top}/{file}"), text.as_bytes()).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap();
    }

    /// helm matches a dependency to a subchart by the subchart's own Chart.yaml name, not by
    /// the directory or archive it sits in: a vendored `charts/bitnami-redis/` of `name: redis`
    /// and an archive `cache.tgz` holding `name: memcached` are the dependencies `redis` and
    /// `memcached`; a directory called `postgresql` of `name: pg` is not `postgresql`.
    #[test]
    fn subcharts_are_matched_by_their_own_chart_yaml_name() {
        let dir = tempfile::tempdir().unwrap();
        let chart = dir.path();
        std::fs::write(
            chart.join("Chart.yaml"),
            "apiVersion: v2\nname: shop\nversion: 1.0.0\ndependencies:\n  - name: redis\n    version: 17.x\n    repository: https://charts.bitnami.com/bitnami\n  - name: memcached\n    version: 6.x\n    repository: https://charts.bitnami.com/bitnami\n  - name: valkey\n    version: 1.x\n    repository: https://charts.bitnami.com/bitnami\n",
        )
        .unwrap();
        std::fs::create_dir_all(chart.join("charts/bitnami-redis")).unwrap();
        std::fs::write(chart.join("charts/bitnami-redis/Chart.yaml"), "apiVersion: v2\nname: redis\nversion: 17.1.0\n")
            .unwrap();
        chart_archive(&chart.join("charts/cache.tgz"), "memcached", "memcached");
        chart_archive(&chart.join("charts/valkey-1.0.0.tgz"), "valkey", "valkey");
        chart_dependencies(chart).unwrap();

        // The name inside decides: an archive called valkey-1.0.0.tgz holding another chart
        // is not valkey.
        chart_archive(&chart.join("charts/valkey-1.0.0.tgz"), "valkey", "keydb");
        let err = chart_dependencies(chart).unwrap_err().to_string();
        assert!(err.contains("valkey missing"), "{err}");
        chart_archive(&chart.join("charts/valkey-1.0.0.tgz"), "valkey", "valkey");
        std::fs::write(chart.join("charts/bitnami-redis/Chart.yaml"), "apiVersion: v2\nname: keydb\nversion: 1.0.0\n")
            .unwrap();
        let err = chart_dependencies(chart).unwrap_err().to_string();
        assert!(err.contains("redis missing"), "{err}");
    }

    #[test]
    fn a_chart_without_dependencies_or_not_local_passes() {
        let dir = tempfile::tempdir().unwrap();
        chart_dependencies(&dir.path().join("nowhere")).unwrap();
        std::fs::write(dir.path().join("Chart.yaml"), "apiVersion: v2\nname: a\nversion: 0.1.0\n").unwrap();
        chart_dependencies(dir.path()).unwrap();
    }
}
