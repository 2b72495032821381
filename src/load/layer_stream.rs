//! Double-buffered layer streaming: a loader thread reads and dequantizes decoder layer `i + 1` while the caller
//! computes layer `i`, so a layer-streamed pass runs at the slower of loading and compute instead of their sum.
//! At most two layers' resident weights are in memory (the one computing and the one loaded ahead). With a device
//! backend the loader also uploads the loaded layer's weights ([`Prefetch`]) before handing it over, so the copy to
//! the GPU overlaps the current layer's kernels too.

use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::open::open_checkpoint;
use super::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::backend::Prefetch;
use crate::runtime::matrix::Matrix;
use crate::runtime::RuntimeError;

/// A decoder layer's resident weights as the stream loads them (the architectures implement it).
pub trait StreamedLayer: Sized + Send + 'static {
    /// Reads and dequantizes layer `index`.
    fn load(reader: &WeightReader, config: &ModelConfig, index: usize) -> Result<Self, RuntimeError>;
    /// The resident weight matrices, for device prefetch.
    fn matrices(&self) -> Vec<&Matrix>;
}

/// The decoder layers of one checkpoint, in order.
pub struct LayerStream<L: StreamedLayer> {
    receiver: Receiver<Result<L, RuntimeError>>,
    loader: Option<JoinHandle<()>>,
}

impl<L: StreamedLayer> LayerStream<L> {
    /// Starts loading layers `0..count` of the model folder `dir` (opened again on the loader thread; the
    /// checkpoint is memory-mapped, so this costs only the header parse).
    pub fn start(dir: &Path, count: usize, prefetch: Option<Arc<dyn Prefetch>>) -> Self {
        // Capacity 1: one layer waits in the channel while the loader holds none (it blocks on send).
        let (sender, receiver) = sync_channel(1);
        let dir = dir.to_path_buf();
        let loader = std::thread::spawn(move || {
            let (checkpoint, config) = match open_checkpoint(&dir) {
                Ok(opened) => opened,
                Err(error) => {
                    let _ = sender.send(Err(error));
                    return;
                }
            };
            let reader = WeightReader::new(&checkpoint);
            for index in 0..count {
                let layer = L::load(&reader, &config, index);
                if let (Ok(layer), Some(prefetch)) = (&layer, &prefetch) {
                    prefetch.prefetch(&layer.matrices());
                }
                let failed = layer.is_err();
                if sender.send(layer).is_err() || failed {
                    return;
                }
            }
        });
        Self { receiver, loader: Some(loader) }
    }

    /// The next layer and the seconds spent waiting for it (loading not hidden behind compute).
    pub fn next_layer(&mut self) -> Result<(L, f64), RuntimeError> {
        let started = Instant::now();
        let layer = self
            .receiver
            .recv()
            .map_err(|_| RuntimeError::Input("the layer loader stopped early (it panicked; see stderr)".into()))??;
        Ok((layer, started.elapsed().as_secs_f64()))
    }
}

impl<L: StreamedLayer> Drop for LayerStream<L> {
    fn drop(&mut self) {
        // Unblock a loader waiting to send, then wait for it so no thread outlives the pass.
        let (_, receiver) = sync_channel(0);
        drop(std::mem::replace(&mut self.receiver, receiver));
        if let Some(loader) = self.loader.take() {
            let _ = loader.join();
        }
    }
}
