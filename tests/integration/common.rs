//! Shared helpers: running the binary, making synthetic models in temporary folders.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr))
    }

    /// Asserts success and returns self.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "expected success\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }
}

/// Asserts exit 2 (an error) with every one of `must_mention` in stderr.
pub fn expect_exit_2(run: &Run, must_mention: &[&str]) {
    assert_eq!(run.code, 2, "expected exit 2\nstdout:{}\nstderr:{}", run.stdout, run.stderr);
    for needle in must_mention {
        assert!(run.stderr.contains(needle), "stderr should mention `{needle}`:\n{}", run.stderr);
    }
}

/// Runs `squeeze` with `args`.
pub fn squeeze(args: &[&str]) -> Run {
    run_command(Command::new(env!("CARGO_BIN_EXE_squeeze")).args(args))
}

/// Runs `squeeze` with `args` in the working folder `cwd`, with the environment variables `env` set.
pub fn squeeze_in(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_squeeze"));
    command.args(args).current_dir(cwd);
    for (name, value) in env {
        command.env(name, value);
    }
    run_command(&mut command)
}

fn run_command(command: &mut Command) -> Run {
    let output: Output = command.output().expect("the squeeze binary runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// Writes a synthetic checkpoint of `arch` into `dir/name` with extra synth flags; returns its path.
pub fn synth(dir: &Path, name: &str, arch: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec!["synth", "--arch", arch, path_str(&out)];
    args.extend_from_slice(extra);
    squeeze(&args).ok();
    out
}

/// Writes a default-size synthetic checkpoint of `arch` with `seed` through the library (no binary run) into a new
/// temporary folder; returns the folder (kept alive by the caller) and the model's path in it.
pub fn synth_in_process(arch: squeeze::synth::SynthArch, seed: u64) -> (tempfile::TempDir, PathBuf) {
    use squeeze::synth::{SynthOptions, SynthSize};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model");
    squeeze::synth::synth(&SynthOptions {
        arch,
        size: SynthSize::default(),
        shards: 1,
        seed,
        out: out.clone(),
        force: true,
    })
    .unwrap();
    (dir, out)
}

/// Writes a safetensors file holding one I64 tensor `input_ids` `[rows, ctx]` with the given ids (the
/// `--tokens` input of `eval` and `calibrate-kv`).
pub fn write_input_ids(path: &Path, rows: &[Vec<i64>]) {
    let ctx = rows.first().map_or(0, Vec::len);
    assert!(rows.iter().all(|row| row.len() == ctx), "input_ids rows differ in length");
    let bytes: Vec<u8> = rows.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
    let mut header = serde_json::json!({
        "input_ids": { "dtype": "I64", "shape": [rows.len(), ctx], "data_offsets": [0, bytes.len()] }
    })
    .to_string()
    .into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&bytes);
    std::fs::write(path, file).expect("the tokens file is written");
}

/// The JSON file at `path`.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("file exists")).expect("valid JSON")
}

/// A folder's files (name → bytes), the lock file aside.
pub fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("output folder")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| !path.to_string_lossy().ends_with(".lock"))
        .map(|path| (path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap()))
        .collect();
    all.sort();
    all
}

/// The tensor names of a checkpoint folder's index.
pub fn tensor_names(dir: &Path) -> Vec<String> {
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    index["weight_map"].as_object().unwrap().keys().cloned().collect()
}

/// The bytes of tensor `name` in a checkpoint folder (found through its index).
pub fn tensor_bytes(dir: &Path, name: &str) -> Vec<u8> {
    let index = read_json(&dir.join("model.safetensors.index.json"));
    let file = index["weight_map"][name].as_str().unwrap_or_else(|| panic!("{name} is not in {}", dir.display()));
    let shard = squeeze::io::ShardFile::open(&dir.join(file)).expect("shard opens");
    shard.get(name).expect("tensor in its shard").bytes.to_vec()
}

/// Rewrites the safetensors header of `file` (data untouched).
pub fn rewrite_header(file: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let bytes = std::fs::read(file).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    edit(&mut header);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut rebuilt = (text.len() as u64).to_le_bytes().to_vec();
    rebuilt.extend_from_slice(&text);
    rebuilt.extend_from_slice(&bytes[8 + header_len..]);
    std::fs::write(file, rebuilt).unwrap();
}
