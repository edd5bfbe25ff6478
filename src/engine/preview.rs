//! Previews through the session: `rdeploy plan`'s (every step at once, as far as their inputs
//! allow) and `up`'s early ones, which go on while the run starts, and the decision each step of
//! `up` takes from them. The plan's model and its renderers are `crate::plan`'s.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use rdeploy_adapters::preview::PreviewError;
use rdeploy_adapters::{Adapter, CancellationToken, PlanAction, Preview};
use tokio::sync::oneshot;

use super::session::Session;
use crate::adapter::StepAdapter;
use crate::exit::{Code, Refusal};
use crate::plan::{input_key, known_inputs, redact_preview, Resolved, StackPlan, StepPlan};
use crate::stack::Step;

/// The output values a step was previewed with, by [`input_key`].
pub(crate) type Inputs = BTreeMap<String, Resolved<serde_json::Value>>;

/// Who runs a set of previews ([`Session::run_previews`]) decides, for each step, whether its
/// preview starts when its inputs are known, and hears each one end.
pub(crate) trait PreviewWatch {
    /// Right before step `index`'s preview starts: the token that stops it, or `None` to leave
    /// it unpreviewed.
    fn start(&mut self, index: usize) -> Option<CancellationToken>;
    /// Step `index`'s preview ended (its tools have exited).
    fn ended(&mut self, index: usize, result: &Result<Preview, PreviewError>, inputs: &Inputs);
}

/// A step's preview as `up` made it early, with the output values it was made with.
pub(crate) struct EarlyPreview {
    pub(crate) preview: Preview,
    pub(crate) inputs: Inputs,
}

/// One step's early preview, shared between the previews under way and the run: not started
/// yet, started (with the run's count of applies when it started reading live state), or taken
/// by the step before it started (then it never starts: the step previews for itself).
pub(crate) struct EarlySlot {
    state: AtomicU8,
    /// [`EarlyPreviews::applies`] when the preview started: a preview is the step's decision
    /// only while the count has not moved since.
    began: AtomicU64,
    /// Stops this preview alone (a child of the run's: an interrupt stops it too).
    cancel: CancellationToken,
}

const WAITING: u8 = 0;
const STARTED: u8 = 1;
const TAKEN: u8 = 2;

/// `up`'s early previews as the run sees them ([`Session::early_previews`]): each step's slot
/// and where its preview comes in, and the count of applies in the run so far.
pub(crate) struct EarlyPreviews {
    pub(crate) slots: HashMap<String, (Arc<EarlySlot>, oneshot::Receiver<EarlyPreview>)>,
    /// How many times something in the run may have changed live state: a step that did not
    /// find everything in place ended (applied, failed, or was stopped), or a revert ended.
    /// Raised once that work has ended, so a preview that read live state while it went on
    /// started at a smaller count.
    pub(crate) applies: Arc<AtomicU64>,
    /// Stops every preview (each slot's token is a child): cancelled once no step starts any
    /// more (the run's cancel is its parent).
    stop: CancellationToken,
}

impl EarlyPreviews {
    /// No early previews (`up --plan` decides by the reviewed plan, `--force-apply` not at all);
    /// `cancel`: the run's.
    pub(crate) fn none(cancel: &CancellationToken) -> EarlyPreviews {
        EarlyPreviews { slots: HashMap::new(), applies: Arc::new(AtomicU64::new(0)), stop: cancel.child_token() }
    }

    /// No step starts any more: the previews still under way are of no use, and are stopped
    /// (their tools get SIGINT; [`Session::early_previews`]' future ends once they have exited).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// `step` will never start (a step it needs failed): its preview, if under way, is stopped.
    pub(crate) fn stop_one(&self, step: &str) {
        if let Some((slot, _)) = self.slots.get(step) {
            slot.cancel.cancel();
        }
    }

