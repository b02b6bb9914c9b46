//! Containers' environment from the apiserver, with the real binary, the
//! fake apiserver and the fake CRI: envFrom and key references to
//! ConfigMaps and Secrets (with the InvalidEnvironmentVariableNames event),
//! a missing object that holds its container in CreateContainerConfigError
//! until it is created, service variables that follow the Services, and a
//! standalone node's static pod that names a ConfigMap.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{api_pod, Cluster};
use crate::support::agent::{running_containers, Agent};
use crate::support::containerd::write_manifest;
use crate::support::fake_cri::FakeCri;

/// Waits up to a minute (a held container is retried on the pod worker's
/// 10 s back-off).
fn wait_long(c: &Cluster, what: &str, mut f: impl FnMut(&Cluster) -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    while !f(c) {
        assert!(
            Instant::now() < end,
            "timed out waiting until {what}\n{}",
            c.agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn env_of(c: &Cluster, container: &str) -> Vec<(String, String)> {
    c.cri.container_env(container).unwrap_or_default()
}

fn get<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn waiting(pod: &Value, index: usize) -> &Value {
    &pod["status"]["containerStatuses"][index]["state"]["waiting"]
}

fn kubernetes_service(c: &Cluster) {
    c.api.create_service(
        "default",
        "kubernetes",
        "10.96.0.1",
        json!([{"name": "https", "port": 443, "protocol": "TCP"}]),
    );
}

#[test]
fn env_from_config_maps_and_secrets_with_prefixes_key_refs_and_the_invalid_names_event() {
    let mut c = Cluster::start(&[]);
    c.api.create_config_map(
        "default",
        "settings",
        &[("LOG_LEVEL", "debug"), ("bad key", "x"), ("1st", "y")],
    );
    c.api.create_secret(
        "default",
        "creds",
        &[("user", "admin"), ("pass", "hunter2")],
    );
    let mut pod = api_pod("envy");
    pod["spec"]["containers"][0]["envFrom"] = json!([
        {"configMapRef": {"name": "settings"}},
        {"prefix": "DB_", "secretRef": {"name": "creds"}},
        {"configMapRef": {"name": "absent", "optional": true}}
    ]);
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LOG_LEVEL"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pass"}}},
        {"name": "MAYBE", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": true}}},
        {"name": "DSN", "value": "$(DB_user):$(PASSWORD)@db"}
    ]);
    c.api.create_pod(pod);
    c.wait_running("envy");
    let env = env_of(&c, "app");
    assert_eq!(get(&env, "LOG_LEVEL"), Some("debug"), "{env:?}");
    assert_eq!(get(&env, "DB_user"), Some("admin"), "{env:?}");
    assert_eq!(get(&env, "DB_pass"), Some("hunter2"), "{env:?}");
    assert_eq!(get(&env, "LEVEL"), Some("debug"), "{env:?}");
    assert_eq!(get(&env, "PASSWORD"), Some("hunter2"), "{env:?}");
    assert_eq!(get(&env, "DSN"), Some("admin:hunter2@db"), "{env:?}");
    assert_eq!(get(&env, "MAYBE"), None, "{env:?}");
    assert_eq!(get(&env, "bad key"), None, "{env:?}");
    assert_eq!(get(&env, "1st"), None, "{env:?}");

    let api = &c.api;
    c.agent.wait("an InvalidEnvironmentVariableNames event", || {
        api.events().iter().any(|e| {
            e["reason"] == "InvalidEnvironmentVariableNames"
                && e["type"] == "Warning"
                && e["involvedObject"]["kind"] == "Pod"
                && e["involvedObject"]["name"] == "envy"
                && e["message"]
                    == "Keys [1st, bad key] from the EnvFrom configMap default/settings were skipped since they are considered invalid environment variable names."
        })
    });
}

