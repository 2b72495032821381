//! Models named as users name them: `ORG/NAME[@REV]` found in a Hugging Face cache laid out as `huggingface_hub`
//! writes it (chosen by HF_HUB_CACHE), an existing folder of the same name winning, and a repo not in the cache
//! refused naming where it looked and how to download it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::{expect_exit_2, path_str, squeeze_in, synth, Run};

const COMMIT: &str = "3f1c0a9e5b7d2468ace013579bdf2468ace01357";

/// A cache under `dir/hub` holding a synthetic Kimi K2 as `org/tiny` (snapshot COMMIT, `refs/main` naming it);
/// returns the cache folder and the snapshot folder.
pub fn fake_cache(dir: &Path) -> (PathBuf, PathBuf) {
    let cache = dir.join("hub");
    let repo = cache.join("models--org--tiny");
    fs::create_dir_all(repo.join("snapshots")).unwrap();
    fs::create_dir_all(repo.join("refs")).unwrap();
    let snapshot = repo.join("snapshots").join(COMMIT);
    fs::rename(synth(dir, "built", "kimi-k2", &[]), &snapshot).unwrap();
    fs::write(repo.join("refs/main"), COMMIT).unwrap();
    (cache, snapshot)
}

fn inspect(dir: &Path, cache: &Path, model: &str) -> Run {
    squeeze_in(dir, &[("HF_HUB_CACHE", cache)], &["inspect", model, "--json"])
}

#[test]
fn a_cached_repo_id_resolves_to_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, snapshot) = fake_cache(dir.path());

    for model in ["org/tiny".to_string(), "org/tiny@main".into(), format!("org/tiny@{COMMIT}")] {
        let json = inspect(dir.path(), &cache, &model).ok().json();
        assert_eq!(json["path"], path_str(&snapshot), "{model}");
        assert_eq!(json["model_type"], "kimi_k2", "{model}");
        assert!(json["tensors"].as_u64().is_some_and(|n| n > 0), "{model}: {json}");
    }

    // `report` takes it too, after paths and presets, and counts the snapshot's weights.
    let run = squeeze_in(dir.path(), &[("HF_HUB_CACHE", &cache)], &["report", "org/tiny", "--json"]).ok();
    assert_eq!(run.json()["exact"], true, "{}", run.stdout);
}

#[test]
fn a_repo_id_not_in_the_cache_exits_2_naming_where_it_looked_and_the_download() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, _) = fake_cache(dir.path());

    let run = inspect(dir.path(), &cache, "org/missing");
    let looked = cache.join("models--org--missing");
    expect_exit_2(
        &run,
        &[path_str(&looked), "HF_HUB_CACHE", "`hf download org/missing`", "`huggingface-cli download org/missing`"],
    );
    assert!(run.stdout.is_empty(), "{}", run.stdout);

    // A revision that is not cached names the cached snapshot and the download of that revision.
    let run = inspect(dir.path(), &cache, "org/tiny@v9");
    expect_exit_2(&run, &[COMMIT, "hf download org/tiny --revision v9"]);

    // A mistyped id says why it is no repo id; a plain missing path keeps the command's own error.
    expect_exit_2(&inspect(dir.path(), &cache, "org/ti ny"), &["no file or folder `org/ti ny`", "holds ` `"]);
    let run = inspect(dir.path(), &cache, "./org/missing");
    expect_exit_2(&run, &["./org/missing: is not a model folder"]);
    assert!(!run.stderr.contains("Hugging Face"), "{}", run.stderr);
}

#[test]
fn an_existing_folder_wins_over_a_repo_id() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, _) = fake_cache(dir.path());
    fs::create_dir(dir.path().join("org")).unwrap();
    let local = synth(&dir.path().join("org"), "tiny", "glm45", &[]);

    let json = inspect(dir.path(), &cache, "org/tiny").ok().json();
    assert_eq!(json["path"], "org/tiny");
    assert_eq!(json["model_type"], "glm4_moe", "the local glm45 folder, not the cached kimi-k2: {json}");
    assert!(local.is_dir());
}

/// calibrate-kv on a repo id would edit the cache's shared snapshot: refused unless --out names a folder of one's
/// own, and the snapshot is left as it was.
#[test]
fn calibrate_kv_does_not_write_into_a_cache_snapshot_without_out() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, snapshot) = fake_cache(dir.path());
    let text = dir.path().join("calibration.txt");
    fs::write(&text, "Shall I compare thee to a summer's day? Thou art more lovely and more temperate.").unwrap();
    let config_before = fs::read(snapshot.join("config.json")).unwrap();
    let env = [("HF_HUB_CACHE", cache.as_path())];
    let args = ["calibrate-kv", "org/tiny", "--data", path_str(&text), "--seq-len", "16", "--samples", "2"];
    let run = squeeze_in(dir.path(), &env, &args);
    expect_exit_2(&run, &[path_str(&snapshot), "Hugging Face cache", "--out DIR"]);
    assert_eq!(fs::read(snapshot.join("config.json")).unwrap(), config_before);
    assert!(!snapshot.join("kv-scales.safetensors").exists());

    let out = dir.path().join("scales");
    let mut with_out = args.to_vec();
    with_out.extend(["--out", path_str(&out)]);
    squeeze_in(dir.path(), &env, &with_out).ok();
    assert!(out.join("kv-scales.safetensors").is_file());
}