    /// Cancelled once [`EarlyPreviews::stop`] was called or the run's cancel was (a Ctrl-C, a
    /// fatal error: it is the parent of both [`EarlyPreviews::none`]'s and
    /// [`Session::early_previews`]'): a step that waited for a preview of its own to stop does
    /// not start then.
    pub(crate) fn stopped(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Something in the run has ended that may have changed live state.
    pub(crate) fn applied(&self) {
        self.applies.fetch_add(1, Ordering::SeqCst);
    }

    /// The early preview of `step`, as it starts: waited for if it is under way (the step is
    /// `alone` and nothing applied since it started: nothing else runs while it is waited for);
    /// one not started yet never starts. Else it is stopped, and what resolves once its tools
    /// have exited is returned beside `None`, for the step's own task to wait on before its
    /// tools start (a preview that went on beside them would read, and lock, what they change),
    /// while the run goes on settling the steps that end meanwhile.
    pub(crate) async fn take(&mut self, step: &str, alone: bool) -> (Option<EarlyPreview>, Option<Stopping>) {
        let Some((slot, receiver)) = self.slots.remove(step) else { return (None, None) };
        if slot.state.compare_exchange(WAITING, TAKEN, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return (None, None);
        }
        let now = self.applies.load(Ordering::SeqCst);
        if !(alone && slot.began.load(Ordering::SeqCst) == now) {
            slot.cancel.cancel();
            return (None, Some(Stopping(receiver)));
        }
        // Resolves once the preview's task has ended: its result, or nothing (it failed, or
        // the previews stopped). Nothing runs while a step that is alone waits: the count
        // cannot have moved, and is checked all the same.
        let early = receiver.await.ok();
        (early.filter(|_| self.applies.load(Ordering::SeqCst) == now), None)
    }
}

/// An early preview being stopped: [`Stopping::ended`] resolves once its tools have exited.
pub(crate) struct Stopping(oneshot::Receiver<EarlyPreview>);

impl Stopping {
    pub(crate) async fn ended(self) {
        let _ = self.0.await;
    }
}

/// [`PreviewWatch`] of `rdeploy plan`: every step previews, each said as it ends.
struct PlanWatch<'a> {
    session: &'a Session,
    steps: &'a [&'a Step],
}

impl PreviewWatch for PlanWatch<'_> {
    fn start(&mut self, _index: usize) -> Option<CancellationToken> {
        Some(self.session.cancel.child_token())
    }

    fn ended(&mut self, index: usize, _result: &Result<Preview, PreviewError>, _inputs: &Inputs) {
        let step = self.steps[index];
        self.session.ui.info(format!("planned {} ({})", step.name, step.tool));
    }
}

/// [`PreviewWatch`] of `up`'s early previews: a step's preview starts unless the step took its
/// slot first; each one that succeeds goes to the step through its channel.
struct EarlyWatch {
    slots: Vec<Option<(Arc<EarlySlot>, oneshot::Sender<EarlyPreview>)>>,
    applies: Arc<AtomicU64>,
}

impl PreviewWatch for EarlyWatch {
    fn start(&mut self, index: usize) -> Option<CancellationToken> {
        let slot = self.slots[index].as_ref()?.0.clone();
        // Stopped before it started: its step will never run.
        if slot.cancel.is_cancelled() {
            self.slots[index] = None;
            return None;
        }
        // Read before the CAS, so before the preview reads anything: an apply that ends in
        // between moves the count and the preview is not taken.
        slot.began.store(self.applies.load(Ordering::SeqCst), Ordering::SeqCst);
        match slot.state.compare_exchange(WAITING, STARTED, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => Some(slot.cancel.clone()),
            Err(_) => {
                self.slots[index] = None;
                None
            }
        }
    }

    fn ended(&mut self, index: usize, result: &Result<Preview, PreviewError>, inputs: &Inputs) {
        // A preview that failed sends nothing: the step previews when it starts.
        if let (Some((_, sender)), Ok(preview)) = (self.slots[index].take(), result) {
            let _ = sender.send(EarlyPreview { preview: preview.clone(), inputs: inputs.clone() });
        }
    }
}

