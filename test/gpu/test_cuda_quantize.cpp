// The CUDA backend's block quantization (qwZ / qgZ) against the host quantizer it must equal
// byte for byte, through the Backend interface the engine uses: int8 from fp32 / bf16 / fp16
// and back, and the fp32 error-feedback forms (int8 and int4 packed two per byte) with their
// residuals and dequantize-add, over sizes that are not multiples of the block, odd block sizes
// (an int4 byte then straddles two blocks), more blocks than one grid, and blocks holding inf
// or NaN (their scale is NaN and they come back NaN). The host side is comm/quantize.cpp, which
// shares its per-element arithmetic with the kernels (comm/quantize_math.hpp); this test is what
// shows the device compiles that arithmetic to the same bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "comm/quantize.hpp"
#include "gpu_test_util.hpp"

using namespace zero;
using namespace zero::gputest;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

struct Shape {
  std::size_t n, block;
};

std::vector<Shape> shapes() {
  std::vector<Shape> s = {{1, 1}, {7, 3}, {255, 16}, {1000, 256}, {1001, 257}, {4099, 5}};
  if (!small_run()) s.push_back({(std::size_t{1} << 22) + 3, 256});  // more blocks than the grid holds
  return s;
}

// Byte equality of two packed buffers, NaN scales equal whatever their payload.
void require_packed_same(const std::vector<char>& got, const std::vector<char>& want, std::size_t n, std::size_t block,
                         const std::string& what) {
  REQUIRE(got.size() == want.size());
  const std::size_t nb = (n + block - 1) / block;
  require_same(got.data(), want.data(), nb, DType::f32, what + " scales");
  std::size_t i = nb * sizeof(float);
  while (i < got.size() && got[i] == want[i]) ++i;
  INFO(what << ": packed values and padding differ at byte " << i << " of " << got.size());
  REQUIRE(i == got.size());
}

}  // namespace

TEST_CASE("int8 quantize and dequantize equal the host quantizer byte for byte", "[quantize]") {
  auto owned = backend("cuda");
  Backend& dev = *owned;
  for (const Shape& sh : shapes())
    for (DType t : kTypes) {
      const std::string what =
          "n " + std::to_string(sh.n) + " block " + std::to_string(sh.block) + " " + std::string(dtype_name(t));
      INFO(what);
      const auto src = to_dtype(random_floats(sh.n, 11 + sh.n, 3.0f), t);
      const std::size_t packed = quant::packed_bytes(sh.n, sh.block);
      std::vector<char> want(packed, 0x5a);  // the padding must be written, not left as found
      quant::quantize_int8(src.data(), t, sh.n, sh.block, want.data());
      Buffer dsrc = upload(dev, src), dout = upload(dev, std::vector<char>(packed, 0x5a));
      dev.quantize_int8(dsrc.get(), t, sh.n, sh.block, dout.get());
      require_packed_same(download<char>(dev, dout, packed), want, sh.n, sh.block, what);

      std::vector<char> back(sh.n * dtype_size(t));
      quant::dequantize_int8(want.data(), sh.n, sh.block, back.data(), t);
      Buffer dback = dev.alloc(back.size());
      dev.dequantize_int8(dout.get(), sh.n, sh.block, dback.get(), t);
      const auto got = download<char>(dev, dback, back.size());
      require_same(got.data(), back.data(), sh.n, t, what + " dequantized");
    }
}

TEST_CASE("error feedback: int8 and int4 packing, residuals and dequantize-add equal the host", "[quantize]") {
  auto owned = backend("cuda");
  Backend& dev = *owned;
  for (const Shape& sh : shapes())
    for (quant::Bits bits : {quant::Bits::int8, quant::Bits::int4}) {
      const std::string what = "n " + std::to_string(sh.n) + " block " + std::to_string(sh.block) +
                               (bits == quant::Bits::int8 ? " int8" : " int4");
      INFO(what);
      std::vector<float> v = random_floats(sh.n, 23 + sh.n, 0.5f);
      const std::size_t packed = quant::packed_bytes(sh.n, sh.block, bits);
      Buffer dv = upload(dev, v), dout = upload(dev, std::vector<char>(packed, 0x5a));
      std::vector<char> want(packed, 0x5a);
      quant::quantize_keep_error(v.data(), sh.n, sh.block, bits, want.data());
      dev.quantize_keep_error(dv.as<float>(), sh.n, sh.block, bits, dout.get());
      require_packed_same(download<char>(dev, dout, packed), want, sh.n, sh.block, what);
      const auto residual = download<float>(dev, dv, sh.n);
      require_same(residual.data(), v.data(), sh.n, DType::f32, what + " residual");

      // Added into an accumulator that already holds values, as the reduce-scatter's sums do.
      std::vector<float> acc = random_floats(sh.n, 31 + sh.n, 1.0f, false);
      Buffer dacc = upload(dev, acc);
      quant::dequantize_add(want.data(), sh.n, sh.block, bits, acc.data());
      dev.dequantize_add(dout.get(), sh.n, sh.block, bits, dacc.as<float>());
      const auto got = download<float>(dev, dacc, sh.n);
      require_same(got.data(), acc.data(), sh.n, DType::f32, what + " dequantize-add");
    }
}

