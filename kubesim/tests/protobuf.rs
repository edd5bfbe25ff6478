//! `kubectl create`'s generators send protobuf bodies (client-go's typed clients): every kind
//! they make is decoded by kubesim's generic wire decoder and every field kubectl set is
//! stored, compared leaf by leaf with the object kubectl itself prints for the same command
//! (`--dry-run=client -o json`, the object it serialises).

use kubesim::testing::{stderr, Kubesim};
use serde_json::Value;

/// The leaves (JSON pointer, value) of a JSON object, skipping nulls and empty objects (Go's
/// zero structs, which say nothing).
fn leaves(v: &Value, path: String, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                leaves(x, format!("{path}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{path}/{i}"), out);
            }
        }
        Value::Null => {}
        other => out.push((path, other.clone())),
    }
}

/// Creates with `args`, then checks every leaf kubectl's own rendering of the object has in
/// the stored object (status aside).
fn creates_whole(k: &Kubesim, args: &[&str], kind: &str, name: &str, ns: Option<&str>) -> Value {
    // the flags go before a `--` (after it they would be the container's command)
    let mut dry: Vec<&str> = args.to_vec();
    let at_dashes = dry.iter().position(|a| *a == "--").unwrap_or(dry.len());
    dry.splice(at_dashes..at_dashes, ["--dry-run=client", "-o", "json"]);
    let sent: Value = serde_json::from_str(&k.kubectl_ok(&dry)).unwrap();
    let o = k.kubectl(args);
    assert!(o.status.success(), "kubectl {args:?}: {}", stderr(&o));
    let mut get = vec!["get", kind, name, "-o", "json"];
    if let Some(ns) = ns {
        get.extend(["-n", ns]);
    }
    let stored: Value = serde_json::from_str(&k.kubectl_ok(&get)).unwrap();
    let mut want = Vec::new();
    leaves(&sent, String::new(), &mut want);
    assert!(want.len() >= 3, "{sent}");
    // status is the server's: a create ignores the one sent, as the real server does
    for (path, v) in want.into_iter().filter(|(p, _)| !p.starts_with("/status")) {
        let got = stored.pointer(&path).unwrap_or(&Value::Null);
        assert_eq!(got, &v, "{kind}/{name}: {path} was sent as {v} and stored as {got}\n{stored:#}");
    }
    stored
}

#[test]
fn kubectl_create_of_every_generator_kind_round_trips_every_field() {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    let cases: &[(&[&str], &str, &str, Option<&str>)] = &[
        (&["create", "namespace", "team-a"], "namespace", "team-a", None),
        (
            &[
                "run",
                "solo",
                "--image=busybox:1.36",
                "--env=A=1",
                "--labels=tier=x",
                "--restart=Never",
                "--port=9000",
                "--",
                "sleep",
                "1",
            ],
            "pod",
            "solo",
            None,
        ),
        (
            &[
                "create",
                "deployment",
                "web",
                "--image=nginx:1.27",
                "--replicas=3",
                "--port=8080",
                "--",
                "nginx",
                "-g",
                "daemon off;",
            ],
            "deployment",
            "web",
            None,
        ),
        (&["create", "service", "nodeport", "web-np", "--tcp=80:8080", "--node-port=30080"], "service", "web-np", None),
        (&["create", "service", "externalname", "ext", "--external-name=db.example.com"], "service", "ext", None),
        (&["create", "configmap", "cfg", "--from-literal=a=1", "--from-literal=b=two words"], "configmap", "cfg", None),
        (
            &["create", "secret", "generic", "s1", "--from-literal=password=hunter2", "--type=Opaque"],
            "secret",
            "s1",
            None,
        ),
        (
            &[
                "create",
                "secret",
                "docker-registry",
                "reg",
                "--docker-server=r.example.com",
                "--docker-username=u",
                "--docker-password=p",
            ],
            "secret",
            "reg",
            None,
        ),
        (&["create", "serviceaccount", "robot", "-n", "team-a"], "serviceaccount", "robot", Some("team-a")),
        (&["create", "job", "once", "--image=busybox:1.36", "--", "echo", "hi"], "job", "once", None),
        (
            &[
                "create",
                "cronjob",
                "nightly",
                "--image=busybox:1.36",
                "--schedule=0 3 * * *",
                "--restart=OnFailure",
                "--",
                "date",
            ],
            "cronjob",
            "nightly",
            None,
        ),
        (
            &["create", "role", "reader", "--verb=get,list,watch", "--resource=pods,configmaps", "--resource-name=cfg"],
            "role",
            "reader",
            None,
        ),
        (
            &[
                "create",
                "rolebinding",
                "reader",
                "--role=reader",
                "--serviceaccount=team-a:robot",
                "--user=alice",
                "--group=devs",
            ],
            "rolebinding",
            "reader",
            None,
        ),
        (
            &["create", "clusterrole", "node-reader", "--verb=get", "--resource=nodes", "--non-resource-url=/healthz"],
            "clusterrole",
            "node-reader",
            None,
        ),
        (
            &["create", "clusterrolebinding", "node-reader", "--clusterrole=node-reader", "--user=bob"],
            "clusterrolebinding",
            "node-reader",
            None,
        ),
        (
            &["create", "quota", "q", "--hard=cpu=2,memory=1Gi,pods=10", "--scopes=NotTerminating"],
            "resourcequota",
            "q",
            None,
        ),
        (
            &[
                "create",
                "priorityclass",
                "high",
                "--value=1000",
                "--description=important",
                "--preemption-policy=Never",
            ],
            "priorityclass",
            "high",
            None,
        ),
        (&["create", "poddisruptionbudget", "web", "--selector=app=web", "--min-available=50%"], "pdb", "web", None),
        (
            &[
                "create",
                "ingress",
                "web",
                "--rule=web.example.com/*=web-np:80,tls=web-tls",
                "--class=nginx",
                "--annotation=a=b",
            ],
            "ingress",
            "web",
            None,
        ),
    ];
    for (args, kind, name, ns) in cases {
        creates_whole(&k, args, kind, name, *ns);
    }
    // an explicit zero of a pointer field survives (Deployment replicas)
    let d = creates_whole(
        &k,
        &["create", "deployment", "idle", "--image=nginx:1.27", "--replicas=0"],
        "deployment",
        "idle",
        None,
    );
    assert_eq!(d["spec"]["replicas"], 0);
    // the workloads created from protobuf run as JSON-created ones do
    k.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    k.kubectl_ok(&["wait", "--for=condition=complete", "job/once", "--timeout=60s"]);
}
