//! Walks `tests/bad-inputs/`: every bad config, checkpoint, preset and workload gives its stated
//! exit code (1 refused input, 2 malformed flag) and error text, never a panic or a signal, within
//! a minute. See `tests/bad-inputs/README.md` for the case format.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One case: its directory, arguments, exit code and expected error text.
struct Case {
    dir: PathBuf,
    args: Vec<String>,
    exit: i32,
    error: String,
}

fn cases() -> Vec<Case> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad-inputs");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/bad-inputs exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.join("case.toml").is_file())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|dir| {
            let text = std::fs::read_to_string(dir.join("case.toml")).expect("readable case");
            let v: toml::Value = toml::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: bad case.toml: {e}", dir.display()));
            let args = v["args"]
                .as_array()
                .expect("args is an array")
                .iter()
                .map(|a| a.as_str().expect("args are strings").to_string())
                .collect();
            Case {
                args,
                exit: v["exit"].as_integer().expect("exit is an integer") as i32,
                error: v["error"].as_str().expect("error is a string").to_string(),
                dir,
            }
        })
        .collect()
}

/// Runs day0 in `dir`, killing it after `limit`; (exit code, stderr), the code `None` for a
/// signal or a kill.
fn run(dir: &Path, args: &[String], limit: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_day0"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("day0 starts");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).ok();
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = reader.join().expect("reader");
    (status.and_then(|s| s.code()), err)
}

#[test]
fn every_bad_input_gives_its_error_and_exit_code() {
    let cases = cases();
    assert!(cases.len() >= 20, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let name = c.dir.file_name().unwrap().to_string_lossy().to_string();
        let (code, err) = run(&c.dir, &c.args, Duration::from_secs(60));
        if code != Some(c.exit) || !err.contains(&c.error) || err.contains("panicked") {
            failures.push(format!(
                "{name}: exit {code:?} (want {}), stderr:\n{err}\n(want it to contain {:?})",
                c.exit, c.error
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}
