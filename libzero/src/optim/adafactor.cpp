// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
// Cost"), in the form of Hugging Face's transformers.optimization.Adafactor: a factored second
// moment for matrices (row and column means of g^2 + eps1), an unfactored one for vectors,
// beta2_t = 1 - t^decay_rate, the update clipped by its RMS, the relative step and parameter
// scale, an optional first moment.
//
// Where the state lives: the per-element array 0 holds V for vectors; for a [rows, cols] matrix
// it holds the row statistics R in its first `rows` places and the column statistics C in the
// next `cols` (the rest is unused), so the factored state is saved, offloaded and re-split with
// the element arrays and needs nothing of its own. Every step each rank contributes the places
// it owns to the statistics exchange, so every rank knows every R and C.
//
// Three passes: (1) the row and column sums of g^2 + eps1 over the whole matrix, ||p||, and the
// vectors' V and ||u||; (2) the matrices' ||u||; (3) the update. Sums are SliceStats folds.
//
// Under tensor parallelism a rank holds a part of a split tensor (ParamInfo::split_axis): its
// ||p||^2 and ||u||^2 are summed over the tensor group, and so are a matrix's sums along the split
// axis (the row sums of a matrix cut by columns, the column sums of one cut by rows), while the
// sums across it are whole and local. Means divide by the whole tensor's extents. A rank keeps
// the R and C of the rows and columns it holds (all of R when the columns are cut, all of C when
// the rows are), and the mean of R over a matrix cut by rows is summed over the group.
//
// State in device memory is stepped by the backend's kernels (Backend::adafactor_*, the host
// kernels' arithmetic), the passes and statistics unchanged: the device folds the row and column
// sums exactly as the host does and the sums of p^2 and u^2 in a fixed order, into device doubles
// laid out as the exchange's slots per held slice; end_pass copies them out (the pass's one wait
// for the device) and adds them to the slots, so the exchange and what follows run on the host
// as before. The stored R and C travel through pinned staging, and the factors go back to the
// device once per step for the second and third passes.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/optimizers.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {
namespace {

// A matrix with a single row or column is factored to the same update as a vector.
bool factored(const ParamInfo& p) { return p.shape.size() == 2 && p.shape[0] >= 2 && p.shape[1] >= 2; }

// The first exchange: ||p||^2 and ||u||^2 (vectors) of every tensor (lane folds), then for each
// matrix its row sums, column sums, stored R and stored C (sequential folds): these, per tensor.
int matrix_slots(const ParamInfo& p) { return factored(p) ? static_cast<int>(2 * (p.shape[0] + p.shape[1])) : 0; }

struct Tensor {
  std::int64_t numel = 0, rows = 1, cols = 0;  // the rank's part
  double whole_numel = 0, whole_rows = 1, whole_cols = 0;
  bool factored = false;
  int split = -1;          // the axis tensor parallelism cuts, with a tensor group
  int index = 0;           // in the layout's numbering: slots 2 index (p2) and 2 index + 1 (u2)
  int slot_m = 0;          // a matrix's first slot: row sums, col sums, old R, old C
  std::int64_t rc_at = 0;  // a matrix's place in the device path's packed R, C and factors
  std::vector<float> row_factor, col_factor, new_r, new_c;
  float scale = 0.0f, neg_decay = 0.0f;
  double lr = 0.0;
};

class Adafactor final : public Optimizer {
 public:
  Adafactor(const OptimizerConfig& o, const OptimizerEnv& env) : cfg_(o), env_(env) {
    int slot = 2 * tensor_offsets(*env.layout).back();
    const double T = env.tensor != nullptr ? env.tensor->size() : 1;
    for (const UnitInfo& u : env.layout->units())
      for (const ParamInfo& p : u.params) {
        Tensor t;
        t.numel = p.numel;
        t.cols = p.numel;
        if (factored(p)) {
          t.factored = true;
          t.rows = p.shape[0];
          t.cols = p.shape[1];
        }
        t.index = static_cast<int>(tensors_.size());
        t.slot_m = slot;
        t.split = env.tensor != nullptr ? p.split_axis : -1;
        t.whole_numel = static_cast<double>(t.numel) * (t.split >= 0 ? T : 1.0);
        t.whole_rows = static_cast<double>(t.rows) * (t.factored && t.split == 0 ? T : 1.0);
        t.whole_cols = static_cast<double>(t.cols) * (t.split == (t.factored ? 1 : 0) ? T : 1.0);
        slot += matrix_slots(p);
        if (t.factored) {
          t.rc_at = rc_total_;
          rc_total_ += t.rows + t.cols;
        }
        tensors_.push_back(std::move(t));
      }
    slots_a_ = slot;
    if (env.tensor != nullptr) {
      AdafactorSplit split = adafactor_split(*env.layout);
      split_a_ = std::move(split.first);
      split_b_ = std::move(split.second);
    }
  }
  const char* name() const override { return "Adafactor"; }
  int moments() const override { return cfg_.adafactor_beta1 > 0.0 ? 2 : 1; }
  int passes() const override { return 3; }
  bool per_tensor() const override { return true; }
  bool device_kernels() const override { return true; }
  std::string unsupported(const Layout& layout) const override {
    for (const UnitInfo& u : layout.units())
      for (const ParamInfo& p : u.params)
        if (p.shape.size() > 2)
          return fmt::format("optimizer.type Adafactor factors 2-D tensors; '{}' of unit '{}' has {} dimensions",
                             p.name, u.name, p.shape.size());
    for (const UnitInfo& u : layout.units())
      for (const ParamInfo& p : u.params) {
        if (p.split_axis < 0 || p.shape.size() != 2) continue;
        std::vector<std::int64_t> whole = p.shape;
        whole[static_cast<std::size_t>(p.split_axis)] *= env_.tensor != nullptr ? env_.tensor->size() : 1;
        if (whole[0] >= 2 && whole[1] >= 2 && !factored(p))
          return fmt::format(
              "optimizer.type Adafactor factors '{}' of unit '{}' ([{}, {}] whole), but tensor parallelism leaves "
              "this rank a part of shape [{}, {}], too thin to hold its row and column statistics: use a smaller "
              "tensor parallelism",
              p.name, u.name, whole[0], whole[1], p.shape[0], p.shape[1]);
      }
    return needs_tensor_group("Adafactor", layout, env_);
  }

