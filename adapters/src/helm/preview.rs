//! `rdeploy plan` for a helm step: the objects of the release as they live in the cluster
//! (named by the release's manifest in `helm status`, read with `kubectl get`, so an edit made
//! out of band shows) against the objects `helm upgrade --install --dry-run=server` renders:
//! per object created, changed (with a unified diff) or deleted, and the values that change.
//!
//! A live object holds far more than the chart wrote (status, defaults, managed fields), so it is
//! compared on the fields the chart sets now or set in the current revision: a field the chart
//! stops setting shows as removed, a field a person edited in the cluster as changed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{Map, Value};

use super::{helm_failure, state, HelmSpec, Release, DESCRIPTION_PREFIX, NEVER_IN_PLACE, QUICK};
use crate::kubectl::manifest::{flatten_lists, objects_from_documents, parse_documents, KubeObject, Scopes};
use crate::preview::{unified_diff, PlanAction, PlanItem, Preview, PreviewError};
use crate::process::{capture, Captured, Command, StdoutLog};
use crate::redact::redact_line;
use crate::{secrets, Failure, StepContext};

/// How far a helm preview goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Depth {
    /// `up`'s decision: stops at the record's verdict when that already says "upgrade".
    Decide,
    /// `plan`: every object and value the upgrade would change.
    Full,
}

/// What the release's record alone says ([`HelmSpec::record_verdict`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum RecordVerdict {
    /// Not installed.
    Absent,
    /// Installed, but its latest revision cannot be in place: why.
    Changed(String),
}

const KUBECTL_HINT: &str = "install kubectl (https://kubernetes.io/docs/tasks/tools/): `rdeploy plan` reads a helm release's live objects with it";

/// `live`, cut down to the fields `template` has (maps key by key, lists item by item when both
/// have the same length), so a diff against the chart's object shows only what the chart owns.
pub fn project(live: &Value, template: &Value) -> Value {
    match (live, template) {
        (Value::Object(live), Value::Object(template)) => Value::Object(
            template
                .iter()
                .filter_map(|(key, t)| live.get(key).map(|l| (key.clone(), project(l, t))))
                .collect::<Map<String, Value>>(),
        ),
        (Value::Array(live), Value::Array(template)) if live.len() == template.len() => {
            Value::Array(live.iter().zip(template).map(|(l, t)| project(l, t)).collect())
        }
        (live, _) => live.clone(),
    }
}

/// The fields of both `a` and `b`: maps merged key by key (`a`'s scalars win).
pub fn union_shape(a: &Value, b: &Value) -> Value {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = a.clone();
            for (key, bv) in b {
                let merged = match a.get(key) {
                    Some(av) => union_shape(av, bv),
                    None => bv.clone(),
                };
                out.insert(key.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            Value::Array(a.iter().zip(b).map(|(x, y)| union_shape(x, y)).collect())
        }
        (a, _) => a.clone(),
    }
}

/// What one object of the release would undergo.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectChange {
    pub id: String,
    pub action: PlanAction,
    pub reason: Option<String>,
    pub diff: Option<String>,
}

/// Replaces every value of a Secret's `data` and `stringData` (base64 or plain, in no registry
/// when the chart generates it) with a mask, as `kubectl diff` does: a value the same on both
/// sides shows as `***`, one that differs as `*** (before)` against `*** (after)`, so the diff
/// tells which keys change and never what they hold.
fn mask_secret_data(mut live: Option<&mut Value>, wanted: &mut Value) {
    for field in ["data", "stringData"] {
        let mut live_map = live.as_mut().and_then(|l| l.get_mut(field)).and_then(Value::as_object_mut);
        let mut wanted_map = wanted.get_mut(field).and_then(Value::as_object_mut);
        let mut keys: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        keys.extend(live_map.iter().flat_map(|m| m.keys().cloned()));
        keys.extend(wanted_map.iter().flat_map(|m| m.keys().cloned()));
        for key in keys {
            let before = live_map.as_ref().and_then(|m| m.get(&key));
            let after = wanted_map.as_ref().and_then(|m| m.get(&key));
            let same = before.is_some() && before == after;
            let (before_mask, after_mask) = if same { ("***", "***") } else { ("*** (before)", "*** (after)") };
            if let Some(v) = live_map.as_mut().and_then(|m| m.get_mut(&key)) {
                *v = Value::String(before_mask.into());
            }
            if let Some(v) = wanted_map.as_mut().and_then(|m| m.get_mut(&key)) {
                *v = Value::String(after_mask.into());
            }
        }
    }
}