TEST_CASE("a block holding inf or NaN comes back NaN on the device as on the host", "[quantize]") {
  auto owned = backend("cuda");
  Backend& dev = *owned;
  std::vector<float> v(48, 0.25f);
  v[5] = std::numeric_limits<float>::infinity();    // block 0 of 16
  v[40] = std::numeric_limits<float>::quiet_NaN();  // block 2
  const std::size_t packed = quant::packed_bytes(v.size(), 16);
  Buffer dv = upload(dev, v), dout = dev.alloc(packed), dback = dev.alloc(v.size() * sizeof(float));
  dev.quantize_int8(dv.get(), DType::f32, v.size(), 16, dout.get());
  dev.dequantize_int8(dout.get(), v.size(), 16, dback.get(), DType::f32);
  const auto back = download<float>(dev, dback, v.size());
  std::vector<char> host_packed(packed);
  std::vector<float> host_back(v.size());
  quant::quantize_int8(v.data(), DType::f32, v.size(), 16, host_packed.data());
  quant::dequantize_int8(host_packed.data(), v.size(), 16, host_back.data(), DType::f32);
  for (std::size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i);
    if (i < 16 || i >= 32)
      CHECK(std::isnan(back[i]));
    else
      CHECK(back[i] == host_back[i]);
    CHECK(std::isnan(host_back[i]) == std::isnan(back[i]));
  }
}

// The batched forms qwZ and qgZ use (one launch for every rank's message, slots through a skip
// or a row table) against the host backend, which runs the single-message host quantizer
// message by message: packed bytes, residuals, sums in slot order, and gathered rows.
TEST_CASE("the batched quantization forms equal the host backend message by message", "[quantize]") {
  auto owned_dev = backend("cuda"), owned_host = backend("host");
  Backend& dev = *owned_dev;
  Backend& host = *owned_host;
  const std::size_t count = 3;
  for (const Shape& sh : shapes()) {
    if (sh.n > 5000) continue;  // the batched grid is covered by the single forms' large shape
    for (quant::Bits bits : {quant::Bits::int8, quant::Bits::int4}) {
      const bool int8 = bits == quant::Bits::int8;
      const std::string what =
          "n " + std::to_string(sh.n) + " block " + std::to_string(sh.block) + (int8 ? " int8" : " int4");
      INFO(what);
      const std::size_t packed = quant::packed_bytes(sh.n, sh.block, bits);
      for (std::size_t skip : {std::size_t{0}, std::size_t{1}, count, ~std::size_t{0}}) {
        INFO("skip " << skip);
        const std::size_t slots = skip <= count ? count + 1 : count;
        std::vector<float> v = random_floats(count * sh.n, 41 + sh.n + skip, 0.5f);
        std::vector<char> want(slots * packed, 0x5a);
        Buffer dv = upload(dev, v), dout = upload(dev, want);
        host.quantize_keep_error(v.data(), count, sh.n, sh.block, bits, want.data(), skip);
        dev.quantize_keep_error(dv.as<float>(), count, sh.n, sh.block, bits, dout.get(), skip);
        const auto got = download<char>(dev, dout, want.size());
        for (std::size_t s = 0; s < slots; ++s)
          require_packed_same(std::vector<char>(got.begin() + s * packed, got.begin() + (s + 1) * packed),
                              std::vector<char>(want.begin() + s * packed, want.begin() + (s + 1) * packed), sh.n,
                              sh.block, what + " slot " + std::to_string(s));
        const auto residual = download<float>(dev, dv, v.size());
        require_same(residual.data(), v.data(), v.size(), DType::f32, what + " residuals");

        // Slots [1, slots) added in order into an accumulator holding values.
        std::vector<float> acc = random_floats(sh.n, 53 + sh.n, 1.0f, false);
        Buffer dacc = upload(dev, acc);
        host.dequantize_add(want.data(), 1, slots, sh.n, sh.block, bits, acc.data());
        dev.dequantize_add(dout.get(), 1, slots, sh.n, sh.block, bits, dacc.as<float>());
        const auto sum = download<float>(dev, dacc, sh.n);
        require_same(sum.data(), acc.data(), sh.n, DType::f32, what + " dequantize-add of slots");
      }
      if (!int8) continue;
      for (DType t : kTypes) {  // qwZ's gather: every rank's int8 message into one buffer
        std::vector<char> in(count * packed);
        for (std::size_t k = 0; k < count; ++k) {
          const auto src = to_dtype(random_floats(sh.n, 61 + k, 2.0f), t);
          quant::quantize_int8(src.data(), t, sh.n, sh.block, in.data() + k * packed);
        }
        std::vector<char> want(count * sh.n * dtype_size(t));
        host.dequantize_int8(in.data(), count, sh.n, sh.block, want.data(), t);
        Buffer din = upload(dev, in), dout = dev.alloc(want.size());
        dev.dequantize_int8(din.get(), count, sh.n, sh.block, dout.get(), t);
        const auto got = download<char>(dev, dout, want.size());
        require_same(got.data(), want.data(), count * sh.n, t, what + " dequantized messages");
      }
    }
  }
  // Rows gathered through a table of row numbers, set and added, from each dtype.
  const std::size_t row = 1001;
  const std::vector<std::int32_t> rows = {2, 0, 3, 2};
  Buffer drows = upload(dev, rows);
  for (DType t : kTypes)
    for (bool add : {false, true}) {
      INFO(dtype_name(t) << (add ? " added" : " set"));
      const auto src = to_dtype(random_floats(4 * row, 71, 3.0f), t);
      std::vector<float> dst = random_floats(rows.size() * row, 73, 1.0f, false);
      Buffer dsrc = upload(dev, src), ddst = upload(dev, dst);
      host.gather_rows(dst.data(), src.data(), t, row, rows.data(), rows.size(), add);
      dev.gather_rows(ddst.as<float>(), dsrc.get(), t, row, drows.as<std::int32_t>(), rows.size(), add);
      const auto got = download<float>(dev, ddst, dst.size());
      require_same(got.data(), dst.data(), dst.size(), DType::f32, "gathered rows");
    }
}
