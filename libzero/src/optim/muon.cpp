// Muon (Jordan et al. 2024; the form of PyTorch's torch.optim.Muon): momentum, then the quintic
// Newton-Schulz orthogonalisation of each whole matrix, scaled by its shape (adjust_lr_fn), with
// decoupled weight decay. Embeddings, the LM head (ParamInfo::embedding) and the parameters that
// are not 2-D are stepped by AdamW with the same rate, betas and eps, as every Muon recipe does.
//
// A rank's slice may hold parts of a matrix. Each matrix has one owner (balanced by the cost of
// its products): after the momentum pass the momentum updates of every unit are all-gathered,
// each owner orthogonalises its matrices, and a reduce-scatter (every element written by exactly
// one rank, so the sum is exact) brings each rank its slice of the result. At stage 0 every rank
// holds every matrix and does the work itself, as it does the rest of the step. An owner takes
// its matrices shape by shape (each unit's; at stage 0 all of them together): several small ones
// of one shape at once, one per host thread (offload::newton_schulz_batch) or in one batched
// launch per product on the device (Backend::newton_schulz_batch). A matrix cut by
// tensor parallelism is orthogonalised whole: its owners (the same partition rank in each tensor
// rank's group) put its parts together over the tensor group, and one of them computes it
// (muon_split.hpp), so the update is the one tensor parallelism 1 makes.
//
// State in device memory is stepped by the backend's kernels with the same organisation: the
// momentum and the update bit for bit as the host's (Backend::muon_momentum, muon_apply; AdamW
// through Backend::adam), the update inputs in device buffers, gathered and scattered by the
// backend's communicator over the partition group, and each owner's Newton-Schulz products in
// bf16 with fp32 accumulation (Backend::newton_schulz): close to the host's fp32 iteration, not
// equal to it.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/muon_split.hpp"
#include "optim/optimizers.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {
namespace {

struct Matrix {
  int unit = 0;
  std::int64_t offset = 0, rows = 0, cols = 0;  // this rank's part's
  int owner = 0;
  float scale = 1.0f;  // from the whole matrix's shape
  int split = -1;      // its entry in splits_ when tensor parallelism cuts it
};

class Muon final : public Optimizer {
 public:
  Muon(const OptimizerConfig& o, const OptimizerEnv& env) : cfg_(o), env_(env) {
    const Layout& layout = *env.layout;
    const std::vector<MuonOwner> owners =
        muon_owners(layout, env.world, env.tensor != nullptr ? env.tensor->size() : 1);
    for (int u = 0; u < layout.num_units(); ++u)
      for (const ParamInfo& p : layout.unit(u).params) {
        const bool matrix = muon_matrix(p);
        index_.push_back(matrix ? static_cast<int>(matrices_.size()) : -1);
        if (!matrix) continue;
        Matrix m{u, p.offset, p.shape[0], p.shape[1], 0, 1.0f, -1};
        double r = static_cast<double>(m.rows), c = static_cast<double>(m.cols);
        if (p.split_axis >= 0 && env.tensor != nullptr && env.tensor->size() > 1) {
          const int T = env.tensor->size();
          SplitMatrix sm{p.shape, p.split_axis, p.split_blocks, m.rows * (p.split_axis == 0 ? T : 1),
                         m.cols * (p.split_axis == 1 ? T : 1)};
          r = static_cast<double>(sm.rows);
          c = static_cast<double>(sm.cols);
          m.split = static_cast<int>(splits_.size());
          splits_.push_back(std::move(sm));
        }
        m.scale = static_cast<float>(cfg_.adjust_lr_fn == MuonScale::original ? std::sqrt(std::max(1.0, r / c))
                                                                              : 0.2 * std::sqrt(std::max(r, c)));
        m.owner = owners[matrices_.size()].owner;
        matrices_.push_back(m);
      }
    x_.resize(static_cast<std::size_t>(layout.num_units()));
    for (const Matrix& m : matrices_) {
      auto& x = x_[static_cast<std::size_t>(m.unit)];
      if (x.empty()) x.assign(static_cast<std::size_t>(env.own_len(m.unit)), 0.0f);
    }
  }
  const char* name() const override { return "Muon"; }
  int moments() const override { return 2; }
  int passes() const override { return 2; }
  bool per_tensor() const override { return true; }
  bool device_kernels() const override { return true; }
  // Newton-Schulz needs each whole matrix: a matrix cut by tensor parallelism is put together
  // over the tensor group, so an engine without one cannot step it. Its AdamW parameters are
  // element-wise and may be split.
  std::string unsupported(const Layout& layout) const override {
    if (env_.tensor != nullptr) return {};
    for (const UnitInfo& u : layout.units())
      for (const ParamInfo& p : u.params)
        if (p.split_axis >= 0 && muon_matrix(p))
          return fmt::format(
              "optimizer.type Muon orthogonalises each whole matrix (Newton-Schulz), and '{}' of unit '{}' is split "
              "by tensor parallelism, but the engine has no tensor group to put its parts together over: construct "
              "the Engine with the ProcessGroups whose tensor group holds the other parts",
              p.name, u.name);
    return {};
  }