  void begin_step(const StepHyper& h) override {
    const double t = static_cast<double>(h.step);
    const double beta2t = 1.0 - std::pow(t, cfg_.decay_rate);
    c_ = offload::AdafactorConstants{h.grad_scale, static_cast<float>(beta2t), static_cast<float>(1.0 - beta2t),
                                     static_cast<float>(cfg_.eps1)};
    beta2t_ = beta2t;
    step_ = t;
    lr_ = h.lr;
    const int n = static_cast<int>(tensors_.size());
    const int held = env_.stage == 0 ? SliceStats::kAllSlices : env_.rank;
    a_.reset(slots_a_, env_.world, 2 * n, held);
    b_.reset(n, env_.world, n, held);
    device_ = nullptr;
  }

  void run(int pass, const OptimRun& r, Backend* device) override {
    if (device != nullptr) return run_device(pass, r, *device);
    Tensor& t = tensors_[static_cast<std::size_t>(r.tensor)];
    const std::size_t n = static_cast<std::size_t>(r.n);
    float* v = r.state[0];
    if (pass == 0) {
      double* p2 = a_.lanes(2 * t.index, r.slice);
      if (!t.factored) {
        offload::adafactor_vector(r.master, v, r.grad, r.grad_type, r.at, n, c_, p2,
                                  a_.lanes(2 * t.index + 1, r.slice));
        return;
      }
      const int rows_at = t.slot_m, cols_at = rows_at + static_cast<int>(t.rows);
      offload::adafactor_matrix_sums(r.master, r.grad, r.grad_type, r.at, n, t.cols, c_, &a_.at(rows_at, r.slice),
                                     &a_.at(cols_at, r.slice), p2);
      // The stored R and C this run holds (flat places [0, rows + cols) of the matrix).
      const int old_at = cols_at + static_cast<int>(t.cols);
      const std::int64_t stored = t.rows + t.cols;
      for (std::int64_t k = r.at; k < std::min(r.at + r.n, stored); ++k)
        a_.at(old_at + static_cast<int>(k), r.slice) += v[k - r.at];
    } else if (pass == 1) {
      if (!t.factored) return;
      offload::adafactor_matrix_rms(r.grad, r.grad_type, r.at, n, t.cols, c_.grad_scale, t.row_factor.data(),
                                    t.col_factor.data(), b_.lanes(r.tensor, r.slice));
      // This run's places of the new R and C.
      const std::int64_t stored = t.rows + t.cols;
      for (std::int64_t k = r.at; k < std::min(r.at + r.n, stored); ++k)
        v[k - r.at] = k < t.rows ? t.new_r[static_cast<std::size_t>(k)] : t.new_c[static_cast<std::size_t>(k - t.rows)];
    } else {
      const offload::AdafactorApply ap = apply_constants(t, r);
      offload::adafactor_apply(r.master, v, ap.first_moment ? r.state[1] : nullptr, r.grad, r.grad_type, r.param_out,
                               r.param_type, r.at, n, t.cols, t.factored ? t.row_factor.data() : nullptr,
                               t.factored ? t.col_factor.data() : nullptr, ap);
    }
  }

