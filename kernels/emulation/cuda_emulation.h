// Host emulation of the CUDA subset squeeze's kernels use, so the same .cu sources compile with g++ and run on CPU.
//
// Model: the grid runs block by block; within a block every CUDA thread is a cooperative fiber with its own stack,
// scheduled round-robin on one OS thread (started with makecontext/setcontext, then switched with _setjmp/_longjmp,
// which unlike swapcontext save no signal mask: no system call per switch; compile without _FORTIFY_SOURCE, whose
// longjmp check refuses a jump to another stack). `__syncthreads` is a barrier over the block's live threads,
// `__syncwarp` one over the warp's; warp shuffles/votes exchange values through per-thread slots between two warp
// barriers, and so does the one tensor-core instruction squeeze uses (`mma_bf16_m16n8k16`: every lane's fragments
// gathered, each lane's four outputs summed in k order). `__shared__` variables are function statics (one block runs
// at a time); the launch's dynamic shared memory is one buffer, refilled with 0xA5 bytes before every block (a
// kernel that reads what it never wrote sees garbage, as on a GPU). Atomics are plain
// read-modify-writes (fibers never preempt each other). Float intrinsics map to the host's IEEE operations
// (compile with -ffp-contract=off so no FMA appears); rintf, powf and friends are the host libm's, the same ones
// Rust's f32 methods call.
//
// Use: compile with -DSQUEEZE_EMULATION (common.cuh then includes this file) and launch with
// `cuda_emulation::launch(kernel, grid, block, args...)`.
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <array>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __constant__ static
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace cuda_emulation {

constexpr unsigned kWarpSize = 32;
constexpr size_t kStackBytes = 256 * 1024;

struct Fiber {
    // The fiber's start (makecontext), and where it yielded.
    ucontext_t context;
    jmp_buf resume;
    bool started;
    uint3 thread_idx;
    bool done;
    std::vector<char> stack;
};

struct State {
    dim3 grid, block;
    uint3 block_idx{0, 0, 0};
    std::vector<Fiber> fibers;
    size_t current = 0;
    jmp_buf scheduler;
    std::function<void()> entry;
    unsigned live = 0;
    unsigned block_arrived = 0;
    unsigned long block_generation = 0;
    std::vector<unsigned> warp_live, warp_arrived;
    std::vector<unsigned long> warp_generation;
    std::vector<uint64_t> slots;
    // Per thread: the A (4 words) and B (2 words) fragments of a warp-wide MMA.
    std::vector<std::array<uint32_t, 6>> fragments;
    std::vector<unsigned char> dynamic_shared;
};

inline State& state() {
    static State s;
    return s;
}

inline size_t linear_thread() { return state().current; }

// Gives the CPU back to the scheduler; the fiber resumes on its next turn.
inline void yield() {
    State& s = state();
    if (_setjmp(s.fibers[s.current].resume) == 0) _longjmp(s.scheduler, 1);
}

inline void block_barrier() {
    State& s = state();
    const unsigned long generation = s.block_generation;
    s.block_arrived += 1;
    while (s.block_generation == generation) {
        if (s.block_arrived >= s.live) {
            s.block_arrived = 0;
            s.block_generation += 1;
            break;
        }
        yield();
    }
}

inline void warp_barrier() {
    State& s = state();
    const size_t warp = s.current / kWarpSize;
    const unsigned long generation = s.warp_generation[warp];
    s.warp_arrived[warp] += 1;
    while (s.warp_generation[warp] == generation) {
        if (s.warp_arrived[warp] >= s.warp_live[warp]) {
            s.warp_arrived[warp] = 0;
            s.warp_generation[warp] += 1;
            break;
        }
        yield();
    }
}

inline void trampoline() {
    State& s = state();
    s.entry();
    s.fibers[s.current].done = true;
    s.live -= 1;
    s.warp_live[s.current / kWarpSize] -= 1;
    _longjmp(s.scheduler, 1);
}

inline void run_block() {
    State& s = state();
    const size_t threads = (size_t)s.block.x * s.block.y * s.block.z;
    const size_t warps = (threads + kWarpSize - 1) / kWarpSize;
    if (s.fibers.size() < threads) s.fibers.resize(threads);
    s.warp_live.assign(warps, 0);
    s.warp_arrived.assign(warps, 0);
    s.warp_generation.assign(warps, 0);
    s.slots.assign(threads, 0);
    s.fragments.assign(threads, {});
    std::memset(s.dynamic_shared.data(), 0xA5, s.dynamic_shared.size());
    s.live = (unsigned)threads;
    s.block_arrived = 0;
    for (size_t t = 0; t < threads; ++t) {
        Fiber& fiber = s.fibers[t];
        fiber.thread_idx = uint3{(unsigned)(t % s.block.x), (unsigned)((t / s.block.x) % s.block.y),
                                 (unsigned)(t / ((size_t)s.block.x * s.block.y))};
        fiber.done = false;
        fiber.started = false;
        if (fiber.stack.empty()) {
            fiber.stack.resize(kStackBytes);
            getcontext(&fiber.context);
        }
        fiber.context.uc_stack.ss_sp = fiber.stack.data();
        fiber.context.uc_stack.ss_size = fiber.stack.size();
        fiber.context.uc_link = nullptr;
        makecontext(&fiber.context, trampoline, 0);
        s.warp_live[t / kWarpSize] += 1;
    }
    size_t remaining = threads;
    while (remaining > 0) {
        for (size_t t = 0; t < threads; ++t) {
            if (s.fibers[t].done) continue;
            s.current = t;
            if (_setjmp(s.scheduler) == 0) {
                Fiber& fiber = s.fibers[t];
                if (!fiber.started) {
                    fiber.started = true;
                    setcontext(&fiber.context);
                }
                _longjmp(fiber.resume, 1);
            }
            if (s.fibers[s.current].done) remaining -= 1;
        }
    }
}

// Runs `kernel(args...)` over the grid, block by block, with `shared_bytes` of dynamic shared memory.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
    State& s = state();
    s.dynamic_shared.assign(shared_bytes, 0xA5);
    s.grid = grid;
    s.block = block;
    s.entry = [=]() { kernel(static_cast<Params>(args)...); };
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                s.block_idx = uint3{x, y, z};
                run_block();
            }
}

