//! scripts/cluster/: the Slurm array script's task → part arithmetic under hand-set SLURM_ARRAY_* variables and a
//! stub squeeze; three array tasks running the real binary, merged, equal one run; the submit script under a stub
//! sbatch submits the array and a merge that waits for it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{files, path_str, squeeze, synth};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster").join(name)
}

/// An executable shell script at `path`.
fn write_executable(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs squeeze-parts.sbatch with `env` and a stub squeeze that prints its arguments one per line; returns the
/// exit code and the arguments (or stderr on failure).
fn run_task(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let stub = dir.join("squeeze-stub");
    write_executable(&stub, "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n");
    let mut command = Command::new("bash");
    command.arg(script("squeeze-parts.sbatch")).args(args).env("SQUEEZE", &stub);
    for key in [
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_MAX",
        "SLURM_ARRAY_TASK_STEP",
        "SLURM_ARRAY_TASK_COUNT",
    ] {
        command.env_remove(key);
    }
    command.envs(env.iter().copied());
    let output = command.output().expect("bash runs");
    let text = if output.status.success() { output.stdout } else { output.stderr };
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&text).into_owned())
}

#[test]
fn the_slurm_script_maps_array_tasks_to_parts() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[(&str, &str)], &str); 6] = [
        (&[("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "8")], "1/8"),
        (&[("SLURM_ARRAY_TASK_ID", "0"), ("SLURM_ARRAY_TASK_MIN", "0"), ("SLURM_ARRAY_TASK_COUNT", "8")], "1/8"),
        (&[("SLURM_ARRAY_TASK_ID", "7"), ("SLURM_ARRAY_TASK_MIN", "0"), ("SLURM_ARRAY_TASK_COUNT", "8")], "8/8"),
        (
            &[
                ("SLURM_ARRAY_TASK_ID", "14"),
                ("SLURM_ARRAY_TASK_MIN", "0"),
                ("SLURM_ARRAY_TASK_STEP", "2"),
                ("SLURM_ARRAY_TASK_COUNT", "8"),
            ],
            "8/8",
        ),
        (
            &[
                ("SLURM_ARRAY_TASK_ID", "5"),
                ("SLURM_ARRAY_TASK_MIN", "1"),
                ("SLURM_ARRAY_TASK_STEP", "2"),
                ("SLURM_ARRAY_TASK_COUNT", "8"),
            ],
            "3/8",
        ),
        // Without the count (older Slurm): from the maximum.
        (&[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_MAX", "4")], "3/4"),
    ];
    for (env, part) in cases {
        let (code, args) = run_task(dir.path(), env, &["quantize", "SRC", "OUT", "--scale-rule", "mse"]);
        assert_eq!(code, 0, "{env:?}: {args}");
        assert_eq!(args, format!("quantize\nSRC\nOUT\n--part\n{part}\n--scale-rule\nmse\n"), "{env:?}");
    }
    let task = [("SLURM_ARRAY_TASK_ID", "2"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "3")];
    let stats = dir.path().join("stats");
    let (code, args) = run_task(dir.path(), &task, &["eval", path_str(&stats), "MODEL", "--data", "eval.txt"]);
    assert_eq!(code, 0, "{args}");
    let expected_file = stats.join("part-00002-of-00003.safetensors");
    assert_eq!(
        args,
        format!("eval\nMODEL\n--data\neval.txt\n--part\n2/3\n--save-stats\n{}\n", expected_file.display())
    );
    let (code, args) = run_task(dir.path(), &task, &["calibrate-kv", path_str(&stats), "MODEL", "--samples", "64"]);
    assert_eq!(code, 0, "{args}");
    assert!(args.starts_with("calibrate-kv\nMODEL\n--samples\n64\n--part\n2/3\n--save-stats\n"), "{args}");
    // A rerun task whose part manifest exists resumes.
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("squeeze-part-00002-of-00003.json"), "{}").unwrap();
    let (code, args) = run_task(dir.path(), &task, &["quantize", "SRC", path_str(&out)]);
    assert_eq!(code, 0, "{args}");
    assert!(args.ends_with("--part\n2/3\n--resume\n"), "{args}");
    // Off the array's grid, no task id, an unknown job: exit 2 with the reason.
    let off_grid = [
        ("SLURM_ARRAY_TASK_ID", "2"),
        ("SLURM_ARRAY_TASK_MIN", "1"),
        ("SLURM_ARRAY_TASK_STEP", "2"),
        ("SLURM_ARRAY_TASK_COUNT", "4"),
    ];
    let (code, stderr) = run_task(dir.path(), &off_grid, &["quantize", "SRC", "OUT"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not on the array's grid"), "{stderr}");
    let (code, stderr) = run_task(dir.path(), &[], &["quantize", "SRC", "OUT"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("sbatch --array"), "{stderr}");
    let (code, stderr) = run_task(dir.path(), &task, &["serve", "X"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown job"), "{stderr}");
}

#[test]
fn three_slurm_tasks_then_merge_equal_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &[]);
    let single = dir.path().join("single");
    squeeze(&["quantize", path_str(&source), path_str(&single), "--max-shard-size", "300kB"]).ok();
    let shared = dir.path().join("shared");
    for id in ["2", "0", "1"] {
        let status = Command::new("bash")
            .arg(script("squeeze-parts.sbatch"))
            .args(["quantize", path_str(&source), path_str(&shared), "--max-shard-size", "300kB"])
            .env("SQUEEZE", env!("CARGO_BIN_EXE_squeeze"))
            .env("SLURM_ARRAY_TASK_ID", id)
            .env("SLURM_ARRAY_TASK_MIN", "0")
            .env("SLURM_ARRAY_TASK_COUNT", "3")
            .env_remove("SLURM_ARRAY_TASK_STEP")
            .output()
            .unwrap();
        assert!(status.status.success(), "task {id}: {}", String::from_utf8_lossy(&status.stderr));
    }
    squeeze(&["merge", path_str(&shared)]).ok();
    assert_eq!(files(&shared), files(&single));
}

#[test]
fn the_submit_script_submits_the_array_and_a_merge_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).unwrap();
    let log = dir.path().join("sbatch.log");
    write_executable(
        &bin.join("sbatch"),
        &format!(
            "#!/bin/sh\nprintf '%s|' \"$@\" >> {log}\necho >> {log}\ncase \"$*\" in *--array*) echo 4242 ;; *) echo 4243 ;; esac\n",
            log = log.display()
        ),
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let output = Command::new("bash")
        .arg(script("squeeze-submit.sh"))
        .args(["3", "quantize", "/models/src", "/shared/out", "--scale-rule", "mse"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let calls = fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(lines.len(), 2, "{calls}");
    assert!(
        lines[0].contains("--array=1-3|")
            && lines[0].contains("squeeze-parts.sbatch|quantize|/models/src|/shared/out|--scale-rule|mse|"),
        "{calls}"
    );
    assert!(
        lines[1].contains("--dependency=afterok:4242|") && lines[1].contains("--wrap=squeeze merge /shared/out"),
        "{calls}"
    );
    let output = Command::new("bash")
        .arg(script("squeeze-submit.sh"))
        .args(["3", "eval", "/shared/stats", "/models/int4", "--data", "eval.txt"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let calls = fs::read_to_string(&log).unwrap();
    assert!(calls.contains("--wrap=squeeze merge-eval /shared/stats/part-*-of-00003.safetensors"), "{calls}");
}
