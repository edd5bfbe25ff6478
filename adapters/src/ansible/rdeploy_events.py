# rdeploy_events: an aggregate ansible callback shipped by rdeploy's ansible adapter. It writes
# one JSON line per task result per host, plus playbook/play starts and the final per-host stats,
# to the file named by RDEPLOY_ANSIBLE_EVENTS, flushing every line so rdeploy can checkpoint each
# host while the run goes on. It never prints: the user's stdout callback stays in charge.
from __future__ import annotations

DOCUMENTATION = """
    name: rdeploy_events
    type: aggregate
    short_description: per-host JSON lines for rdeploy checkpoints
    description:
      - Writes one JSON line per task result per host and the final stats to the file named by
        the RDEPLOY_ANSIBLE_EVENTS environment variable.
    requirements:
      - enabled through ANSIBLE_CALLBACKS_ENABLED (rdeploy sets it)
"""

import json
import os
import re
import sys

from ansible.plugins.callback import CallbackBase

# Bump when a record's shape changes; the Rust parser checks it.
FORMAT = 1
# One line stays readable in a report; the full text is in the human output.
MSG_LIMIT = 2000


def _one_line(text):
    text = " ".join(str(text).split())
    return text if len(text) <= MSG_LIMIT else text[: MSG_LIMIT - 3] + "..."


def _message(result):
    """The tool's own words for a result: msg, then the last stderr line (command modules)."""
    msg = result.get("msg") or ""
    if not isinstance(msg, str):
        msg = json.dumps(msg, default=str)
    stderr = result.get("stderr") or ""
    if isinstance(stderr, str) and stderr.strip():
        last = stderr.strip().splitlines()[-1]
        msg = f"{msg}: {last}" if msg else last
    if not msg and result.get("rc") not in (None, 0):
        msg = f"rc={result.get('rc')}"
    if not msg and result.get("exception"):
        msg = str(result.get("exception")).strip().splitlines()[-1]
    return _one_line(msg)


def _text(value):
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"


def _diffs(result):
    """What `--diff` says a task changes: before/after texts (or a diff the module prepared).
    Only the task's own words; `no_log` tasks never carry a diff."""
    diff = result.get("diff")
    if not diff:
        return None
    items = diff if isinstance(diff, list) else [diff]
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        entry = {k: _text(item.get(k)) for k in ("before", "after", "before_header", "after_header", "prepared")}
        entry = {k: v for k, v in entry.items() if v is not None}
        if entry:
            out.append(entry)
    return out or None


def _rescuable(task):
    """Whether a failure of this task will be handled by an enclosing block's `rescue`: the
    strategy then counts it as rescued, not failed, so it must not be reported as failed yet."""
    child, parent = task, getattr(task, "_parent", None)
    while parent is not None:
        if getattr(parent, "rescue", None):
            ids = {getattr(t, "_uuid", None) for t in (getattr(parent, "block", None) or [])}
            if getattr(child, "_uuid", None) in ids:
                return True
        child, parent = parent, getattr(parent, "_parent", None)
    return False


def _name(host):
    return host.get_name() if hasattr(host, "get_name") else str(host)


def _executor_frame():
    """The PlaybookExecutor.run frame that sends the stats: ansible says which hosts it marked
    failed (any_errors_fatal, max_fail_percentage mark hosts failed without counting a failure)
    and whether it broke out of the play loop only there, never in a callback argument."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "run" and type(owner).__name__ == "PlaybookExecutor":
            return frame
        frame = frame.f_back
    return None


def _literal(pattern):
    """Whether a play's `hosts` needs no templating: ansible uses it as written."""
    items = pattern if isinstance(pattern, (list, tuple)) else [pattern]
    return bool(items) and all(
        isinstance(p, str) and not any(mark in p for mark in ("{{", "{%", "{#")) for p in items
    )


