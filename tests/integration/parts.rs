//! `squeeze quantize --part I/N` and `squeeze merge`: parts merged equal one run byte for byte; a missing,
//! duplicated or differently made part fails the merge with exit 2 naming it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::{files, path_str, squeeze, synth, Run};

/// Small shards, so that the tiny model has enough of them for three parts.
const SHARD: &str = "300kB";

fn quantize(source: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["quantize", path_str(source), path_str(out), "--max-shard-size", SHARD, "--json"];
    args.extend_from_slice(extra);
    squeeze(&args)
}

fn merge(out: &Path, parts: &[&Path]) -> Run {
    let mut args = vec!["merge", path_str(out), "--json"];
    args.extend(parts.iter().map(|p| path_str(p)));
    squeeze(&args)
}

/// A source, its single-run output and three parts each in its own folder.
struct Fixture {
    dir: tempfile::TempDir,
    source: PathBuf,
    single: PathBuf,
    parts: Vec<PathBuf>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary folder");
    let source = synth(dir.path(), "fp8", "kimi-k2", &["--shards", "3"]);
    let single = dir.path().join("single");
    let report = quantize(&source, &single, &[]).ok().json();
    assert!(report["shards"].as_u64().unwrap() >= 5, "the model needs more shards for this test: {report}");
    let parts = (1..=3)
        .map(|index| {
            let out = dir.path().join(format!("part{index}"));
            let part = quantize(&source, &out, &["--part", &format!("{index}/3")]).ok().json();
            assert_eq!(part["part"]["part"], format!("{index}/3"));
            out
        })
        .collect();
    Fixture { dir, source, single, parts }
}

fn assert_same_files(expected: &Path, got: &Path) {
    let (expected_files, got_files) = (files(expected), files(got));
    let names = |all: &[(String, Vec<u8>)]| all.iter().map(|(name, _)| name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&expected_files), names(&got_files), "the folders hold different files");
    for ((name, a), (_, b)) in expected_files.iter().zip(&got_files) {
        assert!(a == b, "{name} differs from the single run's");
    }
}