  void begin_step(const StepHyper& h) override {
    h_ = h;
    adam_ = AdamHyper{static_cast<float>(h.lr),
                      static_cast<float>(cfg_.beta1),
                      static_cast<float>(cfg_.beta2),
                      static_cast<float>(cfg_.eps),
                      static_cast<float>(cfg_.weight_decay),
                      true,
                      true,
                      h.step,
                      h.grad_scale};
    device_ = nullptr;
  }

  void run(int pass, const OptimRun& r, Backend* device) override {
    if (device != nullptr) return run_device(pass, r, *device);
    const int mi = index_[static_cast<std::size_t>(r.tensor)];
    const std::size_t n = static_cast<std::size_t>(r.n);
    if (mi < 0) {  // AdamW, in the pass that writes the parameters
      if (pass == 0) return;
      AdamHyper a = adam_;
      if (!r.decay) a.weight_decay = 0.0f;
      offload::adam_step(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.param_out, r.param_type, n, a);
      return;
    }
    float* x = x_[static_cast<std::size_t>(r.unit)].data() + r.own_at;
    if (pass == 0) {
      offload::muon_momentum(r.state[0], r.grad, r.grad_type, n, h_.grad_scale, static_cast<float>(cfg_.momentum),
                             cfg_.nesterov, x);
      return;
    }
    const Matrix& m = matrices_[static_cast<std::size_t>(mi)];
    const float decay = r.decay ? static_cast<float>(1.0 - h_.lr * cfg_.weight_decay) : 1.0f;
    offload::muon_apply(r.master, x, r.param_out, r.param_type, n, decay, static_cast<float>(h_.lr * m.scale));
  }

  void end_pass(int) override {
    if (device_ != nullptr) return end_pass_device();
    const bool local = env_.stage == 0 || env_.comm == nullptr || env_.world == 1;
    for (std::size_t u = 0; u < x_.size(); ++u) {
      auto& x = x_[u];
      if (x.empty()) continue;
      const int unit = static_cast<int>(u);
      if (local) {
        for (const Matrix& m : matrices_)
          if (m.unit == unit) orthogonalise(m, x.data() + m.offset);
        orthogonalise_splits();
        continue;
      }
      const std::size_t slice = x.size();
      full_.assign(slice * static_cast<std::size_t>(env_.world), 0.0f);
      env_.comm->all_gather(x.data(), full_.data(), slice, DType::f32);
      // Keep only what this rank computes: its matrices, orthogonalised.
      result_.assign(full_.size(), 0.0f);
      for (const Matrix& m : matrices_)
        if (m.unit == unit && m.owner == env_.rank) orthogonalise(m, full_.data() + m.offset);
      orthogonalise_whole();
      orthogonalise_splits();
      for (const Matrix& m : matrices_)
        if (m.unit == unit && m.owner == env_.rank) {
          const float* at = full_.data() + m.offset;
          std::copy(at, at + m.rows * m.cols, result_.data() + m.offset);
        }
      env_.comm->reduce_scatter(result_.data(), x.data(), slice, DType::f32, ReduceOp::sum);
    }
    orthogonalise_whole();  // the local case's, every unit's matrices together
  }

