//! Pipelined layer streaming: a reader thread reads and dequantizes decoder layer `i + 1` while the caller computes
//! layer `i`, so a layer-streamed pass runs at the slower of loading and compute instead of their sum. With a device
//! backend a second thread uploads the read layers' weights ([`Prefetch`]) before handing them over: the reader
//! reads layer `i + 2` from disk while the uploader copies `i + 1` to the GPU and the kernels run `i`, so a pass
//! runs at the slowest of reading, uploading and compute.
//!
//! Memory: the layer computing, the one handed over next (in the channel, or held by the last stage blocked on
//! it), and on a device the one the reader holds while the upload runs — at most three layers' resident weights on
//! the host, two on the device (the one computing, the one uploaded ahead).

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
    /// The reader, and on a device the uploader after it.
    stages: Vec<JoinHandle<()>>,
}

impl<L: StreamedLayer> LayerStream<L> {
    /// Starts loading layers `0..count` of the model folder `dir` (opened again on the reader thread; the
    /// checkpoint is memory-mapped, so this costs only the header parse), uploading each through `prefetch` when
    /// given.
    pub fn start(dir: &Path, count: usize, prefetch: Option<Arc<dyn Prefetch>>) -> Self {
        // Rendezvous channels: a stage holds at most the layer it works on or waits to hand over.
        let (read_sender, read_receiver) = sync_channel(0);
        let dir = dir.to_path_buf();
        let reader = std::thread::spawn(move || {
            let (checkpoint, config) = match open_checkpoint(&dir) {
                Ok(opened) => opened,
                Err(error) => {
                    let _ = read_sender.send(Err(error));
                    return;
                }
            };
            let reader = WeightReader::new(&checkpoint);
            for index in 0..count {
                let layer = L::load(&reader, &config, index);
                let failed = layer.is_err();
                if read_sender.send(layer).is_err() || failed {
                    return;
                }
            }
        });
        let Some(prefetch) = prefetch else { return Self { receiver: read_receiver, stages: vec![reader] } };
        let (upload_sender, receiver) = sync_channel(0);
        let uploader = std::thread::spawn(move || {
            for layer in read_receiver {
                if let Ok(layer) = &layer {
                    prefetch.prefetch(&layer.matrices());
                }
                let failed = layer.is_err();
                if upload_sender.send(layer).is_err() || failed {
                    return;
                }
            }
        });
        Self { receiver, stages: vec![reader, uploader] }
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
        // Unblock the last stage waiting to send (which drops its receiver, unblocking the reader in turn), then
        // wait for every stage so no thread outlives the pass.
        let (_, receiver) = sync_channel(0);
        drop(std::mem::replace(&mut self.receiver, receiver));
        for stage in self.stages.drain(..).rev() {
            let _ = stage.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// Layers loaded so far, across the test's streams (the tests below run one stream each, serialized by `SERIAL`).
    static LOADED: AtomicUsize = AtomicUsize::new(0);
    static SERIAL: Mutex<()> = Mutex::new(());

    struct Marker(usize);

    impl StreamedLayer for Marker {
        fn load(_: &WeightReader, _: &ModelConfig, index: usize) -> Result<Self, RuntimeError> {
            LOADED.fetch_add(1, Ordering::SeqCst);
            Ok(Marker(index))
        }
        fn matrices(&self) -> Vec<&Matrix> {
            Vec::new()
        }
    }

    /// Records each upload; upload `k` (but the last) waits until the reader has loaded layer `k + 1`, which only
    /// a reader running beside the uploader can do.
    struct Uploads {
        count: usize,
        seen: Mutex<Vec<usize>>,
        overlapped: AtomicUsize,
    }

    impl Prefetch for Uploads {
        fn prefetch(&self, _: &[&Matrix]) {
            let mut seen = self.seen.lock().unwrap();
            let k = seen.len();
            seen.push(k);
            drop(seen);
            if k + 1 < self.count {
                let started = Instant::now();
                while LOADED.load(Ordering::SeqCst) < k + 2 && started.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if LOADED.load(Ordering::SeqCst) >= k + 2 {
                    self.overlapped.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    fn demo_model() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("eval").join(crate::demo_model::NAME)
    }

    #[test]
    fn on_a_device_the_next_layer_is_read_while_this_one_uploads() {
        let _serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        LOADED.store(0, Ordering::SeqCst);
        let count = 5;
        let uploads = Arc::new(Uploads { count, seen: Mutex::new(Vec::new()), overlapped: AtomicUsize::new(0) });
        let mut stream = LayerStream::<Marker>::start(&demo_model(), count, Some(uploads.clone()));
        for index in 0..count {
            let (layer, _) = stream.next_layer().unwrap();
            assert_eq!(layer.0, index);
            assert!(uploads.seen.lock().unwrap().contains(&index), "layer {index} handed over before its upload");
        }
        assert_eq!(uploads.overlapped.load(Ordering::SeqCst), count - 1, "uploads that saw the next layer read");
    }

    #[test]
    fn a_stream_dropped_early_stops_both_stages() {
        let _serial = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        LOADED.store(0, Ordering::SeqCst);
        let uploads = Arc::new(Uploads { count: 0, seen: Mutex::new(Vec::new()), overlapped: AtomicUsize::new(0) });
        let mut stream = LayerStream::<Marker>::start(&demo_model(), 1000, Some(uploads.clone()));
        assert_eq!(stream.next_layer().unwrap().0 .0, 0);
        drop(stream); // joins the reader and the uploader: returns only once both stopped
        let loaded = LOADED.load(Ordering::SeqCst);
        assert!(loaded <= 4, "{loaded} layers loaded for 1 taken: the stages ran ahead unbounded");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(LOADED.load(Ordering::SeqCst), loaded, "a stage kept loading after the drop");
    }
}