def _templated_hosts(frame, play):
    """A play's `hosts` written as one extra var (`hosts: "{{ targets }}"`, the var passed with
    `-e`), as the executor will template it when the play starts, so that its hosts are named
    pending if the run stops before it. None for any other template: one may read what earlier
    plays set (a `default()` would hide that it is not set yet) or run a lookup, so its hosts
    are told when its play starts, as before."""
    items = play.hosts if isinstance(play.hosts, (list, tuple)) else [play.hosts]
    owner = frame.f_locals.get("self")
    try:
        extra = owner._variable_manager.extra_vars
        names = [re.fullmatch(r"\s*\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*", p) for p in items]
        if not all(names) or not all(m.group(1) in extra for m in names):
            return None
        pattern = [extra[m.group(1)] for m in names]
    except Exception:  # an internal API of ansible
        return None
    flat = []
    for value in pattern:
        flat.extend(value if isinstance(value, (list, tuple)) else [value])
    return flat if _literal(flat) else None


def _playbook_hosts(playbook):
    """The hosts the playbook's plays target, as `--list-hosts` lists them (the inventory,
    `--limit` applied), a templated `hosts` templated as the play will be when it can be now;
    the others are told as each play starts. None when ansible's executor cannot be found."""
    frame = _executor_frame()
    inventory = getattr(frame.f_locals.get("self"), "_inventory", None) if frame is not None else None
    if inventory is None:
        return None
    hosts = []
    # A group made as the run goes (`add_host`, `group_by`) matches nothing yet: ansible's
    # "Could not match supplied host pattern" is not the user's to read (nor an error under
    # `host_pattern_mismatch = error`). Its hosts are told when its play starts.
    try:
        from ansible import constants

        mismatch = getattr(constants, "HOST_PATTERN_MISMATCH", None)
        constants.HOST_PATTERN_MISMATCH = "ignore"
    except Exception:  # an internal API of ansible: never break the run over it
        constants, mismatch = None, None
    try:
        for play in playbook.get_plays():
            pattern = play.hosts if _literal(play.hosts) else _templated_hosts(frame, play)
            if pattern is not None:
                hosts.extend(_name(h) for h in inventory.get_hosts(pattern))
    except Exception:  # an internal API of ansible: never break the run over it
        return None
    finally:
        if constants is not None:
            constants.HOST_PATTERN_MISMATCH = mismatch
        # Not remembered: a pattern that still matches nothing when its play starts is warned
        # about by ansible then, as without rdeploy.
        clear = getattr(inventory, "clear_caches", None)
        if clear is not None:
            try:
                clear()
            except Exception:  # an internal API of ansible: never break the run over it
                pass
    return hosts


def _play_hosts():
    """Every host of the play starting now, over all its serial batches, as the executor
    selected them (its `hosts` templated, `--limit` applied). None when it cannot be found."""
    frame = _executor_frame()
    if frame is None or "batches" not in frame.f_locals:
        return None
    try:
        return [_name(h) for b in frame.f_locals.get("batches") or [] for h in b]
    except Exception:  # an internal API of ansible: never break the run over it
        return None


# Tasks whose result is followed by tasks ansible inserts only afterwards (the included file).
_INCLUDES = {"include_tasks", "include_role", "ansible.builtin.include_tasks", "ansible.builtin.include_role"}