  void end_pass(int pass) override {
    Communicator* comm = env_.stage == 0 ? nullptr : env_.comm;
    if (device_ != nullptr) device_sums_out(pass);
    if (pass == 0) {
      a_.combine(comm, env_.rank);
      if (!split_a_.empty()) a_.sum_over_tensor_group(*env_.tensor, split_a_);
      r_sums_.clear();
      for (Tensor& t : tensors_) {
        // The step size: the relative step or the configured rate, times the parameter's RMS.
        double lr = lr_;
        if (cfg_.relative_step) lr = std::min(cfg_.warmup_init ? 1e-6 * step_ : 1e-2, 1.0 / std::sqrt(step_));
        if (cfg_.scale_parameter) lr *= std::max(cfg_.eps2, std::sqrt(a_.total(2 * t.index) / t.whole_numel));
        t.lr = lr;
        t.neg_decay = static_cast<float>(-cfg_.weight_decay * lr);
        if (!t.factored) {
          set_scale(t, a_.total(2 * t.index + 1));
          continue;
        }
        const int rows_at = t.slot_m, cols_at = rows_at + static_cast<int>(t.rows);
        const int old_r = cols_at + static_cast<int>(t.cols), old_c = old_r + static_cast<int>(t.rows);
        t.new_r.resize(static_cast<std::size_t>(t.rows));
        t.new_c.resize(static_cast<std::size_t>(t.cols));
        double r_sum = 0.0;
        for (std::int64_t i = 0; i < t.rows; ++i) {
          const double mean = a_.total(rows_at + static_cast<int>(i)) / t.whole_cols;
          const float r = static_cast<float>(beta2t_ * a_.total(old_r + static_cast<int>(i)) + (1.0 - beta2t_) * mean);
          t.new_r[static_cast<std::size_t>(i)] = r;
          r_sum += r;
        }
        for (std::int64_t j = 0; j < t.cols; ++j) {
          const double mean = a_.total(cols_at + static_cast<int>(j)) / t.whole_rows;
          t.new_c[static_cast<std::size_t>(j)] =
              static_cast<float>(beta2t_ * a_.total(old_c + static_cast<int>(j)) + (1.0 - beta2t_) * mean);
        }
        t.col_factor.resize(t.new_c.size());
        for (std::size_t j = 0; j < t.new_c.size(); ++j)
          t.col_factor[j] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(t.new_c[j])));
        r_sums_.push_back(r_sum);
      }
      // The sums of R of the matrices cut by rows are a part's: one exchange for all of them.
      if (env_.tensor != nullptr) {
        r_split_.clear();
        std::size_t k = 0;
        for (const Tensor& t : tensors_)
          if (t.factored) {
            if (t.split == 0) r_split_.push_back(r_sums_[k]);
            ++k;
          }
        sum_over_tensor_group(*env_.tensor, r_split_);
        k = 0;
        std::size_t s = 0;
        for (const Tensor& t : tensors_)
          if (t.factored) {
            if (t.split == 0) r_sums_[k] = r_split_[s++];
            ++k;
          }
      }
      // u = g / sqrt(R_i C_j / mean(R)) = g * rsqrt(R_i / mean(R)) * rsqrt(C_j).
      std::size_t k = 0;
      for (Tensor& t : tensors_) {
        if (!t.factored) continue;
        const double r_mean = r_sums_[k++] / t.whole_rows;
        t.row_factor.resize(t.new_r.size());
        for (std::size_t i = 0; i < t.new_r.size(); ++i)
          t.row_factor[i] = static_cast<float>(1.0 / std::sqrt(t.new_r[i] / r_mean));
      }
      if (device_ != nullptr) factors_in();
    } else {
      b_.combine(comm, env_.rank);
      if (!split_b_.empty()) b_.sum_over_tensor_group(*env_.tensor, split_b_);
      for (std::size_t k = 0; k < tensors_.size(); ++k)
        if (tensors_[k].factored) set_scale(tensors_[k], b_.total(static_cast<int>(k)));
    }
  }

 private:
  // The update's RMS clip and the step size, folded into one factor.
  void set_scale(Tensor& t, double u_sumsq) const {
    const double rms = std::sqrt(u_sumsq / t.whole_numel);
    t.scale = static_cast<float>(t.lr / std::max(1.0, rms / cfg_.clip_threshold));
  }

  // The last pass's constants for run r of tensor t.
  offload::AdafactorApply apply_constants(const Tensor& t, const OptimRun& r) const {
    return {c_.grad_scale,
            t.scale,
            r.decay ? t.neg_decay : 0.0f,
            static_cast<float>(cfg_.adafactor_beta1),
            static_cast<float>(1.0 - cfg_.adafactor_beta1),
            cfg_.adafactor_beta1 > 0.0};
  }

  // The device path (see the top of this file). Slice `slice`'s sums: held index `held(slice)`.
  std::size_t held() const { return env_.stage == 0 ? static_cast<std::size_t>(env_.world) : 1; }
  std::size_t held(int slice) const { return env_.stage == 0 ? static_cast<std::size_t>(slice) : 0; }
  int slice_of(std::size_t h) const { return env_.stage == 0 ? static_cast<int>(h) : env_.rank; }
  // rc_host_'s three regions: the stored R and C read in the first pass, the new R and C, the factors.
  float* rc_region(int k) const { return rc_host_.as<float>() + k * rc_total_; }

  void run_device(int pass, const OptimRun& r, Backend& dev) {
    Tensor& t = tensors_[static_cast<std::size_t>(r.tensor)];
    const std::size_t n = static_cast<std::size_t>(r.n);
    float* v = r.state[0];
    // The places [r.at, stored_end) of the stored R and C this run holds.
    const std::int64_t stored_end = t.factored ? std::min(r.at + r.n, t.rows + t.cols) : r.at;
    const std::size_t stored_bytes = static_cast<std::size_t>(std::max<std::int64_t>(stored_end - r.at, 0)) * 4;
    if (pass == 0) {
      if (device_ == nullptr) start_device(dev);
      double* a = dev_a_.as<double>() + held(r.slice) * static_cast<std::size_t>(slots_a_);
      if (!t.factored) return dev.adafactor_vector(r.master, v, r.grad, r.grad_type, n, c_, a + 2 * t.index);
      const int rows_at = t.slot_m, cols_at = rows_at + static_cast<int>(t.rows);
      dev.adafactor_matrix_sums(r.master, r.grad, r.grad_type, r.at, n, t.cols, c_, a + rows_at, a + cols_at,
                                a + 2 * t.index);
      if (stored_bytes > 0) {
        dev.to_host_async(rc_region(0) + t.rc_at + r.at, v, stored_bytes);
        stored_.push_back({r.tensor, r.slice, r.at, stored_end});
      }
      return;
    }
    const float* rf = t.factored ? factors_.as<float>() + t.rc_at : nullptr;
    const float* cf = t.factored ? rf + t.rows : nullptr;
    if (pass == 1) {
      if (!t.factored) return;
      dev.adafactor_matrix_rms(
          r.grad, r.grad_type, r.at, n, t.cols, c_.grad_scale, rf, cf,
          dev_b_.as<double>() + held(r.slice) * tensors_.size() + static_cast<std::size_t>(t.index));
      if (stored_bytes > 0) dev.from_host_async(v, rc_region(1) + t.rc_at + r.at, stored_bytes);
      return;
    }
    const offload::AdafactorApply ap = apply_constants(t, r);
    dev.adafactor_apply(r.master, v, ap.first_moment ? r.state[1] : nullptr, r.grad, r.grad_type, r.param_out,
                        r.param_type, r.at, n, t.cols, rf, cf, ap);
  }

  // The step's first device run: the device sums start at zero.
  void start_device(Backend& dev) {
    device_ = &dev;
    const std::size_t a_bytes = held() * static_cast<std::size_t>(slots_a_) * sizeof(double);
    const std::size_t b_bytes = held() * tensors_.size() * sizeof(double);
    if (!dev_a_) {
      dev_a_ = dev.alloc(a_bytes);
      dev_b_ = dev.alloc(b_bytes);
      sums_host_ = dev.staging_buffer(std::max(a_bytes, b_bytes));
      if (rc_total_ > 0) {
        factors_ = dev.alloc(static_cast<std::size_t>(rc_total_) * sizeof(float));
        rc_host_ = dev.staging_buffer(3 * static_cast<std::size_t>(rc_total_) * sizeof(float));
      }
    }
    dev.zero(dev_a_.get(), a_bytes);
    dev.zero(dev_b_.get(), b_bytes);
    stored_.clear();
  }

  // After pass `pass` on the device: its sums (and in pass 0 the stored R and C) join the slots.
  void device_sums_out(int pass) {
    const bool first = pass == 0;
    const std::size_t per = first ? static_cast<std::size_t>(slots_a_) : tensors_.size();
    device_->to_host_async(sums_host_.data(), first ? dev_a_.get() : dev_b_.get(), held() * per * sizeof(double));
    device_->wait_copies();
    SliceStats& s = first ? a_ : b_;
    const double* got = sums_host_.as<double>();
    for (std::size_t h = 0; h < held(); ++h)
      for (std::size_t k = 0; k < per; ++k) s.at(static_cast<int>(k), slice_of(h)) += got[h * per + k];
    if (!first) return;
    for (const Stored& p : stored_) {
      const Tensor& t = tensors_[static_cast<std::size_t>(p.tensor)];
      const int old_at = t.slot_m + static_cast<int>(t.rows + t.cols);
      for (std::int64_t k = p.begin; k < p.end; ++k)
        a_.at(old_at + static_cast<int>(k), p.slice) += rc_region(0)[t.rc_at + k];
    }
    stored_.clear();
  }

  // The new R and C, and the factors, for the device's second and third passes (the host has
  // waited for the device since their last use, in device_sums_out).
  void factors_in() {
    if (rc_total_ == 0) return;
    for (const Tensor& t : tensors_) {
      if (!t.factored) continue;
      float* fresh = rc_region(1) + t.rc_at;
      float* factor = rc_region(2) + t.rc_at;
      std::copy(t.new_r.begin(), t.new_r.end(), fresh);
      std::copy(t.new_c.begin(), t.new_c.end(), fresh + t.rows);
      std::copy(t.row_factor.begin(), t.row_factor.end(), factor);
      std::copy(t.col_factor.begin(), t.col_factor.end(), factor + t.rows);
    }
    device_->from_host_async(factors_.get(), rc_region(2), static_cast<std::size_t>(rc_total_) * sizeof(float));
  }

  OptimizerConfig cfg_;
  OptimizerEnv env_;
  std::vector<Tensor> tensors_;
  int slots_a_ = 0;
  std::int64_t rc_total_ = 0;  // the matrices' rows + cols
  // The device path: this step's backend (null: host memory), its sums and factors.
  struct Stored {  // a run's places of the stored R and C, read in the first pass
    int tensor = 0, slice = 0;
    std::int64_t begin = 0, end = 0;
  };
  Backend* device_ = nullptr;
  Buffer dev_a_, dev_b_, factors_;
  offload::PinnedBuffer sums_host_, rc_host_;
  std::vector<Stored> stored_;
  offload::AdafactorConstants c_{};
  double beta2t_ = 0.0, step_ = 1.0, lr_ = 0.0;
  SliceStats a_, b_;
  // The statistics summed over the tensor group: a_'s and b_'s slots, and the matrices' sums of R.
  std::vector<int> split_a_, split_b_;
  std::vector<double> r_sums_, r_split_;
};

}  // namespace

