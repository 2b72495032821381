//! `squeeze eval --part I/N --save-stats FILE` and `squeeze merge-eval`: three parts merged give the report of one
//! run to the bit (one model, and parity of all four modes); a missing, duplicated or differently made part fails
//! the merge with exit 2 naming it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::calibrate::write_tokens;
use crate::common::{path_str, squeeze, synth, Run};

/// Keys that are times (they differ between any two runs) and are summed, not recomputed, by the merge.
const TIMES: [&str; 4] = ["seconds", "tokens_per_second", "load_seconds", "compute_seconds"];

fn without_times(mut report: Value) -> Value {
    if let Some(map) = report.as_object_mut() {
        for key in TIMES {
            map.remove(key);
        }
    }
    report
}

struct Fixture {
    dir: tempfile::TempDir,
    reference: PathBuf,
    candidate: PathBuf,
    tokens: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let reference = synth(dir.path(), "fp8", "kimi-k2", &[]);
    let candidate = dir.path().join("int4");
    squeeze(&["quantize", path_str(&reference), path_str(&candidate), "--device", "cpu"]).ok();
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 7, 20, 384);
    Fixture { dir, reference, candidate, tokens }
}

/// `eval` with the fixture's tokens on the CPU plus `extra`.
fn eval(fixture: &Fixture, models: &[&str], extra: &[&str]) -> Run {
    let mut args = vec!["eval", "--tokens", path_str(&fixture.tokens), "--device", "cpu", "--json"];
    args.extend_from_slice(models);
    args.extend_from_slice(extra);
    squeeze(&args)
}

/// Runs parts 1..=3 and returns their statistics files.
fn parts(fixture: &Fixture, models: &[&str], name: &str) -> Vec<PathBuf> {
    (1..=3)
        .map(|index| {
            let file = fixture.dir.path().join(format!("{name}-{index}.safetensors"));
            let part = format!("{index}/3");
            eval(fixture, models, &["--part", &part, "--save-stats", path_str(&file)]).ok();
            file
        })
        .collect()
}

fn merge_eval(files: &[&Path]) -> Run {
    let mut args = vec!["merge-eval", "--json"];
    args.extend(files.iter().map(|f| path_str(f)));
    squeeze(&args)
}

#[test]
fn three_eval_parts_merged_equal_one_run_to_the_bit() {
    let fixture = fixture();
    let model = [path_str(&fixture.candidate)];
    let single = eval(&fixture, &model, &[]).ok().json();
    let files = parts(&fixture, &model, "eval");
    // A part reports its own chunks only.
    let second = eval(&fixture, &model, &["--part", "2/3", "--save-stats", path_str(&files[1])]).ok().json();
    assert_eq!(second["chunks"], 2);
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let merged = merge_eval(&[files[2], files[0], files[1]]).ok().json();
    assert_eq!(without_times(merged), without_times(single.clone()));
    // One run's own statistics file merges to its report as well.
    let whole = fixture.dir.path().join("whole.safetensors");
    eval(&fixture, &model, &["--save-stats", path_str(&whole)]).ok();
    assert_eq!(without_times(merge_eval(&[&whole]).ok().json()), without_times(single));
}

#[test]
fn three_parity_parts_merged_equal_one_run_to_the_bit() {
    let fixture = fixture();
    let models = [
        "--reference",
        path_str(&fixture.reference),
        "--candidate",
        path_str(&fixture.candidate),
        "--kv-scales",
        "one",
    ];
    // Gates loose enough that the random model passes them (the exit code is compared below too).
    let gates = ["--max-mean-kld", "100", "--min-same-top", "0", "--max-ppl-ratio", "100"];
    let args: Vec<&str> = models.iter().chain(&gates).copied().collect();
    let single = eval(&fixture, &args, &[]).ok().json();
    let files = parts(&fixture, &args, "parity");
    let files: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let merged = merge_eval(&files).ok().json();
    assert_eq!(merged["chunks"], 7);
    assert_eq!(without_times(merged), without_times(single));
    let human = squeeze(&["merge-eval", path_str(files[0]), path_str(files[1]), path_str(files[2])]).ok();
    assert!(human.stdout.contains("merged 3 part(s)") && human.stdout.contains("Mean KLD"), "{}", human.stdout);

    // Default gates: the random candidate fails them, and the merge says so as one run does (exit 1).
    let strict = parts(&fixture, &models, "strict");
    let strict: Vec<&Path> = strict.iter().map(PathBuf::as_path).collect();
    let failed = merge_eval(&strict);
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    assert!(failed.stderr.contains("gate"), "{}", failed.stderr);
}

#[test]
fn a_missing_duplicated_or_different_eval_part_fails_the_merge_naming_it() {
    let fixture = fixture();
    let model = [path_str(&fixture.candidate)];
    let files = parts(&fixture, &model, "eval");
    let [one, two, three] = [0, 1, 2].map(|i| files[i].as_path());
    let expect = |run: Run, needles: &[&str]| {
        assert_eq!(run.code, 2, "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
        for needle in needles {
            assert!(run.stderr.contains(needle), "stderr lacks `{needle}`:\n{}", run.stderr);
        }
    };
    expect(merge_eval(&[one, three]), &["part 2/3 is missing", "--part 2/3"]);
    expect(merge_eval(&[one, two, two, three]), &["part 2/3 appears twice"]);
    // Other input chunks (one more row) for part 3.
    let other_tokens = fixture.dir.path().join("other.safetensors");
    write_tokens(&other_tokens, 8, 20, 384);
    let other = fixture.dir.path().join("other-3.safetensors");
    squeeze(&[
        "eval",
        path_str(&fixture.candidate),
        "--tokens",
        path_str(&other_tokens),
        "--device",
        "cpu",
        "--part",
        "3/3",
        "--save-stats",
        path_str(&other),
    ])
    .ok();
    expect(merge_eval(&[one, two, &other]), &["part 3/3", "different input", "other-3.safetensors"]);
    // Another model for part 2.
    let fp8 = fixture.dir.path().join("fp8-2.safetensors");
    eval(&fixture, &[path_str(&fixture.reference)], &["--part", "2/3", "--save-stats", path_str(&fp8)]).ok();
    expect(merge_eval(&[one, &fp8, three]), &["part 2/3", "different model"]);
    // A file that is not a statistics file.
    expect(merge_eval(&[one, two, &fixture.tokens]), &["tokens.safetensors", "not a squeeze statistics file"]);
    // --part needs --save-stats, and more parts than chunks are refused.
    let no_stats = eval(&fixture, &model, &["--part", "1/3"]);
    assert_eq!(no_stats.code, 2);
    assert!(no_stats.stderr.contains("--save-stats"), "{}", no_stats.stderr);
    let scratch = fixture.dir.path().join("x.safetensors");
    let too_many = eval(&fixture, &model, &["--part", "8/8", "--save-stats", path_str(&scratch)]);
    assert_eq!(too_many.code, 2);
    assert!(too_many.stderr.contains("at most 7 parts"), "{}", too_many.stderr);
}
