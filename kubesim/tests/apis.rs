//! The API groups charts use beyond the workloads (issue 20), through the real kubectl: each
//! kind is discovered, applied client-side and server-side, read back by its short name, and an
//! unknown kind fails as on a real cluster.

use kubesim::testing::{stderr, stdout, Kubesim};
use std::time::Duration;

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
        .filter(|l| !l.starts_with("serviceaccount/default") && *l != "storageclass.storage.k8s.io/standard")
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

const TO_DEFAULT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: grafana}
spec:
  strategy: {type: RollingUpdate}
  selector: {matchLabels: {app: grafana}}
  template:
    metadata: {labels: {app: grafana}}
    spec:
      volumes:
      - {name: config, configMap: {name: grafana}}
      - {name: storage}
      containers:
      - name: grafana
        image: grafana/grafana
        readinessProbe: {httpGet: {port: 3000}}
        env:
        - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: recreate}
spec:
  strategy: {type: Recreate}
  selector: {matchLabels: {app: recreate}}
  template:
    metadata: {labels: {app: recreate}}
    spec:
      containers: [{name: c, image: "nginx:1.27"}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  updateStrategy: {type: RollingUpdate}
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: c, image: "registry.example/agent@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: c, image: "postgres:16"}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: migrate}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: "registry.example/migrate:1"}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: grafana}
  ports: [{port: 80}]
"#;

fn get_json(k: &Kubesim, kind: &str, name: &str) -> serde_json::Value {
    serde_json::from_str(&k.kubectl_ok(&["get", kind, name, "-o", "json"])).unwrap()
}

/// The API server's defaulting (pkg/apis/apps/v1, batch/v1 and core/v1 defaults.go) for fields
/// the manifests leave out, nested ones included.
#[test]
fn defaults_fill_what_the_api_server_fills() {
    let k = Kubesim::start("kubesim");
    let o = k.kubectl_stdin(&["apply", "-f", "-"], TO_DEFAULT);
    assert!(o.status.success(), "apply: {}", stderr(&o));

    let d = get_json(&k, "deployment", "grafana");
    assert_eq!(
        d["spec"]["strategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
    );
    assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Always");
    assert_eq!(pod["dnsPolicy"], "ClusterFirst");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    let c = &pod["containers"][0];
    assert_eq!(c["imagePullPolicy"], "Always", "no tag means latest");
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(c["terminationMessagePolicy"], "File");
    assert_eq!(
        c["readinessProbe"],
        serde_json::json!({"httpGet": {"port": 3000, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
    );
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
    assert_eq!(pod["volumes"][0]["configMap"]["defaultMode"], 420);
    assert_eq!(pod["volumes"][1]["emptyDir"], serde_json::json!({}));

    let r = get_json(&k, "deployment", "recreate");
    assert_eq!(r["spec"]["strategy"], serde_json::json!({"type": "Recreate"}), "Recreate has no rollingUpdate");
    assert_eq!(r["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent");

    let ds = get_json(&k, "daemonset", "agent");
    assert_eq!(
        ds["spec"]["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    );
    assert_eq!(ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent", "a digest");

    let sts = get_json(&k, "statefulset", "db");
    assert_eq!(
        sts["spec"]["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    );
    assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
    assert_eq!(
        sts["spec"]["persistentVolumeClaimRetentionPolicy"],
        serde_json::json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );

    let job = get_json(&k, "job", "migrate");
    assert_eq!(job["spec"]["backoffLimit"], 6);
    assert_eq!(job["spec"]["podReplacementPolicy"], "TerminatingOrFailed");

    let svc = get_json(&k, "service", "web");
    assert_eq!(svc["spec"]["sessionAffinity"], "None");
    assert_eq!(svc["spec"]["externalTrafficPolicy"], "Cluster");
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["protocol"], "TCP");
    assert_eq!(port["targetPort"], 80);
    let node_port = port["nodePort"].as_i64().unwrap();
    assert!((30000..=32767).contains(&node_port), "{node_port}");
    assert!(svc["spec"]["clusterIP"].as_str().unwrap().starts_with("10.96."));

    // Re-applying the same manifests stores nothing new. kubectl still sends `$retainKeys`
    // for `strategy` and `volumes` (their patch strategy) because the live object has the
    // defaulted fields, so it says "configured" for grafana as against a real cluster; the
    // server drops the defaulted fields, defaults them again, and the spec does not move
    // (nor the generation; resourceVersions move with the controller's status writes).
    let rvs = || {
        let v: serde_json::Value =
            serde_json::from_str(&k.kubectl_ok(&["get", "deploy,ds,sts,job,svc", "-o", "json"])).unwrap();
        let items = v["items"].as_array().unwrap().iter();
        items.map(|o| (o["metadata"]["generation"].clone(), o["spec"].clone())).collect::<Vec<_>>()
    };
    let before = rvs();
    let again = k.kubectl_stdin(&["apply", "-f", "-"], TO_DEFAULT);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(rvs(), before, "{}", stdout(&again));
}

/// helm 4 applies `spec: {}` for the namespace `--create-namespace` makes; over a namespace
/// kubectl applied, that changes nothing, so a real server reports no conflict.
#[test]
fn helm4_create_namespace_over_a_kubectl_applied_namespace() {
    let k = Kubesim::start("kubesim");
    let o = k.kubectl_stdin(&["apply", "-f", "-"], "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n");
    assert!(o.status.success(), "{}", stderr(&o));
    let chart = kubesim::testing::testdata("webapp");
    k.helm_ok(4, &["install", "web", &chart.to_string_lossy(), "-n", "shop", "--create-namespace"]);
    assert_eq!(k.helm_statuses(4, "web", "shop"), ["deployed"]);
}

const CLAIMS: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 2Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: broken-data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: db}
spec:
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      containers: [{name: db, image: "postgres:16", volumeMounts: [{name: data, mountPath: /var/lib/postgresql}]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: stuck}
spec:
  selector: {matchLabels: {app: stuck}}
  template:
    metadata: {labels: {app: stuck}}
    spec:
      volumes: [{name: data, persistentVolumeClaim: {claimName: broken-data}}]
      containers: [{name: c, image: "postgres:16"}]
"#;

/// A default StorageClass and a provisioner: claims bind (with a PersistentVolume), pods that
/// mount them run; a claim matching `--fail-pvc` stays Pending and so does its pod.
#[test]
fn claims_bind_through_the_default_storage_class_unless_provisioning_fails() {
    let k = Kubesim::start_with("kubesim", &["--fail-pvc", "broken-*", "--pod-startup-ms", "50"]);
    let sc = k.kubectl_ok(&["get", "storageclass", "-o", "jsonpath={.items[*].metadata.name}"]);
    assert_eq!(sc, "standard");
    let o = k.kubectl_stdin(&["apply", "-f", "-"], CLAIMS);
    assert!(o.status.success(), "{}", stderr(&o));
    k.kubectl_ok(&["wait", "--for=jsonpath={.status.phase}=Bound", "pvc/data", "--timeout=30s"]);
    let pvc = get_json(&k, "pvc", "data");
    assert_eq!(pvc["spec"]["storageClassName"], "standard");
    let pv_name = pvc["spec"]["volumeName"].as_str().expect("volumeName").to_string();
    assert_eq!(pvc["status"]["capacity"]["storage"], "2Gi");
    let pv = get_json(&k, "pv", &pv_name);
    assert_eq!(pv["status"]["phase"], "Bound");
    assert_eq!(pv["spec"]["claimRef"]["name"], "data");
    k.kubectl_ok(&["rollout", "status", "deployment/db", "--timeout=30s"]);

    let o = k.kubectl(&["rollout", "status", "deployment/stuck", "--timeout=2s"]);
    assert!(!o.status.success(), "a deployment on an unprovisioned claim must not roll out");
    assert_eq!(get_json(&k, "pvc", "broken-data")["status"]["phase"], "Pending");
    let pods =
        k.kubectl_ok(&["get", "pods", "-l", "app=stuck", "-o", "jsonpath={.items[0].status.conditions[0].message}"]);
    assert!(pods.contains("pod has unbound immediate PersistentVolumeClaims"), "{pods}");
}

/// A big CRD: client-side apply stores the whole object in the last-applied annotation and
/// fails on the 256 KiB annotation limit as on a real cluster; server-side apply succeeds.
#[test]
fn big_crd_fails_client_side_and_applies_server_side() {
    let k = Kubesim::start("kubesim");
    // A CRD shaped like the big operators' (prometheus-operator, Argo CD): a wide schema.
    let mut props = String::new();
    for i in 0..2200 {
        props.push_str(&format!(
            "              field{i:04}:\n                type: string\n                description: \"{}\"\n",
            "x".repeat(100)
        ));
    }
    let crd = format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: widgets.example.com}}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {{plural: widgets, singular: widget, kind: Widget}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec:\n            type: object\n            properties:\n{props}"
    );
    assert!(crd.len() > 262_144, "the CRD must be over the limit: {}", crd.len());
    let o = k.kubectl_stdin(&["apply", "-f", "-"], &crd);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("metadata.annotations: Too long: must have at most 262144 bytes"), "{}", stderr(&o));
    let o = k.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &crd);
    assert!(o.status.success(), "{}", stderr(&o));
    k.kubectl_ok(&["get", "crd", "widgets.example.com"]);
}

/// kubectl's imperative generators send protobuf bodies: a Deployment and a Service.
#[test]
fn kubectl_create_deployment_and_service_send_protobuf() {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    k.kubectl_ok(&["create", "deployment", "web", "--image=nginx:1.27", "--replicas=2", "--port=8080"]);
    k.kubectl_ok(&["create", "service", "clusterip", "web", "--tcp=80:8080"]);
    let d = get_json(&k, "deployment", "web");
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "web");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "nginx:1.27");
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    let s = get_json(&k, "service", "web");
    assert_eq!(s["spec"]["ports"][0]["port"], 80);
    assert_eq!(s["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(s["spec"]["selector"]["app"], "web");
    k.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=30s"]);
}

/// The two size limits a client meets: the API server's 3 MiB request body limit (413, before
/// decoding) and etcd's 1.5 MiB request limit for what is stored (a reasonless 500).
#[test]
fn oversized_objects_fail_as_on_a_real_cluster() {
    let k = Kubesim::start("kubesim");
    let deployment = |name: &str, value_len: usize| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      containers:\n      - name: app\n        image: nginx:1.27\n        env:\n        - name: BLOB\n          value: \"{}\"\n",
            "x".repeat(value_len)
        )
    };
    // under both limits: stored
    let o = k.kubectl_stdin(&["create", "-f", "-"], &deployment("small", 1024 * 1024));
    assert!(o.status.success(), "{}", stderr(&o));
    // a 2 MiB body passes the API server and is refused by etcd
    let o = k.kubectl_stdin(&["create", "-f", "-"], &deployment("medium", 2 * 1024 * 1024));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("Error from server: error when creating \"STDIN\": etcdserver: request is too large"),
        "{}",
        stderr(&o)
    );
    // a 4 MiB body is refused before it is read as an object
    let o = k.kubectl_stdin(&["create", "-f", "-"], &deployment("large", 4 * 1024 * 1024));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("Error from server (RequestEntityTooLarge): error when creating \"STDIN\": Request entity too large: limit is 3145728"),
        "{}",
        stderr(&o)
    );
    // neither was stored; an update that grows the small one past etcd's limit is refused too
    let o = k.kubectl(&["get", "deployment", "medium"]);
    assert!(!o.status.success());
    let o = k.kubectl_stdin(&["replace", "-f", "-"], &deployment("small", 1700 * 1024));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("etcdserver: request is too large"), "{}", stderr(&o));
}

/// batch validation: a Job's (and a CronJob's) pods restart OnFailure or Never; an unset
/// policy is defaulted to Always first and refused the same way.
#[test]
fn jobs_that_would_restart_always_are_refused() {
    let k = Kubesim::start("kubesim");
    let job = |name: &str, policy: &str| {
        format!("apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  template:\n    spec:\n      {policy}containers: [{{name: c, image: busybox:1.36}}]\n")
    };
    for (name, policy) in [("unset", ""), ("always", "restartPolicy: Always\n      ")] {
        let o = k.kubectl_stdin(&["apply", "-f", "-"], &job(name, policy));
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains(&format!("The Job \"{name}\" is invalid: spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\"")),
            "{}",
            stderr(&o)
        );
        assert!(!k.kubectl(&["get", "job", name]).status.success());
    }
    let o = k.kubectl_stdin(&["apply", "-f", "-"], &job("ok", "restartPolicy: OnFailure\n      "));
    assert!(o.status.success(), "{}", stderr(&o));
    let cron = "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly}\nspec:\n  schedule: '0 3 * * *'\n  jobTemplate:\n    spec:\n      template:\n        spec: {containers: [{name: c, image: busybox:1.36}]}\n";
    let o = k.kubectl_stdin(&["apply", "-f", "-"], cron);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("spec.jobTemplate.spec.template.spec.restartPolicy: Unsupported value: \"Always\""),
        "{}",
        stderr(&o)
    );
}

