//! The node's container runtime against the real containerd and runc: skerry's supervisor
//! starts containerd in a temp dir, skerry's builder makes the pause and busybox images,
//! skerry's importer puts them in containerd, and pods run through skerry's CRI client.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{BUSYBOX_IMAGE, TestRuntime, missing_prerequisite};
use skerry_node::containerd::api::proto;
use skerry_node::cri::api;
use skerry_node::images::{self, build};

fn sandbox_config(rt: &TestRuntime, name: &str) -> api::PodSandboxConfig {
    let log_dir = rt
        .data_dir()
        .join("pods")
        .join(format!("default_{name}_uid-{name}"));
    std::fs::create_dir_all(&log_dir).expect("log dir");
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            uid: format!("uid-{name}"),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        log_directory: log_dir.display().to_string(),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        annotations: HashMap::from([("skerry.test/annotation".to_string(), "kept".to_string())]),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: rt.cgroup_parent.clone(),
            security_context: Some(api::LinuxSandboxSecurityContext {
                // The host's network: no CNI needed yet.
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str, command: &[&str]) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(skerry_node::cri::image_spec(image)),
        command: command.iter().map(|s| s.to_string()).collect(),
        envs: vec![api::KeyValue {
            key: "GREETING".into(),
            value: "hello".into(),
        }],
        log_path: format!("{name}/0.log"),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(api::LinuxContainerResources {
                memory_limit_in_bytes: 64 * 1024 * 1024,
                cpu_shares: 256,
                ..Default::default()
            }),
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// Waits for `path` to hold a line for which `want` holds; returns the file.
async fn wait_for_log(path: &Path, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(&want) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "log {} never matched; it holds:\n{text}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A CRI log line: `2016-10-06T00:17:09.669794202Z stdout F message`.
fn is_cri_line(line: &str, stream: &str, message: &str) -> bool {
    let mut parts = line.splitn(4, ' ');
    let (Some(time), Some(s), Some(tag), Some(msg)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    time.len() >= 20
        && time.as_bytes()[4] == b'-'
        && time.as_bytes()[10] == b'T'
        && time.ends_with('Z')
        && s == stream
        && tag == "F"
        && msg == message
}

/// Runs a sandbox with one container from `image` and checks it works end to end.
async fn run_pod(rt: &TestRuntime, name: &str, image: &str) -> Duration {
    let cri = &rt.cri;
    let sandbox = sandbox_config(rt, name);
    let started = Instant::now();
    let sandbox_id = cri
        .run_pod_sandbox(sandbox.clone(), "")
        .await
        .expect("RunPodSandbox");
    let container_id = cri
        .create_container(
            &sandbox_id,
            container_config(
                "app",
                image,
                &[
                    "sh",
                    "-c",
                    "echo \"$GREETING from busybox\"; echo to-stderr >&2; exec sleep 1000",
                ],
            ),
            sandbox.clone(),
        )
        .await
        .expect("CreateContainer");
    cri.start_container(&container_id)
        .await
        .expect("StartContainer");
    let to_started = started.elapsed();

    let status = cri
        .pod_sandbox_status(&sandbox_id, false)
        .await
        .expect("PodSandboxStatus")
        .status
        .expect("status");
    assert_eq!(status.state, api::PodSandboxState::SandboxReady as i32);
    assert_eq!(
        status
            .annotations
            .get("skerry.test/annotation")
            .map(String::as_str),
        Some("kept")
    );
    let container = cri
        .container_status(&container_id, false)
        .await
        .expect("ContainerStatus")
        .status
        .expect("status");
    assert_eq!(
        container.state,
        api::ContainerState::ContainerRunning as i32,
        "{container:?}"
    );

    // The CRI-format log file under the sandbox's log directory.
    let log = Path::new(&sandbox.log_directory).join("app/0.log");
    assert_eq!(container.log_path, log.display().to_string());
    let text = wait_for_log(&log, |l| is_cri_line(l, "stdout", "hello from busybox")).await;
    wait_for_log(&log, |l| is_cri_line(l, "stderr", "to-stderr")).await;
    assert!(text.lines().count() >= 1, "{text}");

    // ExecSync: stdout, stderr and the exit code.
    let exec = cri
        .exec_sync(
            &container_id,
            vec![
                "sh".into(),
                "-c".into(),
                "echo out; echo err >&2; exit 3".into(),
            ],
            Duration::from_secs(10),
        )
        .await
        .expect("ExecSync");
    assert_eq!(exec.stdout, b"out\n");
    assert_eq!(exec.stderr, b"err\n");
    assert_eq!(exec.exit_code, 3);

    // Stop and remove everything.
    cri.stop_container(&container_id, Duration::from_secs(2))
        .await
        .expect("StopContainer");
    let stopped = cri
        .container_status(&container_id, false)
        .await
        .expect("ContainerStatus")
        .status
        .expect("status");
    assert_eq!(stopped.state, api::ContainerState::ContainerExited as i32);
    cri.remove_container(&container_id)
        .await
        .expect("RemoveContainer");
    let err = cri
        .container_status(&container_id, false)
        .await
        .expect_err("removed");
    assert!(err.is_not_found(), "{err}");
    cri.stop_pod_sandbox(&sandbox_id)
        .await
        .expect("StopPodSandbox");
    cri.remove_pod_sandbox(&sandbox_id)
        .await
        .expect("RemovePodSandbox");
    let left = cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            id: sandbox_id.clone(),
            ..Default::default()
        }))
        .await
        .expect("ListPodSandbox");
    assert!(left.is_empty(), "{left:?}");
    to_started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_from_images_built_and_imported_by_skerry() {
    if missing_prerequisite().is_some() {
        return;
    }
    let rt = TestRuntime::start().await;
    let version = rt.cri.version().await.expect("Version");
    assert_eq!(version.runtime_name, "containerd");

    let started = Instant::now();
    let pause = rt.import_pause().await;
    let pause_took = started.elapsed();
    assert_eq!(pause.images[0].0, build::PAUSE_IMAGE);
    let started = Instant::now();
    let busybox = images::import_file(&rt.api, &rt.busybox_archive())
        .await
        .expect("busybox imports");
    let busybox_took = started.elapsed();
    assert_eq!(busybox.images[0].0, BUSYBOX_IMAGE);

    // The CRI plugin learnt of both through containerd's image events.
    for image in [build::PAUSE_IMAGE, BUSYBOX_IMAGE] {
        let mut status = None;
        for _ in 0..100 {
            status = rt.cri.image_status(image).await.expect("ImageStatus");
            if status.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let status = status.unwrap_or_else(|| panic!("CRI does not list {image}"));
        assert!(status.repo_tags.contains(&image.to_string()), "{status:?}");
        assert!(status.size > 0);
    }
    let listed = rt.cri.list_images(None).await.expect("ListImages");
    assert!(
        listed
            .iter()
            .any(|i| i.repo_tags.contains(&BUSYBOX_IMAGE.to_string()))
    );

    // Importing again writes nothing new.
    let again = images::import_file(&rt.api, &rt.busybox_archive())
        .await
        .expect("reimport");
    assert_eq!(again.blobs_written, 0, "{again:?}");

    let to_started = run_pod(&rt, "busybox", BUSYBOX_IMAGE).await;
    eprintln!(
        "measured: pause image import {pause_took:?} ({} bytes), busybox import {busybox_took:?} \
         ({} bytes), RunPodSandbox to started container {to_started:?}",
        pause.bytes_written, busybox.bytes_written
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_archive_is_converted_with_exact_digests_and_runs() {
    if missing_prerequisite().is_some() {
        return;
    }
    let Some(skopeo) = skerry_node::containerd::find_on_path("skopeo") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "skopeo is needed (Debian: skopeo)"
        );
        eprintln!("skipping: skopeo is not installed");
        return;
    };
    let rt = TestRuntime::start().await;
    rt.import_pause().await;
    let oci = rt.busybox_archive();
    let docker = rt.data_dir().join("busybox-docker.tar");
    let name = "skerry.test/busybox-docker:2";
    let out = std::process::Command::new(skopeo)
        .arg("--insecure-policy")
        .arg("copy")
        .arg(format!("oci-archive:{}", oci.display()))
        .arg(format!("docker-archive:{}:{name}", docker.display()))
        .output()
        .expect("skopeo runs");
    assert!(
        out.status.success(),
        "skopeo: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let report = images::import_file(&rt.api, &docker)
        .await
        .expect("docker archive imports");
    assert_eq!(report.images.len(), 1);
    assert_eq!(report.images[0].0, name);
    // The image id (the config's digest) is the one the OCI layout had: the config's bytes
    // went through unchanged.
    let oci_archive = images::archive::read(&oci).expect("oci");
    let docker_archive = images::archive::read(&docker).expect("docker");
    let config_of = |a: &images::archive::ImageArchive| {
        a.blobs
            .iter()
            .find(|b| b.gc_labels.is_empty() && b.size < 4096)
            .map(|b| b.digest.clone())
    };
    let status = rt
        .cri
        .image_status(name)
        .await
        .expect("ImageStatus")
        .expect("listed");
    assert_eq!(
        Some(status.id.clone()),
        config_of(&docker_archive),
        "{status:?}"
    );
    assert!(config_of(&oci_archive).is_some());

    run_pod(&rt, "docker", name).await;
    rt.shutdown().await;
}

/// Rewrites the tar at `from` into `to`, flipping one byte of the largest blob.
fn corrupt_largest_blob(from: &Path, to: &Path) {
    let mut archive = tar::Archive::new(std::fs::File::open(from).expect("open"));
    let mut entries: Vec<(tar::Header, Vec<u8>)> = Vec::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).expect("read");
        entries.push((entry.header().clone(), data));
    }
    let largest = entries
        .iter()
        .enumerate()
        .max_by_key(|(_, (_, d))| d.len())
        .map(|(i, _)| i)
        .expect("entries");
    let mid = entries[largest].1.len() / 2;
    entries[largest].1[mid] ^= 0xff;
    let mut out = tar::Builder::new(std::fs::File::create(to).expect("create"));
    for (mut header, data) in entries {
        let path = header.path().expect("path").into_owned();
        out.append_data(&mut header, path, data.as_slice())
            .expect("append");
    }
    out.finish().expect("finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_archives_are_refused_clearly_and_leave_nothing() {
    if missing_prerequisite().is_some() {
        return;
    }
    let rt = TestRuntime::start().await;
    let good = rt.busybox_archive();
    let good_archive = images::archive::read(&good).expect("good archive");

    // A flipped byte in the layer.
    let corrupt = rt.data_dir().join("corrupt.tar");
    corrupt_largest_blob(&good, &corrupt);
    let err = images::import_file(&rt.api, &corrupt)
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("not a valid image archive"),
        "{err}"
    );
    assert!(err.to_string().contains("has the digest"), "{err}");

    // Cut in half.
    let bytes = std::fs::read(&good).expect("read");
    let truncated = rt.data_dir().join("truncated.tar");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let err = images::import_file(&rt.api, &truncated)
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("not a valid image archive"),
        "{err}"
    );

    // Not a tarball at all.
    let garbage = rt.data_dir().join("garbage.tar");
    std::fs::write(&garbage, b"this is not an image").expect("write");
    let err = images::import_file(&rt.api, &garbage)
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("not a valid image archive"),
        "{err}"
    );

    // Nothing named, nothing stored.
    let mut imgs = rt.api.images.clone();
    let get = proto::images::GetImageRequest {
        name: BUSYBOX_IMAGE.to_string(),
    };
    let status = imgs
        .get(rt.api.request(get, None))
        .await
        .expect_err("no image");
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert!(
        rt.cri
            .image_status(BUSYBOX_IMAGE)
            .await
            .expect("ImageStatus")
            .is_none()
    );
    for blob in &good_archive.blobs {
        let mut content = rt.api.content.clone();
        let info = proto::content::InfoRequest {
            digest: blob.digest.clone(),
        };
        let status = content
            .info(rt.api.request(info, None))
            .await
            .expect_err("no blob");
        assert_eq!(status.code(), tonic::Code::NotFound, "{}", blob.digest);
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_containerd_is_restarted_and_answers_again() {
    if missing_prerequisite().is_some() {
        return;
    }
    let rt = TestRuntime::start().await;
    let containerd = rt.containerd.as_ref().expect("running");
    let pid = containerd.pid();
    assert_ne!(pid, 0);
    let killed = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill");
    let deadline = Instant::now() + Duration::from_secs(30);
    while containerd.restarts() == 0 {
        assert!(Instant::now() < deadline, "containerd was not restarted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new_pid = containerd.pid();
    assert_ne!(new_pid, pid);
    assert_ne!(new_pid, 0);
    rt.cri
        .version()
        .await
        .expect("the restarted containerd answers");
    eprintln!(
        "measured: SIGKILL to answering again {:?}",
        killed.elapsed()
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_images_folder_imports_a_file_once_it_is_complete() {
    if missing_prerequisite().is_some() {
        return;
    }
    let rt = TestRuntime::start().await;
    let folder = rt
        .containerd
        .as_ref()
        .expect("running")
        .layout()
        .images_dir
        .clone();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (events, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = tokio::spawn(images::watch::watch_folder(
        rt.api.clone(),
        folder.clone(),
        stop_rx,
        Some(events),
    ));
    // Written in two halves, a second apart: the half-written file is not imported.
    let bytes = std::fs::read(rt.busybox_archive()).expect("read");
    let target = folder.join("busybox.tar");
    std::fs::write(&target, &bytes[..bytes.len() / 2]).expect("first half");
    tokio::time::sleep(Duration::from_secs(1)).await;
    {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&target)
            .expect("open");
        file.write_all(&bytes[bytes.len() / 2..])
            .expect("second half");
    }
    let event = tokio::time::timeout(Duration::from_secs(30), events_rx.recv())
        .await
        .expect("imported within 30 s")
        .expect("an event");
    assert_eq!(event.path, target);
    let report = event.result.expect("the complete file imports");
    assert_eq!(report.images[0].0, BUSYBOX_IMAGE);
    // containerd's CRI image store follows its image service through events, so a loaded
    // machine may answer ImageStatus a moment after the import returned.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while rt
        .cri
        .image_status(BUSYBOX_IMAGE)
        .await
        .expect("ImageStatus")
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{BUSYBOX_IMAGE} not seen by CRI 5 s after its import"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Not imported a second time.
    let again = tokio::time::timeout(
        images::watch::POLL_INTERVAL * 2 + images::watch::SETTLE,
        events_rx.recv(),
    )
    .await;
    assert!(again.is_err(), "imported twice: {again:?}");
    let _ = stop.send(true);
    watcher.await.expect("watcher");
    rt.shutdown().await;
}
