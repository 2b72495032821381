// The emulated CUDA device behind `--device emulated` (src/runtime/device/emulated.rs): device memory and kernel
// launches served over stdin/stdout, every kernel of kernels/*.cu run under kernels/emulation/cuda_emulation.h, plus
// `emulation_primitives`, which checks the emulation itself (tests/integration/device_ops.rs).
//
// Protocol (little-endian; every command gets a reply `u8 status` (0 ok, 1 error) + `u32 length` + that many bytes:
// the data for `R`, an error message otherwise):
//   'A' u64 id, u64 bytes                      allocate (filled with 0xA5 so an unwritten element shows up)
//   'W' u64 id, u64 offset, u64 length, bytes  write
//   'R' u64 id, u64 offset, u64 length         read
//   'F' u64 id                                 free
//   'C' u64 source, u64 target, u64 offset, u64 length   copy device to device
//   'L' u32 name_length, name, u32 grid[3], u32 block[3], u32 shared_bytes, u32 count, count × argument
//                                              launch (synchronous) with shared_bytes of dynamic shared memory
//       argument: u8 kind (0 null pointer, 1 buffer: u64 id + u64 byte offset, 2 integer: i64, 3 real: f64)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

// Every kernel family; each registers its kernels with SQUEEZE_EMULATION_KERNEL.
#include "../activation.cu"
#include "../attention.cu"
#include "../fp4_dequant.cu"
#include "../fp8_dequant.cu"
#include "../gptq.cu"
#include "../indexer.cu"
#include "../int4_quantize.cu"
#include "../kv_write.cu"
#include "../linear.cu"
#include "../norm.cu"
#include "../paged_attention.cu"
#include "../paged_mla_decode.cu"
#include "../rope.cu"
#include "../routing.cu"
#include "../tensor.cu"
#include "../w4a16.cu"

// The emulation's own primitives, for a test that they behave like CUDA's: a block reduction with shared memory and
// __syncthreads, warp reductions with xor and down shuffles, a ballot and a lane-0 broadcast. Launched with blocks of
// 256 threads over `in` (one value per thread); per block its sum, per warp [xor sum, down sum], ballot of `v > 0`
// and lane 0's value.
extern "C" __global__ void emulation_primitives(const float* in, float* block_sums, float* warp_sums,
                                                unsigned* ballots, float* broadcast) {
    __shared__ float partial[256];
    const unsigned t = threadIdx.x;
    const float v = in[blockIdx.x * blockDim.x + t];
    partial[t] = v;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    if (t == 0) block_sums[blockIdx.x] = partial[0];
    float x = v;
    for (int mask = 16; mask > 0; mask /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, mask);
    float y = v;
    for (unsigned delta = 16; delta > 0; delta /= 2) y += __shfl_down_sync(0xFFFFFFFFu, y, delta);
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, v > 0.0f);
    const float first = __shfl_sync(0xFFFFFFFFu, v, 0);
    if (t % 32 == 0) {
        const unsigned warp = (blockIdx.x * blockDim.x + t) / 32;
        warp_sums[2 * warp] = x;
        warp_sums[2 * warp + 1] = y;
        ballots[warp] = ballot;
        broadcast[warp] = first;
    }
}
SQUEEZE_EMULATION_KERNEL(emulation_primitives);

