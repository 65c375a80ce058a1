//! Where bundles come from: `gpu-operator driver import` from the copy of a
//! precompiled driver image, and `driver fetch` of a tarball from a file or
//! a loopback HTTP server, the real binary against temporary host roots;
//! then `driver check` on what they put in the store. Also the library's
//! `ensure_fetched`, as the agent will call it.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use gpu_operator::driver::bundle::SIGNATURE_TRAILER;
use gpu_operator::driver::source::{
    self, FetchOptions, Placement, SOURCE_MARKER, SourceKind, TarballSource,
};
use gpu_operator::host::HostRoot;
use support::bundles::{self, STORE};

const KERNEL: &str = "6.8.0-49-generic";
const VERSION: &str = "6.12.12";
const TAG: &str = "ubuntu-22.04-6.8.0-49-generic-6.12.12";
const STAGING: &str = "/staging";

/// A temporary directory standing for a host's `/`.
struct Root {
    dir: tempfile::TempDir,
    host: HostRoot,
}

impl Root {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        Self { dir, host }
    }

    /// `gpu-operator driver ARGS --host-root <root>`: exit code, stdout, stderr.
    fn driver(&self, args: &[&str]) -> (i32, String, String) {
        bundles::run_driver(self.dir.path(), args)
    }

    /// As [`Root::driver`] with `-o json`, stdout parsed.
    fn driver_json(&self, args: &[&str]) -> (i32, serde_json::Value, String) {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let (code, stdout, stderr) = self.driver(&all);
        let json = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
        (code, json, stderr)
    }

    /// `driver check --kernel <kernel>`: exit code and its JSON.
    fn check(&self, kernel: &str) -> (i32, serde_json::Value) {
        let (code, json, stderr) = self.driver_json(&["check", "--kernel", kernel]);
        assert!(json.is_object(), "check printed no JSON: {stderr}");
        (code, json)
    }

    /// The names in the store; none for a store that does not exist.
    fn store_names(&self) -> Vec<String> {
        self.host.list_dir_or_empty(STORE).unwrap()
    }

    fn bundle_dir(&self) -> String {
        format!("{STORE}/{VERSION}-{KERNEL}")
    }

    /// Every file under the bundle, relative to it.
    fn bundle_files(&self) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, base, out);
                } else {
                    out.push(path.strip_prefix(base).unwrap().display().to_string());
                }
            }
        }
        let base = self.host.path(self.bundle_dir());
        let mut out = Vec::new();
        walk(&base, &base, &mut out);
        out.sort();
        out
    }
}

fn module(name: &str) -> Vec<u8> {
    let mut bytes = format!("\x7fELF {name}").into_bytes();
    bytes.extend_from_slice(SIGNATURE_TRAILER);
    bytes
}

/// What an init container leaves in `STAGING` from a driver image for
/// `KERNEL`: amdgpu and amdttm under updates/dkms, the kernel's own tree
/// under `kernel/` (here through a link inside the copy, as dev images
/// have it) with two drm helpers amdgpu needs and a network driver it does
/// not, depmod's index files, and firmware.
fn write_image_copy(host: &HostRoot) {
    let modules = format!("{STAGING}/opt/lib/modules/{KERNEL}");
    for name in ["amdgpu", "amdttm"] {
        host.write(format!("{modules}/updates/dkms/{name}.ko"), module(name))
            .unwrap();
    }
    let tree = format!("{STAGING}/opt/lib/modules/{KERNEL}-tree");
    for path in [
        "drivers/gpu/drm/display/drm_display_helper.ko",
        "drivers/gpu/drm/drm_kms_helper.ko",
        "drivers/net/ethernet/intel/e1000e/e1000e.ko",
    ] {
        host.write(format!("{tree}/{path}"), module(path)).unwrap();
    }
    host.symlink(&tree, format!("{modules}/kernel")).unwrap();
    host.write(
        format!("{modules}/modules.dep"),
        "updates/dkms/amdgpu.ko: updates/dkms/amdttm.ko kernel/drivers/gpu/drm/display/drm_display_helper.ko\n\
         updates/dkms/amdttm.ko:\n\
         kernel/drivers/gpu/drm/display/drm_display_helper.ko: kernel/drivers/gpu/drm/drm_kms_helper.ko\n\
         kernel/drivers/gpu/drm/drm_kms_helper.ko:\n\
         kernel/drivers/net/ethernet/intel/e1000e/e1000e.ko:\n",
    )
    .unwrap();
    host.write(
        format!("{modules}/modules.dep.bin"),
        [0x57u8, 0xe1, 0xda, 0x1e],
    )
    .unwrap();
    host.write(
        format!("{modules}/modules.alias"),
        "alias pci:v00001002d* amdgpu\n",
    )
    .unwrap();
    let firmware = format!("{STAGING}/firmwareDir/updates/amdgpu");
    host.write(format!("{firmware}/psp_13_0_6_sos.bin"), "sos")
        .unwrap();
    host.write(format!("{firmware}/gc_9_4_3_mec.bin"), "mec")
        .unwrap();
    // linux-firmware links one name to another.
    host.symlink(
        format!("{firmware}/gc_9_4_3_mec.bin"),
        format!("{firmware}/gc_9_4_4_mec.bin"),
    )
    .unwrap();
}