 private:
  // A whole matrix is queued for orthogonalise_whole, a part for orthogonalise_splits.
  void orthogonalise(const Matrix& m, float* at) {
    if (m.split < 0) return whole_.push_back({at, m.rows, m.cols});
    queued_.push_back(&splits_[static_cast<std::size_t>(m.split)]);
    queued_at_.push_back(at);
  }
  // The queued whole matrices (muon_split.hpp: orthogonalise_host on the host; on the device each
  // shape's products in one launch each, Backend::newton_schulz_batch).
  void orthogonalise_whole() { orthogonalise_host(whole_, cfg_.ns_steps, work_); }
  void orthogonalise_whole(Backend& dev) {
    each_shape(whole_, [&](std::int64_t rows, std::int64_t cols, std::vector<float*>& xs) {
      dev.newton_schulz_batch(xs.data(), xs.size(), rows, cols, cfg_.ns_steps);
    });
  }
  // The queued parts, in the same order on every member of the tensor group (the same unit, the
  // same owners: their shapes are the same).
  void orthogonalise_splits() {
    if (!queued_.empty()) orthogonalise_split(*env_.tensor, queued_, queued_at_, cfg_.ns_steps, work_);
    queued_.clear();
    queued_at_.clear();
  }

  bool local() const { return env_.stage == 0 || env_.comm == nullptr || env_.world == 1; }

  void run_device(int pass, const OptimRun& r, Backend& dev) {
    if (device_ == nullptr) start_device(dev);
    const int mi = index_[static_cast<std::size_t>(r.tensor)];
    const std::size_t n = static_cast<std::size_t>(r.n);
    if (mi < 0) {
      if (pass == 0) return;
      AdamHyper a = adam_;
      if (!r.decay) a.weight_decay = 0.0f;
      dev.adam(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.param_out, r.param_type, n, a);
      return;
    }
    float* x = x_dev_[static_cast<std::size_t>(r.unit)].as<float>() + r.own_at;
    if (pass == 0) {
      dev.muon_momentum(r.state[0], r.grad, r.grad_type, n, h_.grad_scale, static_cast<float>(cfg_.momentum),
                        cfg_.nesterov, x);
      return;
    }
    const Matrix& m = matrices_[static_cast<std::size_t>(mi)];
    const float decay = r.decay ? static_cast<float>(1.0 - h_.lr * cfg_.weight_decay) : 1.0f;
    dev.muon_apply(r.master, x, r.param_out, r.param_type, n, decay, static_cast<float>(h_.lr * m.scale));
  }

  // The step's first device run. The device buffers are made once, for every unit with matrices
  // (every rank takes part in every unit's exchange).
  void start_device(Backend& dev) {
    ZERO_CHECK(splits_.empty(),
               fmt::format("optimizer.type Muon with tensor parallelism steps host memory only: its matrices are put "
                           "together over the tensor group's host communicator, and the {} backend keeps the state in "
                           "device memory; use tensor parallelism 1 with Muon on this backend, or the host backend",
                           dev.name()));
    device_ = &dev;
    if (!x_dev_.empty()) return;
    x_dev_.resize(x_.size());
    std::size_t widest = 0;
    for (std::size_t u = 0; u < x_.size(); ++u) {
      if (x_[u].empty()) continue;
      x_dev_[u] = dev.alloc(x_[u].size() * sizeof(float));
      widest = std::max(widest, x_[u].size());
    }
    if (!local()) {
      const std::size_t bytes = widest * static_cast<std::size_t>(env_.world) * sizeof(float);
      full_dev_ = dev.alloc(bytes);
      result_dev_ = dev.alloc(bytes);
    }
  }

