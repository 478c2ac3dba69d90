//! Issue 45: what a file ktune writes for the user may replace. A character
//! device the user names is written through, never renamed over (`tune -o
//! /dev/null` run as root once replaced the system's device with a file); a
//! FIFO (refused without opening it, so without blocking), a directory, one of
//! the command's own inputs (also through a symbolic link), or a path whose
//! folder does not exist is exit 2 naming the problem and the fix, with nothing
//! changed and nothing created. The device nodes are made with `mknod` in a
//! temporary folder (root only; skipped loudly otherwise): the system's /dev is
//! never touched.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{fixture, ktune_process, tempdir};

/// A character device node at `path` with `major:minor` (1:3 is /dev/null's,
/// 1:7 /dev/full's); false (and a loud skip) when this process may not make one.
fn char_device(path: &Path, major: u32, minor: u32) -> bool {
    let c = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    // SAFETY: a valid NUL-terminated path; mknod only reads it.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) };
    if rc != 0 {
        eprintln!("SKIPPED: mknod {} failed ({}): the device-node checks need root", path.display(), std::io::Error::last_os_error());
        return false;
    }
    true
}

fn fifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

fn is_char_device(path: &Path, major: u32, minor: u32) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == libc::makedev(major, minor))
}

/// ktune with `args` in the cache `cache`, killed after 60 s (a FIFO opened for
/// writing would block without a reader): (exit code, stderr).
fn ktune(cache: &Path, args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let mut child = ktune_process(cache)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawns");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("ktune {args:?} still running after 60 s (blocked on a FIFO?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("ends");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `eval` on the tiny fixture writing `--save-logits out`, with `extra` flags.
fn eval_saving(cache: &Path, out: &Path, file: &Path) -> (Option<i32>, String) {
    let gguf = fixture("gguf/smollm2-tiny-q8_0.gguf");
    let args: Vec<&std::ffi::OsStr> = vec![
        "eval".as_ref(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--gguf".as_ref(),
        gguf.as_os_str(),
        "--file".as_ref(),
        file.as_os_str(),
        "--ctx".as_ref(),
        "64".as_ref(),
        "--chunks".as_ref(),
        "1".as_ref(),
        "--save-logits".as_ref(),
        out.as_os_str(),
    ];
    ktune(cache, &args)
}

fn text() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eval.txt")
}

/// Regression (issue 45): `tune -o /dev/null` as root replaced the device with
/// a regular file. Here on a node of the same major:minor in a temporary
/// folder: after the tune it is still that character device.
#[test]
fn tune_o_onto_a_character_device_writes_through_it() {
    let dir = tempdir();
    let null = dir.path().join("null");
    if !char_device(&null, 1, 3) {
        return;
    }
    let tune = "tune --model smollm2-135m --layers 1 --device cpu --budget 1s --prefill-tokens 8 --context 32 --decode-tokens 4 -o";
    let args: Vec<&std::ffi::OsStr> = tune.split(' ').map(|a| a.as_ref()).chain([null.as_os_str()]).collect();
    let (code, stderr) = ktune(&dir.path().join("cache"), &args);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(is_char_device(&null, 1, 3), "the node is no longer a 1:3 character device: {:?}", std::fs::symlink_metadata(&null));
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 2, "no temporary file beside it: {left:?}");
}

/// Regression (issue 45): `eval --save-logits` onto /dev/full replaced it with a
/// file. A node of /dev/full's numbers: the write goes through, fails (the
/// device is full), exit 2 saying so, the node unchanged.
#[test]
fn save_logits_onto_a_full_device_is_exit_2_and_leaves_the_device() {
    let dir = tempdir();
    let full = dir.path().join("full");
    if !char_device(&full, 1, 7) {
        return;
    }
    let (code, stderr) = eval_saving(dir.path(), &full, &text());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot write") && stderr.contains("disk is full"), "{stderr}");
    assert!(is_char_device(&full, 1, 7), "the node was replaced");
}

/// Regression (issue 45): `eval --save-logits FIFO` replaced the FIFO with a
/// file. Refused before anything is opened (no reader: an open would block).
#[test]
fn save_logits_onto_a_fifo_is_refused_without_blocking() {
    let dir = tempdir();
    let pipe = dir.path().join("pipe");
    fifo(&pipe);
    let (code, stderr) = eval_saving(dir.path(), &pipe, &text());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("a FIFO") && stderr.contains("give a file path"), "{stderr}");
    assert!(std::fs::symlink_metadata(&pipe).expect("still there").file_type().is_fifo());
}

#[test]
fn save_logits_onto_a_directory_is_refused() {
    let dir = tempdir();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).expect("mkdir");
    let (code, stderr) = eval_saving(dir.path(), &sub, &text());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("a directory"), "{stderr}");
    assert!(sub.is_dir() && std::fs::read_dir(&sub).expect("ls").count() == 0);
}

/// Regression (issue 45): `eval --save-logits X --file X` silently replaced its
/// own text with the logits. Refused, directly and through a symbolic link, the
/// text unchanged.
#[test]
fn save_logits_onto_its_own_file_is_refused_and_the_file_unchanged() {
    let dir = tempdir();
    let own = dir.path().join("text.txt");
    std::fs::copy(text(), &own).expect("copy");
    let before = std::fs::read(&own).expect("read");
    let link = dir.path().join("link.bin");
    std::os::unix::fs::symlink(&own, &link).expect("symlink");
    for out in [&own, &link] {
        let (code, stderr) = eval_saving(dir.path(), out, &own);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("is the same file as --file") && stderr.contains("write to another path"), "{stderr}");
        assert_eq!(std::fs::read(&own).expect("read"), before, "the text is unchanged");
    }
    assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
}

/// Regression (issue 45): a user-named output's missing folders were created.
/// Now exit 2 naming the folder and the fix; nothing is created.
#[test]
fn a_missing_parent_folder_is_refused_and_not_created() {
    let dir = tempdir();
    let out = dir.path().join("no").join("such").join("ref.bin");
    let (code, stderr) = eval_saving(dir.path(), &out, &text());
    assert_eq!(code, Some(2), "{stderr}");
    let folder = dir.path().join("no").join("such");
    assert!(stderr.contains(&format!("the folder {} does not exist", folder.display())) && stderr.contains("mkdir -p"), "{stderr}");
    assert!(!dir.path().join("no").exists(), "nothing created");
    // The same for a report's -o, and for a man page directory's parent.
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/profiles");
    let yaml =
        std::fs::read_dir(&profile).expect("profiles").flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|e| e == "yaml"));
    if let Some(yaml) = yaml {
        let (code, stderr) =
            ktune(dir.path(), &["report".as_ref(), yaml.as_os_str(), "-o".as_ref(), out.with_extension("html").as_os_str()]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("does not exist"), "{stderr}");
    }
    let (code, stderr) = ktune(dir.path(), &["man".as_ref(), "-o".as_ref(), folder.as_os_str()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!dir.path().join("no").exists(), "nothing created");
}