/// Replaces the values under the stack's marked keys and under secret-named keys (see
/// [`secrets::is_secret_entry`]) in the current (`before`) and wanted (`after`) release values,
/// as [`mask_secret_data`] does for a Secret: `***` where both sides hold the same value,
/// `*** (before)` against `*** (after)` where they differ. `path` is the dotted key of the maps.
fn mask_secret_values(
    mut before: Option<&mut Value>,
    mut after: Option<&mut Value>,
    path: &str,
    marked: &std::collections::BTreeMap<String, secrets::Marked>,
) {
    let mut keys: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    keys.extend(before.as_ref().and_then(|v| v.as_object()).into_iter().flat_map(|m| m.keys().cloned()));
    keys.extend(after.as_ref().and_then(|v| v.as_object()).into_iter().flat_map(|m| m.keys().cloned()));
    for key in keys {
        let dotted = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        let b = before.as_mut().and_then(|v| v.as_object_mut()).and_then(|m| m.get_mut(&key));
        let a = after.as_mut().and_then(|v| v.as_object_mut()).and_then(|m| m.get_mut(&key));
        // A map under a secret-sounding key is looked into (`secrets: {enabled: true}`), its
        // strings masked as any under such a key; a marked key is masked whole.
        let secret = marked.contains_key(&dotted)
            || [b.as_deref(), a.as_deref()]
                .into_iter()
                .flatten()
                .any(|v| !v.is_object() && secrets::is_secret_entry(&dotted, v, marked));
        if secret {
            let same = b.is_some() && b.as_deref() == a.as_deref();
            let (before_mask, after_mask) = if same { ("***", "***") } else { ("*** (before)", "*** (after)") };
            if let Some(b) = b {
                *b = Value::String(before_mask.into());
            }
            if let Some(a) = a {
                *a = Value::String(after_mask.into());
            }
        } else {
            mask_secret_values(b, a, &dotted, marked);
        }
    }
}

/// Compares the release's objects: `current` (the current revision's manifest), `wanted` (the
/// dry-run's manifest) and `live` (read from the cluster, by id; absent when not there).
pub fn compare(current: &[KubeObject], wanted: &[KubeObject], live: &HashMap<String, Value>) -> Vec<ObjectChange> {
    let current_by_id: HashMap<String, &KubeObject> = current.iter().map(|o| (o.id(), o)).collect();
    let mut changes = Vec::new();
    for object in wanted {
        let id = object.id();
        let is_secret = object.kind == "Secret";
        let mut wanted_body = object.body.clone();
        if is_secret {
            mask_secret_data(None, &mut wanted_body);
        }
        let wanted_text = crate::yaml::to_text(&wanted_body);
        let change = match (live.get(&id), current_by_id.get(&id)) {
            (None, before) => ObjectChange {
                reason: Some(if before.is_some() { "in the release, missing in the cluster" } else { "new" }.into()),
                diff: unified_diff("", &wanted_text, &format!("live/{id}"), &format!("wanted/{id}")),
                id,
                action: PlanAction::Create,
            },
            (Some(live_body), before) => {
                let shape = match before {
                    Some(before) => union_shape(&object.body, &before.body),
                    None => object.body.clone(),
                };
                let mut live_projected = project(live_body, &shape);
                let wanted_text = if is_secret {
                    let mut wanted_body = object.body.clone();
                    mask_secret_data(Some(&mut live_projected), &mut wanted_body);
                    crate::yaml::to_text(&wanted_body)
                } else {
                    wanted_text
                };
                let live_text = crate::yaml::to_text(&live_projected);
                match unified_diff(&live_text, &wanted_text, &format!("live/{id}"), &format!("wanted/{id}")) {
                    None => ObjectChange { id, action: PlanAction::Unchanged, reason: None, diff: None },
                    Some(diff) => ObjectChange {
                        id,
                        action: PlanAction::Update,
                        reason: Some(if before.is_none() { "exists outside the release" } else { "differs" }.into()),
                        diff: Some(diff),
                    },
                }
            }
        };
        changes.push(change);
    }
    let wanted_ids: std::collections::HashSet<String> = wanted.iter().map(KubeObject::id).collect();
    for object in current.iter().filter(|o| !wanted_ids.contains(&o.id())) {
        let id = object.id();
        let reason = if live.contains_key(&id) { "no longer rendered" } else { "no longer rendered, already gone" };
        changes.push(ObjectChange {
            action: if live.contains_key(&id) { PlanAction::Delete } else { PlanAction::Unchanged },
            reason: Some(reason.into()),
            diff: None,
            id,
        });
    }
    changes
}

