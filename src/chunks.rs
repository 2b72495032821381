//! The token chunks a job runs through a model (`eval`, parity, `calibrate-kv`): a text file tokenized with the
//! model's tokenizer and cut into `ctx`-token chunks, or a safetensors file holding `input_ids` `[n, ctx]` (I32 or
//! I64), used as given (no BOS added).

use std::path::{Path, PathBuf};

use crate::io::ShardFile;
use crate::model::tokenizer::Tokenizer;

/// Where the tokens come from.
#[derive(Debug, Clone)]
pub enum EvalInput {
    /// UTF-8 text, tokenized with the model's tokenizer and cut into `ctx`-token chunks.
    Text { path: PathBuf, ctx: usize },
    /// A safetensors file with an integer tensor `input_ids` `[n, ctx]` (I32 or I64).
    Tokens { path: PathBuf },
}

/// Why the chunks could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
    #[error(transparent)]
    Tokenizer(#[from] crate::model::tokenizer::TokenizerError),
    #[error("{0}")]
    Input(String),
}

/// Non-overlapping `ctx`-token chunks of a UTF-8 text file; a shorter tail is dropped.
pub fn chunks_from_text(model: &Path, text_file: &Path, ctx: usize) -> Result<Vec<Vec<u32>>, ChunkError> {
    let text = std::fs::read_to_string(text_file)
        .map_err(|e| ChunkError::Input(format!("{}: {e} (expected a UTF-8 text file)", text_file.display())))?;
    let tokenizer = Tokenizer::from_dir(model)?;
    let ids = tokenizer.encode(&text)?;
    if ctx < 2 {
        return Err(ChunkError::Input("--ctx must be at least 2".into()));
    }
    if ids.len() < ctx {
        return Err(ChunkError::Input(format!(
            "{}: {} tokens, fewer than one chunk of --ctx {ctx}; use a longer text or a smaller --ctx",
            text_file.display(),
            ids.len()
        )));
    }
    Ok(ids.chunks_exact(ctx).map(<[u32]>::to_vec).collect())
}

/// The rows of `input_ids` in a safetensors file.
pub fn read_token_file(path: &Path) -> Result<Vec<Vec<u32>>, ChunkError> {
    let file = ShardFile::open(path)?;
    let tensor = file.get("input_ids").ok_or_else(|| {
        ChunkError::Input(format!(
            "{}: has no tensor `input_ids`; write input_ids [n, ctx] as I32 or I64",
            path.display()
        ))
    })?;
    let [rows, ctx] = match tensor.shape {
        [rows, ctx] => [*rows, *ctx],
        other => {
            return Err(ChunkError::Input(format!(
                "{}: tensor `input_ids` has shape {other:?}, expected [n, ctx]",
                path.display()
            )))
        }
    };
    let values: Vec<i64> = match crate::io::dtype::integers(tensor.dtype, tensor.bytes) {
        Some(values) => values,
        None => {
            let other = tensor.dtype;
            return Err(ChunkError::Input(format!(
                "{}: tensor `input_ids` has dtype {other}, expected I32 or I64",
                path.display()
            )));
        }
    };
    if let Some(bad) = values.iter().find(|v| **v < 0 || **v > u32::MAX as i64) {
        return Err(ChunkError::Input(format!(
            "{}: tensor `input_ids` holds {bad}, which is not a token id",
            path.display()
        )));
    }
    let ids: Vec<u32> = values.into_iter().map(|v| v as u32).collect();
    Ok(if ctx == 0 { vec![Vec::new(); rows] } else { ids.chunks(ctx).map(<[u32]>::to_vec).collect() })
}

/// Reads `input` (text tokenized with the tokenizer in `model`, or a token file), keeps at most `limit` chunks and
/// checks there is at least one chunk of at least `min_ctx` tokens, all inside a vocabulary of `vocab`.
pub fn load_sequences(
    input: &EvalInput,
    model: &Path,
    limit: Option<usize>,
    min_ctx: usize,
    vocab: usize,
) -> Result<Vec<Vec<u32>>, ChunkError> {
    let mut sequences = match input {
        EvalInput::Text { path, ctx } => chunks_from_text(model, path, *ctx)?,
        EvalInput::Tokens { path } => read_token_file(path)?,
    };
    if let Some(limit) = limit {
        sequences.truncate(limit.max(1));
    }
    if sequences.is_empty() {
        return Err(ChunkError::Input(
            "no chunks to evaluate; give a longer text, a smaller --ctx/--seq-len or more input_ids rows".into(),
        ));
    }
    let ctx = sequences[0].len();
    if ctx < min_ctx {
        return Err(ChunkError::Input(format!(
            "chunks of {ctx} token(s) are too short: this needs at least {min_ctx} per chunk; use a larger --ctx"
        )));
    }
    if let Some(bad) = sequences.iter().flatten().find(|&&id| id as usize >= vocab) {
        return Err(ChunkError::Input(format!(
            "token id {bad} is outside the model's vocabulary of {vocab}; the tokens were made for another model"
        )));
    }
    Ok(sequences)
}