// Writes `value` to this thread's slot, waits for the warp, reads lane `source` (this lane when out of range).
template <class T>
T exchange(T value, int source_lane) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffles move at most 8 bytes");
    State& s = state();
    const size_t me = s.current;
    const size_t base = me - me % kWarpSize;
    std::memcpy(&s.slots[me], &value, sizeof(T));
    warp_barrier();
    const size_t source = base + (size_t)source_lane;
    T result = value;
    if (source_lane >= 0 && source_lane < (int)kWarpSize && source < s.fibers.size() && source < s.slots.size())
        std::memcpy(&result, &s.slots[source], sizeof(T));
    warp_barrier();
    return result;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with D = C (`d` in and out): A 16×16 and B 16×8 BF16, each
// lane holding the PTX ISA's fragments (g = lane / 4, t = lane % 4; the lower-indexed element in the low 16 bits):
//   a[0] A[g][2t, 2t+1], a[1] A[g+8][2t, 2t+1], a[2] A[g][2t+8, 2t+9], a[3] A[g+8][2t+8, 2t+9];
//   b[0] B[2t, 2t+1][g], b[1] B[2t+8, 2t+9][g];  d[0..1] D[g][2t, 2t+1], d[2..3] D[g+8][2t, 2t+1].
// Each product of two BF16 values is exact in f32; this lane's outputs add the 16 products in k order, then C.
inline void mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    State& s = state();
    const size_t me = s.current;
    const size_t base = me - me % kWarpSize;
    s.fragments[me] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    warp_barrier();
    auto half = [](uint32_t word, int k) {
        const uint32_t bits = (k % 2 == 0 ? word : word >> 16) & 0xFFFFu;
        float value;
        const uint32_t wide = bits << 16;
        std::memcpy(&value, &wide, sizeof value);
        return value;
    };
    const int lane = (int)(me - base), g = lane / 4, t = lane % 4;
    for (int out = 0; out < 4; ++out) {
        const int row = g + 8 * (out / 2), column = 2 * t + out % 2;
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) {
            const auto& a_lane = s.fragments[base + (size_t)((row % 8) * 4 + (k % 8) / 2)];
            const auto& b_lane = s.fragments[base + (size_t)(column * 4 + (k % 8) / 2)];
            const float a_value = half(a_lane[(row / 8) + 2 * (k / 8)], k);
            const float b_value = half(b_lane[4 + k / 8], k);
            sum += a_value * b_value;
        }
        d[out] += sum;
    }
    warp_barrier();
}

// A launch argument as the emulation server receives it: a pointer (a buffer address or null) or a number.
struct LaunchArg {
    bool pointer;
    void* address;
    long long integer;
    double real;
};

template <class T>
T convert_arg(const LaunchArg& arg, size_t index) {
    if constexpr (std::is_pointer_v<T>) {
        if (!arg.pointer) throw std::runtime_error("argument " + std::to_string(index) + " must be a buffer");
        return static_cast<T>(arg.address);
    } else {
        if (arg.pointer) throw std::runtime_error("argument " + std::to_string(index) + " must be a number");
        if constexpr (std::is_floating_point_v<T>) return static_cast<T>(arg.real);
        else return static_cast<T>(arg.integer);
    }
}

