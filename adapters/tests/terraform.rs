//! The terraform adapter against real terraform: each test copies a fixture from
//! `fixtures/terraform/` to a temp dir, injects failures with marker files (`fail-NAME`,
//! `slow-NAME`, see `prov.sh`) and calls `ToolSpec::Terraform(..).apply/recover/inspect`.
//! Every provisioner appends to `runs/NAME.log`, so "ran exactly once" is a line count.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdeploy_adapters::terraform::{TerraformSpec, FACT_LOCK_ID};
use rdeploy_adapters::testing::{step_context, Recorder};
use rdeploy_adapters::{Adapter, Event, Failure, PriorStep, Recovered, StepContext, SubStatus, ToolSpec};

/// Fails loudly: these tests exist to run real terraform.
fn require_terraform() {
    let found = std::process::Command::new("terraform").arg("version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "terraform is not installed or does not run: these tests need terraform v1.11 on PATH"
    );
}

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Fixture {
    /// A copy of `fixtures/terraform/<name>` (with `prov.sh`) at `<tmp>/cfg`.
    fn new(name: &str) -> Fixture {
        require_terraform();
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/terraform");
        copy_dir(&fixtures.join(name), &root.join("cfg"));
        std::fs::copy(fixtures.join("prov.sh"), root.join("cfg/prov.sh")).unwrap();
        Fixture { _tmp: tmp, root }
    }

    fn cfg(&self) -> PathBuf {
        self.root.join("cfg")
    }

    fn ctx(&self) -> StepContext {
        StepContext {
            step: "infra".into(),
            work_dir: self.root.join("state/infra"),
            timeout: Some(Duration::from_secs(240)),
            ..step_context(&self.root)
        }
    }

    fn marker(&self, name: &str) {
        std::fs::write(self.cfg().join(name), "").unwrap();
    }

    fn unmark(&self, name: &str) {
        std::fs::remove_file(self.cfg().join(name)).unwrap();
    }

    /// How many times the provisioner of `name` completed.
    fn runs(&self, name: &str) -> usize {
        std::fs::read_to_string(self.cfg().join(format!("runs/{name}.log"))).map_or(0, |s| s.lines().count())
    }

    fn wait_for(&self, file: &str) {
        let path = self.cfg().join(file);
        let start = Instant::now();
        while !path.exists() {
            assert!(start.elapsed() < Duration::from_secs(60), "{file} never appeared");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs terraform directly, as an operator (or another deploy) would.
    fn terraform(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new("terraform").args(args).current_dir(self.cfg()).output().unwrap()
    }

    /// Addresses terraform marks tainted in state right now.
    fn tainted(&self) -> Vec<String> {
        let out = self.terraform(&["show", "-json"]);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut found = Vec::new();
        fn walk(module: &serde_json::Value, found: &mut Vec<String>) {
            for r in module["resources"].as_array().into_iter().flatten() {
                if r["tainted"] == serde_json::Value::Bool(true) {
                    found.push(r["address"].as_str().unwrap().to_string());
                }
            }
            for child in module["child_modules"].as_array().into_iter().flatten() {
                walk(child, found);
            }
        }
        walk(&doc["values"]["root_module"], &mut found);
        found
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn spec() -> TerraformSpec {
    TerraformSpec {
        marked: Default::default(),
        dir: "cfg".into(),
        vars: BTreeMap::new(),
        var_files: vec![],
        workspace: None,
        binary: None,
        lock_timeout: None,
        saved_plan: None,
    }
}

fn chain(range: std::ops::RangeInclusive<u32>) -> Vec<String> {
    range.map(|i| format!("terraform_data.a{i}")).collect()
}

async fn apply(spec: &TerraformSpec, ctx: &StepContext, sink: &Recorder) -> Result<(), Failure> {
    ToolSpec::Terraform(spec.clone()).apply(ctx, sink).await
}

async fn recover(
    spec: &TerraformSpec,
    ctx: &StepContext,
    prior: &PriorStep,
    sink: &Recorder,
) -> Result<Recovered, Failure> {
    ToolSpec::Terraform(spec.clone()).recover(ctx, prior, sink).await
}

#[tokio::test]
async fn a_chain_failing_at_5_of_6_recovers_by_applying_only_the_rest() {
    let fx = Fixture::new("chain");
    fx.marker("fail-a5");
    let sink = Recorder::default();
    let failure = apply(&spec(), &fx.ctx(), &sink).await.unwrap_err();

    assert_eq!(sink.planned(), vec![chain(1..=6)]);
    assert_eq!(sink.done(), chain(1..=4));
    assert_eq!(sink.failed(), chain(5..=5));
    assert_eq!(sink.pending(), chain(6..=6));
    assert!(!failure.interrupted);
    assert_eq!(failure.exit_code, Some(1));
    assert!(
        failure.summary.starts_with("`terraform apply -input=false -json ")
            && failure.summary.contains("failed at terraform_data.a5: local-exec provisioner error"),
        "{}",
        failure.summary
    );
    assert!(failure.stderr_tail.iter().any(|l| l.contains("fail-a5 is present")), "{:?}", failure.stderr_tail);
    assert!(failure.hint.as_deref().unwrap().contains("rdeploy recover"));
    let error = sink.prior().sub_changes.into_iter().find(|s| s.id == "terraform_data.a5").unwrap().error.unwrap();
    assert!(error.contains("Error running command 'sh ./prov.sh a5': exit status 1"), "{error}");
    // Terraform's own evidence agrees: a5 is in state and tainted.
    assert_eq!(fx.tainted(), chain(5..=5));
    for i in 1..=4 {
        assert_eq!(fx.runs(&format!("a{i}")), 1);
    }
    assert_eq!(fx.runs("a5"), 0);

    fx.unmark("fail-a5");
    let prior = sink.prior();
    let again = Recorder::default();
    recover(&spec(), &fx.ctx(), &prior, &again).await.unwrap();
    assert_eq!(again.planned(), vec![chain(5..=6)]);
    assert_eq!(again.started(), chain(5..=6));
    assert_eq!(again.done(), chain(5..=6));
    assert!(again.warnings().is_empty(), "{:?}", again.warnings());
    for i in 1..=6 {
        assert_eq!(fx.runs(&format!("a{i}")), 1, "a{i} ran once");
    }
    assert!(fx.tainted().is_empty());

    // Nothing is left: a second recover plans no change and applies nothing.
    let third = Recorder::default();
    recover(&spec(), &fx.ctx(), &again.prior(), &third).await.unwrap();
    assert_eq!(third.planned(), vec![Vec::<String>::new()]);
    assert!(third.started().is_empty());
}

#[tokio::test]
async fn several_independent_failures_are_each_reported_and_recovered() {
    let fx = Fixture::new("independent");
    fx.marker("fail-svc-a");
    fx.marker("fail-svc-c");
    let sink = Recorder::default();
    let failure = apply(&spec(), &fx.ctx(), &sink).await.unwrap_err();
    let svc = |keys: &[&str]| keys.iter().map(|k| format!(r#"terraform_data.svc["{k}"]"#)).collect::<Vec<_>>();
    assert_eq!(sink.failed(), svc(&["a", "c"]));
    assert_eq!(sink.done(), svc(&["b", "d", "e"]));
    assert!(failure.summary.contains("(and 1 more)"), "{}", failure.summary);
    assert_eq!(failure.stderr_tail.len(), 2, "{:?}", failure.stderr_tail);
    assert_eq!(fx.tainted(), svc(&["a", "c"]));

    fx.unmark("fail-svc-a");
    fx.unmark("fail-svc-c");
    let again = Recorder::default();
    recover(&spec(), &fx.ctx(), &sink.prior(), &again).await.unwrap();
    assert_eq!(again.done(), svc(&["a", "c"]));
    for key in ["a", "b", "c", "d", "e"] {
        assert_eq!(fx.runs(&format!("svc-{key}")), 1, "svc-{key}");
    }
}

#[tokio::test]
async fn nested_modules_with_for_each_keys_are_checkpointed_by_full_address() {
    // The fixture is not initialized: the adapter sees "Module not installed" and runs init.
    let fx = Fixture::new("modules");
    fx.marker("fail-api-node-1");
    let sink = Recorder::default();
    apply(&spec(), &fx.ctx(), &sink).await.unwrap_err();
    let planned = &sink.planned()[0];
    assert_eq!(planned.len(), 6);
    assert!(planned.contains(&r#"module.svc["web"].module.db.terraform_data.db"#.to_string()));
    assert_eq!(sink.failed(), vec![r#"module.svc["api"].terraform_data.node[1]"#.to_string()]);
    assert!(sink.done().contains(&r#"module.svc["api"].terraform_data.node[0]"#.to_string()));
    assert!(sink.pending().contains(&r#"module.svc["api"].module.db.terraform_data.db"#.to_string()));
    // Every planned address is settled: done, failed or pending; none is left started.
    let prior = sink.prior();
    assert!(prior.sub_changes.iter().all(|s| s.status != SubStatus::Started), "{prior:?}");

    fx.unmark("fail-api-node-1");
    let again = Recorder::default();
    recover(&spec(), &fx.ctx(), &prior, &again).await.unwrap();
    for name in ["web-node-0", "web-node-1", "api-node-0", "api-node-1", "web-db", "api-db"] {
        assert_eq!(fx.runs(name), 1, "{name}");
    }
    let mut all = sink.done();
    all.extend(again.done());
    all.sort();
    let mut expected = planned.clone();
    expected.sort();
    assert_eq!(all, expected);
}

#[tokio::test]
async fn a_resource_changed_outside_between_failure_and_recover_shows_in_the_plan() {
    let fx = Fixture::new("chain");
    fx.marker("fail-a5");
    let sink = Recorder::default();
    apply(&spec(), &fx.ctx(), &sink).await.unwrap_err();
    fx.unmark("fail-a5");
    // Someone taints a2 by hand, and the fix also changes a variable feeding a3.
    assert!(fx.terraform(&["taint", "terraform_data.a2"]).status.success());
    let mut fixed = spec();
    fixed.vars.insert("rev".into(), serde_json::json!("2"));
    let prior = sink.prior();

    // recover --dry-run: says what would happen, changes nothing.
    let inspection = ToolSpec::Terraform(fixed.clone()).inspect(&fx.ctx(), &prior).await.unwrap();
    assert_eq!(
        inspection.actions[0], "`terraform plan`: 3 to add, 1 to change, 2 to destroy",
        "{:?}",
        inspection.actions
    );
    assert!(
        inspection.actions.contains(&"replace terraform_data.a2 (tainted)".to_string()),
        "{:?}",
        inspection.actions
    );
    assert!(inspection.actions.contains(&"update terraform_data.a3".to_string()), "{:?}", inspection.actions);
    assert!(inspection.actions.iter().any(|a| a.contains("changed since the failure")), "{:?}", inspection.actions);
    assert_eq!(inspection.remaining.len(), 4);
    let mut tainted = fx.tainted();
    tainted.sort();
    assert_eq!(tainted, vec!["terraform_data.a2".to_string(), "terraform_data.a5".to_string()]);
    assert_eq!(fx.runs("a2"), 1);

    let again = Recorder::default();
    recover(&fixed, &fx.ctx(), &prior, &again).await.unwrap();
    let warning = again.warnings().join("\n");
    assert!(
        warning.contains("replace terraform_data.a2 (tainted)") && warning.contains("update terraform_data.a3"),
        "{warning}"
    );
    // a2 was replaced because it was tainted; the others done before ran once.
    assert_eq!(fx.runs("a2"), 2);
    for name in ["a1", "a3", "a4", "a5", "a6"] {
        assert_eq!(fx.runs(name), 1, "{name}");
    }
}

#[tokio::test]
async fn a_held_state_lock_stops_with_its_id_and_applies_nothing() {
    let fx = Fixture::new("chain");
    fx.marker("slow-a1");
    // Another deploy holds the lock, blocked in a1's provisioner.
    let mut holder = std::process::Command::new("terraform")
        .args(["apply", "-input=false", "-auto-approve", "-no-color"])
        .current_dir(fx.cfg())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    fx.wait_for("runs/a1.started");
    let lock_info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.cfg().join(".terraform.tfstate.lock.info")).unwrap()).unwrap();
    let lock_id = lock_info["ID"].as_str().unwrap().to_string();

    let sink = Recorder::default();
    let result = apply(&spec(), &fx.ctx(), &sink).await;
    fx.unmark("slow-a1");
    assert!(holder.wait().unwrap().success());

    let failure = result.unwrap_err();
    assert!(
        failure.summary.starts_with("the terraform state is locked by another process: lock ID "),
        "{}",
        failure.summary
    );
    assert!(
        failure.summary.contains(&lock_id)
            && failure.summary.contains("held by ")
            && failure.summary.contains(" since ")
    );
    assert!(
        failure.hint.as_deref().unwrap().contains(&format!("terraform force-unlock {lock_id}")),
        "{:?}",
        failure.hint
    );
    assert!(sink.started().is_empty(), "nothing applied: {:?}", sink.events());
    assert!(sink.events().contains(&Event::Fact { key: FACT_LOCK_ID.into(), value: serde_json::json!(lock_id) }));
    // Only the holder ran the provisioners.
    assert_eq!(fx.runs("a1"), 1);
    // The runbook names the lock and the command, and never runs it.
    let doc = ToolSpec::Terraform(spec()).describe_recovery(
        &rdeploy_adapters::DescribeContext { step: "infra", stack_file: "stack.yaml", stack_dir: ".", resumable: true },
        Some(&sink.prior()),
    );
    assert!(doc.notes.iter().any(|n| n.contains(&format!("terraform force-unlock {lock_id}"))), "{:?}", doc.notes);

    // Once the holder is gone, recover goes through and clears the lock fact.
    let again = Recorder::default();
    recover(&spec(), &fx.ctx(), &sink.prior(), &again).await.unwrap();
    assert!(again.events().contains(&Event::Fact { key: FACT_LOCK_ID.into(), value: serde_json::Value::Null }));
    assert_eq!(fx.runs("a1"), 1);
}

#[tokio::test]
async fn an_interrupt_mid_apply_stops_terraform_gracefully_and_recover_finishes() {
    let fx = Fixture::new("chain");
    fx.marker("slow-a3");
    let ctx = fx.ctx();
    let cancel = ctx.cancel.clone();
    let cfg = fx.cfg();
    tokio::spawn(async move {
        let started = cfg.join("runs/a3.started");
        while !started.exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cancel.cancel();
    });
    let sink = Recorder::default();
    let failure = apply(&spec(), &ctx, &sink).await.unwrap_err();
    assert!(failure.interrupted, "{failure:?}");
    assert!(failure.summary.contains("was interrupted: 2 of 6 resources done, 1 failed"), "{}", failure.summary);
    assert_eq!(sink.done(), chain(1..=2));
    assert_eq!(sink.failed(), chain(3..=3));
    assert_eq!(sink.pending(), chain(4..=6));
    // Terraform wrote its state and released the lock: a3 is tainted, nothing is locked.
    assert_eq!(fx.tainted(), chain(3..=3));
    assert!(fx.terraform(&["plan", "-input=false", "-lock-timeout=0s"]).status.success());

    fx.unmark("slow-a3");
    let again = Recorder::default();
    recover(&spec(), &fx.ctx(), &sink.prior(), &again).await.unwrap();
    assert_eq!(again.done(), chain(3..=6));
    for i in 1..=6 {
        assert_eq!(fx.runs(&format!("a{i}")), 1, "a{i}");
    }
}

#[tokio::test]
async fn sensitive_values_never_reach_events_or_failures() {
    let fx = Fixture::new("sensitive");
    fx.marker("fail-secret");
    let mut spec = spec();
    spec.vars.insert("token".into(), serde_json::json!("s3cr3t-value"));
    // A var file too: its values are read from the saved plan and redacted during apply.
    std::fs::write(fx.root.join("extra.tfvars.json"), r#"{"region": "eu-central-1"}"#).unwrap();
    spec.var_files.push("extra.tfvars.json".into());
    let sink = Recorder::default();
    let failure = apply(&spec, &fx.ctx(), &sink).await.unwrap_err();
    let everything = format!("{:?}\n{:?}", sink.events(), failure);
    assert!(!everything.contains("s3cr3t"), "{everything}");
    // Terraform printed it in the diagnostic: the adapter redacted it there.
    assert!(failure.stderr_tail.iter().any(|l| l.contains("sh ./prov.sh secret ***")), "{:?}", failure.stderr_tail);
    assert_eq!(sink.failed(), vec!["terraform_data.secret".to_string()]);

    fx.unmark("fail-secret");
    let again = Recorder::default();
    recover(&spec, &fx.ctx(), &sink.prior(), &again).await.unwrap();
    assert!(!format!("{:?}", again.events()).contains("s3cr3t"));
    let runbook = ToolSpec::Terraform(spec).describe_recovery(
        &rdeploy_adapters::DescribeContext {
            step: "infra",
            stack_file: "stack.yaml",
            stack_dir: &fx.root.to_string_lossy(),
            resumable: true,
        },
        Some(&again.prior()),
    );
    assert!(!format!("{runbook:?}").contains("s3cr3t"));
}

#[tokio::test]
async fn preflight_reads_the_version_and_names_a_missing_binary() {
    let fx = Fixture::new("chain");
    let info = ToolSpec::Terraform(spec()).preflight(&fx.ctx()).await.unwrap();
    assert!(info.version.starts_with("1."), "{info:?}");
    assert!(info.binary.ends_with("terraform"));
    let mut missing = spec();
    missing.binary = Some("./no-such/tofu".into());
    let err = ToolSpec::Terraform(missing).preflight(&fx.ctx()).await.unwrap_err();
    assert!(err.to_string().contains("no-such/tofu") && err.to_string().contains("was not found"), "{err}");
}

/// What an apply that outlived the rdeploy that started it (kill -9) completed after the
/// checkpoint last heard is read from terraform's state: a resource recorded started that the
/// plan no longer touches is done, once, and nothing is applied again.
#[tokio::test]
async fn recover_settles_what_the_apply_of_a_dead_run_completed_from_terraforms_state() {
    let fx = Fixture::new("chain");
    fx.marker("fail-a5");
    let sink = Recorder::default();
    apply(&spec(), &fx.ctx(), &sink).await.unwrap_err();

    // As if rdeploy had died right after a4 started: the checkpoint has a4 started, and
    // terraform's state has it in place.
    let mut prior = sink.prior();
    for sub in &mut prior.sub_changes {
        if sub.id == "terraform_data.a4" {
            sub.status = SubStatus::Started;
        }
    }
    fx.unmark("fail-a5");
    let again = Recorder::default();
    recover(&spec(), &fx.ctx(), &prior, &again).await.unwrap();
    let note = again.events().into_iter().find_map(|e| match e {
        Event::Done { id, note } if id == "terraform_data.a4" => note,
        _ => None,
    });
    assert_eq!(note.as_deref(), Some("terraform plans no change for it now"));
    assert_eq!(again.done().iter().filter(|id| *id == "terraform_data.a4").count(), 1, "a4 is settled once");
    for i in 1..=6 {
        assert_eq!(fx.runs(&format!("a{i}")), 1, "a{i} ran once");
    }
}

/// A variable declared `sensitive` reaches terraform through `TF_VAR_token`, not `-var`: terraform
/// gets the value (the provisioner writes its digest), nothing rdeploy sees holds it, even when the
/// provisioner echoes it in its failure, and plain values and flags print as they are.
#[tokio::test]
async fn a_sensitive_variable_goes_through_the_environment_and_plain_ones_print_in_clear() {
    use sha2::Digest;
    let fx = Fixture::new("secret-env");
    fx.marker("fail-secret");
    let mut spec = spec();
    spec.vars.insert("token".into(), serde_json::json!("SECRETVALUE-tf-42"));
    spec.vars.insert("enabled".into(), serde_json::json!(false));
    spec.vars.insert("region".into(), serde_json::json!("eu-west-2"));
    let sink = Recorder::default();
    let failure = apply(&spec, &fx.ctx(), &sink).await.unwrap_err();
    let everything = format!("{:?}\n{:?}", sink.events(), failure);
    assert!(!everything.contains("SECRETVALUE"), "{everything}");
    let digest = std::fs::read_to_string(fx.cfg().join("token.sha256")).unwrap();
    assert_eq!(
        digest.trim(),
        sha2::Sha256::digest(b"SECRETVALUE-tf-42").iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    // The saved plan holds the value: it is gone once applied.
    assert!(!fx.ctx().work_dir.join("tfplan").exists(), "the saved plan is deleted after the apply");

    // A plan that fails shows its whole command line: plain values and flags in clear, the
    // sensitive variable not there at all.
    spec.vars.insert("region".into(), serde_json::json!("nowhere-false"));
    let failure = apply(&spec, &fx.ctx(), &Recorder::default()).await.unwrap_err();
    let command = failure.command.clone().unwrap_or_default();
    assert!(command.contains("plan -input=false"), "{command}");
    assert!(command.contains("-var enabled=false"), "{command}");
    assert!(command.contains("-var region=nowhere-false"), "{command}");
    assert!(!command.contains("token") && !command.contains("SECRETVALUE"), "{command}");
}