/// Where the release's rendering (`wanted`, the dry run's manifest) differs from the deployed
/// revision's (`current`), made by rdeploy from the same chart and values: what a template
/// computes anew on every render (`randAlphaNum`, `now`, a generated password or certificate,
/// `.Release.Revision`). Per template (helm's `# Source:` line), the dotted paths of the fields
/// that differ (never their values), in manifest order. A document is matched to the one at the
/// same place in the same template, so an object whose name is random shows as `metadata.name`.
pub fn renders_anew(current: &str, wanted: &str) -> Vec<(String, Vec<String>)> {
    let current = by_template(current);
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for ((source, n), after) in by_template(wanted) {
        let Some((_, before)) = current.iter().find(|((s, i), _)| *s == source && *i == n) else { continue };
        let mut fields = Vec::new();
        differing_fields(before, &after, "", &mut fields);
        if fields.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(s, _)| *s == source) {
            Some((_, all)) => all.extend(fields.into_iter().filter(|f| !all.contains(f)).collect::<Vec<_>>()),
            None => out.push((source, fields)),
        }
    }
    out
}

/// The words of the note: ``` `TEMPLATE` renders `FIELD`, ... differently every time ... ```.
pub(super) fn renders_anew_words(varying: &[(String, Vec<String>)]) -> String {
    const MAX: usize = 4;
    let list = |items: Vec<String>| match items.len() {
        n if n > MAX => format!("{}, and {} more", items[..MAX].join(", "), n - MAX),
        _ => items.join(", "),
    };
    let parts: Vec<String> = varying
        .iter()
        .map(|(source, fields)| {
            format!("`{source}` renders {}", list(fields.iter().map(|f| format!("`{f}`")).collect()))
        })
        .collect();
    format!(
        "{} differently every time with the same chart and values (a random, time- or revision-based value): the release is upgraded on every `up`",
        list(parts)
    )
}

/// A manifest's documents by template and place within it; a document that does not parse is
/// left out (the comparison that decides is [`compare`]'s, this one only explains it).
fn by_template(manifest: &str) -> Vec<((String, usize), Value)> {
    let mut chunks: Vec<(String, String)> = Vec::new();
    let mut source = String::new();
    let mut text = String::new();
    let flush = |source: &mut String, text: &mut String, chunks: &mut Vec<(String, String)>| {
        if !text.trim().is_empty() {
            chunks.push((std::mem::take(source), std::mem::take(text)));
        }
        source.clear();
        text.clear();
    };
    for line in manifest.lines() {
        if line.trim_end() == "---" {
            flush(&mut source, &mut text, &mut chunks);
            continue;
        }
        if let Some(s) = line.strip_prefix("# Source: ") {
            source = s.trim().to_string();
        }
        text.push_str(line);
        text.push('\n');
    }
    flush(&mut source, &mut text, &mut chunks);
    let mut out = Vec::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (source, text) in chunks {
        let Ok(docs) = parse_documents(&text) else { continue };
        for doc in docs {
            let n = counts.entry(source.clone()).or_default();
            out.push(((source.clone(), *n), doc));
            *n += 1;
        }
    }
    out
}

/// The dotted paths under `path` where `a` and `b` differ: maps key by key, lists of the same
/// length item by item (`containers[0].env`), anything else as a whole.
fn differing_fields(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    if a == b {
        return;
    }
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let null = Value::Null;
                differing_fields(x.get(key).unwrap_or(&null), y.get(key).unwrap_or(&null), &join(key), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differing_fields(p, q, &format!("{path}[{i}]"), out);
            }
        }
        _ => out.push(if path.is_empty() { "(the whole document)".to_string() } else { path.to_string() }),
    }
}

impl HelmSpec {
    /// The dry-run's words: the upgrade of `up` without what only a real run uses (waiting,
    /// rollback on failure, forced replacement), so they are the same for helm 3 and 4.
    fn dry_run_words(&self, ctx: &StepContext) -> Vec<String> {
        let spec = HelmSpec { wait: Some(false), atomic: None, force: None, ..self.clone() };
        let ctx = StepContext { timeout: None, ..ctx.clone() };
        let mut words = spec.upgrade_words_with(4, Some(&ctx), super::PREVIEW_SECRET_VALUES_FILE);
        words.extend(["--dry-run=server".to_string(), "-o".into(), "json".into()]);
        words
    }