def _finished(result):
    """Whether the host has nothing left to run in this play once this result is in: no task,
    no notified handler (the implicit flush_handlers is skipped only when none is notified).
    The strategy's PlayIterator is a local of the frame that sends the result; peeking works on
    a copy of the host's state. None when the iterator cannot be found (another strategy)."""
    task = result.task
    if getattr(task, "action", None) in _INCLUDES:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        iterator = frame.f_locals.get("iterator")
        if iterator is not None and type(iterator).__name__ == "PlayIterator":
            try:
                _, upcoming = iterator.get_next_task_for_host(result.host, peek=True)
            except Exception:  # an internal API of ansible: never break the run over it
                return None
            return upcoming is None
        frame = frame.f_back
    return None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rdeploy_events"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # rdeploy's own file, with no name on disk (/proc/PID/fd/N): records hold task messages
        # and diffs as printed, secrets included. Line buffering plus an explicit flush: each
        # record reaches the file whole, at once.
        path = os.environ.get("RDEPLOY_ANSIBLE_EVENTS")
        self._out = open(path, "a", encoding="utf-8", buffering=1) if path else None
        self._play = None
        self._listed_plays = set()
        self._unlink_secret_vars()

    def _unlink_secret_vars(self):
        """Removes the secret extra vars file once ansible has read it: `-e @FILE` is loaded once
        (load_extra_vars keeps it) when the variable manager is made, before callbacks load; so a
        kill -9 of rdeploy later in the run leaves no secret in its state directory."""
        path = os.environ.get("RDEPLOY_ANSIBLE_UNLINK")
        if not path:
            return
        try:
            from ansible.utils.vars import load_extra_vars
        except ImportError:
            return
        if getattr(load_extra_vars, "extra_vars", None) is None:
            return  # not read yet: the playbook start comes after it
        try:
            os.unlink(path)
        except OSError:
            pass
        os.environ.pop("RDEPLOY_ANSIBLE_UNLINK", None)

    def _write(self, record):
        if self._out is None:
            return
        record["v"] = FORMAT
        self._out.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self._out.flush()

    def _result(self, status, result, **extra):
        task = result.task
        record = {
            "event": "result",
            "status": status,
            "host": result.host.get_name(),
            "task": task.get_name(),
            "task_uuid": getattr(task, "_uuid", None),
            "play": self._play,
            "msg": _message(result.result),
        }
        diffs = _diffs(result.result)
        if diffs:
            record["diff"] = diffs
        record.update(extra)
        self._write(record)

    def v2_playbook_on_start(self, playbook):
        self._unlink_secret_vars()
        self._write({"event": "playbook_start", "playbook": getattr(playbook, "_file_name", None)})
        # Before any task: the hosts rdeploy checkpoints, so one never reached is named pending.
        hosts = _playbook_hosts(playbook)
        if hosts:
            self._write({"event": "hosts", "hosts": hosts})

    def v2_playbook_on_play_start(self, play):
        self._play = play.get_name()
        uuid = getattr(play, "_uuid", None)
        self._write({"event": "play_start", "play": self._play, "play_uuid": uuid})
        # Once per play: a play of serial batches starts again for each batch.
        if uuid is None or uuid not in self._listed_plays:
            self._listed_plays.add(uuid)
            hosts = _play_hosts()
            if hosts:
                self._write({"event": "hosts", "hosts": hosts})

    def v2_playbook_on_no_hosts_remaining(self):
        self._write({"event": "no_hosts_remaining", "play": self._play})

    def v2_runner_on_ok(self, result):
        self._result("changed" if result.result.get("changed") else "ok", result, finished=_finished(result))

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if ignore_errors:
            self._result("ignored", result, finished=_finished(result))
        else:
            self._result("failed", result, rescuable=_rescuable(result.task))

    def v2_runner_on_unreachable(self, result):
        self._result("unreachable", result)

    def v2_runner_on_skipped(self, result):
        self._result("skipped", result, finished=_finished(result))

    def v2_playbook_on_stats(self, stats):
        record = {
            "event": "stats",
            "hosts": {host: stats.summarize(host) for host in sorted(stats.processed)},
        }
        # `set_stats` data (aggregate, not per host): the step's outputs for later steps.
        custom = getattr(stats, "custom", None) or {}
        run_stats = custom.get("_run")
        if isinstance(run_stats, dict) and run_stats:
            try:
                json.dumps(run_stats)
                record["custom"] = run_stats
            except (TypeError, ValueError):
                record["custom"] = {k: str(v) for k, v in run_stats.items()}
        frame = _executor_frame()
        if frame is not None:
            tqm = getattr(frame.f_locals.get("self"), "_tqm", None)
            local = frame.f_locals
            record["failed_hosts"] = sorted(getattr(tqm, "_failed_hosts", {}) or {})
            record["unreachable_hosts"] = sorted(getattr(tqm, "_unreachable_hosts", {}) or {})
            plays = local.get("plays") or []
            record["aborted"] = bool(local.get("break_play"))
            if record["aborted"]:
                batches = local.get("batches") or []
                batch = local.get("batch") or []
                record["abort"] = {
                    "play": getattr(local.get("play"), "name", None),
                    # Later plays never start after a break: hosts they target are not done.
                    "last_play": bool(plays) and plays[-1] is local.get("play"),
                    "batch": [_name(h) for h in batch],
                    "play_hosts": [_name(h) for b in batches for h in b],
                }
        self._write(record)
        if self._out is not None:
            self._out.close()
            self._out = None