fn expect_merge_failure(run: Run, must_mention: &[&str]) {
    assert_eq!(run.code, 2, "merge should fail\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    for needle in must_mention {
        assert!(run.stderr.contains(needle), "stderr lacks `{needle}`:\n{}", run.stderr);
    }
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn three_parts_merged_equal_one_run_byte_for_byte() {
    let fixture = fixture();
    let parts: Vec<&Path> = fixture.parts.iter().map(PathBuf::as_path).collect();
    // No part folder looks like a finished model: no index, config or final manifest.
    for part in &parts {
        for name in ["config.json", "model.safetensors.index.json", "squeeze-manifest.json"] {
            assert!(!part.join(name).exists(), "{} holds {name}", part.display());
        }
    }
    let merged = fixture.dir.path().join("merged");
    let report = merge(&merged, &parts).ok().json();
    assert_eq!(report["parts"], 3);
    assert_same_files(&fixture.single, &merged);
    // The merged folder verifies like a single run's.
    squeeze(&["verify", path_str(&merged), "--source", path_str(&fixture.source)]).ok();
    // Merging again (say after an interrupted merge) gives the same folder.
    merge(&merged, &parts).ok();
    assert_same_files(&fixture.single, &merged);
}

#[test]
fn parts_sharing_one_folder_merge_in_place_and_one_part_equals_a_run() {
    let fixture = fixture();
    let shared = fixture.dir.path().join("shared");
    for index in [3, 1, 2] {
        quantize(&fixture.source, &shared, &["--part", &format!("{index}/3")]).ok();
    }
    let report = merge(&shared, &[]).ok().json();
    assert_eq!(report["shards_in_place"], report["shards"]);
    assert_same_files(&fixture.single, &shared);

    let whole = fixture.dir.path().join("whole");
    quantize(&fixture.source, &whole, &["--part", "1/1"]).ok();
    merge(&whole, &[]).ok();
    assert_same_files(&fixture.single, &whole);
}

#[test]
fn a_missing_or_duplicated_part_fails_the_merge_naming_it() {
    let fixture = fixture();
    let [one, two, three] = [0, 1, 2].map(|i| fixture.parts[i].as_path());
    let out = fixture.dir.path().join("merged");
    expect_merge_failure(merge(&out, &[one, three]), &["part 2/3 is missing", "squeeze-part-00002-of-00003.json"]);
    assert!(!out.join("squeeze-manifest.json").exists());

    let again = fixture.dir.path().join("part2-again");
    quantize(&fixture.source, &again, &["--part", "2/3"]).ok();
    expect_merge_failure(merge(&out, &[one, two, three, &again]), &["part 2/3 appears twice", "part2-again"]);

    // A shard a part recorded but that is gone, or damaged, is named with the part.
    let shard = fs::read_dir(three)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let mut bytes = fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    fs::write(&shard, bytes).unwrap();
    expect_merge_failure(merge(&out, &[one, two, three]), &["part 3/3", "differs", "--resume"]);
    fs::remove_file(&shard).unwrap();
    expect_merge_failure(merge(&out, &[one, two, three]), &["part 3/3", "is missing"]);
    assert!(!out.join("config.json").exists() && !out.join("squeeze-manifest.json").exists());
}

#[test]
fn parts_made_with_other_options_or_sources_fail_the_merge_naming_them() {
    let fixture = fixture();
    let [one, two, three] = [0, 1, 2].map(|i| fixture.parts[i].as_path());
    let out = fixture.dir.path().join("merged");

    let other_rule = fixture.dir.path().join("part3-absmax7");
    quantize(&fixture.source, &other_rule, &["--part", "3/3", "--scale-rule", "absmax7"]).ok();
    expect_merge_failure(merge(&out, &[one, two, &other_rule]), &["part 3/3", "different options", "--scale-rule"]);

    // Same layout (shapes, names, sizes), other weights: only the sampled bytes tell the sources apart.
    let other_source = synth(fixture.dir.path(), "fp8-seed1", "kimi-k2", &["--shards", "3", "--seed", "1"]);
    let other_part = fixture.dir.path().join("part2-other-source");
    quantize(&other_source, &other_part, &["--part", "2/3"]).ok();
    expect_merge_failure(merge(&out, &[one, &other_part, three]), &["part 2/3", "different source", "fp8-seed1"]);

    let other_count = fixture.dir.path().join("part1-of-2");
    quantize(&fixture.source, &other_count, &["--part", "1/2"]).ok();
    expect_merge_failure(merge(&out, &[&other_count, two, three]), &["part 2/3", "different part count"]);

    let unfinished = fixture.dir.path().join("not-parts");
    fs::create_dir(&unfinished).unwrap();
    expect_merge_failure(merge(&out, &[one, two, &unfinished]), &["not-parts", "no part manifest"]);
    assert!(!out.join("squeeze-manifest.json").exists());
}

#[test]
fn a_part_resumes_alone_and_refuses_what_is_not_its_own() {
    let fixture = fixture();
    let two = fixture.parts[1].as_path();
    let refused = quantize(&fixture.source, two, &["--part", "2/3"]);
    assert_eq!(refused.code, 2);
    assert!(refused.stderr.contains("part 2/3") && refused.stderr.contains("--resume"), "{}", refused.stderr);
    let resumed = quantize(&fixture.source, two, &["--part", "2/3", "--resume"]).ok().json();
    let own = resumed["part"]["shards"].as_array().unwrap().len();
    assert!(own >= 1);
    assert_eq!(resumed["shards_reused"].as_u64().unwrap() as usize, own);
    // Another part may write into the same folder; a finished conversion's folder is refused.
    quantize(&fixture.source, two, &["--part", "1/3"]).ok();
    let finished = quantize(&fixture.source, &fixture.single, &["--part", "1/3"]);
    assert_eq!(finished.code, 2);
    assert!(finished.stderr.contains("finished conversion"), "{}", finished.stderr);
    // A part number past the shards, a malformed one, and a calibrated method are refused with the remedy.
    let too_many = quantize(&fixture.source, &fixture.dir.path().join("x"), &["--part", "40/40"]);
    assert_eq!(too_many.code, 2);
    assert!(too_many.stderr.contains("at most"), "{}", too_many.stderr);
    let calibrated = quantize(
        &fixture.source,
        &fixture.dir.path().join("x"),
        &["--part", "1/3", "--method", "imatrix", "--calibration", "calibration.txt"],
    );
    assert_eq!(calibrated.code, 2);
    assert!(calibrated.stderr.contains("--method rtn"), "{}", calibrated.stderr);
    let malformed = quantize(&fixture.source, &fixture.dir.path().join("x"), &["--part", "4/3"]);
    assert_eq!(malformed.code, 2);
    assert!(malformed.stderr.contains("I/N"), "{}", malformed.stderr);
    let dry = quantize(&fixture.source, &fixture.dir.path().join("x"), &["--part", "2/3", "--dry-run"]).ok().json();
    assert_eq!(dry["part"]["shards"].as_array().unwrap().len(), own);
    assert!(!fixture.dir.path().join("x").exists());
}