    /// kubectl, in the step's cluster (its kubeconfig and context).
    fn kubectl_command(&self, ctx: &StepContext, kubectl: &Path) -> Command {
        Command::new(kubectl)
            .cwd(&ctx.stack_dir)
            .envs(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .args_shown_as(self.kubectl_cluster_args(ctx), self.shown().kubectl_cluster_args(ctx))
            .in_step(ctx)
    }

    fn kubectl_cluster_args(&self, ctx: &StepContext) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(path) = self.kubeconfig_arg(Some(ctx)) {
            args.extend(["--kubeconfig".to_string(), path.to_string_lossy().into_owned()]);
        }
        if let Some(c) = &self.context {
            args.extend(["--context".to_string(), c.clone()]);
        }
        args
    }

    /// Why the release's latest revision cannot be in place, from its record alone (read
    /// in-process, no helm): not installed, not `deployed`, or not made by rdeploy from the
    /// chart as it is now (its digest in the description, see [`super::converge`]). `None`:
    /// it may be in place, and only the server dry-run against the live objects can tell.
    /// The first half of the one in-place verdict `plan` shows and `up` takes.
    pub(super) fn record_verdict(&self, ctx: &StepContext, current: Option<&Value>) -> Option<RecordVerdict> {
        let Some(current) = current else { return Some(RecordVerdict::Absent) };
        let info = current.get("info");
        let text = |key: &str| info.and_then(|i| i.get(key)).and_then(Value::as_str).unwrap_or("");
        let wanted = self.chart_description(ctx);
        let why = if text("status") != "deployed" {
            format!("the release is {}", text("status"))
        } else if wanted.as_deref() != Some(text("description")) {
            match (wanted, text("description")) {
                (None, _) => "the chart's content cannot be known before helm fetches it (pin `version`)".to_string(),
                (Some(_), d) if d.starts_with(DESCRIPTION_PREFIX) => {
                    "the deployed revision was made from another chart or chart content".to_string()
                }
                (Some(_), d) => format!("the deployed revision was not made by rdeploy from this chart (`{d}`)"),
            }
        } else {
            return None;
        };
        Some(RecordVerdict::Changed(why))
    }

    /// [`HelmSpec::preview_release`] in full: what `plan` shows (and `up --plan` observes).
    pub(super) async fn preview_release(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        self.preview_release_to(ctx, Depth::Full).await
    }