impl Session {
    /// Every step's preview that `wanted` selects and `watch` starts, run at once as far as
    /// their inputs allow: a step that reads outputs starts once each producer's preview is in
    /// and changes nothing and the recorded deploy has the value; one whose values stay pending
    /// is not previewed (`None`). Returns each step's result and the output values it was
    /// previewed with; `watch` hears each preview end as it ends.
    pub(crate) async fn run_previews(
        &self,
        steps: &[&Step],
        recorded: Option<&crate::checkpoint::Deploy>,
        wanted: &dyn Fn(&Step) -> bool,
        decision: bool,
        watch: &mut dyn PreviewWatch,
    ) -> anyhow::Result<(Vec<Option<Result<Preview, PreviewError>>>, Vec<Inputs>)> {
        let mut running = tokio::task::JoinSet::new();
        let mut results: Vec<Option<Result<Preview, PreviewError>>> = steps.iter().map(|_| None).collect();
        let mut inputs: Vec<Inputs> = vec![BTreeMap::new(); steps.len()];
        let mut started = vec![false; steps.len()];
        // Which step each preview task is, to hear the one that panicked end as a failure.
        let mut tasks: HashMap<tokio::task::Id, usize> = HashMap::new();
        let mut panicked: Option<tokio::task::JoinError> = None;
        loop {
            for (index, step) in steps.iter().enumerate() {
                // After a panic nothing new starts; the previews under way end as they do.
                if started[index] || !wanted(step) || panicked.is_some() {
                    continue;
                }
                let known = known_inputs(step, steps, &results, recorded);
                // A producer not previewed yet, or one that would change: wait (until a
                // preview ends, or for good).
                let waiting = known.values().any(|v| matches!(v, Resolved::Pending { .. }));
                inputs[index] = known;
                if waiting {
                    continue;
                }
                let values: HashMap<String, String> = inputs[index]
                    .iter()
                    .filter_map(|(k, v)| match v {
                        Resolved::Known(v) => Some((k.clone(), rdeploy_adapters::outputs::value_text(v))),
                        Resolved::Pending { .. } => None,
                    })
                    .collect();
                // A value its key cannot take is for `up` to refuse; the plan leaves it pending.
                let Ok(step) = step.resolve(&|r| values.get(&input_key(r)).cloned()) else { continue };
                started[index] = true;
                let Some(cancel) = watch.start(index) else { continue };
                // As for `up`: marked secrets are read (and registered for redaction) before the
                // tool starts; one that cannot be read fails this step's preview.
                let (step, ctx, read) = self.resolved(&step, cancel);
                let records = self.state.shared.clone();
                let task = running.spawn(async move {
                    let adapter = StepAdapter::of(&step, &records);
                    let result = match read {
                        // `up` takes the decision alone (the same verdict, maybe fewer reads).
                        Ok(()) if decision => adapter.decision_preview(&ctx).await,
                        Ok(()) => adapter.preview(&ctx).await,
                        Err(failure) => Err(PreviewError::Failed(failure)),
                    };
                    (index, result)
                });
                tasks.insert(task.id(), index);
            }
            // One at a time: the steps that read a producer's outputs start as soon as its
            // preview is in.
            let Some(joined) = running.join_next().await else { break };
            let (index, result) = match joined {
                Ok(ended) => ended,
                // The others are waited for, not dropped (their tools would be left exiting
                // beside the steps' own); the step that panicked previews as it starts.
                Err(e) => {
                    let index = tasks[&e.id()];
                    let failed = Err(PreviewError::Failed(rdeploy_adapters::Failure::new("its preview task panicked")));
                    watch.ended(index, &failed, &inputs[index]);
                    panicked.get_or_insert(e);
                    continue;
                }
            };
            watch.ended(index, &result, &inputs[index]);
            results[index] = Some(result);
        }
        match panicked {
            Some(e) => Err(anyhow::anyhow!("a preview task panicked: {e}")),
            None => Ok((results, inputs)),
        }
    }