/// The disruption controller's PDB status from the pods the selector matches.
#[test]
fn pdb_status_counts_the_matching_pods() {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    k.apply(
        "kubesim",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 3\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: c, image: nginx:1.27}]}\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: min2}\nspec: {minAvailable: 2, selector: {matchLabels: {app: web}}}\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: half}\nspec: {maxUnavailable: 50%, selector: {matchLabels: {app: web}}}\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: none}\nspec: {minAvailable: 1, selector: {matchLabels: {app: nothing}}}\n",
    );
    let status = |n: &str| get_json(&k, "pdb", n)["status"].clone();
    let want = |healthy: i64, desired: i64, allowed: i64, expected: i64| serde_json::json!({"currentHealthy": healthy, "desiredHealthy": desired, "disruptionsAllowed": allowed, "expectedPods": expected});
    let counts = |s: &serde_json::Value| serde_json::json!({"currentHealthy": s["currentHealthy"], "desiredHealthy": s["desiredHealthy"], "disruptionsAllowed": s["disruptionsAllowed"], "expectedPods": s["expectedPods"]});
    assert!(
        k.eventually(Duration::from_secs(30), || counts(&status("min2")) == want(3, 2, 1, 3)),
        "{:#}",
        status("min2")
    );
    // maxUnavailable 50% of 3 rounds up to 2: one must stay healthy
    assert_eq!(counts(&status("half")), want(3, 1, 2, 3));
    let none = status("none");
    assert_eq!(counts(&none), want(0, 1, 0, 0));
    assert_eq!(none["conditions"][0]["type"], "DisruptionAllowed");
    assert_eq!(none["conditions"][0]["status"], "False");
    assert_eq!(none["conditions"][0]["reason"], "InsufficientPods");
    assert_eq!(status("min2")["conditions"][0]["reason"], "SufficientPods");
}

