//! `tinylet status` on real containerd with no node server: the runtime
//! source lists a running static pod with its phase, ready count, IP and
//! source, and `-o wide` its container.

use std::process::Command;

use crate::e2e::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    tinylet_bin, wait_until, write_manifest, PrivateContainerd, Tinylet,
};

fn status(ctd: &PrivateContainerd, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(tinylet_bin())
        .arg("status")
        .args(["--container-runtime-endpoint", &ctd.endpoint()])
        .args(extra)
        .output()
        .expect("run tinylet status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn e2e_status_from_the_runtime_lists_a_running_static_pod() {
    let ctd = PrivateContainerd::start();
    let tl = Tinylet::start(&ctd, NODE);
    write_manifest(
        &tl.manifest_dir(),
        "web.yaml",
        &yaml_pod("web", LONG_RUNNING, ""),
    );
    wait_until(SETTLE, "web-edge-1 runs", || {
        ctd.pod_running("web-edge-1", &["app"])
    });
    let (code, out, err) = status(&ctd, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("from the container runtime, {}", ctd.endpoint())),
        "{err}"
    );
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.contains("web-edge-1"))
        .unwrap_or_else(|| panic!("no row for web-edge-1:\n{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(row.len(), 8, "{out}");
    assert_eq!(
        [row[0], row[1], row[2], row[3], row[4], row[7]],
        ["default", "web-edge-1", "Running", "1/1", "0", "file"],
        "{out}"
    );
    assert!(
        row[5].ends_with('s') || row[5].ends_with('m'),
        "age {}",
        row[5]
    );
    assert!(row[6].starts_with(&ctd.pod_ip_prefix()), "IP {}", row[6]);

    let (code, out, _) = status(&ctd, &["-o", "wide"]);
    assert_eq!(code, 0);
    let app: Vec<&str> = out
        .lines()
        .find(|l| l.trim_start().starts_with("app "))
        .unwrap_or_else(|| panic!("no row for container app:\n{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(&app[..4], ["app", "Running", "1/1", "0"], "{out}");

    let (code, out, _) = status(&ctd, &["-o", "json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&out).expect("-o json is JSON");
    let pod = list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|p| p["metadata"]["name"] == "web-edge-1"))
        .unwrap_or_else(|| panic!("web-edge-1 in {out}"));
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["metadata"]["namespace"], "default");
}
