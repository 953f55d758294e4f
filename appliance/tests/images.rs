//! `skerry images import` against a containerd started by skerry's supervisor in a temp dir:
//! the real binary, the real containerd.

use std::path::Path;
use std::process::Command;

use skerry_node::containerd::{Containerd, ContainerdConfig, find_on_path};
use skerry_node::images::build;

/// Root and containerd, runc, busybox-static; a failure under `CI=true`, a skip otherwise.
fn missing_prerequisite() -> bool {
    let ok = rustix::process::geteuid().is_root()
        && ["containerd", "containerd-shim-runc-v2", "runc"]
            .iter()
            .all(|b| find_on_path(b).is_some())
        && Path::new(build::BUSYBOX).exists();
    if !ok {
        let why = "images tests need root, containerd, runc and busybox-static";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("skipping: {why}");
    }
    !ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skerry_images_import_imports_and_refuses_bad_files() {
    if missing_prerequisite() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("ski")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let containerd = Containerd::start(ContainerdConfig {
        data_dir: dir.path().to_path_buf(),
        sandbox_image: build::PAUSE_IMAGE.to_string(),
        binary: None,
    })
    .await
    .expect("containerd starts");

    let archive = dir.path().join("busybox.tar");
    build::busybox_image(Path::new(build::BUSYBOX), "skerry.test/cli-busybox:1")
        .expect("image")
        .write_oci_archive(&archive)
        .expect("write");
    let garbage = dir.path().join("garbage.tar");
    std::fs::write(&garbage, b"not an image").expect("write");

    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["images", "import", "--data-dir"])
        .arg(dir.path())
        .arg(&archive)
        .output()
        .expect("skerry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("skerry.test/cli-busybox:1 sha256:"),
        "{stdout}"
    );
    // The CRI plugin learns of it from containerd's image event, asynchronously.
    let mut listed = false;
    for _ in 0..100 {
        let status = containerd
            .cri()
            .image_status("skerry.test/cli-busybox:1")
            .await
            .expect("ImageStatus");
        if status.is_some() {
            listed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(listed, "CRI lists the imported image");

    let out = Command::new(env!("CARGO_BIN_EXE_skerry"))
        .args(["images", "import", "--container-runtime-endpoint"])
        .arg(containerd.endpoint())
        .arg(&garbage)
        .output()
        .expect("skerry runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a valid image archive"), "{stderr}");
    assert!(stderr.contains("1 of 1 files not imported"), "{stderr}");

    containerd.stop().await;
}