/// The StatefulSet controller creates `<template>-<set>-<ordinal>` claims that the provisioner
/// binds, and mounts them in the pods.
#[test]
fn statefulset_claim_templates_create_bound_claims() {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    k.apply(
        "kubesim",
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec:\n  replicas: 2\n  serviceName: db\n  selector: {matchLabels: {app: db}}\n  template:\n    metadata: {labels: {app: db}}\n    spec:\n      containers: [{name: c, image: postgres:16, volumeMounts: [{name: data, mountPath: /var/lib/postgresql}]}]\n  volumeClaimTemplates:\n  - metadata: {name: data, labels: {tier: storage}}\n    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n",
    );
    k.kubectl_ok(&["rollout", "status", "statefulset/db", "--timeout=60s"]);
    for i in 0..2 {
        let pvc = get_json(&k, "pvc", &format!("data-db-{i}"));
        assert_eq!(pvc["status"]["phase"], "Bound", "{pvc:#}");
        assert_eq!(pvc["spec"]["storageClassName"], "standard");
        assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert_eq!(pvc["metadata"]["labels"], serde_json::json!({"tier": "storage", "app": "db"}));
        let pod = get_json(&k, "pod", &format!("db-{i}"));
        let vols = pod["spec"]["volumes"].as_array().unwrap();
        assert!(
            vols.contains(
                &serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("data-db-{i}")}})
            ),
            "{vols:?}"
        );
    }
}