namespace {

struct Buffer {
    void* data;
    uint64_t bytes;
};

std::map<uint64_t, Buffer> buffers;

bool read_exact(void* out, size_t bytes) { return std::fread(out, 1, bytes, stdin) == bytes; }

template <class T>
T take() {
    T value{};
    if (!read_exact(&value, sizeof value)) std::exit(0);  // the client closed the pipe
    return value;
}

void reply(uint8_t status, const void* data, uint32_t length) {
    std::fwrite(&status, 1, 1, stdout);
    std::fwrite(&length, 4, 1, stdout);
    if (length) std::fwrite(data, 1, length, stdout);
    std::fflush(stdout);
}

void fail(const std::string& message) { reply(1, message.data(), (uint32_t)message.size()); }

Buffer* find(uint64_t id) {
    auto it = buffers.find(id);
    return it == buffers.end() ? nullptr : &it->second;
}

void serve_one(char command) {
    switch (command) {
        case 'A': {
            const uint64_t id = take<uint64_t>(), bytes = take<uint64_t>();
            const size_t rounded = ((bytes + 63) / 64) * 64 + 64;
            void* data = std::aligned_alloc(64, rounded);
            if (!data) return fail("out of host memory for a " + std::to_string(bytes) + "-byte buffer");
            std::memset(data, 0xA5, rounded);
            buffers[id] = Buffer{data, bytes};
            return reply(0, nullptr, 0);
        }
        case 'W': {
            const uint64_t id = take<uint64_t>(), offset = take<uint64_t>(), length = take<uint64_t>();
            std::vector<unsigned char> bytes(length);
            if (length && !read_exact(bytes.data(), length)) std::exit(0);
            Buffer* buffer = find(id);
            if (!buffer) return fail("write to unknown buffer " + std::to_string(id));
            if (offset + length > buffer->bytes) return fail("write past the end of buffer " + std::to_string(id));
            std::memcpy((unsigned char*)buffer->data + offset, bytes.data(), length);
            return reply(0, nullptr, 0);
        }
        case 'R': {
            const uint64_t id = take<uint64_t>(), offset = take<uint64_t>(), length = take<uint64_t>();
            Buffer* buffer = find(id);
            if (!buffer) return fail("read of unknown buffer " + std::to_string(id));
            if (offset + length > buffer->bytes) return fail("read past the end of buffer " + std::to_string(id));
            return reply(0, (unsigned char*)buffer->data + offset, (uint32_t)length);
        }
        case 'F': {
            const uint64_t id = take<uint64_t>();
            Buffer* buffer = find(id);
            if (buffer) {
                std::free(buffer->data);
                buffers.erase(id);
            }
            return reply(0, nullptr, 0);
        }
        case 'C': {
            const uint64_t source_id = take<uint64_t>(), target_id = take<uint64_t>();
            const uint64_t offset = take<uint64_t>(), length = take<uint64_t>();
            Buffer* source = find(source_id);
            Buffer* target = find(target_id);
            if (!source || !target) return fail("copy between unknown buffers");
            if (length > source->bytes || offset + length > target->bytes) return fail("copy past the end of a buffer");
            std::memmove((unsigned char*)target->data + offset, source->data, length);
            return reply(0, nullptr, 0);
        }
        case 'L': {
            const uint32_t name_length = take<uint32_t>();
            std::string name(name_length, '\0');
            if (!read_exact(name.data(), name_length)) std::exit(0);
            uint32_t shape[7];
            for (uint32_t& value : shape) value = take<uint32_t>();
            const uint32_t count = take<uint32_t>();
            std::vector<cuda_emulation::LaunchArg> args(count);
            std::string problem;
            for (uint32_t i = 0; i < count; ++i) {
                cuda_emulation::LaunchArg& arg = args[i];
                arg = cuda_emulation::LaunchArg{false, nullptr, 0, 0.0};
                const uint8_t kind = take<uint8_t>();
                if (kind == 0) {
                    arg.pointer = true;
                } else if (kind == 1) {
                    const uint64_t id = take<uint64_t>(), offset = take<uint64_t>();
                    arg.pointer = true;
                    Buffer* buffer = find(id);
                    if (!buffer || offset > buffer->bytes)
                        problem = "argument " + std::to_string(i) + " names an unknown buffer";
                    else
                        arg.address = (unsigned char*)buffer->data + offset;
                } else if (kind == 2) {
                    arg.integer = take<int64_t>();
                } else {
                    arg.real = take<double>();
                    arg.integer = (long long)arg.real;
                }
            }
            auto kernel = cuda_emulation::registry().find(name);
            if (kernel == cuda_emulation::registry().end()) return fail("no kernel named " + name);
            if (!problem.empty()) return fail(name + ": " + problem);
            try {
                kernel->second(dim3(shape[0], shape[1], shape[2]), dim3(shape[3], shape[4], shape[5]), shape[6], args);
            } catch (const std::exception& error) {
                return fail(name + ": " + error.what());
            }
            return reply(0, nullptr, 0);
        }
        default:
            fail(std::string("unknown command ") + command);
            std::exit(2);
    }
}

}  // namespace

int main() {
    for (;;) {
        char command;
        if (!read_exact(&command, 1)) return 0;
        serve_one(command);
    }
}