using Launcher = std::function<void(dim3, dim3, size_t, const std::vector<LaunchArg>&)>;

// Kernels by name, filled by SQUEEZE_EMULATION_KERNEL at static initialization.
inline std::map<std::string, Launcher>& registry() {
    static std::map<std::string, Launcher> kernels;
    return kernels;
}

template <class... Params, size_t... I>
void launch_converted(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      const std::vector<LaunchArg>& args, std::index_sequence<I...>) {
    launch(kernel, grid, block, shared_bytes, convert_arg<Params>(args[I], I)...);
}

template <class... Params>
Launcher launcher(void (*kernel)(Params...)) {
    return [kernel](dim3 grid, dim3 block, size_t shared_bytes, const std::vector<LaunchArg>& args) {
        if (args.size() != sizeof...(Params))
            throw std::runtime_error("expected " + std::to_string(sizeof...(Params)) + " arguments, got " +
                                     std::to_string(args.size()));
        launch_converted(kernel, grid, block, shared_bytes, args, std::index_sequence_for<Params...>{});
    };
}

struct Registrar {
    Registrar(const char* name, Launcher launch) { registry()[name] = std::move(launch); }
};

}  // namespace cuda_emulation

// Makes an extern "C" __global__ kernel launchable by name from kernels/emulation/server.cpp. Every .cu file ends
// with one line per kernel inside `#ifdef SQUEEZE_EMULATION`.
#define SQUEEZE_EMULATION_KERNEL(name) \
    static ::cuda_emulation::Registrar squeeze_emulation_registrar_##name(#name, ::cuda_emulation::launcher(name))

#define threadIdx (::cuda_emulation::state().fibers[::cuda_emulation::state().current].thread_idx)
#define blockIdx (::cuda_emulation::state().block_idx)
#define blockDim (::cuda_emulation::state().block)
#define gridDim (::cuda_emulation::state().grid)
#define warpSize 32

inline void __syncthreads() { cuda_emulation::block_barrier(); }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { cuda_emulation::warp_barrier(); }
inline void __threadfence() {}
// A trap ends the emulated device (a GPU's context is lost too); the client reports the server's exit.
inline void __trap() {
    std::fprintf(stderr, "a kernel trapped (block %u %u %u, thread %zu)\n", cuda_emulation::state().block_idx.x,
                 cuda_emulation::state().block_idx.y, cuda_emulation::state().block_idx.z,
                 cuda_emulation::linear_thread());
    std::abort();
}

inline unsigned emulation_lane() { return (unsigned)(cuda_emulation::linear_thread() % cuda_emulation::kWarpSize); }

template <class T>
T __shfl_sync(unsigned, T value, int source_lane, int width = 32) {
    const int lane = (int)emulation_lane();
    return cuda_emulation::exchange(value, (lane - lane % width) + source_lane % width);
}
template <class T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int width = 32) {
    const int lane = (int)emulation_lane();
    const int source = lane ^ lane_mask;
    return cuda_emulation::exchange(value, source / width == lane / width ? source : lane);
}
template <class T>
T __shfl_down_sync(unsigned, T value, unsigned delta, int width = 32) {
    const int lane = (int)emulation_lane();
    const int source = lane + (int)delta;
    return cuda_emulation::exchange(value, source / width == lane / width ? source : lane);
}
template <class T>
T __shfl_up_sync(unsigned, T value, unsigned delta, int width = 32) {
    const int lane = (int)emulation_lane();
    const int source = lane - (int)delta;
    return cuda_emulation::exchange(value, source >= 0 && source / width == lane / width ? source : lane);
}
inline unsigned __ballot_sync(unsigned, int predicate) {
    unsigned bits = 0;
    for (unsigned source = 0; source < cuda_emulation::kWarpSize; ++source) {
        const int other = cuda_emulation::exchange(predicate ? 1 : 0, (int)source);
        if (other) bits |= 1u << source;
    }
    return bits;
}
inline int __all_sync(unsigned mask, int predicate) { return __ballot_sync(mask, !predicate) == 0; }
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }

template <class T>
T atomicAdd(T* address, T value) {
    const T old = *address;
    *address = old + value;
    return old;
}
template <class T>
T atomicMax(T* address, T value) {
    const T old = *address;
    if (value > old) *address = value;
    return old;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
// One rounding, as the GPU's FFMA.
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline unsigned __float_as_uint(float value) {
    unsigned bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}
inline float __uint_as_float(unsigned bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}
inline float __int_as_float(int bits) { return __uint_as_float((unsigned)bits); }
inline int __popc(unsigned bits) { return __builtin_popcount(bits); }
template <class T>
T __ldg(const T* address) {
    return *address;
}
// fabsf, fmaxf, fminf, powf, rintf: the global C functions from <cmath>.
