// PretrainedWeights' reads (zero/formats/hf.hpp): a parameter, or one tensor rank's part of it,
// from the Hugging Face tensors that make it, reading only the file stretches the part needs.
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/hf_mapping.hpp"
#include "checkpoint/hf_source.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero::hf {

void check_finite(const std::string& path, const std::string& name, const float* v, std::size_t n, const char* order) {
  // A NaN or an infinity would train on NaN from step 1; the engine would see it only as one
  // unit's values, without the file and its tensor.
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      ZERO_THROW(
          fmt::format("model.init_from: tensor '{}' in '{}' holds {} at index {}{}, which is not finite; the "
                      "file is damaged or the weights diverged: export them again from a checkpoint whose "
                      "loss was finite",
                      name, path, v[i], i, order));
}

void PretrainedWeights::read(const std::string& name, const Shape& shape, std::span<float> out) const {
  read_part(name, shape, {}, out);
}

std::uint64_t PretrainedWeights::bytes_read() const { return src_->bytes_read; }

void PretrainedWeights::read_part(const std::string& name, const Shape& shape, const PartCut& cut,
                                  std::span<float> out) const {
  Source& S = *src_;
  const std::int64_t want = count(shape);
  const bool split = cut.axis >= 0 && cut.parts > 1;
  ZERO_CHECK(!split || (cut.axis < static_cast<int>(shape.size()) && cut.blocks >= 1 && cut.part >= 0 &&
                        cut.part < cut.parts &&
                        shape[static_cast<std::size_t>(cut.axis)] % (std::int64_t{cut.blocks} * cut.parts) == 0),
             fmt::format("PretrainedWeights::read_part: '{}' ({}) cannot be cut {} ways in {} blocks along axis {}",
                         name, shape_text(shape), cut.parts, cut.blocks, cut.axis));
  const std::int64_t part_size = split ? want / cut.parts : want;
  ZERO_CHECK(
      static_cast<std::int64_t>(out.size()) == part_size,
      fmt::format("PretrainedWeights::read: '{}' needs {} values, got room for {}", name, part_size, out.size()));
  Mapping m;
  plan::GptShape c;
  if (S.maps) {
    auto it = S.maps->find(name);
    ZERO_CHECK(it != S.maps->end(),
               fmt::format("model.init_from: a {} model has no parameter '{}'", plan::arch_name(S.config->arch), name));
    m = it->second;
    c = *S.config;
  } else {
    auto it = S.tensors.find(name);
    ZERO_CHECK(it != S.tensors.end(), fmt::format("model.init_from: '{}' has no tensor '{}'", path_, name));
    const Shape& ts = it->second.shape;
    m = it->second.transposed ? Mapping{Kind::transpose, {{name, {ts[1], ts[0]}}}} : Mapping{Kind::copy, {{name, ts}}};
  }
  // The whole parameter from these tensors: the same count, or fewer for the vocabulary's rows
  // (the padding that follows).
  std::int64_t have = 0;
  for (const auto& t : m.from) have += count(t.shape);
  const bool rows = name == kWte || name == kLmHead;
  ZERO_CHECK(have == want || (rows && have < want),
             fmt::format("model.init_from: '{}' is made of {} values of {}, the model needs {} ({})", name, have,
                         m.from[0].name, want, shape_text(shape)));

  // The cut (as the layout's, tensor_parallel.hpp): the whole as [outer, A, inner] around the
  // axis, each of `blocks` blocks of A cut into `parts` runs; a whole index's place in this
  // part, or -1 when another part holds it.
  std::int64_t outer = 1, inner = 1, A = 1;
  if (split) {
    A = shape[static_cast<std::size_t>(cut.axis)];
    for (int i = 0; i < cut.axis; ++i) outer *= shape[static_cast<std::size_t>(i)];
    for (std::size_t i = static_cast<std::size_t>(cut.axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  }
  const std::int64_t block = A / cut.blocks, local = A / (split ? cut.parts : 1), run = local / cut.blocks;
  auto part_index = [&](std::int64_t ours) -> std::int64_t {
    if (!split) return ours;
    const std::int64_t o = ours / (A * inner), x = (ours / inner) % A, i = ours % inner;
    const std::int64_t b = x / block, w = x % block;
    if (w / run != cut.part) return -1;
    return (o * local + b * run + w % run) * inner + i;
  };

  // Pass 1: of each source tensor's rows (its first dimension), the columns this part needs.
  struct Need {
    std::int64_t width = 1;
    std::vector<std::int64_t> lo, hi;  // per row; lo > hi: not needed
  };
  std::vector<Need> need(m.from.size());
  for (std::size_t s = 0; s < m.from.size(); ++s) {
    const Shape& ts = m.from[s].shape;
    const std::int64_t n = count(ts);
    need[s].width = ts.size() >= 2 ? n / ts[0] : n;
    const auto nrows = static_cast<std::size_t>(n / need[s].width);
    // The whole parameter needs every element of its tensors: no walk to find them.
    need[s].lo.assign(nrows, split ? need[s].width : 0);
    need[s].hi.assign(nrows, split ? -1 : need[s].width - 1);
  }
  if (split)
    place(m, c, [&](std::int64_t ours, int s, std::int64_t theirs) {
      if (part_index(ours) < 0) return;
      Need& nd = need[static_cast<std::size_t>(s)];
      const auto r = static_cast<std::size_t>(theirs / nd.width);
      const std::int64_t col = theirs % nd.width;
      nd.lo[r] = std::min(nd.lo[r], col);
      nd.hi[r] = std::max(nd.hi[r], col);
    });

  // Read those spans (consecutive whole rows in one read), widened to fp32 in place.
  std::vector<std::vector<float>> values(m.from.size());
  std::vector<unsigned char> raw;
  for (std::size_t s = 0; s < m.from.size(); ++s) {
    const auto it = S.tensors.find(m.from[s].name);
    ZERO_CHECK(it != S.tensors.end(), fmt::format("model.init_from: '{}' has no tensor '{}'", path_, m.from[s].name));
    const Source::Tensor& t = it->second;
    const Source::File& f = S.files[static_cast<std::size_t>(t.file)];
    const std::size_t es = dtype_size(t.dtype);
    const Need& nd = need[s];
    values[s].assign(static_cast<std::size_t>(count(t.shape)), 0.0f);
    auto load = [&](std::int64_t first, std::int64_t n) {  // elements [first, first + n)
      raw.resize(static_cast<std::size_t>(n) * es);
      f.fd.pread_all(raw.data(), raw.size(), f.data_start + t.begin + static_cast<std::uint64_t>(first) * es);
      S.bytes_read += raw.size();
      float* dst = values[s].data() + first;
      convert(raw.data(), t.dtype, dst, DType::f32, static_cast<std::size_t>(n));
      check_finite(f.fd.path(), m.from[s].name, dst, static_cast<std::size_t>(n),
                   t.transposed ? " (as stored, before llm.c's transpose)" : "");
    };
    const auto nrows = static_cast<std::int64_t>(nd.lo.size());
    for (std::int64_t r = 0; r < nrows;) {
      const std::int64_t lo = nd.lo[static_cast<std::size_t>(r)], hi = nd.hi[static_cast<std::size_t>(r)];
      if (lo > hi) {
        ++r;
        continue;
      }
      if (lo == 0 && hi == nd.width - 1) {  // whole rows: one read for the run of them
        std::int64_t e = r + 1;
        while (e < nrows && nd.lo[static_cast<std::size_t>(e)] == 0 &&
               nd.hi[static_cast<std::size_t>(e)] == nd.width - 1)
          ++e;
        load(r * nd.width, (e - r) * nd.width);
        r = e;
        continue;
      }
      load(r * nd.width + lo, hi - lo + 1);
      ++r;
    }
  }
  std::fill(out.begin(), out.end(), 0.0f);
  place(m, c, [&](std::int64_t ours, int s, std::int64_t theirs) {
    const std::int64_t at = part_index(ours);
    if (at >= 0)
      out[static_cast<std::size_t>(at)] = values[static_cast<std::size_t>(s)][static_cast<std::size_t>(theirs)];
  });
}
}  // namespace zero::hf
