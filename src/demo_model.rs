//! The trained tiny Shakespeare checkpoint (`eval/tiny-shakespeare-fp8`) and its texts, embedded in the binary so
//! `squeeze demo` runs a real model from any directory.

use std::path::Path;

use crate::io::atomic::write_file;
use crate::io::IoError;

/// The folder name the checkpoint has in the repository.
pub const NAME: &str = "tiny-shakespeare-fp8";

/// Every file of `eval/tiny-shakespeare-fp8/`, by name.
const FILES: [(&str, &[u8]); 7] = [
    ("config.json", include_bytes!("../eval/tiny-shakespeare-fp8/config.json")),
    ("generation_config.json", include_bytes!("../eval/tiny-shakespeare-fp8/generation_config.json")),
    ("model.safetensors", include_bytes!("../eval/tiny-shakespeare-fp8/model.safetensors")),
    ("tiktoken.model", include_bytes!("../eval/tiny-shakespeare-fp8/tiktoken.model")),
    ("tokenizer.json", include_bytes!("../eval/tiny-shakespeare-fp8/tokenizer.json")),
    ("tokenizer_config.json", include_bytes!("../eval/tiny-shakespeare-fp8/tokenizer_config.json")),
    ("training.json", include_bytes!("../eval/tiny-shakespeare-fp8/training.json")),
];

/// The held-out play (The Tempest, never seen in training; `eval/shakespeare-heldout.txt`).
const HELDOUT: &str = include_str!("../eval/shakespeare-heldout.txt");

/// Where the play's dialogue starts (before it: the title page and the cast list).
const DIALOGUE_START: &str = "ACT 1\n";

/// The task file made from the held-out play (`eval/tempest-tasks.jsonl`, `scripts/make-task-file.py`).
pub const TASKS: &str = include_str!("../eval/tempest-tasks.jsonl");

/// The task the demo runs: which of four words ends a line of the held-out play.
pub const DEMO_TASK: &str = "tempest-next-word";

/// Shakespeare's sonnets 1, 2 and 18 (`eval/sonnets.txt`): training-like text for KV calibration.
pub const SONNETS: &str = include_str!("../eval/sonnets.txt");

/// What was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Unpacked {
    pub name: &'static str,
    pub files: usize,
    pub bytes: u64,
}

/// Writes the checkpoint's files into `dir` (created if missing), each atomically.
pub fn write_checkpoint(dir: &Path) -> Result<Unpacked, IoError> {
    std::fs::create_dir_all(dir).map_err(|e| IoError::file(dir, e))?;
    let mut bytes = 0;
    for (name, content) in FILES {
        write_file(&dir.join(name), content)?;
        bytes += content.len() as u64;
    }
    Ok(Unpacked { name: NAME, files: FILES.len(), bytes })
}

/// The first `bytes` bytes (fewer if the play is shorter) of the held-out play's dialogue, from Act 1 on.
pub fn heldout_dialogue(bytes: usize) -> &'static str {
    let start = HELDOUT.find(DIALOGUE_START).unwrap_or(0);
    let text = &HELDOUT[start..];
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dialogue_excerpt_starts_at_act_one_and_has_the_length_asked() {
        let text = heldout_dialogue(4096);
        assert!(text.starts_with("ACT 1\nSCENE 1"), "{}", &text[..40]);
        assert_eq!(text.len(), 4096);
        assert!(heldout_dialogue(usize::MAX).len() < HELDOUT.len());
    }

    #[test]
    fn the_written_checkpoint_is_byte_identical_to_the_repository_folder() {
        let folder = tempfile::tempdir().unwrap();
        let dir = folder.path().join("model");
        let written = write_checkpoint(&dir).unwrap();
        assert_eq!(written.files, FILES.len());
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("eval").join(NAME);
        for entry in std::fs::read_dir(&repository).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(dir.join(name)).unwrap(), "{name:?}");
        }
    }
}
