//! MoE routing on the device: kernels/routing.cu (sigmoid scores, group-limited top-k, gate weights).

use crate::runtime::backend::ROUTING_NEAR_TIE_RELATIVE as NEAR_TIE_RELATIVE;
use crate::runtime::backend::{Routes, RoutingShape};
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

use super::checks::buffers_hold;
use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;

use super::checks::unsupported;
use super::state::CudaBackend;
use super::tensor::{buffer, download_decisions, words};
use crate::runtime::device::DeviceWeight;

/// Tokens per block: one warp each (the kernel's `kRouteWarps`).
const TOKENS_PER_BLOCK: usize = 4;
/// Experts a warp holds (the kernel's `kRouteMaxExperts`).
pub const MAX_EXPERTS: usize = 512;
/// Groups are scored one per lane.
pub const MAX_GROUPS: usize = 32;
/// Chosen experts are held one per lane.
pub const MAX_TOP_K: usize = 32;

/// Checks what the kernel supports.
pub fn check(tokens: usize, shape: &RoutingShape) -> Result<(), CudaError> {
    let RoutingShape { experts, top_k, groups, .. } = *shape;
    if experts == 0 || experts > MAX_EXPERTS {
        return Err(unsupported("route", format!("{experts} experts; the routing kernel takes 1 to {MAX_EXPERTS}")));
    }
    if top_k == 0 || top_k > experts.min(MAX_TOP_K) {
        return Err(unsupported(
            "route",
            format!("top-k {top_k} of {experts} experts; the routing kernel takes 1 to {}", experts.min(MAX_TOP_K)),
        ));
    }
    if groups == 0 || groups > experts.min(MAX_GROUPS) {
        return Err(unsupported(
            "route",
            format!(
                "{groups} expert groups of {experts} experts; the routing kernel takes 1 to {}",
                experts.min(MAX_GROUPS)
            ),
        ));
    }
    if tokens > i32::MAX as usize / experts {
        return Err(unsupported("route", format!("{tokens} tokens of {experts} logits overflow the kernel's indices")));
    }
    Ok(())
}

/// Device buffers of one routing launch: `logits` f32 `[tokens, experts]`, `bias` f32 `[experts]`; out
/// `experts` i32 `[tokens, top_k]`, `weights` f32 `[tokens, top_k]`, `near_tie` i32 `[tokens]`.
pub struct RouteBuffers<'a> {
    pub logits: &'a DeviceBuffer,
    pub bias: &'a DeviceBuffer,
    pub experts: &'a DeviceBuffer,
    pub weights: &'a DeviceBuffer,
    pub near_tie: &'a DeviceBuffer,
}

/// Launches `route_sigmoid_topk` on device-resident buffers.
pub fn launch_route(
    device: &dyn Device,
    buffers: &RouteBuffers,
    tokens: usize,
    shape: &RoutingShape,
) -> Result<(), CudaError> {
    check(tokens, shape)?;
    let sizes = [
        ("logits", buffers.logits.bytes(), tokens * shape.experts * 4),
        ("correction bias", buffers.bias.bytes(), shape.experts * 4),
        ("expert output", buffers.experts.bytes(), tokens * shape.top_k * 4),
        ("weight output", buffers.weights.bytes(), tokens * shape.top_k * 4),
        ("near-tie output", buffers.near_tie.bytes(), tokens * 4),
    ];
    buffers_hold("route", &sizes)?;
    if tokens == 0 {
        return Ok(());
    }
    let blocks = tokens.div_ceil(TOKENS_PER_BLOCK);
    device.launch(
        "route_sigmoid_topk",
        LaunchShape::linear(blocks as u32, (TOKENS_PER_BLOCK * 32) as u32),
        &[
            Arg::Buffer(buffers.logits),
            Arg::Buffer(buffers.bias),
            Arg::Buffer(buffers.experts),
            Arg::Buffer(buffers.weights),
            Arg::Buffer(buffers.near_tie),
            Arg::I32(tokens as i32),
            Arg::I32(shape.experts as i32),
            Arg::I32(shape.groups as i32),
            Arg::I32(shape.topk_group.min(shape.groups) as i32),
            Arg::I32(shape.top_k as i32),
            Arg::I32(shape.norm_topk_prob as i32),
            Arg::F32(shape.routed_scaling_factor),
            Arg::F32(NEAR_TIE_RELATIVE),
        ],
    )
}

/// Routes each `[experts]`-row of `logits` on the device; the choices come back as decisions.
pub fn route(
    backend: &CudaBackend,
    logits: &Tensor,
    correction_bias: &Matrix,
    shape: &RoutingShape,
) -> Result<Routes, CudaError> {
    let tokens = logits.rows();
    check(tokens, shape)?;
    if logits.columns() != shape.experts || correction_bias.values().len() != shape.experts {
        return Err(unsupported(
            "route",
            format!(
                "logits rows of {} and {} biases for {} experts",
                logits.columns(),
                correction_bias.values().len(),
                shape.experts
            ),
        ));
    }
    let device = backend.device();
    let bias = backend.weight(correction_bias)?;
    let DeviceWeight::Dense(bias) = bias.as_ref() else {
        return Err(unsupported("route", "the correction bias is INT4"));
    };
    let experts = device.alloc_for::<i32>((tokens * shape.top_k).max(1))?;
    let weights = device.alloc_for::<f32>((tokens * shape.top_k).max(1))?;
    let near_tie = device.alloc_for::<i32>(tokens.max(1))?;
    let buffers =
        RouteBuffers { logits: buffer(logits)?, bias, experts: &experts, weights: &weights, near_tie: &near_tie };
    launch_route(device, &buffers, tokens, shape)?;
    let [experts, weights, near_tie] = download_decisions(backend, [&experts, &weights, &near_tie])?;
    let picks = tokens * shape.top_k;
    let chosen: Vec<usize> =
        words(&experts).take(picks).map(|expert| usize::try_from(expert as i32).unwrap_or(usize::MAX)).collect();
    if let Some(bad) = chosen.iter().find(|&&expert| expert >= shape.experts) {
        return Err(unsupported("route", format!("the kernel chose expert {bad} of {}", shape.experts)));
    }
    Ok(Routes {
        top_k: shape.top_k,
        experts: chosen,
        weights: words(&weights).take(picks).map(f32::from_bits).collect(),
        near_ties: words(&near_tie).take(tokens).filter(|&tie| tie != 0).count(),
    })
}