    /// `up`'s previews, made as `plan` makes them (at once, with the output values the last
    /// deploy recorded; each tool's [`Adapter::decision_preview`], the same verdict with no more
    /// reads than it needs) while the run goes on: each step takes its own when its turn comes
    /// ([`EarlyPreviews::take`]), so a deploy where everything is in place costs about a plan
    /// and the tools that run anyway. A step whose adapter does not converge by its preview
    /// ([`Adapter::converges_by_preview`]: ansible runs anyway, a fleet step previews per
    /// cluster) or one with `always: true` gets none. Returns the previews as the run sees them,
    /// and the future that makes them: it ends once every preview started has ended, and
    /// `cancel` stops those still under way (they only read).
    pub(crate) fn early_previews(
        &self,
        cancel: &CancellationToken,
    ) -> (EarlyPreviews, impl std::future::Future<Output = ()> + '_) {
        let steps: Vec<&Step> = self.stack.ordered().collect();
        let wanted = |step: &Step| StepAdapter::of(step, &self.state.shared).converges_by_preview() && !step.always;
        let applies = Arc::new(AtomicU64::new(0));
        let mut previews = EarlyPreviews { slots: HashMap::new(), applies: applies.clone(), stop: cancel.clone() };
        let mut watch = EarlyWatch { slots: Vec::new(), applies };
        for step in &steps {
            if !wanted(step) {
                watch.slots.push(None);
                continue;
            }
            let slot = Arc::new(EarlySlot {
                state: AtomicU8::new(WAITING),
                began: AtomicU64::new(0),
                cancel: cancel.child_token(),
            });
            let (sender, receiver) = oneshot::channel();
            previews.slots.insert(step.name.clone(), (slot.clone(), receiver));
            watch.slots.push(Some((slot, sender)));
        }
        let making = async move {
            let recorded = self.store.last_finished().ok().flatten().filter(|d| d.stack == self.stack.name);
            // A preview task that panicked starts no other, and the others end as they do:
            // each step still to come previews for itself.
            let _ = self.run_previews(&steps, recorded.as_ref(), &wanted, true, &mut watch).await;
        };
        (previews, making)
    }

    /// The decision a step of `up` takes ([`Adapter::converge_step`]):
    /// under `up --plan`, the reviewed plan's items (exactly what it said would change); else
    /// the step's early preview ([`EarlyPreviews::take`]: made while nothing in the run applied
    /// anything, with no other step running), as long as the output values the step gets now
    /// are those it was previewed with; otherwise `None`: the step previews when it starts.
    pub(crate) fn decided_preview(
        &self,
        current: &dyn Fn(&str, &str) -> Option<serde_json::Value>,
        step: &Step,
        early: Option<EarlyPreview>,
    ) -> Option<Preview> {
        if let Some(loaded) = &self.from_plan {
            return loaded.step(&step.name).and_then(crate::planfile::SavedStep::decided);
        }
        let EarlyPreview { preview, inputs } = early?;
        let same = step.refs.iter().all(|r| match inputs.get(&input_key(r)) {
            Some(Resolved::Known(then)) => current(&r.step, &r.key).as_ref() == Some(then),
            _ => false,
        });
        same.then_some(preview)
    }

