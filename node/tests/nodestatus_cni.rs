//! The conflist skerry writes, run by the real plugins (Debian's containernetworking-plugins
//! in `/usr/lib/cni`) the way the runtime runs a `.conflist` (libcni's `AddNetworkList`:
//! each plugin in order, the previous result passed on as `prevResult`, the `portMappings`
//! capability as `runtimeConfig`; `DEL` in reverse order), in a network namespace made for
//! the test: the pod gets an address of the podCIDR with the gateway as its default route,
//! its hostPort is mapped, `loopback` brings `lo` up as the runtime runs it, and `DEL`
//! gives the address back to host-local and removes the mapping.
//!
//! Needs root, `ip` and the plugins. Without them the test says so and passes; under
//! `CI=true` (`.ci/run` installs the plugins and runs as root) it fails instead.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use skerry_node::cni::{self, CniConfig, PodRange};

/// The pod range of the test: TEST-NET-2's neighbour in the benchmarking block
/// (198.18.0.0/15, RFC 2544), on no real network.
const POD_CIDR: &str = "198.18.7.0/24";
/// A hostPort unlikely to be in use.
const HOST_PORT: u16 = 31_877;

/// Whether this run may skip for a missing prerequisite (not under `CI=true`).
fn may_skip(why: &str) -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "{why}; CI=true, so this test fails instead of skipping"
    );
    eprintln!("{why}: skipped (under CI=true this fails)");
    true
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs one plugin with `command` on `netns`/`ifname` and its network configuration `conf`;
/// returns the result it printed (`null` for DEL).
fn plugin(
    plugin_dir: &Path,
    command: &str,
    container: &str,
    netns: &Path,
    ifname: &str,
    conf: &Value,
) -> Value {
    let kind = conf["type"].as_str().unwrap();
    let mut child = Command::new(plugin_dir.join(kind))
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", plugin_dir)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(conf).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{kind} {command} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// The configuration libcni hands one plugin of a list.
fn plugin_conf(list: &Value, plugin: &Value, prev: Option<&Value>, runtime: &Value) -> Value {
    let mut conf = plugin.clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    if let Some(prev) = prev {
        conf["prevResult"] = prev.clone();
    }
    if let Some(caps) = plugin["capabilities"].as_object() {
        let mut rc = serde_json::Map::new();
        for (cap, on) in caps {
            if on == true && runtime.get(cap).is_some() {
                rc.insert(cap.clone(), runtime[cap].clone());
            }
        }
        if !rc.is_empty() {
            conf["runtimeConfig"] = Value::Object(rc);
        }
    }
    conf
}

/// Removes the namespace and the bridge whatever happens.
struct Cleanup {
    netns: String,
    bridge: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}

#[test]
fn the_written_conflist_gives_a_pod_an_address_of_the_pod_cidr() {
    let plugin_dir = PathBuf::from(cni::PLUGIN_DIR_DEFAULT);
    let missing = cni::missing_plugins(&plugin_dir);
    if !missing.is_empty()
        && may_skip(&format!(
            "CNI plugins {missing:?} not in {} (apt-get install {})",
            plugin_dir.display(),
            cni::PLUGINS_PACKAGE
        ))
    {
        return;
    }
    if !rustix::process::geteuid().is_root() && may_skip("not root") {
        return;
    }
    if Command::new("ip").arg("-V").output().is_err() && may_skip("ip not installed (iproute2)") {
        return;
    }

    let pid = std::process::id();
    let guard = Cleanup {
        netns: format!("skerry-cni-{pid}"),
        // At most 15 bytes (IFNAMSIZ - 1).
        bridge: format!("skt{}", pid % 1_000_000),
    };
    let root = tempfile::tempdir().unwrap();
    let config = CniConfig {
        bridge: guard.bridge.clone(),
        ..CniConfig::under(root.path())
    };
    let path = cni::write(&config, &[POD_CIDR.to_string()]).unwrap();
    let list: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();

    run(Command::new("ip").args(["netns", "add", &guard.netns]));
    let netns = PathBuf::from("/var/run/netns").join(&guard.netns);
    let container = format!("skerry-test-{pid}");
    let runtime = json!({"portMappings": [
        {"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"}
    ]});

    // ADD: lo as the runtime brings it up, then the list in order.
    plugin(
        &plugin_dir,
        "ADD",
        &container,
        &netns,
        "lo",
        &json!({"cniVersion": cni::CNI_VERSION, "name": "cni-loopback", "type": "loopback"}),
    );
    let mut result: Option<Value> = None;
    for p in list["plugins"].as_array().unwrap() {
        let conf = plugin_conf(&list, p, result.as_ref(), &runtime);
        result = Some(plugin(
            &plugin_dir,
            "ADD",
            &container,
            &netns,
            "eth0",
            &conf,
        ));
    }
    let result = result.unwrap();

    let range = PodRange::parse(POD_CIDR).unwrap();
    let address = result["ips"][0]["address"].as_str().unwrap();
    let ip: IpAddr = address.split_once('/').unwrap().0.parse().unwrap();
    assert!(range.contains(ip), "{ip} is not in {POD_CIDR}");
    assert_ne!(ip, range.gateway(), "the gateway is the bridge's");
    assert_eq!(
        result["ips"][0]["gateway"].as_str(),
        Some(range.gateway().to_string().as_str())
    );

    let ns = |args: &[&str]| {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &guard.netns, "ip"]).args(args);
        run(&mut cmd)
    };
    assert!(ns(&["-o", "-4", "addr", "show", "dev", "eth0"]).contains(address));
    assert!(
        ns(&["route"]).contains(&format!("default via {}", range.gateway())),
        "the pod routes through the gateway"
    );
    assert!(
        ns(&["-o", "link", "show", "lo"]).contains(",UP"),
        "lo is up"
    );
    let bridge = run(Command::new("ip").args(["-o", "-4", "addr", "show", "dev", &guard.bridge]));
    assert!(
        bridge.contains(&format!("{}/24", range.gateway())),
        "the bridge holds the gateway: {bridge}"
    );
    // host-local's reservation, in skerry's data dir.
    let reservation = config
        .ipam_data_dir
        .join(cni::NETWORK_NAME)
        .join(ip.to_string());
    assert!(reservation.exists(), "{} missing", reservation.display());
    let nat = run(Command::new("iptables").args(["-t", "nat", "-S"]));
    assert!(
        nat.contains(&format!("--dport {HOST_PORT}")),
        "portmap mapped the hostPort"
    );

    // DEL in reverse order, with the ADD's result, as libcni does.
    for p in list["plugins"].as_array().unwrap().iter().rev() {
        let conf = plugin_conf(&list, p, Some(&result), &runtime);
        plugin(&plugin_dir, "DEL", &container, &netns, "eth0", &conf);
    }
    assert!(!reservation.exists(), "the address went back to host-local");
    let nat = run(Command::new("iptables").args(["-t", "nat", "-S"]));
    assert!(
        !nat.contains(&format!("--dport {HOST_PORT}")),
        "the hostPort mapping is gone"
    );
    drop(guard);
}