/// autoscaling's validateHorizontalPodAutoscalerSpec: the replica bounds and the target.
#[test]
fn hpas_with_impossible_replica_bounds_are_refused() {
    let k = Kubesim::start("kubesim");
    let hpa = |name: &str, bounds: &str| {
        format!("apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {{name: {name}}}\nspec:\n  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: web}}\n  {bounds}\n")
    };
    for (name, bounds, msg) in [
        ("zero", "maxReplicas: 0", "spec.maxReplicas: Invalid value: 0: must be greater than 0"),
        (
            "inverted",
            "{minReplicas: 5, maxReplicas: 2}",
            "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`",
        ),
        (
            "scale-to-zero",
            "{minReplicas: 0, maxReplicas: 2}",
            "spec.minReplicas: Invalid value: 0: must be greater than or equal to 1",
        ),
    ] {
        let bounds = bounds.trim_start_matches('{').trim_end_matches('}').replace(", ", "\n  ");
        let o = k.kubectl_stdin(&["apply", "-f", "-"], &hpa(name, &bounds));
        assert!(!o.status.success(), "{name}");
        assert!(
            stderr(&o).contains(&format!("The HorizontalPodAutoscaler \"{name}\" is invalid: {msg}")),
            "{}",
            stderr(&o)
        );
        assert!(!k.kubectl(&["get", "hpa", name]).status.success());
    }
    let o = k.kubectl_stdin(&["apply", "-f", "-"], &hpa("ok", "minReplicas: 1\n  maxReplicas: 3"));
    assert!(o.status.success(), "{}", stderr(&o));
}