#[test]
fn a_missing_config_map_holds_its_container_until_it_exists_and_other_pods_run() {
    let mut c = Cluster::start(&[]);
    c.api
        .create_secret("default", "creds", &[("user", "admin")]);
    let mut held = api_pod("held");
    held["spec"]["containers"][0]["name"] = json!("main");
    held["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "later"}}]);
    let mut side = held["spec"]["containers"][0].clone();
    side["name"] = json!("side");
    side["envFrom"] = json!([]);
    side["env"] = json!([
        {"name": "K", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "missing"}}}
    ]);
    held["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(side);
    c.api.create_pod(held);
    c.api.create_pod(api_pod("free"));
    c.wait_running("free");

    wait_long(
        &c,
        "both containers wait in CreateContainerConfigError",
        |_| {
            c.api.pod("default", "held").is_some_and(|p| {
                (0..2).all(|i| waiting(&p, i)["reason"] == "CreateContainerConfigError")
            })
        },
    );
    let pod = c.api.pod("default", "held").unwrap();
    let by_name = |name: &str| {
        let list = pod["status"]["containerStatuses"].as_array().unwrap();
        let i = list.iter().position(|s| s["name"] == name).unwrap();
        waiting(&pod, i)["message"].clone()
    };
    assert_eq!(by_name("main"), "configmap \"later\" not found", "{pod:#}");
    assert_eq!(
        by_name("side"),
        "couldn't find key missing in Secret default/creds",
        "{pod:#}"
    );
    assert!(
        c.cri.container_env("main").is_none() && c.cri.container_env("side").is_none(),
        "no container was created for the held ones"
    );
    let api = &c.api;
    c.agent.wait("a Failed event with the reason", || {
        api.events().iter().any(|e| {
            e["reason"] == "Failed"
                && e["involvedObject"]["name"] == "held"
                && e["message"] == "Error: configmap \"later\" not found"
        })
    });

    // The ConfigMap appears: the held container starts at the pod's next
    // sync; the other still waits for its key.
    c.api
        .create_config_map("default", "later", &[("MODE", "late")]);
    wait_long(&c, "the held container runs", |c| {
        running_containers(&c.cri, "held") == 1
    });
    assert_eq!(get(&env_of(&c, "main"), "MODE"), Some("late"));
    assert_eq!(running_containers(&c.cri, "free"), 1);
    let pod = c.api.pod("default", "held").unwrap();
    assert_eq!(
        pod["status"]["containerStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "side")
            .map(|s| s["state"]["waiting"]["reason"].clone()),
        Some(json!("CreateContainerConfigError")),
        "{pod:#}"
    );
}

#[test]
fn service_variables_follow_the_services_of_the_pods_namespace() {
    let mut c = Cluster::start(&[]);
    kubernetes_service(&c);
    c.api.create_service(
        "default",
        "my-db",
        "10.96.5.5",
        json!([{"port": 5432}, {"name": "metrics", "port": 9187}]),
    );
    c.api
        .create_service("default", "headless", "None", json!([{"port": 80}]));
    c.api
        .create_service("other", "elsewhere", "10.96.7.7", json!([{"port": 80}]));
    c.api.create_pod(api_pod("first"));
    c.wait_running("first");
    let env = env_of(&c, "app");
    for (k, v) in [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
        ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
        ("KUBERNETES_PORT_443_TCP_PORT", "443"),
        ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
        ("MY_DB_SERVICE_HOST", "10.96.5.5"),
        ("MY_DB_SERVICE_PORT", "5432"),
        ("MY_DB_SERVICE_PORT_METRICS", "9187"),
        ("MY_DB_PORT_9187_TCP_ADDR", "10.96.5.5"),
    ] {
        assert_eq!(get(&env, k), Some(v), "{k} in {env:?}");
    }
    assert_eq!(get(&env, "HEADLESS_SERVICE_HOST"), None, "{env:?}");
    assert_eq!(get(&env, "ELSEWHERE_SERVICE_HOST"), None, "{env:?}");

    // A Service added and one removed: the next container sees both
    // changes; a pod without service links only the kubernetes Service.
    c.api
        .create_service("default", "cache", "10.96.9.9", json!([{"port": 6379}]));
    assert!(c.api.delete_service("default", "my-db"));
    // The watch is asynchronous: a pod created now might still see the
    // old set, so wait until the node has the change by creating pods
    // until one sees it (each is a new container).
    let mut n = 0;
    let seen = loop {
        n += 1;
        let name = format!("later-{n}");
        let mut pod = api_pod(&name);
        pod["spec"]["containers"][0]["name"] = json!(name);
        c.api.create_pod(pod);
        let api_name = name.clone();
        wait_long(&c, &format!("{api_name} runs"), |c| {
            running_containers(&c.cri, &api_name) == 1
        });
        let env = env_of(&c, &name);
        if get(&env, "MY_DB_SERVICE_HOST").is_none() || n == 5 {
            break env;
        }
    };
    assert_eq!(
        get(&seen, "CACHE_SERVICE_HOST"),
        Some("10.96.9.9"),
        "{seen:?}"
    );
    assert_eq!(get(&seen, "CACHE_PORT"), Some("tcp://10.96.9.9:6379"));
    assert_eq!(get(&seen, "MY_DB_SERVICE_HOST"), None, "{seen:?}");
    assert_eq!(get(&seen, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));

    let mut pod = api_pod("nolinks");
    pod["spec"]["enableServiceLinks"] = json!(false);
    pod["spec"]["containers"][0]["name"] = json!("nolinks");
    c.api.create_pod(pod);
    wait_long(&c, "nolinks runs", |c| {
        running_containers(&c.cri, "nolinks") == 1
    });
    let env = env_of(&c, "nolinks");
    assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
    assert_eq!(get(&env, "CACHE_SERVICE_HOST"), None, "{env:?}");
    assert_eq!(
        env.iter()
            .filter(|(k, _)| k.starts_with("KUBERNETES_"))
            .count(),
        8
    );
}

#[test]
fn api_pods_wait_for_the_first_list_of_services() {
    // The first LISTs of Services fail (the reflector backs off 1, 2, 4,
    // 8 s): the pod is held with upstream's message, and starts with the
    // variables once a list succeeded.
    let c = Cluster::start(&[]);
    kubernetes_service(&c);
    c.api.fail_next(
        "GET",
        "/api/v1/services",
        500,
        "InternalError",
        "etcd is slow",
        4,
    );
    c.api.create_pod(api_pod("early"));
    wait_long(&c, "the pod waits for the Services", |_| {
        c.api.pod("default", "early").is_some_and(|p| {
            waiting(&p, 0)["message"]
                == "services have not yet been read at least once, cannot construct envvars"
        })
    });
    assert_eq!(c.cri.count("CreateContainer"), 0);
    wait_long(&c, "the pod runs", |c| {
        running_containers(&c.cri, "early") == 1
    });
    let env = env_of(&c, "app");
    assert_eq!(
        get(&env, "KUBERNETES_SERVICE_HOST"),
        Some("10.96.0.1"),
        "{env:?}"
    );
}

#[test]
fn a_standalone_static_pod_naming_a_config_map_waits_with_upstreams_reason() {
    // No apiserver: nothing to read the ConfigMap from, so the container
    // is never created and the log says why; a pod beside it runs, with
    // no service variables.
    let cri = FakeCri::start();
    let mut agent = Agent::start(&cri.endpoint(), &[]);
    let pod = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: {name}\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, \"1000\"]\n{extra}"
        )
    };
    write_manifest(
        &agent.manifests(),
        "needs.yaml",
        &pod(
            "needs",
            "    envFrom:\n    - configMapRef: {name: settings}\n",
        ),
    );
    write_manifest(&agent.manifests(), "plain.yaml", &pod("plain", ""));
    agent.wait("plain runs", || {
        running_containers(&cri, "plain-edge-1") == 1
    });
    let path = agent.log_path();
    agent.wait("the log names the reason", || {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .contains("couldn't get configMap default/settings, no kubeClient defined")
    });
    assert!(cri.container_env("needs").is_none(), "needs was created");
    let env = cri.container_env("plain").unwrap();
    assert!(
        !env.iter().any(|(k, _)| k.starts_with("KUBERNETES_")),
        "{env:?}"
    );
}
