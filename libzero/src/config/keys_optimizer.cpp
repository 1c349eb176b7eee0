// The optimizer section of libzero's key table (config/keys.hpp): optimizer.type and each
// optimizer's hyper-parameters, with the rules saying which optimizers a key applies to.
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "config/keys.hpp"

namespace zero::keys {

namespace {

// Which optimizer types a key applies to, as the reason it does not: "applies to Adam, AdamW,
// Lamb, Lion and Muon, not SGD (use momentum)"; empty where it applies.
std::string optimizers_text(std::initializer_list<OptimizerType> types) {
  std::string out;
  std::size_t i = 0;
  for (OptimizerType t : types) {
    out += (i == 0 ? "" : (i + 1 == types.size() ? " and " : ", ")) + std::string(to_string(t));
    ++i;
  }
  return out;
}

std::string for_optimizers(const Config& c, std::initializer_list<OptimizerType> types, const std::string& hint = {}) {
  for (OptimizerType t : types)
    if (c.optimizer.type == t) return std::string();
  std::string why =
      "applies to " + optimizers_text(types) + ", not " + to_string(c.optimizer.type) + " (optimizer.type)";
  if (!hint.empty()) why += "; " + hint;
  return why;
}

using O = OptimizerType;

std::string adam_family(const Config& c) {
  // OneBitLamb takes the key (DeepSpeed's example configs give it) but moves without bias
  // correction whatever it says, as DeepSpeed's; cross_checks.cpp refuses true.
  return for_optimizers(c, {O::adam, O::adamw, O::lamb, O::onebit_lamb},
                        c.optimizer.type == O::onebit_adam
                            ? "OneBitAdam uses its moments without bias correction, as DeepSpeed's"
                            : std::string());
}

std::string adafactor_only(const Config& c) { return for_optimizers(c, {O::adafactor}); }

std::string muon_only(const Config& c) { return for_optimizers(c, {O::muon}); }

std::string onebit_lamb_only(const Config& c) { return for_optimizers(c, {O::onebit_lamb}); }

std::string betas_rule(const Config& c) {
  std::string hint;
  if (c.optimizer.type == O::sgd) hint = "use momentum";
  if (c.optimizer.type == O::adafactor)
    hint = "Adafactor's first-moment rate is beta1, its second-moment decay decay_rate";
  return for_optimizers(c, {O::adam, O::adamw, O::lamb, O::lion, O::muon, O::onebit_adam, O::onebit_lamb}, hint);
}

std::string eps_rule(const Config& c) {
  std::string hint;
  if (c.optimizer.type == O::adafactor) hint = "Adafactor's are eps1 and eps2";
  if (c.optimizer.type == O::lion) hint = "Lion's update is a sign and has no denominator";
  return for_optimizers(c, {O::adam, O::adamw, O::lamb, O::muon, O::onebit_adam, O::onebit_lamb}, hint);
}

std::string momentum_rule(const Config& c) {
  const std::string type = to_string(c.optimizer.type);
  return for_optimizers(
      c, {O::sgd, O::muon},
      c.optimizer.type == O::adafactor ? "Adafactor's first-moment rate is beta1" : type + "'s momentum is betas[0]");
}

std::string adafactor_beta1_rule(const Config& c) {
  return for_optimizers(c, {O::adafactor},
                        c.optimizer.type == O::sgd ? "SGD's is momentum" : "use betas for its moment rates");
}

// SGD takes nesterov: false only (cross_checks refuses true); Muon takes both.
std::string nesterov_rule(const Config& c) { return for_optimizers(c, {O::muon, O::sgd}); }

}  // namespace

std::vector<Spec> optimizer_keys() {
  return {
      // ---- optimizer
      // Hyper-parameters take DeepSpeed's names where DeepSpeed has the optimizer (Adam, AdamW,
      // Lamb, Lion, SGD), Hugging Face's for Adafactor and PyTorch's (torch.optim.Muon) for Muon.
      {.path = "optimizer.type",
       .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) { return static_cast<int>(k.optimizer.type); },
                        [](Config& k, int v) { k.optimizer.type = OptimizerType(v); }};
       },
       .choices = {"AdamW", "Adam", "SGD", "Lamb", "Lion", "Adafactor", "Muon", "OneBitAdam", "OneBitLamb"},
       .any_case = true,
       .doc = "The optimizer; required when the section is present. Lamb: Adam's update scaled per tensor by "
              "the trust ratio norm(p) / norm(update), clamped to [min_coeff, max_coeff]. Lion: the sign of "
              "interpolated momentum. "
              "Adafactor (Hugging Face's): factored second moment for matrices. Muon: momentum orthogonalized "
              "by Newton-Schulz iterations for matrices, AdamW (betas, eps) for the 1-D, embedding and head "
              "tensors. OneBitAdam (DeepSpeed's): Adam for freeze_step steps, then the variance frozen and the "
              "momentum exchanged at 1 bit per element with error feedback, in place of the gradient "
              "reduction (stages 1 and 2). OneBitLamb (DeepSpeed's): Lamb for freeze_step steps, recording each "
              "tensor's trust ratio, then the same compressed exchange, the variance frozen and each tensor's "
              "recorded ratio modulated by a bounded factor (stages 1 and 2).",
       .refused_values = {{"ZeroOneAdam", "0/1 Adam is not implemented"},
                          {"Adagrad", "is a DeepSpeed optimizer that libzero does not implement"}}},
      {.path = "optimizer.params.lr",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.lr; },
       .range = ge(0),
       .auto_rule = Auto::fallback,
       .doc = "Learning rate (the peak for WarmupCosineLR). Not with Adafactor's relative_step, which "
              "replaces it.",
       // Adafactor's relative step size replaces lr (and lr given with it is an error).
       .omitted =
           [](const Config& c) { return c.optimizer.type == OptimizerType::adafactor && c.optimizer.relative_step; }},
      {.path = "optimizer.params.betas",
       .kind = Kind::pair,
       .slot = [](Config& c) -> Slot {
         return PairRef{&c.optimizer.beta1, &c.optimizer.beta2};
       },
       .range = Range::closed_open(0, 1),
       .auto_rule = Auto::fallback,
       .doc = "Moment decay rates: Adam, AdamW, Lamb, OneBitAdam and OneBitLamb; Lion's interpolation and momentum "
              "rates; Muon's "
              "AdamW part (its non-matrix tensors).",
       .default_text = "Lion `[0.9, 0.99]`, others `[0.9, 0.999]`",
       // Lion's paper and DeepSpeed's FusedLion default to (0.9, 0.99); the rest to Adam's.
       .dynamic_default =
           [](Config& c) {
             c.optimizer.beta1 = 0.9;
             c.optimizer.beta2 = c.optimizer.type == OptimizerType::lion ? 0.99 : 0.999;
           },
       .default_depends_on = "optimizer.type",
       .inapplicable = betas_rule},
      {.path = "optimizer.params.eps",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.eps; },
       .range = Range::above(0),
       .auto_rule = Auto::fallback,
       .doc = "Denominator term: Adam, AdamW, Lamb, OneBitAdam, OneBitLamb, and Muon's AdamW part.",
       .inapplicable = eps_rule},
      {.path = "optimizer.params.weight_decay",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.weight_decay; },
       .range = ge(0),
       .auto_rule = Auto::fallback,
       .doc = "Weight decay, on the parameters the layout marks (Layout::set_decay; zero-gpt: matrices and "
              "embeddings only): decoupled for AdamW (and Adam with adam_w_mode), added to the gradient "
              "for Adam without adam_w_mode.",
       .default_text = "AdamW `0.01`, Muon `0.1`, others `0`",
       // PyTorch's defaults, which DeepSpeed passes through: decoupled decay 0.01 for AdamW,
       // 0.1 for Muon (torch.optim.Muon), none for the others (DeepSpeed's Lamb and Lion,
       // Hugging Face's Adafactor, SGD).
       .dynamic_default =
           [](Config& c) {
             c.optimizer.weight_decay = c.optimizer.type == OptimizerType::adamw  ? 0.01
                                        : c.optimizer.type == OptimizerType::muon ? 0.1
                                                                                  : 0.0;
           },
       .default_depends_on = "optimizer.type"},
      {.path = "optimizer.params.adam_w_mode",
       .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.optimizer.adam_w_mode; },
       .doc = "With type Adam: true (DeepSpeed's default) decouples the weight decay as AdamW "
              "does, false adds it to the gradient (L2). AdamW always decouples, as in DeepSpeed.",
       .inapplicable =
           [](const Config& c) {
             return for_optimizers(c, {O::adam, O::adamw});
           }},
      {.path = "optimizer.params.bias_correction",
       .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.optimizer.bias_correction; },
       .doc = "Adam, AdamW, Lamb: divide the moments by 1 - beta^t (DeepSpeed's BERT Lamb configs set false). "
              "OneBitLamb takes false only (DeepSpeed's ignores the key and never corrects).",
       .inapplicable = adam_family},
      {.path = "optimizer.params.max_coeff",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.max_coeff; },
       .range = Range::above(0),
       .doc = "Lamb, OneBitLamb: upper bound of the trust ratio (DeepSpeed's FusedLamb).",
       .inapplicable =
           [](const Config& c) {
             return for_optimizers(c, {O::lamb, O::onebit_lamb});
           }},
      {.path = "optimizer.params.min_coeff",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.min_coeff; },
       .range = ge(0),
       .doc = "Lamb, OneBitLamb: lower bound of the trust ratio; at most max_coeff.",
       .inapplicable =
           [](const Config& c) {
             return for_optimizers(c, {O::lamb, O::onebit_lamb});
           }},
      {.path = "optimizer.params.eps1",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.eps1; },
       .range = Range::above(0),
       .doc = "Adafactor: added to the squared gradient (Hugging Face's eps[0]).",
       .inapplicable = adafactor_only},
      {.path = "optimizer.params.eps2",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.eps2; },
       .range = ge(0),
       .doc = "Adafactor: lower bound of the parameter RMS that scale_parameter multiplies by (Hugging "
              "Face's eps[1]).",
       .inapplicable = adafactor_only},
      {.path = "optimizer.params.clip_threshold",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.clip_threshold; },
       .range = Range::above(0),
       .doc = "Adafactor: the update's RMS is clipped to this.",
       .inapplicable = adafactor_only},
      {.path = "optimizer.params.decay_rate",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.decay_rate; },
       .range = below(0),
       .doc = "Adafactor: the second moment's rate at step t is 1 - t^decay_rate.",
       .inapplicable = adafactor_only},
      {.path = "optimizer.params.beta1",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.adafactor_beta1; },
       .range = Range::closed_open(0, 1),
       .doc = "Adafactor: first-moment rate; 0 keeps no first moment (Hugging Face's None, which null "
              "also means).",
       .inapplicable = adafactor_beta1_rule,
       // Hugging Face's Adafactor reads beta1=None as no first moment, the default here.
       .null_is_default = true},
      {.path = "optimizer.params.scale_parameter",
       .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.optimizer.scale_parameter; },
       .doc = "Adafactor: multiply the step size by max(eps2, RMS of the parameter). The default is the "
              "Hugging Face Trainer's (the Adafactor class defaults to true).",
       .inapplicable = adafactor_only},
      {.path = "optimizer.params.relative_step",
       .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.optimizer.relative_step; },
       .doc = "Adafactor: the step size is min(1e-2, 1/sqrt(t)) instead of lr (then lr may not be given). "
              "The default is the Hugging Face Trainer's (the Adafactor class defaults to true).",
       .inapplicable = adafactor_only},
      {.path = "optimizer.params.warmup_init",
       .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.optimizer.warmup_init; },
       .doc = "Adafactor: with relative_step, the step size warms up as 1e-6 t.",
       .inapplicable = adafactor_only},
      {.path = "optimizer.params.momentum",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.momentum; },
       .range = Range::closed_open(0, 1),
       .doc = "SGD and Muon momentum.",
       .default_text = "SGD `0`, Muon `0.95`",
       // PyTorch's defaults: torch.optim.SGD 0, torch.optim.Muon 0.95.
       .dynamic_default =
           [](Config& c) { c.optimizer.momentum = c.optimizer.type == OptimizerType::muon ? 0.95 : 0.0; },
       .default_depends_on = "optimizer.type",
       .inapplicable = momentum_rule},
      {.path = "optimizer.params.nesterov",
       .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.optimizer.nesterov; },
       .doc = "Muon: Nesterov momentum. SGD takes `false` only (Nesterov SGD is not implemented).",
       .inapplicable = nesterov_rule,
       // Nesterov is Muon's; an SGD config gets the key only as written (false).
       .omitted = [](const Config& c) { return c.optimizer.type != OptimizerType::muon; }},
      {.path = "optimizer.params.freeze_step",
       .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.optimizer.freeze_step; },
       .range = between(0, 1e15),
       .doc = "OneBitAdam, OneBitLamb: exact Adam (Lamb) steps (full-precision gradient reduction) before "
              "the variance is frozen and the momentum exchange is compressed to 1 bit.",
       .inapplicable =
           [](const Config& c) {
             return for_optimizers(c, {O::onebit_adam, O::onebit_lamb});
           }},
      {.path = "optimizer.params.coeff_beta",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.coeff_beta; },
       .range = Range::closed_open(0, 1),
       .doc = "OneBitLamb: rate of the warm-up's moving average of each tensor's trust ratio, the ratio "
              "frozen for the compressed steps (1/(1 - coeff_beta) at most freeze_step, DeepSpeed advises).",
       .inapplicable = onebit_lamb_only},
      {.path = "optimizer.params.factor_max",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.factor_max; },
       .range = Range::above(0),
       .doc = "OneBitLamb: upper bound of the factor that scales the frozen trust ratio after freeze_step.",
       .inapplicable = onebit_lamb_only},
      {.path = "optimizer.params.factor_min",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.factor_min; },
       .range = ge(0),
       .doc = "OneBitLamb: lower bound of that factor; at most factor_max.",
       .inapplicable = onebit_lamb_only},
      {.path = "optimizer.params.factor_threshold",
       .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.optimizer.factor_threshold; },
       .range = ge(0),
       .doc = "OneBitLamb: the factor changes by at most this fraction of its last value per step.",
       .inapplicable = onebit_lamb_only},
      {.path = "optimizer.params.ns_steps",
       .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.optimizer.ns_steps; },
       .range = between(1, 100),
       .doc = "Muon: Newton-Schulz iterations per step.",
       .inapplicable = muon_only},
      {.path = "optimizer.params.adjust_lr_fn",
       .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) { return static_cast<int>(k.optimizer.adjust_lr_fn); },
                        [](Config& k, int v) { k.optimizer.adjust_lr_fn = MuonScale(v); }};
       },
       .choices = {"original", "match_rms_adamw"},
       .doc = "Muon: the update's scale for a rows x cols matrix: `original`, sqrt(max(1, rows/cols)) "
              "(Keller Jordan's); `match_rms_adamw`, 0.2 sqrt(max(rows, cols)) (Moonlight's, to match "
              "AdamW's update RMS). PyTorch's None (null here) is `original`.",
       .inapplicable = muon_only,
       // torch.optim.Muon reads adjust_lr_fn=None as the original scale.
       .null_is_default = true},

  };
}

}  // namespace zero::keys