    /// The preview to [`Depth`]: `up`'s decision stops where the release's record already says
    /// it is not in place ([`HelmSpec::record_verdict`]): no dry-run, no live reads, the upgrade
    /// follows. Else, and always for `plan`, the server dry-run and the live objects decide.
    pub(super) async fn preview_release_to(&self, ctx: &StepContext, depth: Depth) -> Result<Preview, PreviewError> {
        let binary = crate::resolve_binary(ctx, self.binary_name(), super::INSTALL_HINT)?;
        // No `helm version`: the dry-run's flags are the same for both majors.
        let release = Release::new(self, ctx, binary);
        let secrets = secrets::normalize(secrets::secret_strings(&self.set, &self.marked));
        let mut preview = Preview::default();

        let current: Option<Value> = match release.records().await {
            Some(records) => {
                let read = async {
                    match records.revisions().await?.last() {
                        Some(latest) => records.release(latest.revision).await,
                        None => Ok(None),
                    }
                };
                read.await.map_err(|e| {
                    Failure::new(e.0).with_hint("check that the cluster is reachable, then `rdeploy plan` again")
                })?
            }
            None => self.current_release(&release, ctx).await?,
        };
        let revision = current.as_ref().and_then(|c| c.get("version")).and_then(Value::as_u64);
        preview.observe(
            format!("revision of helm release {}", self.release),
            revision.map_or_else(|| "absent".to_string(), |r| r.to_string()),
        );
        let verdict = self.record_verdict(ctx, current.as_ref());
        if depth == Depth::Decide {
            if let Some(verdict) = &verdict {
                // The record decides: the upgrade follows, nothing more to read.
                let (item, summary) = match verdict {
                    RecordVerdict::Absent => (
                        PlanItem::new(format!("{} release", self.release), PlanAction::Create).because("not installed"),
                        "install".to_string(),
                    ),
                    RecordVerdict::Changed(why) => (
                        PlanItem::new(format!("{} chart", self.release), PlanAction::Update).because(why.clone()),
                        match revision {
                            Some(r) => format!("revision {} over {r}: {why}", r + 1),
                            None => format!("upgrade: {why}"),
                        },
                    ),
                };
                preview.items.push(item);
                preview.summary = Some(summary);
                return Ok(preview);
            }
        }

        let _secret_values = release.secret_values_file(super::PREVIEW_SECRET_VALUES_FILE)?;
        let dry_cmd = release.command().args_shown_as(self.dry_run_words(ctx), self.shown().dry_run_words(ctx));
        let Captured { outcome, stdout, stderr } =
            capture(&dry_cmd, ctx, Some(ctx.timeout.unwrap_or(QUICK)), None, StdoutLog::UnlessJson)
                .await
                .map_err(Failure::from)?;
        if !outcome.success() {
            return Err(secrets::redact_failure(
                helm_failure(&dry_cmd.display(), &outcome, &stderr)
                    .with_hint("fix the chart or its values, then `rdeploy plan` again"),
                &secrets,
            )
            .into());
        }
        let rendered: Value = serde_json::from_str(&stdout.join("\n"))
            .map_err(|e| Failure::new(format!("`{}` printed unexpected JSON: {e}", dry_cmd.display())))?;

        let namespace = self.namespace.clone().unwrap_or_else(|| "default".into());
        let manifest_of = |release: Option<&Value>, what: &str| -> Result<Vec<Value>, Failure> {
            let manifest = release.and_then(|r| r.get("manifest")).and_then(Value::as_str).unwrap_or("");
            parse_documents(manifest).map(flatten_lists).map_err(|e| {
                Failure::new(format!("the {what} manifest of release {} does not parse: {e}", self.release))
            })
        };
        let current_docs = manifest_of(current.as_ref(), "current")?;
        let wanted_docs = manifest_of(Some(&rendered), "rendered")?;
        // Which kinds are namespaced, as the API says (the release's CRDs first), so an object
        // is named as kubectl and the checkpoint name it.
        let all: Vec<Value> = current_docs.iter().chain(&wanted_docs).cloned().collect();
        let mut scopes = Scopes::from_documents(&all);
        let kubectl = crate::resolve_binary(ctx, "kubectl", KUBECTL_HINT)?;
        if !all.is_empty() && scopes.lacks_any(&all) {
            let cmd = self.kubectl_command(ctx, &kubectl).arg("api-resources");
            match capture(&cmd, ctx, Some(QUICK), None, StdoutLog::UnlessJson).await {
                Ok(Captured { stdout, .. }) if scopes.add_discovery(&stdout) > 0 => {}
                _ => preview.notes.push(format!(
                    "`{}` gave no answer: kinds the release's CRDs do not define are taken as namespaced",
                    cmd.display()
                )),
            }
        }
        let objects_of = |docs: Vec<Value>| {
            objects_from_documents(docs, Path::new(&self.release), &namespace, &scopes).map_err(Failure::new)
        };
        let current_objects = objects_of(current_docs)?;
        let wanted_objects = objects_of(wanted_docs)?;

        let live = self.read_live(ctx, &current_objects, &wanted_objects, &mut preview).await?;
        for change in compare(&current_objects, &wanted_objects, &live) {
            let mut item = PlanItem::new(change.id, change.action);
            item.reason = change.reason;
            item.diff = change.diff.map(|d| redact_line_by_line(&d, &secrets));
            preview.items.push(item);
        }
        // The values helm records for the new revision against the current one's.
        let values = |r: Option<&Value>| r.and_then(|r| r.get("config")).cloned().filter(|v| !v.is_null());
        let (mut before, mut after) = (values(current.as_ref()), values(Some(&rendered)));
        // Masked by key, not by value: the current revision may hold a value rotated since
        // (in no registry any more), and a chart default under a secret name is in none.
        mask_secret_values(before.as_mut(), after.as_mut(), "", &self.marked);
        let empty = Value::Object(Map::new());
        let before_text = crate::yaml::to_text(before.as_ref().unwrap_or(&empty));
        let after_text = crate::yaml::to_text(after.as_ref().unwrap_or(&empty));
        if current.is_some() {
            if let Some(diff) = unified_diff(&before_text, &after_text, "values/current", "values/wanted") {
                let mut item = PlanItem::new(format!("{} values", self.release), PlanAction::Update)
                    .because("the release's values change");
                item.diff = Some(redact_line_by_line(&diff, &secrets));
                preview.items.push(item);
            }
        }
        // Same chart and values as deployed, and yet the objects change: where the rendering
        // itself differs from the deployed revision's, the chart computes values anew on every
        // render and can never be in place. Said once, naming the templates and fields.
        let values_change = preview.items.iter().any(|i| i.id == format!("{} values", self.release));
        if verdict.is_none() && !values_change && preview.changes() > 0 {
            fn manifest(r: Option<&Value>) -> &str {
                r.and_then(|r| r.get("manifest")).and_then(Value::as_str).unwrap_or("")
            }
            let varying = renders_anew(manifest(current.as_ref()), manifest(Some(&rendered)));
            if !varying.is_empty() {
                preview.notes.push(format!("{NEVER_IN_PLACE}{}", renders_anew_words(&varying)));
            }
        }
        // The revision itself: deployed, and made by rdeploy from this very chart (its digest in
        // the description, see `converge`). Anything else is upgraded by `up`, so it shows.
        if let Some(RecordVerdict::Changed(why)) = verdict {
            preview.items.push(PlanItem::new(format!("{} chart", self.release), PlanAction::Update).because(why));
        }
        let (mut add, mut change, mut delete) = (0, 0, 0);
        for item in &preview.items {
            match item.action {
                PlanAction::Create => add += 1,
                PlanAction::Update => change += 1,
                PlanAction::Delete => delete += 1,
                _ => {}
            }
        }
        let changes = preview.changes();
        preview.summary = Some(match revision {
            Some(r) if changes == 0 => format!("revision {r} in place: no upgrade"),
            Some(r) => format!("revision {} over {r}: {add} to create, {change} to change, {delete} to delete", r + 1),
            None => format!("install: {add} to create"),
        });
        Ok(preview)
    }

