//! The tools' known transient errors: a failure that the same command, resumed a little later,
//! is expected to get past without a human (a state lock held for a moment, an API server
//! restarting). `retry:` retries these unless `transient: false`; each pattern is pinned to
//! output captured from the real tool under `fixtures/*/captured/`.

use std::sync::LazyLock;

use regex::Regex;

use crate::{Failure, Tool};

/// One class of transient error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransientClass {
    /// terraform: "Error acquiring the state lock" (another terraform holds it).
    TerraformStateLock,
    /// kubectl or helm: the Kubernetes API refused the connection, timed out, or answered
    /// 429 / 500 / 503 / etcd leader changed.
    KubernetesApi,
    /// helm: "another operation (install/upgrade/rollback) is in progress".
    HelmOperationInProgress,
    /// ansible: a host was UNREACHABLE (a retry `--limit`s the failed and unreachable hosts).
    AnsibleUnreachable,
}

impl TransientClass {
    pub fn describe(self) -> &'static str {
        match self {
            TransientClass::TerraformStateLock => "the terraform state lock is held",
            TransientClass::KubernetesApi => "the Kubernetes API is unavailable",
            TransientClass::HelmOperationInProgress => "another helm operation is in progress",
            TransientClass::AnsibleUnreachable => "a host was unreachable",
        }
    }
}

static KUBERNETES_API: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?i)(connect: connection refused",
        r"|The connection to the server \S+ was refused",
        r"|dial tcp \S+: i/o timeout",
        r"|net/http: TLS handshake timeout",
        // A connection broken mid-response (an API server or its proxy restarting); kubesim's
        // offline cluster answers this way too (`apply-kubesim-offline.stderr`).
        r"|net/http: HTTP/1.x transport connection broken",
        r"|read: connection reset by peer",
        r"|Unable to connect to the server: .*(timeout|EOF)",
        r"|\(TooManyRequests\)|has received too many requests and has asked us to try again later",
        r"|\(InternalError\)|an error on the server \(.*\) has prevented the request from succeeding",
        r"|\(ServiceUnavailable\)|the server is currently unable to handle the request",
        r"|etcdserver: leader changed",
        r"|kubernetes cluster unreachable: .*(refused|timeout|too many requests|unable to handle the request|has prevented the request))",
    ))
    .expect("a valid pattern")
});

static TERRAFORM_LOCK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"Error acquiring the state lock").expect("a valid pattern"));
static HELM_IN_PROGRESS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"another operation \(install/upgrade/rollback\) is in progress").expect("a valid pattern")
});
static ANSIBLE_UNREACHABLE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"UNREACHABLE!|"unreachable": true|\bunreachable=[1-9]|one or more hosts were unreachable"#)
        .expect("a valid pattern")
});

/// The transient class of one line of a tool's output, if any.
pub fn classify_line(tool: Tool, line: &str) -> Option<TransientClass> {
    match tool {
        Tool::Terraform => TERRAFORM_LOCK.is_match(line).then_some(TransientClass::TerraformStateLock),
        Tool::Kubectl => KUBERNETES_API.is_match(line).then_some(TransientClass::KubernetesApi),
        Tool::Helm => {
            if HELM_IN_PROGRESS.is_match(line) {
                Some(TransientClass::HelmOperationInProgress)
            } else {
                KUBERNETES_API.is_match(line).then_some(TransientClass::KubernetesApi)
            }
        }
        Tool::Ansible => ANSIBLE_UNREACHABLE.is_match(line).then_some(TransientClass::AnsibleUnreachable),
        Tool::Shell => None,
    }
}

/// The transient class of a failure: its summary or its stderr tail.
pub fn classify(tool: Tool, failure: &Failure) -> Option<TransientClass> {
    std::iter::once(failure.summary.as_str())
        .chain(failure.stderr_tail.iter().map(String::as_str))
        .find_map(|line| classify_line(tool, line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn class_of(tool: Tool, path: &str) -> Option<TransientClass> {
        captured(path).lines().find_map(|l| classify_line(tool, l))
    }

    #[test]
    fn terraform_state_lock() {
        assert_eq!(
            class_of(Tool::Terraform, "terraform/captured/lock-held-plan.jsonl"),
            Some(TransientClass::TerraformStateLock)
        );
    }

    #[test]
    fn kubernetes_api_connection_refused_from_kubectl_and_helm() {
        for path in ["kubectl/captured/get-refused.stderr", "kubectl/captured/apply-refused.stderr"] {
            assert_eq!(class_of(Tool::Kubectl, path), Some(TransientClass::KubernetesApi), "{path}");
        }
        for path in ["helm/captured/helm3-status-refused.stderr", "helm/captured/helm4-status-refused.stderr"] {
            assert_eq!(class_of(Tool::Helm, path), Some(TransientClass::KubernetesApi), "{path}");
        }
    }

    #[test]
    fn kubernetes_api_429_500_503_from_kubectl_and_helm() {
        for code in ["429", "500", "503"] {
            let k = format!("kubectl/captured/get-{code}.stderr");
            assert_eq!(class_of(Tool::Kubectl, &k), Some(TransientClass::KubernetesApi), "{k}");
            let h = format!("helm/captured/helm4-status-{code}.stderr");
            assert_eq!(class_of(Tool::Helm, &h), Some(TransientClass::KubernetesApi), "{h}");
        }
    }

    #[test]
    fn kubernetes_api_connection_broken_mid_response() {
        assert_eq!(
            class_of(Tool::Kubectl, "kubectl/captured/apply-kubesim-offline.stderr"),
            Some(TransientClass::KubernetesApi)
        );
    }

    #[test]
    fn kubernetes_api_tls_handshake_timeout() {
        assert_eq!(
            class_of(Tool::Kubectl, "kubectl/captured/get-tls-timeout.stderr"),
            Some(TransientClass::KubernetesApi)
        );
    }

    #[test]
    fn helm_another_operation_in_progress() {
        assert_eq!(
            class_of(Tool::Helm, "helm/captured/helm4-upgrade-pending.stderr"),
            Some(TransientClass::HelmOperationInProgress)
        );
    }

    #[test]
    fn ansible_unreachable() {
        assert_eq!(
            class_of(Tool::Ansible, "ansible/captured/unreachable-and-failed.stdout"),
            Some(TransientClass::AnsibleUnreachable)
        );
    }

    #[test]
    fn ansible_exit_status_4_as_the_adapter_words_it() {
        let words = crate::ansible::exit_codes::describe(4, true, true);
        assert_eq!(classify_line(Tool::Ansible, &words), Some(TransientClass::AnsibleUnreachable), "{words}");
        assert_eq!(classify_line(Tool::Ansible, "ok=3 changed=1 unreachable=0 failed=1"), None);
    }

    #[test]
    fn ordinary_failures_are_not_transient() {
        for (tool, path) in [
            (Tool::Kubectl, "kubectl/captured/apply-invalid.stderr"),
            (Tool::Kubectl, "kubectl/captured/apply-missing-namespace.stderr"),
            (Tool::Kubectl, "kubectl/captured/rollout-broken.stderr"),
        ] {
            assert_eq!(class_of(tool, path), None, "{path}");
        }
        assert_eq!(classify(Tool::Shell, &Failure::new("connect: connection refused")), None);
    }
}