  // end_pass on device memory: the host path's exchange over the backend's communicator (the
  // partition group's, whose ranks are numbered as env_.comm's).
  void end_pass_device() {
    Backend& dev = *device_;
    Communicator* comm = local() ? nullptr : &dev.comm();
    if (comm != nullptr)
      ZERO_CHECK(comm->size() == env_.world && comm->rank() == env_.rank,
                 fmt::format("Muon on the {} backend: its communicator has {} ranks (this one {}), the partition "
                             "group {} (this one {})",
                             dev.name(), comm->size(), comm->rank(), env_.world, env_.rank));
    for (std::size_t u = 0; u < x_dev_.size(); ++u) {
      if (!x_dev_[u]) continue;
      float* x = x_dev_[u].as<float>();
      const int unit = static_cast<int>(u);
      if (comm == nullptr) {
        for (const Matrix& m : matrices_)
          if (m.unit == unit) whole_.push_back({x + m.offset, m.rows, m.cols});
        continue;
      }
      const std::size_t slice = x_[u].size();
      float* full = full_dev_.as<float>();
      float* result = result_dev_.as<float>();
      comm->all_gather(x, full, slice, DType::f32);
      dev.zero(result, slice * static_cast<std::size_t>(env_.world) * sizeof(float));
      for (const Matrix& m : matrices_)
        if (m.unit == unit && m.owner == env_.rank) whole_.push_back({full + m.offset, m.rows, m.cols});
      orthogonalise_whole(dev);
      for (const Matrix& m : matrices_)
        if (m.unit == unit && m.owner == env_.rank)
          dev.copy(result + m.offset, full + m.offset, static_cast<std::size_t>(m.rows * m.cols) * sizeof(float));
      comm->reduce_scatter(result, x, slice, DType::f32, ReduceOp::sum);
    }
    orthogonalise_whole(dev);  // the local case's, every unit's matrices together
  }

  OptimizerConfig cfg_;
  OptimizerEnv env_;
  std::vector<Matrix> matrices_;
  std::vector<int> index_;             // per tensor: its matrix, or -1 (AdamW)
  std::vector<std::vector<float>> x_;  // per unit with matrices: the owned range's update input / result
  std::vector<float> full_, result_, work_;
  std::vector<SplitMatrix> splits_;  // the matrices tensor parallelism cuts
  std::vector<WholeMatrix> whole_;   // this step's whole matrices to orthogonalise
  std::vector<const SplitMatrix*> queued_;
  std::vector<float*> queued_at_;
  StepHyper h_;
  AdamHyper adam_;
  // The device path: this step's backend (null: host memory), x_'s device twins, the exchange's.
  Backend* device_ = nullptr;
  std::vector<Buffer> x_dev_;
  Buffer full_dev_, result_dev_;
};

}  // namespace

bool muon_matrix(const ParamInfo& p) { return p.shape.size() == 2 && !p.embedding; }

std::vector<MuonOwner> muon_owners(const Layout& layout, int world, int tensors) {
  std::vector<MuonOwner> out;
  std::vector<double> load(static_cast<std::size_t>(std::max(world, 1)), 0.0);
  for (const UnitInfo& u : layout.units())
    for (const ParamInfo& p : u.params) {
      if (!muon_matrix(p)) continue;
      MuonOwner m{p.shape[0], p.shape[1], p.split_axis >= 0 && tensors > 1, 0};
      if (m.split) (p.split_axis == 0 ? m.rows : m.cols) *= tensors;
      const double r = static_cast<double>(m.rows), c = static_cast<double>(m.cols);
      // The least-loaded rank takes the next matrix (its products cost about min(r,c)^2 max(r,c)).
      const auto least = std::min_element(load.begin(), load.end());
      m.owner = static_cast<int>(least - load.begin());
      *least += std::min(r, c) * std::min(r, c) * std::max(r, c);
      out.push_back(m);
    }
  return out;
}

double newton_schulz_flops(std::int64_t rows, std::int64_t cols, int steps) {
  const double r = static_cast<double>(std::min(rows, cols)), k = static_cast<double>(std::max(rows, cols));
  return steps * (2 * r * r * k + 2 * r * r * r + 2 * r * r * k);
}

std::unique_ptr<Optimizer> make_muon(const OptimizerConfig& o, const OptimizerEnv& env) {
  return std::make_unique<Muon>(o, env);
}

}  // namespace zero