    /// `helm status -o json`: the current release as helm prints it, `None` when not installed.
    async fn current_release(&self, release: &Release<'_>, ctx: &StepContext) -> Result<Option<Value>, PreviewError> {
        let status_cmd = release
            .command()
            .args(["status", &self.release, "-o", "json"])
            .args_shown_as(self.cluster_args(Some(ctx)), self.shown().cluster_args(Some(ctx)));
        let Captured { outcome, stdout, stderr } =
            capture(&status_cmd, ctx, Some(QUICK), None, StdoutLog::UnlessJson).await.map_err(Failure::from)?;
        let current: Option<Value> = if outcome.success() {
            Some(
                serde_json::from_str(&stdout.join("\n"))
                    .map_err(|e| Failure::new(format!("`{}` printed unexpected JSON: {e}", status_cmd.display())))?,
            )
        } else if state::is_not_found(&stderr) {
            None
        } else {
            return Err(helm_failure(&status_cmd.display(), &outcome, &stderr)
                .with_hint("check that the cluster is reachable, then `rdeploy plan` again")
                .into());
        };
        Ok(current)
    }

    /// Every object of the current and the rendered manifests as it is in the cluster, by id,
    /// with its resourceVersion observed.
    async fn read_live(
        &self,
        ctx: &StepContext,
        current: &[KubeObject],
        wanted: &[KubeObject],
        preview: &mut Preview,
    ) -> Result<HashMap<String, Value>, PreviewError> {
        let mut all: BTreeMap<String, &KubeObject> = BTreeMap::new();
        for object in current.iter().chain(wanted) {
            all.entry(object.id()).or_insert(object);
        }
        if all.is_empty() {
            return Ok(HashMap::new());
        }
        let kubectl = crate::resolve_binary(ctx, "kubectl", KUBECTL_HINT)?;
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": all.values().map(|o| o.body.clone()).collect::<Vec<_>>(),
        });
        let path = ctx.work_dir.join("plan-objects.json");
        crate::private::create_dir_all(&ctx.work_dir)
            .and_then(|()| crate::private::write(&path, list.to_string().as_bytes()))
            .map_err(|e| Failure::new(format!("could not write {}: {e}", path.display())))?;
        let cmd =
            self.kubectl_command(ctx, &kubectl).args(["get", "--ignore-not-found", "-o", "json", "-f"]).arg(&path);
        let Captured { outcome, stdout, stderr } =
            capture(&cmd, ctx, Some(QUICK), None, StdoutLog::UnlessJson).await.map_err(Failure::from)?;
        let _ = std::fs::remove_file(&path);
        if !outcome.success() {
            let why = stderr.last().cloned().unwrap_or_else(|| outcome.describe_status());
            return Err(Failure::new(format!("`{}` failed: {why}", cmd.display()))
                .with_hint("check that the cluster is reachable, then `rdeploy plan` again")
                .into());
        }
        let found = crate::kubectl::preview::objects_by_key(&stdout.join("\n"));
        let mut live = HashMap::new();
        for (id, object) in all {
            let key = (object.kind.clone(), object.namespace.clone(), object.name.clone());
            let body = found.get(&key);
            let version = body
                .and_then(|b| b.pointer("/metadata/resourceVersion"))
                .and_then(Value::as_str)
                .unwrap_or("absent")
                .to_string();
            preview.observe(format!("resourceVersion of {id}"), version);
            if let Some(body) = body {
                live.insert(id, body.clone());
            }
        }
        Ok(live)
    }
}