AdafactorSplit adafactor_split(const Layout& layout) {
  AdafactorSplit s;
  int slot = 2 * tensor_offsets(layout).back(), index = 0;
  for (const UnitInfo& u : layout.units())
    for (const ParamInfo& p : u.params) {
      if (p.split_axis >= 0) {
        s.first.insert(s.first.end(), {2 * index, 2 * index + 1});
        if (factored(p)) {
          // The sums along the cut axis: row sums of a matrix cut by columns, column sums of one
          // cut by rows.
          const std::int64_t rows = p.shape[0], cols = p.shape[1];
          const int at = p.split_axis == 1 ? slot : slot + static_cast<int>(rows);
          for (std::int64_t k = 0; k < (p.split_axis == 1 ? rows : cols); ++k)
            s.first.push_back(at + static_cast<int>(k));
          s.second.push_back(index);
          if (p.split_axis == 0) ++s.row_cut;
        }
      }
      slot += matrix_slots(p);
      ++index;
    }
  return s;
}

std::int64_t adafactor_stat_slots(const Layout& layout) {
  std::int64_t n = 2 * tensor_offsets(layout).back();
  for (const UnitInfo& u : layout.units())
    for (const ParamInfo& p : u.params) n += matrix_slots(p);
  return n;
}

std::unique_ptr<Optimizer> make_adafactor(const OptimizerConfig& o, const OptimizerEnv& env) {
  return std::make_unique<Adafactor>(o, env);
}

}  // namespace zero
