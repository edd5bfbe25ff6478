//! What ansible-playbook's exit statuses mean (`ExitCode` in lib/ansible/errors, checked against
//! ansible-core 2.19), told apart with the callback's records where one code has two causes.

/// A clear message for an exit status. `saw_unreachable` and `saw_records` come from the
/// callback: status 4 is both "a host was unreachable" and "the playbook did not parse", and
/// only the records tell which (a parse error stops ansible before any record is written).
pub fn describe(code: i32, saw_unreachable: bool, saw_records: bool) -> String {
    match code {
        0 => "every host succeeded".into(),
        1 => "ansible-playbook reported an error (for example `--limit` matched no host)".into(),
        2 => "one or more hosts failed".into(),
        3 => "one or more hosts were unreachable".into(),
        4 if saw_unreachable => "one or more hosts were unreachable".into(),
        4 if !saw_records => "the playbook, inventory or extra vars could not be parsed".into(),
        4 => "a host was unreachable or the playbook could not be parsed".into(),
        5 => "ansible-playbook rejected its options".into(),
        8 => "the play was aborted".into(),
        99 => "ansible-playbook was interrupted (no play recap)".into(),
        250 => "ansible-playbook hit an unexpected error (a bug or a broken plugin)".into(),
        other => format!("ansible-playbook exited with unknown status {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_is_told_apart_by_the_records() {
        assert_eq!(describe(4, true, true), "one or more hosts were unreachable");
        assert_eq!(describe(4, false, false), "the playbook, inventory or extra vars could not be parsed");
    }

    #[test]
    fn every_documented_code_has_its_own_message() {
        let codes = [0, 1, 2, 3, 5, 8, 99, 250];
        let messages: std::collections::HashSet<_> = codes.iter().map(|&c| describe(c, false, true)).collect();
        assert_eq!(messages.len(), codes.len());
        assert!(describe(42, false, true).contains("42"));
    }
}