fn redact_line_by_line(text: &str, secrets: &[String]) -> String {
    text.lines().map(|l| redact_line(l, secrets) + "\n").collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn objects(yaml: &str) -> Vec<KubeObject> {
        let docs = parse_documents(yaml).unwrap();
        objects_from_documents(docs, Path::new("r"), "shop", &Scopes::default()).unwrap()
    }

    #[test]
    fn projects_a_live_object_onto_the_fields_the_chart_sets() {
        let live = json!({"metadata": {"name": "a", "uid": "u", "labels": {"app": "a"}}, "data": {"color": "red"},
                          "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}, "status": {}});
        let template = json!({"metadata": {"name": "a", "labels": {"app": "a"}}, "data": {"color": "blue"},
                              "spec": {"ports": [{"port": 80}]}});
        assert_eq!(
            project(&live, &template),
            json!({"metadata": {"name": "a", "labels": {"app": "a"}}, "data": {"color": "red"}, "spec": {"ports": [{"port": 80}]}})
        );
    }

    #[test]
    fn objects_are_created_changed_deleted_or_unchanged() {
        let current = objects(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: same}\ndata: {a: '1'}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: edited}\ndata: {a: '1', old: x}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gone}\ndata: {a: '1'}\n",
        );
        let wanted = objects(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: same}\ndata: {a: '1'}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: edited}\ndata: {a: '1'}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: new}\ndata: {a: '1'}\n",
        );
        let mut live = HashMap::new();
        let meta = |name: &str| json!({"name": name, "namespace": "shop", "resourceVersion": "5", "uid": "x"});
        live.insert(
            "ConfigMap/shop/same".to_string(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("same"), "data": {"a": "1"}}),
        );
        // Edited in the cluster (a = 2) and still holding the key the chart no longer sets.
        live.insert("ConfigMap/shop/edited".to_string(), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("edited"), "data": {"a": "2", "old": "x"}}));
        live.insert(
            "ConfigMap/shop/gone".to_string(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("gone"), "data": {"a": "1"}}),
        );
        let got = compare(&current, &wanted, &live);
        let summary: Vec<(&str, PlanAction)> = got.iter().map(|c| (c.id.as_str(), c.action)).collect();
        assert_eq!(
            summary,
            [
                ("ConfigMap/shop/same", PlanAction::Unchanged),
                ("ConfigMap/shop/edited", PlanAction::Update),
                ("ConfigMap/shop/new", PlanAction::Create),
                ("ConfigMap/shop/gone", PlanAction::Delete),
            ]
        );
        let diff = got[1].diff.as_deref().unwrap();
        assert!(diff.contains("-  a: '2'\n") && diff.contains("+  a: '1'\n"), "an edit in the cluster shows: {diff}");
        assert!(diff.contains("-  old: x\n"), "a field the chart stops setting shows as removed: {diff}");
    }

    #[test]
    fn secret_values_are_masked_by_key_in_the_values_diff() {
        let mut marked = std::collections::BTreeMap::new();
        marked.insert("app.apiToken".to_string(), secrets::Marked::inline(json!("new-token")));
        marked.insert("plainly".to_string(), secrets::Marked::inline(json!("x")));
        let mut before = json!({"app": {"apiToken": "old-token", "replicas": 2,
                                        "db": {"password": "same-pw"}}, "plainly": "old-plain", "color": "red"});
        let mut after = json!({"app": {"apiToken": "new-token", "replicas": 3,
                                       "db": {"password": "same-pw"}}, "plainly": "new-plain", "color": "blue",
                               "auth": {"enabled": true}, "secrets": {"enabled": true, "name": "generated"}});
        mask_secret_values(Some(&mut before), Some(&mut after), "", &marked);
        assert_eq!(
            before,
            json!({"app": {"apiToken": "*** (before)", "replicas": 2, "db": {"password": "***"}},
                   "plainly": "*** (before)", "color": "red"})
        );
        assert_eq!(
            after,
            json!({"app": {"apiToken": "*** (after)", "replicas": 3, "db": {"password": "***"}},
                   "plainly": "*** (after)", "color": "blue", "auth": {"enabled": true},
                   "secrets": {"enabled": true, "name": "*** (after)"}})
        );
    }

    #[test]
    fn a_secrets_values_never_show_only_which_keys_change() {
        // `cGxhaW4x` is base64 of a value in no registry (a chart-generated secret).
        let current =
            objects("apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {same: c2FtZQ==, rotated: b2xkdmFs}\n");
        let wanted = objects(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {same: c2FtZQ==, rotated: bmV3dmFs, added: cGxhaW4x}\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {name: fresh}\nstringData: {token: plain-token}\n",
        );
        let mut live = HashMap::new();
        live.insert(
            "Secret/shop/s".to_string(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "shop"},
                   "data": {"same": "c2FtZQ==", "rotated": "b2xkdmFs"}}),
        );
        let got = compare(&current, &wanted, &live);
        let diffs: String = got.iter().filter_map(|c| c.diff.clone()).collect();
        for clear in ["c2FtZQ==", "b2xkdmFs", "bmV3dmFs", "cGxhaW4x", "plain-token"] {
            assert!(!diffs.contains(clear), "{clear} shows in the diff: {diffs}");
        }
        assert_eq!(got[0].action, PlanAction::Update, "{got:?}");
        let diff = got[0].diff.as_deref().unwrap();
        assert!(
            diff.contains("-  rotated: '*** (before)'\n") && diff.contains("+  rotated: '*** (after)'\n"),
            "{diff}"
        );
        assert!(diff.contains("+  added: '*** (after)'\n"), "{diff}");
        assert!(diff.contains("   same: '***'\n"), "an unchanged key shows masked, unchanged: {diff}");
        assert_eq!(got[1].action, PlanAction::Create);
        assert!(got[1].diff.as_deref().unwrap().contains("token: '*** (after)'"), "{got:?}");
    }

    /// Two renders of one chart: each template's differing fields are named by path, never by
    /// value; a template that renders the same is not named; a random name is `metadata.name`.
    #[test]
    fn a_rendering_that_differs_names_its_templates_and_fields() {
        let render = |password: &str, stamp: &str, job: &str| {
            format!(
                "---\n# Source: c/templates/secret.yaml\napiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ndata:\n  user: YXBw\n  password: {password}\n---\n# Source: c/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n---\n# Source: c/templates/deploy.yaml\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    metadata:\n      annotations:\n        rollme: \"{stamp}\"\n    spec:\n      containers:\n      - name: web\n        image: nginx\n---\n# Source: c/templates/job.yaml\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {job}\n"
            )
        };
        let got = renders_anew(
            &render("c2VjcmV0MQ==", "1700000000", "m-abc"),
            &render("c2VjcmV0Mg==", "1700000042", "m-xyz"),
        );
        assert_eq!(
            got,
            [
                ("c/templates/secret.yaml".to_string(), vec!["data.password".to_string()]),
                ("c/templates/deploy.yaml".to_string(), vec!["spec.template.metadata.annotations.rollme".to_string()]),
                ("c/templates/job.yaml".to_string(), vec!["metadata.name".to_string()]),
            ]
        );
        let words = renders_anew_words(&got);
        assert!(
            words.starts_with("`c/templates/secret.yaml` renders `data.password`, `c/templates/deploy.yaml` renders"),
            "{words}"
        );
        assert!(!words.contains("c2VjcmV0"), "never a value: {words}");
        let same = render("c2VjcmV0MQ==", "1", "m");
        assert!(renders_anew(&same, &same).is_empty());
    }
}