fn import_args() -> Vec<&'static str> {
    vec![
        "import",
        "--from",
        STAGING,
        "--image-tag",
        TAG,
        "--bundle-dir",
        STORE,
    ]
}

#[test]
fn import_keeps_amdgpu_its_dependencies_index_files_and_firmware_and_check_passes() {
    let root = Root::new();
    write_image_copy(&root.host);
    let (code, stdout, stderr) = root.driver(&import_args());
    assert_eq!(code, 0, "{stdout} {stderr}");
    assert!(
        stdout.contains(&format!("imported {}", root.bundle_dir())),
        "{stdout}"
    );

    let m = format!("lib/modules/{KERNEL}");
    let mut expected = vec![
        format!("{m}/kernel/drivers/gpu/drm/display/drm_display_helper.ko"),
        format!("{m}/kernel/drivers/gpu/drm/drm_kms_helper.ko"),
        format!("{m}/modules.alias"),
        format!("{m}/modules.dep"),
        format!("{m}/modules.dep.bin"),
        format!("{m}/updates/dkms/amdgpu.ko"),
        format!("{m}/updates/dkms/amdttm.ko"),
        "firmware/amdgpu/gc_9_4_3_mec.bin".to_owned(),
        "firmware/amdgpu/gc_9_4_4_mec.bin".to_owned(),
        "firmware/amdgpu/psp_13_0_6_sos.bin".to_owned(),
        "manifest.json".to_owned(),
        SOURCE_MARKER.to_owned(),
    ];
    expected.sort();
    assert_eq!(root.bundle_files(), expected, "e1000e must not be copied");
    // The linked firmware name is a file of its own in the bundle.
    let linked = root.host.path(format!(
        "{}/firmware/amdgpu/gc_9_4_4_mec.bin",
        root.bundle_dir()
    ));
    assert!(
        !std::fs::symlink_metadata(&linked)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&linked).unwrap(), b"mec");
    let marker = source::read_marker(&root.host, &root.bundle_dir()).unwrap();
    assert_eq!(
        (marker.kind, marker.source.as_str()),
        (SourceKind::DriverImage, TAG)
    );
    assert_eq!(
        root.store_names(),
        [format!("{VERSION}-{KERNEL}")],
        "no work directory left"
    );

    let (code, json) = root.check(KERNEL);
    assert_eq!(code, 0, "{json:#}");
    assert_eq!(json["bundles"][0]["verified"]["version"], VERSION);
    assert_eq!(
        json["bundles"][0]["verified"]["module"],
        format!("{m}/updates/dkms/amdgpu.ko")
    );
}