    /// `rdeploy plan`: every step's preview, shown in run order; changes nothing. The previews
    /// only read, so they run at once (a plan costs about its slowest tool, not their sum); a
    /// tool that is missing is bad input (exit 2), as preflight says for `up`.
    pub async fn plan(&self) -> anyhow::Result<StackPlan> {
        let steps: Vec<&Step> = self.stack.ordered().collect();
        let mut plan = StackPlan { stack: self.stack.name.clone(), changes: 0, steps: Vec::new(), notes: Vec::new() };
        if let Ok(Some(deploy)) = self.store.load_unfinished() {
            plan.notes.push(format!(
                "deploy {} is unfinished: `rdeploy up` refuses until `rdeploy recover {}` (or `rdeploy reset`) settles it",
                deploy.deploy_id, self.stack_arg
            ));
        }
        // What the unfinished deploy (else the last one of this stack) journaled, for the values
        // of producers that would not change.
        let recorded = match self.store.load_unfinished() {
            Ok(Some(deploy)) => Some(deploy),
            _ => self.store.last_finished().ok().flatten().filter(|d| d.stack == self.stack.name),
        };
        let mut watch = PlanWatch { session: self, steps: &steps };
        let (results, inputs) = self.run_previews(&steps, recorded.as_ref(), &|_| true, false, &mut watch).await?;
        let missing: Vec<String> = steps
            .iter()
            .zip(&results)
            .filter_map(|(step, result)| match result {
                Some(Err(PreviewError::Tool(e))) => {
                    let hint = e.hint().map(|h| format!("\n  hint: {h}")).unwrap_or_default();
                    Some(format!("step `{}`: {e}{hint}", step.name))
                }
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            return Err(Refusal::new(Code::BadInput, missing.join("\n")).into());
        }
        for ((step, result), inputs) in steps.iter().zip(results).zip(inputs) {
            let step_plan = self.step_plan(step, result, inputs)?;
            plan.changes += step_plan.changes;
            plan.steps.push(step_plan);
        }
        Ok(plan)
    }

    /// What the plan says of one step from its preview's result (`None`: not previewed, its
    /// inputs pending), redacted; an interrupted preview refuses the whole plan.
    fn step_plan(
        &self,
        step: &Step,
        result: Option<Result<Preview, PreviewError>>,
        inputs: Inputs,
    ) -> anyhow::Result<StepPlan> {
        // The run's registry holds every secret of the stack (registered when it loaded,
        // and the marked ones read for this step's preview).
        let redact = |text: &str| self.redactor.redact(text);
        let mut step_plan = StepPlan {
            name: step.name.clone(),
            tool: step.tool,
            changes: 0,
            summary: None,
            items: Vec::new(),
            notes: Vec::new(),
            unknown_until: Vec::new(),
            inputs,
            error: None,
            observed: Vec::new(),
            saved_plan: None,
        };
        match result {
            None => {
                for value in step_plan.inputs.values() {
                    if let Resolved::Pending { step } = value {
                        if !step_plan.unknown_until.contains(step) {
                            step_plan.unknown_until.push(step.clone());
                        }
                    }
                }
                let after: Vec<String> = step_plan
                    .unknown_until
                    .iter()
                    .map(|s| Resolved::<String>::Pending { step: s.clone() }.to_string())
                    .collect();
                step_plan.summary = Some(format!("not previewed: it reads outputs {}", after.join(", ")));
                // Counted as a change: the plan cannot claim it would change nothing.
                step_plan.changes = 1;
            }
            Some(Ok(mut preview)) => {
                if step.always {
                    // What `up` decides: the tool runs, in place or not.
                    preview.items.push(
                        rdeploy_adapters::PlanItem::new(step.name.clone(), PlanAction::Run)
                            .because("`always: true`: the tool runs on every `up`, whatever is in place"),
                    );
                }
                redact_preview(&mut preview, redact);
                step_plan.changes = preview.changes();
                step_plan.summary = preview.summary;
                step_plan.items = preview.items;
                step_plan.notes = preview.notes;
                step_plan.observed = preview.observed;
                step_plan.saved_plan = preview.saved_plan;
            }
            Some(Err(PreviewError::Failed(failure))) if failure.interrupted || self.cancel.is_cancelled() => {
                return Err(Refusal::new(
                    Code::Interrupted,
                    format!("interrupted while planning step `{}`: nothing was changed", step.name),
                )
                .with_hint(format!("run `rdeploy plan {}` again", self.stack_arg))
                .into());
            }
            Some(Err(PreviewError::Failed(failure))) => {
                let mut error = redact(&failure.summary);
                if let Some(hint) = &failure.hint {
                    error.push_str(&format!(" (hint: {})", redact(hint)));
                }
                step_plan.error = Some(error);
                step_plan.changes = 1;
            }
            Some(Err(PreviewError::Tool(_))) => unreachable!("`plan` refuses a missing tool before any step plan"),
        }
        Ok(step_plan)
    }
}