/// apps ValidateStatefulSetUpdate: only replicas, ordinals, template, updateStrategy,
/// revisionHistoryLimit, the PVC retention policy and minReadySeconds may change.
#[test]
fn statefulset_updates_outside_the_mutable_fields_are_forbidden() {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    let sts = |size: &str, replicas: u32, image: &str| {
        format!("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: db}}\nspec:\n  serviceName: db\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: db}}}}\n  template:\n    metadata: {{labels: {{app: db}}}}\n    spec: {{containers: [{{name: db, image: {image}}}]}}\n  volumeClaimTemplates:\n  - metadata: {{name: data}}\n    spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: {size}}}}}}}\n")
    };
    k.apply("kubesim", &sts("1Gi", 1, "postgres:16"));
    // the mutable fields change
    k.apply("kubesim", &sts("1Gi", 2, "postgres:17"));
    let msg = "The StatefulSet \"db\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden";
    for args in [&["apply", "-f", "-"][..], &["apply", "--server-side", "--force-conflicts", "-f", "-"][..]] {
        let o = k.kubectl_stdin(args, &sts("2Gi", 2, "postgres:17"));
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(msg), "{args:?}: {}", stderr(&o));
    }
    let size = k.kubectl_ok(&[
        "get",
        "sts",
        "db",
        "-o",
        "jsonpath={.spec.volumeClaimTemplates[0].spec.resources.requests.storage}",
    ]);
    assert_eq!(size, "1Gi");
    let o = k.kubectl(&["patch", "sts", "db", "-p", "{\"spec\":{\"serviceName\":\"other\"}}"]);
    assert!(stderr(&o).contains(msg), "{}", stderr(&o));
}