#[test]
fn importing_again_is_a_no_op_and_a_different_bundle_needs_replace() {
    let root = Root::new();
    write_image_copy(&root.host);
    let (code, _, stderr) = root.driver(&import_args());
    assert_eq!(code, 0, "{stderr}");
    let manifest = root
        .host
        .path(format!("{}/manifest.json", root.bundle_dir()));
    let written = std::fs::metadata(&manifest).unwrap().modified().unwrap();

    let (code, json, stderr) = root.driver_json(&import_args());
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["placement"], "AlreadyPresent", "{json:#}");
    assert_eq!(
        std::fs::metadata(&manifest).unwrap().modified().unwrap(),
        written
    );
    assert_eq!(root.store_names().len(), 1);

    // A new firmware file: another bundle under the same name.
    root.host
        .write(
            format!("{STAGING}/firmwareDir/updates/amdgpu/new.bin"),
            "new",
        )
        .unwrap();
    let (code, json, stderr) = root.driver_json(&import_args());
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(json["refused"]["reason"], "BundleExists", "{json:#}");
    assert!(
        json["refused"]["message"]
            .as_str()
            .unwrap()
            .contains("--replace")
    );
    assert!(
        !root
            .bundle_files()
            .contains(&"firmware/amdgpu/new.bin".to_owned())
    );
    assert_eq!(root.store_names().len(), 1, "the refused copy is gone");

    let mut replace = import_args();
    replace.push("--replace");
    let (code, json, stderr) = root.driver_json(&replace);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["placement"], "Replaced", "{json:#}");
    assert!(
        root.bundle_files()
            .contains(&"firmware/amdgpu/new.bin".to_owned())
    );
    assert_eq!(root.store_names().len(), 1, "the old bundle is gone");
    assert_eq!(root.check(KERNEL).0, 0);
}

#[test]
fn a_bad_tag_or_a_copy_without_the_kernel_exits_2_and_writes_nothing() {
    let root = Root::new();
    write_image_copy(&root.host);
    for (tag, says) in [
        ("ubuntu-22.04-6.12.12", "too few"),
        ("ubuntu-22.04-6.8.0-49-generic-latest", "driver version"),
    ] {
        let (code, _, stderr) = root.driver(&["import", "--from", STAGING, "--image-tag", tag]);
        assert_eq!(code, 2, "{tag}: {stderr}");
        assert!(stderr.contains(says), "{tag}: {stderr}");
    }
    let other = "ubuntu-22.04-6.8.0-51-generic-6.12.12";
    let (code, _, stderr) = root.driver(&[
        "import",
        "--from",
        STAGING,
        "--image-tag",
        other,
        "--bundle-dir",
        STORE,
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("has no opt/lib/modules/6.8.0-51-generic/"),
        "{stderr}"
    );
    assert!(
        stderr.contains(KERNEL),
        "names the kernels it holds: {stderr}"
    );

    let (code, _, stderr) = root.driver(&["import", "--from", "/nowhere", "--image-tag", TAG]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = root.driver(&[
        "import",
        "--from",
        STAGING,
        "--image-tag",
        TAG,
        "--kernel",
        KERNEL,
        "--version",
        VERSION,
    ]);
    assert_eq!(code, 2, "the tag and --kernel both: {stderr}");
    let (code, _, stderr) = root.driver(&["import", "--from", STAGING, "--kernel", KERNEL]);
    assert_eq!(code, 2, "--kernel without --version: {stderr}");
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());

    // --kernel and --version instead of the tag.
    let (code, _, stderr) = root.driver(&[
        "import",
        "--from",
        STAGING,
        "--kernel",
        KERNEL,
        "--version",
        VERSION,
        "--bundle-dir",
        STORE,
    ]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn a_link_out_of_the_copy_or_a_missing_dependency_is_refused() {
    let root = Root::new();
    write_image_copy(&root.host);
    // The image's `kernel` pointing at this host's own module tree.
    let host_tree = format!("/lib/modules/{KERNEL}/kernel");
    root.host
        .write(
            format!("{host_tree}/drivers/gpu/drm/display/drm_display_helper.ko"),
            "x",
        )
        .unwrap();
    let link = format!("{STAGING}/opt/lib/modules/{KERNEL}/kernel");
    root.host.symlink(&host_tree, &link).unwrap();
    let (code, json, stderr) = root.driver_json(&import_args());
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(json["refused"]["reason"], "PathEscapesBundle", "{json:#}");
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());

    root.host.remove_all(&link).unwrap();
    let (code, json, stderr) = root.driver_json(&import_args());
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(json["refused"]["reason"], "DependencyMissing", "{json:#}");
    assert!(
        json["refused"]["message"]
            .as_str()
            .unwrap()
            .contains("drm_display_helper.ko"),
        "{json:#}"
    );
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());
}

// ---------------------------------------------------------------------------
// Tarballs.

#[derive(Clone, Copy, Debug)]
enum Packing {
    Tar,
    Gzip,
    Xz,
    Zstd,
}

/// A tarball of a complete bundle for `KERNEL`, under a top-level
/// directory or (`top_dir` false) with its manifest at the top.
fn bundle_tarball(packing: Packing, top_dir: bool) -> Vec<u8> {
    let maker = tempfile::tempdir().unwrap();
    let host = HostRoot::new(maker.path());
    bundles::write_bundle_at(&host, "/b", VERSION, KERNEL, true);
    let mut builder = tar::Builder::new(Vec::new());
    let top = if top_dir {
        format!("{VERSION}-{KERNEL}")
    } else {
        ".".to_owned()
    };
    builder.append_dir_all(&top, host.path("/b")).unwrap();
    compress(packing, &builder.into_inner().unwrap())
}

fn compress(packing: Packing, tar: &[u8]) -> Vec<u8> {
    match packing {
        Packing::Tar => tar.to_vec(),
        Packing::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(tar).unwrap();
            encoder.finish().unwrap()
        }
        Packing::Xz => {
            let mut out = Vec::new();
            lzma_rs::xz_compress(&mut &tar[..], &mut out).unwrap();
            out
        }
        Packing::Zstd => {
            let mut out = Vec::new();
            ruzstd::encoding::compress(tar, &mut out, ruzstd::encoding::CompressionLevel::Fastest);
            out
        }
    }
}

