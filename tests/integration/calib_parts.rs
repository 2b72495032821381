//! `squeeze calibrate-kv --part I/N --save-stats FILE` and `squeeze merge-calib MODEL FILE…`: three parts merged
//! write the scales of one run, byte for byte (MLA, and GQA per head); a missing, duplicated or differently made
//! part, or another model, fails the merge with exit 2 naming it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::calibrate::write_tokens;
use crate::common::{files, path_str, squeeze, synth, Run};

fn calibrate(model: &Path, tokens: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["calibrate-kv", path_str(model), "--tokens", path_str(tokens), "--device", "cpu", "--json"];
    args.extend_from_slice(extra);
    squeeze(&args)
}

fn without_run_fields(mut report: Value) -> Value {
    if let Some(map) = report.as_object_mut() {
        map.remove("seconds");
        map.remove("written");
    }
    report
}

/// Parts 1..=3 of a calibration of `model` and their statistics files.
fn parts(dir: &Path, model: &Path, tokens: &Path, extra: &[&str], name: &str) -> Vec<PathBuf> {
    (1..=3)
        .map(|index| {
            let file = dir.join(format!("{name}-{index}.safetensors"));
            let part = format!("{index}/3");
            let mut args = vec!["--part", part.as_str(), "--save-stats", path_str(&file)];
            args.extend_from_slice(extra);
            calibrate(model, tokens, &args).ok();
            file
        })
        .collect()
}

fn merge_calib(model: &Path, out: &Path, files: &[PathBuf]) -> Run {
    let mut args = vec!["merge-calib", path_str(model), "--out", path_str(out), "--json"];
    args.extend(files.iter().map(|f| path_str(f)));
    squeeze(&args)
}

fn assert_merge_equals_one_run(arch: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), arch, arch, &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 7, 24, 384);
    let single_out = dir.path().join("single");
    let mut args = vec!["--out", path_str(&single_out)];
    args.extend_from_slice(extra);
    let single = calibrate(&model, &tokens, &args).ok().json();
    let before = files(&model);
    let files_of_parts = parts(dir.path(), &model, &tokens, extra, "calib");
    assert_eq!(files(&model), before, "a part writes nothing into the model");
    let merged_out = dir.path().join("merged");
    let merged = merge_calib(&model, &merged_out, &files_of_parts).ok().json();
    assert_eq!(without_run_fields(merged), without_run_fields(single));
    assert_eq!(files(&merged_out), files(&single_out), "{arch}: the merged scales differ from one run's");
}

#[test]
fn three_calibration_parts_write_the_scales_of_one_run() {
    assert_merge_equals_one_run("kimi-k2", &[]);
    assert_merge_equals_one_run("glm45", &["--strategy", "head", "--percentile", "99.9"]);
}

#[test]
fn a_missing_duplicated_or_different_calibration_part_fails_the_merge_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 6, 24, 384);
    let files_of_parts = parts(dir.path(), &model, &tokens, &[], "calib");
    let out = dir.path().join("out");
    let expect = |run: Run, needles: &[&str]| {
        assert_eq!(run.code, 2, "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
        for needle in needles {
            assert!(run.stderr.contains(needle), "stderr lacks `{needle}`:\n{}", run.stderr);
        }
    };
    let [one, two, three] = [0, 1, 2].map(|i| files_of_parts[i].clone());
    expect(merge_calib(&model, &out, &[one.clone(), three.clone()]), &["part 2/3 is missing"]);
    expect(
        merge_calib(&model, &out, &[one.clone(), two.clone(), three.clone(), two.clone()]),
        &["part 2/3 appears twice"],
    );
    let other = dir.path().join("p99-2.safetensors");
    calibrate(&model, &tokens, &["--part", "2/3", "--save-stats", path_str(&other), "--percentile", "99"]).ok();
    expect(merge_calib(&model, &out, &[one.clone(), other, three.clone()]), &["part 2/3", "different flags"]);
    let other_model = synth(dir.path(), "other-model", "glm45", &["--layers", "2"]);
    expect(
        merge_calib(&other_model, &out, &[one, two, three]),
        &["other-model", "is not the model the parts calibrated"],
    );
    assert!(!out.join("kv-scales.safetensors").exists());
    let refused = calibrate(&model, &tokens, &["--part", "1/3", "--save-stats", "x.safetensors", "--out", "y"]);
    assert_eq!(refused.code, 2);
    assert!(refused.stderr.contains("merge-calib"), "{}", refused.stderr);
}