/// batch ValidateJobSpecUpdate: a Job's pod template is immutable (the classic failed chart
/// upgrade of a non-hook Job with a new image); a suspended Job that never started may change
/// its scheduling directives.
#[test]
fn a_jobs_pod_template_is_immutable() {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    let job = |name: &str, image: &str, extra: &str| {
        format!("apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  {extra}template:\n    metadata: {{labels: {{app: migrate}}}}\n    spec: {{restartPolicy: Never, containers: [{{name: c, image: {image}}}]}}\n")
    };
    k.apply("kubesim", &job("migrate", "migrate:1", ""));
    for args in [&["apply", "-f", "-"][..], &["apply", "--server-side", "--force-conflicts", "-f", "-"][..]] {
        let o = k.kubectl_stdin(args, &job("migrate", "migrate:2", ""));
        assert!(!o.status.success(), "{args:?}");
        assert!(
            stderr(&o).contains("The Job \"migrate\" is invalid: spec.template: Invalid value: core.PodTemplateSpec{"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(stderr(&o).contains("}: field is immutable"), "{}", stderr(&o));
    }
    let image = k.kubectl_ok(&["get", "job", "migrate", "-o", "jsonpath={.spec.template.spec.containers[0].image}"]);
    assert_eq!(image, "migrate:1");
    // the same template again, and a mutable field, are fine
    k.apply("kubesim", &job("migrate", "migrate:1", "ttlSecondsAfterFinished: 600\n  "));
    // suspended and never started: the labels may change, the image may not
    k.apply("kubesim", &job("held", "migrate:1", "suspend: true\n  "));
    let relabelled = job("held", "migrate:1", "suspend: true\n  ").replace("app: migrate", "app: held");
    let o = k.kubectl_stdin(&["apply", "-f", "-"], &relabelled);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = k.kubectl_stdin(&["apply", "-f", "-"], &job("held", "migrate:2", "suspend: true\n  "));
    assert!(stderr(&o).contains("spec.template: Invalid value"), "{}", stderr(&o));
}

/// `Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` (client-go's
/// metadata client, kube's `list_metadata`): each item is its metadata alone, labels included,
/// selected by `labelSelector`; without it the full objects come back.
#[test]
fn metadata_only_lists_carry_the_metadata_alone() {
    use std::io::{Read, Write};
    let k = Kubesim::start("c1");
    for (name, owner) in [("s1", "helm"), ("s2", "helm"), ("s3", "someone")] {
        k.kubectl_ok(&["--context", "c1", "create", "secret", "generic", name, "--from-literal=release=c2VjcmV0"]);
        k.kubectl_ok(&["--context", "c1", "label", "secret", name, &format!("owner={owner}"), "name=web"]);
    }
    let list = |accept: &str| -> serde_json::Value {
        let mut s = std::net::TcpStream::connect(&k.addr).unwrap();
        write!(
            s,
            "GET /clusters/c1/api/v1/namespaces/default/secrets?labelSelector=owner%3Dhelm%2Cname%3Dweb HTTP/1.1\r\nHost: {}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n",
            k.addr
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let body = reply.split_once("\r\n\r\n").unwrap().1;
        // The body may be chunked: the JSON document is between the first `{` and the last `}`.
        let json = &body[body.find('{').unwrap()..=body.rfind('}').unwrap()];
        serde_json::from_str(json).unwrap()
    };
    let meta = list("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json");
    assert_eq!(meta["kind"], "PartialObjectMetadataList");
    assert_eq!(meta["apiVersion"], "meta.k8s.io/v1");
    let items = meta["items"].as_array().unwrap();
    let names: Vec<&str> = items.iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["s1", "s2"]);
    for item in items {
        assert_eq!(item["kind"], "PartialObjectMetadata");
        assert_eq!(item["metadata"]["labels"]["owner"], "helm");
        assert!(item.get("data").is_none(), "{item}");
    }
    let full = list("application/json");
    assert_eq!(full["kind"], "SecretList");
    assert_eq!(full["items"][0]["data"]["release"], "YzJWamNtVjA=");
}