fn sha256(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tar stream with one entry written as given (name, type, link target),
/// unchecked, after a valid manifest-less file.
fn hostile_tarball(name: &str, kind: tar::EntryType, link: Option<&str>) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_entry_type(kind);
    header.set_mode(0o644);
    let data: &[u8] = if link.is_some() { b"" } else { b"evil" };
    if let Some(link) = link {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_size(data.len() as u64);
    header.set_cksum();
    let mut good = tar::Header::new_gnu();
    good.set_path("b/firmware/amdgpu/x.bin").unwrap();
    good.set_size(2);
    good.set_cksum();
    builder.append(&good, &b"fw"[..]).unwrap();
    builder.append(&header, data).unwrap();
    compress(Packing::Gzip, &builder.into_inner().unwrap())
}

#[test]
fn fetch_from_a_local_tar_gz_then_check_passes_and_again_is_a_no_op() {
    let root = Root::new();
    let tarball = bundle_tarball(Packing::Gzip, true);
    root.host.write("/srv/bundle.tar.gz", &tarball).unwrap();
    let sha = sha256(&tarball);
    let args = [
        "fetch",
        "--source",
        "/srv/bundle.tar.gz",
        "--sha256",
        &sha,
        "--bundle-dir",
        STORE,
    ];
    let (code, stdout, stderr) = root.driver(&args);
    assert_eq!(code, 0, "{stdout} {stderr}");
    assert!(
        stdout.contains(&format!("fetched {}", root.bundle_dir())),
        "{stdout}"
    );
    assert_eq!(root.store_names(), [format!("{VERSION}-{KERNEL}")]);
    let marker = source::read_marker(&root.host, &root.bundle_dir()).unwrap();
    assert_eq!(marker.kind, SourceKind::Tarball);
    assert_eq!(marker.sha256.as_deref(), Some(sha.as_str()));
    assert_eq!(marker.source, "/srv/bundle.tar.gz");

    let (code, json) = root.check(KERNEL);
    assert_eq!(code, 0, "{json:#}");

    let (code, json, stderr) = root.driver_json(&args);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["placement"], "AlreadyPresent", "{json:#}");
    assert!(json.get("verified").is_none(), "not read again: {json:#}");

    // The same bundle in another packing: the same content, no change.
    let plain = bundle_tarball(Packing::Tar, false);
    root.host.write("/srv/bundle.tar", &plain).unwrap();
    let plain_sha = sha256(&plain);
    let (code, json, stderr) = root.driver_json(&[
        "fetch",
        "--source",
        "/srv/bundle.tar",
        "--sha256",
        &plain_sha,
        "--bundle-dir",
        STORE,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["placement"], "AlreadyPresent", "{json:#}");
    assert!(json["verified"].is_object(), "{json:#}");
    assert_eq!(root.store_names().len(), 1);
}

/// A loopback HTTP/1.1 server answering each path from `routes` with
/// (status line, extra headers, body), 404 otherwise, and recording the
/// paths asked for. It runs until the test process ends.
fn serve(routes: BTreeMap<String, (String, String, Vec<u8>)>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                request.push(byte[0]);
            }
            let text = String::from_utf8_lossy(&request);
            let path = text
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            log.lock().unwrap().push(path.clone());
            let (status, headers, body) = routes
                .get(&path)
                .cloned()
                .unwrap_or_else(|| ("404 Not Found".into(), String::new(), Vec::new()));
            let head = format!(
                "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (address, asked)
}

fn ok(body: Vec<u8>) -> (String, String, Vec<u8>) {
    ("200 OK".into(), String::new(), body)
}

#[test]
fn fetch_over_http_follows_a_redirect_and_check_passes() {
    let root = Root::new();
    let tarball = bundle_tarball(Packing::Zstd, false);
    let sha = sha256(&tarball);
    let routes = BTreeMap::from([
        (
            "/latest".to_owned(),
            (
                "302 Found".to_owned(),
                "Location: /pool/bundle.tar.zst\r\n".to_owned(),
                Vec::new(),
            ),
        ),
        ("/pool/bundle.tar.zst".to_owned(), ok(tarball)),
    ]);
    let (address, asked) = serve(routes);
    let url = format!("{address}/latest");
    let (code, json, stderr) = root.driver_json(&[
        "fetch",
        "--source",
        &url,
        "--sha256",
        &sha,
        "--bundle-dir",
        STORE,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["placement"], "Added", "{json:#}");
    assert_eq!(json["dir"], root.bundle_dir());
    assert_eq!(*asked.lock().unwrap(), ["/latest", "/pool/bundle.tar.zst"]);
    let (code, json) = root.check(KERNEL);
    assert_eq!(code, 0, "{json:#}");

    // An xz tarball of a bundle for another kernel, in the same store.
    let maker = Root::new();
    let other = "6.8.0-51-generic";
    bundles::write_bundle_at(&maker.host, "/b", VERSION, other, true);
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_dir_all("b", maker.host.path("/b")).unwrap();
    let xz = compress(Packing::Xz, &builder.into_inner().unwrap());
    let xz_sha = sha256(&xz);
    let (address, _) = serve(BTreeMap::from([("/b.tar.xz".to_owned(), ok(xz))]));
    let url = format!("{address}/b.tar.xz");
    let (code, _, stderr) = root.driver(&[
        "fetch",
        "--source",
        &url,
        "--sha256",
        &xz_sha,
        "--bundle-dir",
        STORE,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(root.check(other).0, 0);
    assert_eq!(root.check(KERNEL).0, 0);
}

#[test]
fn a_wrong_sha256_is_refused_and_leaves_nothing() {
    let root = Root::new();
    let tarball = bundle_tarball(Packing::Gzip, true);
    root.host.write("/srv/bundle.tar.gz", &tarball).unwrap();
    let wrong = sha256(b"something else");
    let (code, json, stderr) = root.driver_json(&[
        "fetch",
        "--source",
        "/srv/bundle.tar.gz",
        "--sha256",
        &wrong,
        "--bundle-dir",
        STORE,
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(json["refused"]["reason"], "ChecksumMismatch", "{json:#}");
    let message = json["refused"]["message"].as_str().unwrap();
    assert!(
        message.contains(&sha256(&tarball)) && message.contains(&wrong),
        "{message}"
    );
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());

    let (address, _) = serve(BTreeMap::from([("/b.tgz".to_owned(), ok(tarball))]));
    let url = format!("{address}/b.tgz");
    let (code, stdout, stderr) = root.driver(&[
        "fetch",
        "--source",
        &url,
        "--sha256",
        &wrong,
        "--bundle-dir",
        STORE,
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.contains("refused: ChecksumMismatch"), "{stdout}");
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());
}

/// An import is bounded as a fetch is: the files it would copy, added up,
/// against `--max-disk`, and the free-space margin, both before anything is
/// written; either way it exits 2 with BundleStoreFull naming the bound,
/// and the store holds no bundle, whole or partial, nor a work directory.
#[test]
fn an_import_over_its_disk_bound_is_refused_and_leaves_nothing() {
    let root = Root::new();
    write_image_copy(&root.host);
    // 2 MiB and a byte of firmware: over a 1 MiB bound, within 3 MiB.
    root.host
        .write(
            format!("{STAGING}/firmwareDir/updates/amdgpu/big.bin"),
            vec![0u8; (2 << 20) + 1],
        )
        .unwrap();
    let import = |extra: &[&'static str]| {
        let mut args = import_args();
        args.extend_from_slice(extra);
        root.driver(&args)
    };
    let (code, stdout, stderr) = import(&["--max-disk", "1"]);
    let said = format!("{stdout}{stderr}");
    assert_eq!(code, 2, "{said}");
    assert!(said.contains("BundleStoreFull"), "{said}");
    assert!(said.contains("more than the 1048576 allowed"), "{said}");
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());
    // A margin no disk has.
    let (code, stdout, stderr) = import(&["--min-free", "1000000000000"]);
    let said = format!("{stdout}{stderr}");
    assert_eq!(code, 2, "{said}");
    assert!(
        said.contains("BundleStoreFull") && said.contains("must stay free"),
        "{said}"
    );
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());
    // With room, the same import succeeds.
    let (code, stdout, stderr) = import(&["--max-disk", "3"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(root.store_names(), [format!("{VERSION}-{KERNEL}")]);
}

/// A fetch stops before it fills the disk: the free-space margin is checked
/// before the tarball is written, and the bound on what the work holds at
/// once while it unpacks; either way it exits 2 with BundleStoreFull and
/// leaves nothing in the store.
#[test]
fn a_fetch_without_room_stops_with_the_store_full_and_leaves_nothing() {
    let root = Root::new();
    let tarball = bundle_tarball(Packing::Gzip, true);
    root.host.write("/srv/bundle.tar.gz", &tarball).unwrap();
    let sum = sha256(&tarball);
    let fetch = |extra: &[&str]| {
        let mut args = vec![
            "fetch",
            "--source",
            "/srv/bundle.tar.gz",
            "--sha256",
            &sum,
            "--bundle-dir",
            STORE,
        ];
        args.extend_from_slice(extra);
        root.driver(&args)
    };
    // A margin no disk has.
    let (code, stdout, stderr) = fetch(&["--min-free", "1000000000000"]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stdout.contains("BundleStoreFull") || stderr.contains("BundleStoreFull"),
        "{stdout}{stderr}"
    );
    assert!(
        stdout.contains("must stay free") || stderr.contains("must stay free"),
        "{stdout}{stderr}"
    );
    assert!(root.store_names().is_empty(), "{:?}", root.store_names());
    // With room, the same fetch succeeds.
    let (code, stdout, stderr) = fetch(&[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(root.store_names().len(), 1, "{:?}", root.store_names());
}

#[test]
fn unsafe_tarball_entries_are_refused_and_leave_nothing() {
    let root = Root::new();
    let escape = "../../../../../escaped";
    for (name, tarball, says) in [
        (
            "dotdot",
            hostile_tarball(escape, tar::EntryType::Regular, None),
            "`..`",
        ),
        (
            "absolute",
            hostile_tarball("/tmp/absolute-evil", tar::EntryType::Regular, None),
            "absolute",
        ),
        (
            "symlink",
            hostile_tarball(
                "b/firmware/amdgpu/y.bin",
                tar::EntryType::Symlink,
                Some("/etc/shadow"),
            ),
            "symbolic link",
        ),
        (
            "hard link",
            hostile_tarball(
                "b/firmware/amdgpu/y.bin",
                tar::EntryType::Link,
                Some("/etc/shadow"),
            ),
            "hard link",
        ),
        (
            "device",
            hostile_tarball("b/dev/sda", tar::EntryType::Block, None),
            "device",
        ),
    ] {
        let path = format!("/srv/{name}.tar.gz");
        root.host.write(&path, &tarball).unwrap();
        let sha = sha256(&tarball);
        let (code, json, stderr) = root.driver_json(&[
            "fetch",
            "--source",
            &path,
            "--sha256",
            &sha,
            "--bundle-dir",
            STORE,
        ]);
        assert_eq!(code, 1, "{name}: {stderr}");
        assert_eq!(
            json["refused"]["reason"], "UnsafeTarball",
            "{name}: {json:#}"
        );
        let message = json["refused"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{name}: {message}");
        assert!(
            root.store_names().is_empty(),
            "{name}: {:?}",
            root.store_names()
        );
    }
    // Nothing was written where `..` pointed, nor at the absolute path.
    assert!(!root.host.exists("/escaped") && !root.host.exists("/var/lib/gpu-operator/escaped"));
    assert!(!root.host.exists("/tmp/absolute-evil"));
    assert!(!root.dir.path().parent().unwrap().join("escaped").exists());
}

#[test]
fn fetch_arguments_and_sources_that_cannot_be_read_exit_2() {
    let root = Root::new();
    let sha = sha256(b"x");
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/b.tar", listener.local_addr().unwrap())
    };
    let (address, _) = serve(BTreeMap::new());
    let missing_url = format!("{address}/missing.tar");
    for (source, sha, says) in [
        (
            "/srv/missing.tar.gz",
            sha.as_str(),
            "BundleSourceUnavailable",
        ),
        (closed.as_str(), sha.as_str(), "BundleSourceUnavailable"),
        (missing_url.as_str(), sha.as_str(), "404"),
        ("ftp://mirror/b.tar", sha.as_str(), "ftp://"),
        ("/srv/b.tar", "not-a-sha", "not 64 hexadecimal digits"),
    ] {
        let (code, _, stderr) = root.driver(&[
            "fetch",
            "--source",
            source,
            "--sha256",
            sha,
            "--bundle-dir",
            STORE,
        ]);
        assert_eq!(code, 2, "{source}: {stderr}");
        assert!(stderr.contains(says), "{source}: {stderr}");
        assert!(
            root.store_names().is_empty(),
            "{source}: {:?}",
            root.store_names()
        );
    }
    // A missing file is named with where it was looked for: under the host
    // root, which the host path alone does not say.
    let (_, _, stderr) = root.driver(&[
        "fetch",
        "--source",
        "/srv/missing.tar.gz",
        "--sha256",
        &sha,
        "--bundle-dir",
        STORE,
    ]);
    let looked_at = root.host.path("/srv/missing.tar.gz");
    assert!(
        stderr.contains(&format!("looked for at {}", looked_at.display())),
        "{stderr}"
    );
    for command in ["fetch", "import"] {
        let help = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(["driver", command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(help.contains("Exit status: 0"), "{command}: {help}");
        assert!(
            help.contains("docs/driver.md") || help.contains("sha256"),
            "{command}: {help}"
        );
    }
}

#[tokio::test]
async fn ensure_fetched_skips_a_source_it_fetched_before_and_reports_each() {
    let root = Root::new();
    let tarball = bundle_tarball(Packing::Gzip, true);
    let sha = sha256(&tarball);
    let (address, asked) = serve(BTreeMap::from([("/b.tar.gz".to_owned(), ok(tarball))]));
    let good = TarballSource {
        source: format!("{address}/b.tar.gz"),
        sha256: sha.clone(),
    };
    let bad = TarballSource {
        source: format!("{address}/b.tar.gz"),
        sha256: sha256(b"another"),
    };
    let options = FetchOptions::default();
    let outcomes =
        source::ensure_fetched(&root.host, STORE, &[bad.clone(), good.clone()], &options).await;
    assert_eq!(outcomes.len(), 2);
    let refused = outcomes[0].result.as_ref().unwrap_err();
    assert_eq!(refused.reason(), "ChecksumMismatch");
    let placed = outcomes[1].result.as_ref().unwrap();
    assert_eq!(placed.placement, Placement::Added);
    assert_eq!(placed.dir, root.bundle_dir());
    assert_eq!(asked.lock().unwrap().len(), 2);

    let again = source::ensure_fetched(&root.host, STORE, &[good], &options).await;
    let placed = again[0].result.as_ref().unwrap();
    assert_eq!(placed.placement, Placement::AlreadyPresent);
    assert_eq!(
        (placed.version.as_str(), placed.kernel_release.as_str()),
        (VERSION, KERNEL)
    );
    assert_eq!(asked.lock().unwrap().len(), 2, "nothing downloaded again");
    assert_eq!(
        source::already_fetched(&root.host, STORE, &sha).map(|(dir, _)| dir),
        Some(root.bundle_dir())
    );
}
