// Runs squeeze's kernels under the CUDA emulation on files, for tests/integration/kernels.rs.
//
//   harness primitives
//   harness dequant-f32|dequant-bf16 ROWS COLUMNS FIRST_ROW BLOCK_ROWS BLOCK_COLUMNS CODES SCALES OUT
//   harness int4-fp8 KERNEL ROWS COLUMNS FIRST_ROW GROUP BLOCK_ROWS BLOCK_COLUMNS RULE STEPS GRID NORM CODES SCALES
//           PACKED_OUT SCALES_OUT
//   harness int4-f32 KERNEL ROWS COLUMNS GROUP RULE STEPS GRID NORM VALUES PACKED_OUT SCALES_OUT
//
// Files are raw little-endian arrays. Outputs are poisoned (0xA5 bytes) before the launch, so an element a kernel
// forgets to write shows up as a mismatch. Launch shapes are those of src/cuda (256 threads per block).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../fp8_dequant.cu"
#include "../int4_quantize.cu"

namespace {

constexpr unsigned kThreads = 256;

std::vector<unsigned char> read_file(const char* path) {
    std::vector<unsigned char> bytes;
    FILE* file = std::fopen(path, "rb");
    if (!file) {
        std::fprintf(stderr, "cannot open %s\n", path);
        std::exit(2);
    }
    unsigned char buffer[1 << 16];
    size_t got;
    while ((got = std::fread(buffer, 1, sizeof buffer, file)) > 0) bytes.insert(bytes.end(), buffer, buffer + got);
    std::fclose(file);
    return bytes;
}

void write_file(const char* path, const void* data, size_t bytes) {
    FILE* file = std::fopen(path, "wb");
    if (!file || std::fwrite(data, 1, bytes, file) != bytes) {
        std::fprintf(stderr, "cannot write %s\n", path);
        std::exit(2);
    }
    std::fclose(file);
}

template <class T>
std::vector<T> poisoned(size_t count) {
    std::vector<T> out(count);
    std::memset(out.data(), 0xA5, count * sizeof(T));
    return out;
}

// 16-byte aligned copy of a file (the kernels use 16-byte loads).
template <class T>
std::vector<T, std::allocator<T>> load_aligned(const char* path) {
    std::vector<unsigned char> bytes = read_file(path);
    std::vector<T> out(bytes.size() / sizeof(T) + 16 / sizeof(T));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
}

unsigned blocks_for(long long items) { return (unsigned)((items + kThreads - 1) / kThreads); }

// Block reduction with shared memory and __syncthreads, warp reductions with xor and down shuffles, a ballot.
extern "C" __global__ void primitives_kernel(const float* in, float* block_sums, float* warp_sums, unsigned* ballots,
                                             float* broadcast) {
    __shared__ float partial[kThreads];
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

int primitives() {
    const unsigned blocks = 3;
    std::vector<float> in(blocks * kThreads);
    for (size_t i = 0; i < in.size(); ++i) in[i] = (float)((int)((i * 7919) % 61) - 30);  // small integers: exact sums
    std::vector<float> block_sums(blocks), warp_sums(2 * in.size() / 32), broadcast(in.size() / 32);
    std::vector<unsigned> ballots(in.size() / 32);
    cuda_emulation::launch(primitives_kernel, dim3(blocks), dim3(kThreads), in.data(), block_sums.data(),
                           warp_sums.data(), ballots.data(), broadcast.data());
    int failures = 0;
    for (unsigned b = 0; b < blocks; ++b) {
        float want = 0;
        for (unsigned t = 0; t < kThreads; ++t) want += in[b * kThreads + t];
        if (block_sums[b] != want) ++failures, std::fprintf(stderr, "block %u sum %g want %g\n", b, block_sums[b], want);
    }
    for (size_t w = 0; w < in.size() / 32; ++w) {
        float want = 0;
        unsigned want_ballot = 0;
        for (unsigned l = 0; l < 32; ++l) {
            want += in[w * 32 + l];
            if (in[w * 32 + l] > 0.0f) want_ballot |= 1u << l;
        }
        if (warp_sums[2 * w] != want || warp_sums[2 * w + 1] != want || ballots[w] != want_ballot ||
            broadcast[w] != in[w * 32]) {
            ++failures;
            std::fprintf(stderr, "warp %zu: xor %g down %g want %g; ballot %08x want %08x; lane0 %g want %g\n", w,
                         warp_sums[2 * w], warp_sums[2 * w + 1], want, ballots[w], want_ballot, broadcast[w],
                         in[w * 32]);
        }
    }
    std::printf("primitives: %d failures\n", failures);
    return failures == 0 ? 0 : 1;
}

using Fp8Kernel = void (*)(const uint8_t*, const float*, uint32_t*, uint16_t*, long long, long long, long long, int,
                           int, int, int, int, int, float);
using F32Kernel = void (*)(const float*, uint32_t*, uint16_t*, long long, long long, int, int, int, int, float);

Fp8Kernel fp8_kernel(const std::string& name) {
    if (name == "g32") return int4_quantize_fp8_g32;
    if (name == "g64") return int4_quantize_fp8_g64;
    if (name == "gany") return int4_quantize_fp8_gany;
    std::fprintf(stderr, "unknown kernel variant %s\n", name.c_str());
    std::exit(2);
}

F32Kernel f32_kernel(const std::string& name) {
    if (name == "g32") return int4_quantize_f32_g32;
    if (name == "g64") return int4_quantize_f32_g64;
    if (name == "gany") return int4_quantize_f32_gany;
    std::fprintf(stderr, "unknown kernel variant %s\n", name.c_str());
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const std::string op = argv[1];
    auto number = [&](int index) { return std::atoll(argv[index]); };
    if (op == "primitives") return primitives();
    if ((op == "dequant-f32" || op == "dequant-bf16") && argc == 10) {
        const long long rows = number(2), columns = number(3), first_row = number(4);
        const int block_rows = (int)number(5), block_columns = (int)number(6);
        auto codes = load_aligned<uint8_t>(argv[7]);
        auto scales = load_aligned<float>(argv[8]);
        const unsigned blocks = blocks_for(rows * columns);
        if (op == "dequant-f32") {
            auto out = poisoned<float>(rows * columns);
            cuda_emulation::launch(fp8_block_dequant_f32, dim3(blocks), dim3(kThreads), codes.data(), scales.data(),
                                   out.data(), rows, columns, first_row, block_rows, block_columns);
            write_file(argv[9], out.data(), out.size() * sizeof(float));
        } else {
            auto out = poisoned<uint16_t>(rows * columns);
            cuda_emulation::launch(fp8_block_dequant_bf16, dim3(blocks), dim3(kThreads), codes.data(), scales.data(),
                                   out.data(), rows, columns, first_row, block_rows, block_columns);
            write_file(argv[9], out.data(), out.size() * sizeof(uint16_t));
        }
        return 0;
    }
    if (op == "int4-fp8" && argc == 17) {
        const Fp8Kernel kernel = fp8_kernel(argv[2]);
        const long long rows = number(3), columns = number(4), first_row = number(5);
        const int group = (int)number(6), block_rows = (int)number(7), block_columns = (int)number(8);
        const int rule = (int)number(9), steps = (int)number(10), grid = (int)number(11);
        const float norm = std::strtof(argv[12], nullptr);
        auto codes = load_aligned<uint8_t>(argv[13]);
        auto scales = load_aligned<float>(argv[14]);
        const long long groups = rows * columns / group;
        auto packed = poisoned<uint32_t>(rows * columns / 8);
        auto out_scales = poisoned<uint16_t>(groups);
        cuda_emulation::launch(kernel, dim3(blocks_for(groups)), dim3(kThreads), codes.data(), scales.data(),
                               packed.data(), out_scales.data(), rows, columns, first_row, group, block_rows,
                               block_columns, rule, steps, grid, norm);
        write_file(argv[15], packed.data(), packed.size() * sizeof(uint32_t));
        write_file(argv[16], out_scales.data(), out_scales.size() * sizeof(uint16_t));
        return 0;
    }
    if (op == "int4-f32" && argc == 13) {
        const F32Kernel kernel = f32_kernel(argv[2]);
        const long long rows = number(3), columns = number(4);
        const int group = (int)number(5), rule = (int)number(6), steps = (int)number(7), grid = (int)number(8);
        const float norm = std::strtof(argv[9], nullptr);
        auto values = load_aligned<float>(argv[10]);
        const long long groups = rows * columns / group;
        auto packed = poisoned<uint32_t>(rows * columns / 8);
        auto out_scales = poisoned<uint16_t>(groups);
        cuda_emulation::launch(kernel, dim3(blocks_for(groups)), dim3(kThreads), values.data(), packed.data(),
                               out_scales.data(), rows, columns, group, rule, steps, grid, norm);
        write_file(argv[11], packed.data(), packed.size() * sizeof(uint32_t));
        write_file(argv[12], out_scales.data(), out_scales.size() * sizeof(uint16_t));
        return 0;
    }
    std::fprintf(stderr, "usage: see the comment at the top of harness.cpp (got %s with %d arguments)\n", op.c_str(),
                 argc);
    return 2;
}
