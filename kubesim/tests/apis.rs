//! The API groups charts use beyond the workloads (issue 20), through the real kubectl: each
//! kind is discovered, applied client-side and server-side, read back by its short name, and an
//! unknown kind fails as on a real cluster.

use kubesim::testing::{stderr, stdout, Kubesim};

/// One object of each kind, shaped as popular charts render them.
const CHART_KINDS: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: app}
rules:
- apiGroups: [""]
  resources: [configmaps, secrets]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: app}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: app}
subjects:
- {kind: ServiceAccount, name: app, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: app-reader}
rules:
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: app-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: app-reader}
subjects:
- {kind: ServiceAccount, name: app, namespace: default}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: app}
spec:
  podSelector:
    matchLabels: {app: web}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: 8080, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: nginx
  annotations: {ingressclass.kubernetes.io/is-default-class: "true"}
spec: {controller: k8s.io/ingress-nginx}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: app}
spec:
  ingressClassName: nginx
  rules:
  - host: app.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: app, port: {number: 80}}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: app}
spec:
  minAvailable: 1
  selector:
    matchLabels: {app: web}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: app}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: app}
  minReplicas: 1
  maxReplicas: 5
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: fast}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: app}
webhooks:
- name: validate.app.example.com
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {service: {name: app, namespace: default, path: /validate}}
  rules:
  - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: app}
webhooks:
- name: mutate.app.example.com
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {service: {name: app, namespace: default, path: /mutate}}
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.metrics.k8s.io}
spec:
  group: metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
  service: {name: metrics-server, namespace: kube-system}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: app-critical}
value: 1000000
globalDefault: false
description: for the app
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: app-leader}
spec: {holderIdentity: app-0, leaseDurationSeconds: 15}
"#;

const SHORT_NAMES: &str = "sa,role,rolebinding,clusterrole,clusterrolebinding,netpol,ingressclass,ing,pdb,hpa,sc,validatingwebhookconfiguration,mutatingwebhookconfiguration,apiservice,pc,lease";

fn names(k: &Kubesim) -> Vec<String> {
    let out = k.kubectl_ok(&["get", SHORT_NAMES, "-o", "name"]);
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with("serviceaccount/default"))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

const EXPECTED: &[&str] = &[
    "apiservice.apiregistration.k8s.io/v1beta1.metrics.k8s.io",
    "clusterrole.rbac.authorization.k8s.io/app-reader",
    "clusterrolebinding.rbac.authorization.k8s.io/app-reader",
    "horizontalpodautoscaler.autoscaling/app",
    "ingress.networking.k8s.io/app",
    "ingressclass.networking.k8s.io/nginx",
    "lease.coordination.k8s.io/app-leader",
    "mutatingwebhookconfiguration.admissionregistration.k8s.io/app",
    "networkpolicy.networking.k8s.io/app",
    "poddisruptionbudget.policy/app",
    "priorityclass.scheduling.k8s.io/app-critical",
    "role.rbac.authorization.k8s.io/app",
    "rolebinding.rbac.authorization.k8s.io/app",
    "serviceaccount/app",
    "storageclass.storage.k8s.io/fast",
    "validatingwebhookconfiguration.admissionregistration.k8s.io/app",
];

#[test]
fn chart_kinds_apply_client_side_and_read_back_by_short_name() {
    let k = Kubesim::start("kubesim");
    let o = k.kubectl_stdin(&["apply", "-f", "-"], CHART_KINDS);
    assert!(o.status.success(), "apply: {}\n{}", stderr(&o), stdout(&o));
    assert_eq!(names(&k), EXPECTED);
    // A second apply changes nothing; diff agrees. kubectl always sends a PDB's selector
    // (its patch strategy is `replace`), so it says "configured" there, as on a real cluster,
    // but the stored object does not move.
    let rv = k.kubectl_ok(&["get", "pdb", "app", "-o", "jsonpath={.metadata.resourceVersion}"]);
    let again = k.kubectl_stdin(&["apply", "-f", "-"], CHART_KINDS);
    let out = stdout(&again);
    assert!(
        out.lines().all(|l| l.ends_with(" unchanged") || l == "poddisruptionbudget.policy/app configured"),
        "{out}"
    );
    assert_eq!(k.kubectl_ok(&["get", "pdb", "app", "-o", "jsonpath={.metadata.resourceVersion}"]), rv);
    assert_eq!(k.kubectl_stdin(&["diff", "-f", "-"], CHART_KINDS).status.code(), Some(0));
    let o = k.kubectl_stdin(&["delete", "-f", "-"], CHART_KINDS);
    assert!(o.status.success(), "delete: {}", stderr(&o));
    assert!(names(&k).is_empty());
}

#[test]
fn chart_kinds_apply_server_side() {
    let k = Kubesim::start("kubesim");
    let o = k.kubectl_stdin(&["apply", "--server-side", "-f", "-"], CHART_KINDS);
    assert!(o.status.success(), "apply: {}\n{}", stderr(&o), stdout(&o));
    assert_eq!(names(&k), EXPECTED);
    let hpa = k.kubectl_ok(&[
        "get",
        "hpa",
        "app",
        "-o",
        "jsonpath={.apiVersion} {.spec.metrics[0].resource.target.averageUtilization}",
    ]);
    assert_eq!(hpa, "autoscaling/v2 80");
    let d = k.kubectl_stdin(&["diff", "--server-side", "-f", "-"], CHART_KINDS);
    assert_eq!(d.status.code(), Some(0), "{}{}", stdout(&d), stderr(&d));
}

#[test]
fn discovery_lists_the_groups_at_their_1_32_versions() {
    let k = Kubesim::start("kubesim");
    let out = k.kubectl_ok(&["api-versions"]);
    for gv in [
        "admissionregistration.k8s.io/v1",
        "apiregistration.k8s.io/v1",
        "autoscaling/v2",
        "coordination.k8s.io/v1",
        "networking.k8s.io/v1",
        "policy/v1",
        "rbac.authorization.k8s.io/v1",
        "scheduling.k8s.io/v1",
        "storage.k8s.io/v1",
    ] {
        assert!(out.lines().any(|l| l == gv), "{gv} missing from api-versions:\n{out}");
    }
}

/// An unknown kind: kubectl falls back from OpenAPI v3 to v2 for it, and with v2 served it
/// reaches the REST mapping and reports what a real cluster reports.
#[test]
fn unknown_kind_is_a_resource_mapping_error() {
    let k = Kubesim::start("kubesim");
    let o = k.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: 3}\n",
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("resource mapping not found for name: \"w\""), "{err}");
    assert!(err.contains("no matches for kind \"Widget\" in version \"example.com/v1\""), "{err}");
    assert!(err.contains("ensure CRDs are installed first"), "{err}");
    assert!(!err.contains("error validating data"), "{err}");
    // The JSON form for clients that ask for it.
    let (code, body) = k.http("GET", "/clusters/kubesim/openapi/v2");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json v2");
    assert_eq!(v["swagger"], "2.0");
}
