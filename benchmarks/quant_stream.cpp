// How fast the Q4_0x16 matrix-vector tile (kernels/csrc/quant_repack.cpp's group_tile at one token) streams a
// 1B model's worth of weights from memory on 2 threads, per software prefetch distance, the distances
// interleaved round by round (the machine's memory bandwidth moves between states: compare within one run).
// A copy of the tile's loop, not the engine: the engine's figures come from gguf_decode.py --ab.
//
// Not a test. Build and run (K: the product's inner size, 2048 for q/k/v, o and gate/up, 8192 for down):
//   g++ -O3 -march=native -fopenmp benchmarks/quant_stream.cpp -o /tmp/quant_stream
//   flock /tmp/bench.lock /tmp/quant_stream 2048 11 4096 6144 8192
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlockBytes = 288;  // a group's block: 16 fp16 scales, 4 chunks of 64 bytes of nibbles
constexpr size_t kWeightBytes = size_t{700} << 20;  // a 1B model's Q4_0 file

// One group of 16 rows times one token: the engine's operations (nibble pairs, vpdpwssd, scale fma) with
// non-temporal prefetches `distance` bytes ahead.
__attribute__((noinline)) void group_tile(const uint8_t* g, int64_t nb, const int16_t* q, const float* d,
                                          const int32_t* qsum, float* y, int64_t distance) {
  __m512 facc = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi16(0x000F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = g + b * kBlockBytes;
    for (int64_t l = 0; l < kBlockBytes; l += 64) __builtin_prefetch(blk + distance + l, 0, 0);
    __m512i acc[4] = {_mm512_set1_epi32(-8 * qsum[b]), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (int64_t c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(blk + 32 + 64 * c);
      const __m512i w[4] = {_mm512_and_si512(v, low), _mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                            _mm512_and_si512(_mm512_srli_epi16(v, 8), low), _mm512_srli_epi16(v, 12)};
      for (int64_t p = 0; p < 4; ++p) {
        int32_t pair;
        std::memcpy(&pair, q + b * 32 + 8 * c + 2 * p, 4);
        acc[p] = _mm512_dpwssd_epi32(acc[p], w[p], _mm512_set1_epi32(pair));
      }
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512i dot = _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
    facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(d[b])), facc);
  }
  _mm512_storeu_ps(y, facc);
}

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s K rounds distance [distance ...]\n", argv[0]);
    return 2;
  }
  const int64_t K = std::atoll(argv[1]), nb = K / 32, group_bytes = nb * kBlockBytes;
  const int rounds = std::atoi(argv[2]);
  std::vector<int64_t> distances;
  for (int i = 3; i < argc; ++i) distances.push_back(std::atoll(argv[i]));
  const int64_t groups = kWeightBytes / group_bytes;
  const size_t bytes = groups * group_bytes, huge = size_t{2} << 20;
  // 2 MiB-aligned and advised huge pages, as the engine's repacked weights (layers/quantized.py)
  auto* raw = static_cast<uint8_t*>(mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  uint8_t* w = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~(huge - 1));
  madvise(w, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes; ++i) w[i] = static_cast<uint8_t>(i * 7);
  std::vector<int16_t> q(K, 3);
  std::vector<float> d(nb, 1.f), y(groups * 16);
  std::vector<int32_t> qsum(nb, 3);
  std::vector<std::vector<double>> rates(distances.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t v = 0; v < distances.size(); ++v) {
      const double t = seconds();
#pragma omp parallel num_threads(2)
      {
        const int64_t chunk = (groups + 1) / 2, g0 = std::min(groups, omp_get_thread_num() * chunk);
        for (int64_t g = g0; g < std::min(groups, g0 + chunk); ++g) {
          group_tile(w + g * group_bytes, nb, q.data(), d.data(), qsum.data(), y.data() + g * 16, distances[v]);
        }
      }
      rates[v].push_back(bytes / (seconds() - t) / 1e9);
    }
  }
  std::printf("| K | prefetch distance | GB/s (median of %d) | / the first distance, per round's median |\n", rounds);
  std::printf("| --- | --- | --- | --- |\n");
  for (size_t v = 0; v < distances.size(); ++v) {
    std::vector<double> sorted = rates[v], ratio;
    for (int r = 0; r < rounds; ++r) ratio.push_back(rates[v][r] / rates[0][r]);
    std::sort(sorted.begin(), sorted.end());
    std::sort(ratio.begin(), ratio.end());
    std::printf("| %lld | %lld | %.1f | %.3f |\n", static_cast<long long>(K), static_cast<long long>(distances[v]),
                sorted[rounds / 2], ratio[rounds / 2]);
  }
  return 0;
}
